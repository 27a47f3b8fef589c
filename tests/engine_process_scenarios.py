"""The trainer's side of the fault-injection scenarios of ``tests/test_engine_process.py``, run as a script of its
own so that the test can kill it: ``python tests/engine_process_scenarios.py PHASE MODEL_DIR``.

It starts a :class:`reasonrl.rollouts.process.RolloutProcess` and prints a line as it enters each phase, for the test
to time its kill: ``joined`` once the constructor returned, then ``transfer`` (a weight stream the engine takes
slowly) or ``draw`` (a draw that lasts two minutes). ``start``: the real engine on the tiny model, starting vLLM
while the trainer sends what the GRPO loop sends first: the :class:`Setup`, whose draw carries the CPU preset's train
set (4,800 questions, 0.7 MB pickled: more than a pipe holds, so the request queue's thread is still writing it while
vLLM starts), then the first weights. ``unstartable``: the same, but vLLM refuses the engine's config as it starts (a
``max_model_len`` of 4,096, past the tiny model's 2,048 positions). The other phases run the engine's process with a
stand-in engine (``SCENARIO_STAND_IN=1``), which holds a semaphore as vLLM's does: what is tested there is the
channel and the watch of both processes, not vLLM.

``python tests/engine_process_scenarios.py grading TREE``: the stand-in engine draws by grading a long response with
``rewards.mine:hangs_on_long`` of ``TREE/rewards`` (a reward that never returns on it), bounded at
``SCENARIO_REWARD_SECONDS``.

``python tests/engine_process_scenarios.py lag K``: the GRPO loop's order of requests at ``max_staleness`` K, with
the stand-in engine, a weight stream it takes at once, draws of 0.1 and 1.1 s in turn and training steps of 0.6 s;
prints the seconds per step. ``python tests/engine_process_scenarios.py handoff``: at ``max_staleness`` 2, the
trainer hands the engine version 1's weights while the two draws queued before them run (3 s each); prints how long
``load_weights`` took.
"""

import dataclasses
import functools
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch

from reasonrl import rewards
from reasonrl.config import EngineConfig
from reasonrl.data import parse_lines
from reasonrl.rollouts import engine as engine_module
from reasonrl.rollouts.channel import WeightLayout
from reasonrl.rollouts.process import Draw, RolloutProcess, Setup
from reasonrl.synthetic import arithmetic_lines

ENGINE = EngineConfig(cpu_kv_cache_gib=1, max_model_len=1024, enforce_eager=True)
WEIGHTS = [(f"w{index}", torch.full((65536,), float(index))) for index in range(20)]  # 20 buckets of 256 KiB


class StandInEngine(engine_module.RolloutEngine):
    """What the engine's process needs of an engine, without vLLM; it takes a weight stream at 4 tensors a second.
    Like vLLM's (its executor's worker lock), it holds a semaphore, which a killed engine leaves behind."""

    def __init__(self, model_dir, config) -> None:
        self.config, self._asleep = config, False
        self._lock = multiprocessing.get_context("spawn").Lock()

    def load_weights(self, weights) -> None:
        for _ in weights:
            time.sleep(float(os.environ.get("SCENARIO_TENSOR_SECONDS", "0.25")))


# In this process and in the engine's, which imports this module again (spawn) before it starts its engine.
if os.environ.get("SCENARIO_STAND_IN") == "1":
    engine_module.RolloutEngine = StandInEngine
if "SCENARIO_REWARD_SECONDS" in os.environ:
    rewards.REWARD_SECONDS = float(os.environ["SCENARIO_REWARD_SECONDS"])


def slow_draw(engine, step_seed: int, train=()):
    time.sleep(120)


def preset_train_set() -> list:
    """As big as the CPU preset's synthetic train set: its 5,000 questions less the 200 kept for validation
    (``data.arithmetic`` and ``data.val_size`` in ``presets/cpu.yaml``)."""
    return parse_lines(arithmetic_lines(4800, seed=0, max_steps=2, max_value=9), "the CPU preset's train set")


def grading_draw(engine, step_seed: int, tree: str):
    reward = rewards.prompt_reward("r1_zero", {"r1_zero": "rewards.mine:hangs_on_long"}, Path(tree))
    for response in ("short", "Let me think step by step. " * 20 + "</think> <answer> 4 </answer>"):
        reward(response, "4")


def uneven_draw(engine, step_seed: int):
    time.sleep(0.1 if step_seed % 2 else 1.1)


def three_second_draw(engine, step_seed: int):
    time.sleep(3)


def handoff() -> None:
    layout = WeightLayout.of(WEIGHTS, "float32", bucket_bytes=65536 * 4)
    with RolloutProcess("unused", ENGINE) as process:
        process.setup(Setup(three_second_draw, three_second_draw))
        process.load_weights(WEIGHTS, layout, version=0)
        for step in range(3):
            process.request(Draw(step=step, step_seed=step))
        process.reply()
        started = time.monotonic()
        process.load_weights(WEIGHTS, layout, version=1)  # behind the draws of steps 1 and 2
        print(f"handoff: {time.monotonic() - started:.2f} s", flush=True)


def lag(max_staleness: int, steps: int = 14, warmup: int = 2) -> None:
    """``reasonrl.rollouts.sources.LaggedRollouts``'s requests (after each step the new weights, then the draw
    ``max_staleness`` steps ahead), the engine's work and the trainer's alternately faster and slower than each
    other."""
    layout = WeightLayout.of(WEIGHTS, "float32", bucket_bytes=65536 * 4)
    with RolloutProcess("unused", ENGINE) as process:
        process.setup(Setup(uneven_draw, uneven_draw))
        requested = -1

        def advance(step: int) -> None:
            nonlocal requested
            process.load_weights(WEIGHTS, layout, version=step)
            for later in range(requested + 1, min(step + max_staleness, steps - 1) + 1):
                process.request(Draw(step=later, step_seed=later))
                requested = later

        advance(0)
        for step in range(steps):
            if step == warmup:
                started = time.monotonic()
            assert process.reply().step == step
            time.sleep(0.6)  # training
            advance(step + 1)
        ended = time.monotonic()
    print(f"max_staleness {max_staleness}: {(ended - started) / (steps - warmup):.3f} s/step", flush=True)


def grading(tree: str) -> None:
    with RolloutProcess("unused", ENGINE) as process:
        process.setup(Setup(functools.partial(grading_draw, tree=tree), slow_draw))
        process.load_weights(WEIGHTS, WeightLayout.of(WEIGHTS, "float32", bucket_bytes=65536 * 4), version=0)
        process.request(Draw(step=0, step_seed=0))
        process.reply()


def main(phase: str, model_dir: str) -> None:
    config = ENGINE if phase != "unstartable" else dataclasses.replace(ENGINE, max_model_len=4096)
    with RolloutProcess(model_dir, config, engine_threads=1) as process:
        print("joined", flush=True)
        if phase in ("start", "unstartable"):
            from reasonrl.rollouts.engine import engine_weights
            from reasonrl.training.policy import load_policy

            process.setup(Setup(functools.partial(slow_draw, train=preset_train_set()), slow_draw))
            policy, _ = load_policy(model_dir, torch.device("cpu"))
            layout = WeightLayout.of(engine_weights(policy, ENGINE.dtype), ENGINE.dtype)
            process.load_weights(engine_weights(policy, ENGINE.dtype), layout, version=0)
            print("started", flush=True)
            return
        process.setup(Setup(slow_draw, slow_draw))
        print("transfer", flush=True)
        process.load_weights(WEIGHTS, WeightLayout.of(WEIGHTS, "float32", bucket_bytes=65536 * 4), version=0)
        process.request(Draw(step=0, step_seed=0))
        print("draw", flush=True)
        process.reply()


if __name__ == "__main__":
    if sys.argv[1] == "lag":
        lag(int(sys.argv[2]))
    elif sys.argv[1] == "handoff":
        handoff()
    elif sys.argv[1] == "grading":
        grading(sys.argv[2])
    else:
        main(*sys.argv[1:])

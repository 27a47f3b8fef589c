"""The trainer's side of the fault-injection scenarios of ``tests/test_engine_process.py``, run as a script of its
own so that the test can kill it: ``python tests/engine_process_scenarios.py PHASE MODEL_DIR``.

It starts a :class:`reasonrl.engine_process.RolloutProcess` and prints a line as it enters each phase, for the test
to time its kill: ``joined`` once the constructor returned, then ``transfer`` (a weight stream the engine takes
slowly) or ``draw`` (a draw that lasts two minutes). ``start``: the real engine on the tiny model, starting vLLM
while the trainer sends its first weights. The other phases run the engine's process with a stand-in engine
(``SCENARIO_STAND_IN=1``): what is tested there is the channel and the watch of both processes, not vLLM.
"""

import os
import sys
import time

import torch

from reasonrl import rollout
from reasonrl.config import EngineConfig
from reasonrl.engine_process import Draw, RolloutProcess, Setup, WeightLayout

ENGINE = EngineConfig(cpu_kv_cache_gib=1, max_model_len=1024, enforce_eager=True)
WEIGHTS = [(f"w{index}", torch.full((65536,), float(index))) for index in range(20)]  # 20 buckets of 256 KiB


class StandInEngine(rollout.RolloutEngine):
    """What the engine's process needs of an engine, without vLLM; it takes a weight stream at 4 tensors a second."""

    def __init__(self, model_dir, config) -> None:
        self.config, self._asleep = config, False

    def load_weights(self, weights) -> None:
        for _ in weights:
            time.sleep(0.25)


# In this process and in the engine's, which imports this module again (spawn) before it starts its engine.
if os.environ.get("SCENARIO_STAND_IN") == "1":
    rollout.RolloutEngine = StandInEngine


def slow_draw(engine, step_seed: int):
    time.sleep(120)


def main(phase: str, model_dir: str) -> None:
    with RolloutProcess(model_dir, ENGINE, engine_threads=1) as process:
        print("joined", flush=True)
        if phase == "start":
            from reasonrl.rollout import engine_weights
            from reasonrl.sft import load_policy

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
    main(*sys.argv[1:])

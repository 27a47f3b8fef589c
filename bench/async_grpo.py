"""Seconds per GRPO step on CPU: asynchronous GRPO (``grpo.max_staleness`` ≥ 1) against the synchronous loop.

Both peers run the library's own loop, ``reasonrl.grpo.run_grpo``, on the same tiny Qwen2 (the pipeline's own,
``prepare_base_model``: BPE trained on synthetic arithmetic problems, random weights, fp32) from the same initial
weights, on the same questions: ``--questions`` × ``--group-size`` samples per step, each forced to exactly
``--max-tokens`` tokens (``min_tokens = max_tokens``), one optimizer step of the whole batch in
``--gradient-accumulation-steps`` microbatches, the short ``question_only`` prompt by default (r1_zero's 117 prompt
tokens make training, which reads them every pass, much longer than generation, which reads them once), on-policy
REINFORCE with group-normalised advantages and a small KL penalty (a random model earns no reward: the penalty gives
every step a gradient, as training with rewards would).

- synchronous (``max_staleness: 0``, today's default): the engine in this process; generate, then train; engine and
  policy each use all ``--threads`` threads in turn.
- asynchronous (``max_staleness: --max-staleness``, 1 by default, ``rollout_is_cap: 2``): the engine in its own
  process pinned to the first half of the cores, the trainer pinned to the rest (one core each on 2 cores); step s
  trains on rollouts drawn with step s − k's weights while the engine draws the next steps'. The correction needs
  π_old; with one optimizer step per rollout batch, as here, it is the update's own forward, detached
  (``reasonrl.grpo.old_log_probs_source``), so neither peer runs an old-log-prob pass: their ``old_log_prob`` phase
  is the KL reference's forward.

Timing: ``time/step_seconds`` of each GRPO step as the loop logs it (rollouts or the wait for them, scoring,
fixed log-probs, training, and for the asynchronous peer streaming the new weights to the engine), validation left
out; the first ``--warmup-steps`` steps are dropped and the median of the rest reported, with each phase's median.
The asynchronous peer runs first, then the synchronous one (whose in-process engine binds this process's threads).

The expected ratio at the 1.5B shape, on two GPUs (the engine on one, the trainer on the other): a step of the
synchronous loop takes generation + training; the asynchronous one, once the pipeline is full, max(generation,
training) + the weight transfer. Each loop is charged the phases its config runs at the shape of ``params.yaml``
(256 responses, one optimizer step per rollout batch), ``--gpu-loss-type`` and ``--gpu-kl-coef``: the update, plus
one gradient-free forward over the batch for π_old's separate pass (only where later optimizer steps need it) and
one for π_ref (a KL penalty). The update's and the forward's seconds are H200 figures of ``bench/gpu_train_step.py``
(``--gpu-update-seconds``, ``--gpu-fixed-pass-seconds``); generation is ``--gpu-tokens`` response tokens at
``--engine-tokens-per-second``, which was not measured (no vLLM on the lent GPU): an assumption, printed as one.
The weight transfer (3.1 GB of bf16 weights) over NVLink is well under 0.1 s and left out. The bench prints each
input with where it comes from.

Run: ``python bench/async_grpo.py`` (about 3 minutes on 2 cores). The last line is the headline ratio.
``--peers async`` or ``--peers sync`` runs one peer alone: ``tests/test_bench.py`` runs the asynchronous peer at a
small shape.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import tempfile
from pathlib import Path

import torch

from reasonrl.cli import open_live
from reasonrl.config import EngineConfig, EvalConfig, GRPOConfig, TinyModelSpec
from reasonrl.data import parse_lines
from reasonrl.grpo import old_log_probs_source, run_grpo
from reasonrl.loss_registry import LOSS_TYPES
from reasonrl.models import prepare_base_model
from reasonrl.rollouts.process import start_engine
from reasonrl.synthetic import arithmetic_lines
from reasonrl.training.policy import load_policy

PEERS = ("both", "sync", "async")
PHASES = ("step", "rollout", "old_log_prob", "train", "engine")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=16, help="questions per GRPO step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per question")
    parser.add_argument("--max-tokens", type=int, default=128, help="completion length (forced)")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=4, help="microbatches per optimizer step")
    parser.add_argument(
        "--prompt", default="question_only", help="question_only (short: balances the phases) or r1_zero"
    )
    parser.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per peer (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the whole run (split in two: async)")
    parser.add_argument(
        "--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start; the tests' small runs)"
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="async: leave the engine and the trainer to the OS scheduler"
    )
    parser.add_argument("--peers", choices=PEERS, default="both", help="run both peers (the ratio) or one alone")
    parser.add_argument("--max-staleness", type=int, default=1, help="the asynchronous peer's lag (≥ 1)")
    parser.add_argument(
        "--gpu-update-seconds", type=float, default=4.3, help="1.5B: one optimizer step over 256 responses (H200)"
    )
    parser.add_argument(
        "--gpu-fixed-pass-seconds", type=float, default=2.4, help="1.5B: a gradient-free forward over them (H200)"
    )
    parser.add_argument(
        "--gpu-loss-type", choices=sorted(LOSS_TYPES), default="reinforce_with_baseline", help="1.5B loops' loss"
    )
    parser.add_argument("--gpu-kl-coef", type=float, default=0.0, help="1.5B loops' KL penalty (params.yaml: 0)")
    parser.add_argument("--gpu-tokens", type=int, default=256 * 360, help="response tokens per 1.5B step")
    parser.add_argument(
        "--engine-tokens-per-second", type=float, default=20_000.0, help="assumed vLLM throughput, 1.5B, one GPU"
    )
    return parser.parse_args()


def build_model(directory: Path) -> list:
    """The pipeline's tiny model (``reasonrl.models.prepare_base_model``) in ``directory``, its tokenizer trained on
    synthetic arithmetic problems; returns them, the training questions."""
    examples = parse_lines(arithmetic_lines(512, seed=0, max_steps=2, max_value=9), "synthetic train")
    prepare_base_model("tiny", TinyModelSpec(), seed=0, train=examples, out_dir=directory)
    return examples


def run_peer(lag: int, model_dir: Path, train: list, config: GRPOConfig, args, workdir: Path) -> dict[str, list]:
    """One peer's per-step phase seconds, from the curves its ``run_grpo`` logged."""
    engine_config = EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=1024, enforce_eager=args.enforce_eager)
    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    if lag:
        torch.set_num_threads(len(cores))
        engine = start_engine(model_dir, engine_config, max_staleness=lag)  # as the grpo stage starts it
        half = engine.engine_threads  # half of the threads to the engine's process
        if not args.no_pin:  # the engine's process and the trainer: a core each
            os.sched_setaffinity(engine.pid, cores[:half])
            os.sched_setaffinity(0, cores[half:] or cores)
        config = dataclasses.replace(config, max_staleness=lag, rollout_is_cap=2.0)
    else:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
        engine = start_engine(model_dir, engine_config)
    live = workdir / f"live_{lag}"
    policy, tokenizer = load_policy(model_dir, torch.device("cpu"))
    with contextlib.redirect_stdout(io.StringIO()):  # run_grpo's source of rollouts stops the engine's process
        run_grpo(
            policy, tokenizer, engine, train, train[:2], config, EvalConfig(max_tokens=8),
            open_live=lambda resume: open_live(str(live), resume=resume), live_dir=live,
            checkpoint_dir=workdir / f"checkpoints_{lag}", init_model_dir=model_dir,
        )  # fmt: skip
    times = {}
    for phase in PHASES:
        curve = live / "plots/metrics/time" / f"{phase}_seconds.tsv"
        if curve.exists():
            times[phase] = [float(row.split("\t")[1]) for row in curve.read_text().splitlines()[1:]]
    return times


def report(name: str, times: dict[str, list], warmup: int) -> dict[str, float]:
    medians = {phase: statistics.median(values[warmup:]) for phase, values in times.items()}
    phases = ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in medians.items() if phase != "step")
    steps = " ".join(f"{seconds:.2f}" for seconds in times["step"])
    print(f"{name}: {medians['step']:.2f} s/step ({phases}; median of {len(times['step']) - warmup}; all: {steps})")
    return medians


def fixed_passes(config: GRPOConfig) -> list[str]:
    """The gradient-free forwards over the rollout batch that a step of ``config`` runs before its update."""
    separate = ["old-log-prob pass"] if old_log_probs_source(config) == "separate_pass" else []
    return separate + (["KL reference pass"] if config.loss.kl_coef > 0 else [])


def projection(args: argparse.Namespace) -> list[str]:
    """The expected seconds per step of both loops at the 1.5B shape, each charged the phases its config runs
    (:func:`fixed_passes`), after the inputs and where each comes from; the last line is the expected ratio."""
    sync = GRPOConfig(loss_type=args.gpu_loss_type, kl_coef=args.gpu_kl_coef)  # params.yaml's shape: 256 responses
    lagged = dataclasses.replace(sync, max_staleness=1, rollout_is_cap=2.0)
    generation = args.gpu_tokens / args.engine_tokens_per_second
    update, forward = args.gpu_update_seconds, args.gpu_fixed_pass_seconds
    lines = [
        f"1.5B inputs measured on one H200 by bench/gpu_train_step.py (not by this run): update {update:.1f} s, "
        f"gradient-free forward {forward:.1f} s, each over 256 responses of 160 + 120-600 tokens",
        f"1.5B inputs assumed: generation of {args.gpu_tokens} response tokens at {args.engine_tokens_per_second:,.0f}"
        " tok/s (vLLM never ran on the lent GPU); the weight transfer, 3.1 GB over NVLink, under 0.1 s (left out)",
    ]
    training = {}
    for name, config in (("synchronous", sync), ("max_staleness 1", lagged)):
        passes = fixed_passes(config)
        training[name] = args.gpu_update_seconds + len(passes) * args.gpu_fixed_pass_seconds
        charged = " + ".join(["update", *passes])
        lines.append(f"1.5B {name}, {config.loss.loss_type}: training {training[name]:.1f} s ({charged})")
    synchronous = generation + training["synchronous"]
    lagged_step = max(generation, training["max_staleness 1"])
    lines.append(
        f"1.5B on two GPUs, expected: generation {generation:.1f} s, synchronous {synchronous:.1f} s/step, "
        f"max_staleness 1 {lagged_step:.1f} s/step, ratio {synchronous / lagged_step:.2f}x"
    )
    return lines


def main() -> None:
    args = parse_args()
    config = GRPOConfig(
        n_grpo_steps=args.warmup_steps + args.steps,
        learning_rate=1e-5,
        rollout_batch_size=args.questions * args.group_size,
        group_size=args.group_size,
        train_batch_size=args.questions * args.group_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        min_tokens=args.max_tokens,
        max_tokens=args.max_tokens,
        loss_type="reinforce_with_baseline",
        kl_coef=0.01,
        prompt=args.prompt,
        eval_every=10_000,
        eval_examples=2,
        checkpoint_every=10_000,
    )
    print(
        f"shape: {args.questions} questions x {args.group_size} samples x {args.max_tokens} forced tokens, prompt "
        f"{args.prompt}, one "
        f"optimizer step in {args.gradient_accumulation_steps} microbatches; {args.warmup_steps} warm-up + "
        f"{args.steps} timed steps; cpus {sorted(os.sched_getaffinity(0))[: args.threads]}",
        flush=True,
    )
    medians = {}
    with tempfile.TemporaryDirectory() as workdir:
        model_dir = Path(workdir) / "model"
        train = build_model(model_dir)
        # async first: the in-process engine binds its threads
        for lag, name in ((args.max_staleness, "async"), (0, "sync")):
            if args.peers in ("both", name):
                times = run_peer(lag, model_dir, train, config, args, Path(workdir))
                medians[name] = report(f"{name} (max_staleness {lag})", times, args.warmup_steps)

    for line in projection(args):
        print(line)
    if args.peers == "both":
        ratio = medians["sync"]["step"] / medians["async"]["step"]
        print(f"async_grpo_speedup_vs_sync: {ratio:.2f}x (target >= 1.5x on 2 cores)")


if __name__ == "__main__":
    main()

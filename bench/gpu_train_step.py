"""Seconds, tokens/s, MFU and peak memory of the training half of a full-scale step, through the loops' own functions.

A random-weight model of Qwen2.5-Math-1.5B's shape is built from a ``Qwen2Config`` (no download: hidden 1536, 28
layers, 12 heads / 2 KV heads, MLP 8960, vocabulary 151,936, tied embeddings), and fed the RL shape: 256 responses of
160 prompt tokens + 120–600 response tokens (uniform, seeded), 132k tokens. Per setting it times

- one GRPO optimizer step over the 256 responses: ``reasonrl.grpo.accumulate_gradients`` + ``optimizer_step`` with
  ``make_optimizer``'s AdamW (on-policy ``reinforce_with_baseline``), as ``run_grpo`` calls them;
- the old-log-prob pass over the same responses: ``reasonrl.grpo.compute_old_log_probs``;
- one SFT optimizer step over 32 of them: ``reasonrl.sft.accumulate_sft_gradients`` + clipping + AdamW.

Settings: the handout's (pure bf16, fixed microbatches of 2), bf16 with token-budget microbatches, the new
defaults (``mixed`` precision: fp32 master weights under bf16 autocast, token budget ``--microbatch-tokens``), and the
defaults with LoRA adapters of rank ``--lora-rank`` on every linear layer. Each runs one untimed warm-up step, then
``--steps`` timed ones (median). MFU counts 6 FLOPs per parameter and real (unpadded) token for a training step (4
with LoRA: no weight gradients for the frozen matrices), 2 for the old-log-prob pass, against the GPU's dense bf16
peak: ``--peak-tflops``, else the datasheet figure of the board its device name denotes (``CARDS``: 989.5 for an
H100 SXM, 756.5 for an H100 PCIe, 835.5 for an H100 NVL), else no MFU at all. Peak memory is
``torch.cuda.max_memory_allocated`` per setting; the AdamW state is the bytes of the optimizer's moment tensors after
the GRPO steps.

Imports no vLLM, so it runs on a bare GPU machine with torch and transformers and no network::

    PYTHONPATH=src python3 bench/gpu_train_step.py                  # the 1.5B shape on cuda:0 (a few minutes)
    PYTHONPATH=src python3 bench/gpu_train_step.py --shape small --device cpu --peak-tflops 1   # CI smoke run

The last line is the headline: the defaults' GRPO-step MFU and their speed-up over the handout's microbatches, and
LoRA's AdamW state as a fraction of full fine-tuning's, measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import statistics
import time
from collections.abc import Callable

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl.batching import sequence_lengths
from reasonrl.config import GRPOConfig, SFTConfig
from reasonrl.grpo import (
    FixedLogProbs,
    Forwards,
    NonFiniteGuard,
    RolloutBatch,
    accumulate_gradients,
    compute_old_log_probs,
    optimizer_step,
)
from reasonrl.lora import trainable_parameters
from reasonrl.models import policy_dtype
from reasonrl.sft import accumulate_sft_gradients
from reasonrl.tokenization import batch_from_token_ids
from reasonrl.training.optimizer import make_optimizer
from reasonrl.training.policy import prepare_for_training

SHAPES = {
    "qwen2.5-1.5b": dict(
        vocab_size=151_936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, tie_word_embeddings=True, rope_theta=10_000.0, max_position_embeddings=4096,
    ),
    "small": dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=512, tie_word_embeddings=True, max_position_embeddings=4096,
    ),
}  # fmt: skip
CARDS = (
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 1671 / 2),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 1513 / 2),
    (r"\bH100\b.*\b(HBM3|SXM\d?)\b", "H100 SXM", 1979 / 2),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 1671 / 2),
    (r"^NVIDIA H200$|\bH200\b.*\b(HBM3e?|SXM\d?)\b", "H200 SXM", 1979 / 2),
    (r"\bGH200\b", "GH200", 1979 / 2),
    (r"\bH800\b.*\bPCIe\b", "H800 PCIe", 1513 / 2),
    (r"^NVIDIA H800$|\bH800\b.*\b(HBM3|SXM\d?)\b", "H800 SXM", 1979 / 2),
    (r"\bA100\b", "A100", 312.0),
    (r"\bL40S\b", "L40S", 362.05),
)
"""(pattern searched in the name ``torch.cuda.get_device_name`` reports, card, dense bf16 tensor-core TFLOP/s).

The peaks are NVIDIA's datasheet figures; Hopper datasheets give them with 2:4 sparsity, hence the halves. One chip
name covers boards whose clocks and power differ, so the pattern must tell them apart: an H100 SXM reports
"NVIDIA H100 80GB HBM3" (989.5 TFLOP/s), the PCIe card "NVIDIA H100 PCIe" (756.5), the NVL card "NVIDIA H100 NVL"
(835.5 per GPU); the H200 SXM reports a bare "NVIDIA H200", the NVL card "NVIDIA H200 NVL". Every A100 (SXM4 or
PCIe, 40 or 80 GB) has the same 312 TFLOP/s. A name no pattern matches (or a board not listed, such as a bare
"NVIDIA H100") gets no peak, so no MFU is printed rather than one against another board's peak."""


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    precision: str
    microbatch_size: int
    microbatch_tokens: int | None
    old_log_probs_microbatch_tokens: int | None
    lora_rank: int = 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--responses", type=int, default=256, help="responses per GRPO step (32 per SFT step)")
    parser.add_argument("--prompt-tokens", type=int, default=160)
    parser.add_argument("--response-tokens", type=int, nargs=2, default=(120, 600), metavar=("MIN", "MAX"))
    parser.add_argument("--microbatch-tokens", type=int, default=8192, help="training token budget of the defaults")
    parser.add_argument("--old-log-probs-microbatch-tokens", type=int, default=65536)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--lora-rank", type=int, default=16, help="rank of the LoRA setting")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per measurement (after one warm-up)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak (default: from its name)")
    return parser.parse_args()


def known_card(device_name: str) -> tuple[str, float] | None:
    """The card a CUDA device name denotes and its dense bf16 peak (TFLOP/s); None when :data:`CARDS` has no entry."""
    for pattern, card, tflops in CARDS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return card, tflops
    return None


def build_policy(shape: str, device: torch.device, config: GRPOConfig, checkpointing: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    model_config = Qwen2Config(**SHAPES[shape], attn_implementation="sdpa", use_cache=False)
    with torch.device(device):
        policy = Qwen2ForCausalLM(model_config).to(policy_dtype(device, config.precision))
    return prepare_for_training(policy, checkpointing, lora=config.lora)


def rollout_batch(args: argparse.Namespace, vocab_size: int) -> RolloutBatch:
    """``--responses`` random responses of seeded random lengths after random prompts, with random advantages."""
    rng = random.Random(0)
    low, high = args.response_tokens
    prompts = [[rng.randrange(vocab_size) for _ in range(args.prompt_tokens)] for _ in range(args.responses)]
    responses = [[rng.randrange(vocab_size) for _ in range(rng.randint(low, high))] for _ in range(args.responses)]
    tensors = batch_from_token_ids(prompts, responses, pad_token_id=0)
    advantages = torch.randn(args.responses, generator=torch.Generator().manual_seed(0))
    return RolloutBatch(
        prompts=[""] * args.responses,
        responses=[""] * args.responses,
        ground_truths=[""] * args.responses,
        **tensors,
        engine_log_probs=None,
        raw_rewards=(advantages > 0).float(),
        advantages=advantages,
        response_lengths=[len(r) for r in responses],
        sequence_lengths=sequence_lengths(tensors["response_mask"]),
        truncated=torch.zeros(args.responses, dtype=torch.bool),
    )


def timed(function: Callable[[], None], device: torch.device, steps: int) -> tuple[float, float]:
    """Median seconds of ``steps`` calls after one warm-up call, and the peak memory (GiB; 0 off CUDA)."""
    function()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return statistics.median(seconds), peak


def time_grpo_step(policy, batch: RolloutBatch, config: GRPOConfig, device, steps: int) -> tuple[float, float, float]:
    """One optimizer step over the whole batch, as ``run_grpo`` takes it; the optimizer lives for this measurement.
    Also returns the GiB of AdamW state it ended with."""
    optimizer, guard = make_optimizer(policy, config.optimizer), NonFiniteGuard(limit=10**9)
    rows = list(range(len(batch.responses)))
    fixed, forwards, max_tokens = FixedLogProbs(), Forwards.training(config), config.sampling.max_tokens

    def step() -> None:
        accumulate_gradients(policy, batch, rows, fixed, config.loss, forwards, max_tokens)
        optimizer_step(policy, optimizer, config.optimizer.max_grad_norm, guard, 0, {})

    seconds, memory = timed(step, device, steps)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim() > 0)
    return seconds, memory, state / 2**30


def time_sft_step(policy, batch: dict[str, torch.Tensor], config: SFTConfig, device, steps: int) -> tuple[float, float]:
    """One optimizer step as ``sft_steps`` takes it, on already tokenized tensors."""
    optimizer = make_optimizer(policy, config.optimizer)

    def step() -> None:
        accumulate_sft_gradients(policy, batch, config)
        torch.nn.utils.clip_grad_norm_(trainable_parameters(policy), config.optimizer.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed(step, device, steps)


def measure(
    args: argparse.Namespace, setting: Setting, device: torch.device, peak: float | None
) -> dict[str, float | None]:
    """Time (and MFU, with a known peak) the GRPO step, the old-log-prob pass and the SFT step in one setting, each
    line printed; returns the GRPO step's seconds and MFU and the AdamW state's GiB."""
    grpo = GRPOConfig(
        rollout_batch_size=args.responses,
        group_size=8,
        train_batch_size=args.responses,
        gradient_accumulation_steps=args.responses // setting.microbatch_size,
        microbatch_tokens=setting.microbatch_tokens,
        old_log_probs_microbatch_tokens=setting.old_log_probs_microbatch_tokens,
        precision=setting.precision,
        learning_rate=1e-6,
        lora_rank=setting.lora_rank,
    )
    policy = build_policy(args.shape, device, grpo, args.gradient_checkpointing)
    parameters = sum(p.numel() for p in policy.parameters())
    # A training step is 2 FLOPs per parameter and token forward, 2 for the input gradients, and 2 more for the
    # weight gradients, which LoRA computes for its adapters only.
    train_flops = 4 * parameters if setting.lora_rank else 6 * parameters
    batch = rollout_batch(args, policy.config.vocab_size)
    tokens = sum(batch.sequence_lengths)
    results = {}
    results["grpo_seconds"], memory, results["adamw_gib"] = time_grpo_step(policy, batch, grpo, device, args.steps)
    results["grpo_mfu"] = report(
        "grpo step", setting, results["grpo_seconds"], tokens, train_flops * tokens, peak, memory
    )
    print(f"{'AdamW state':<14} {setting.name:<34} {results['adamw_gib']:7.3f} GiB", flush=True)
    seconds, memory = timed(lambda: compute_old_log_probs(policy, batch, Forwards.fixed(grpo)), device, args.steps)
    report("old log-probs", setting, seconds, tokens, 2 * parameters * tokens, peak, memory)

    sft_rows = list(range(min(32, args.responses)))
    sft_batch = {
        "input_ids": batch.input_ids[sft_rows],
        "labels": batch.labels[sft_rows],
        "response_mask": batch.response_mask[sft_rows],
    }
    sft = SFTConfig(
        batch_size=len(sft_rows),
        microbatch_size=setting.microbatch_size,
        microbatch_tokens=setting.microbatch_tokens,
        precision=setting.precision,
        learning_rate=1e-6,
        lora_rank=setting.lora_rank,
    )
    sft_tokens = sum(batch.sequence_lengths[row] for row in sft_rows)
    seconds, memory = time_sft_step(policy, sft_batch, sft, device, args.steps)
    report("sft step", setting, seconds, sft_tokens, train_flops * sft_tokens, peak, memory)
    return results


def report(
    what: str, setting: Setting, seconds: float, tokens: int, flops: float, peak: float | None, memory: float
) -> float | None:
    """Print one measurement; returns its MFU (None without a peak)."""
    mfu = None if peak is None else flops / seconds / (peak * 1e12)
    print(
        f"{what:<14} {setting.name:<34} {seconds:7.2f} s  {tokens / seconds / 1e3:7.1f}k tok/s  "
        f"MFU {'  n/a' if mfu is None else f'{100 * mfu:4.1f}%'}  peak {memory:5.1f} GiB",
        flush=True,
    )
    return mfu


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    card = known_card(name)
    if args.peak_tflops is not None:
        peak, peak_note = args.peak_tflops, f"peak {args.peak_tflops:g} TFLOP/s (--peak-tflops)"
    elif card is not None:
        peak, peak_note = card[1], f"peak {card[1]:g} TFLOP/s ({card[0]} datasheet, dense bf16)"
    else:
        peak, peak_note = None, "no known bf16 peak for this device: MFU not reported (pass --peak-tflops)"
    budget, old_budget = args.microbatch_tokens, args.old_log_probs_microbatch_tokens
    settings = [
        Setting("handout: bf16, microbatches of 2", "bf16", 2, None, None),
        Setting(f"bf16, {budget}-token microbatches", "bf16", 2, budget, old_budget),
        Setting(f"defaults: mixed, {budget}-token", "mixed", 2, budget, old_budget),
        Setting(f"defaults + LoRA rank {args.lora_rank}", "mixed", 2, budget, old_budget, args.lora_rank),
    ]
    print(
        f"gpu_train_step: {args.shape} shape on {name} ({args.device}), {args.responses} responses of "
        f"{args.prompt_tokens} + {args.response_tokens[0]}-{args.response_tokens[1]} tokens, {peak_note}, "
        f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, median of {args.steps} steps"
        + ("" if device.type == "cuda" else " (off CUDA every precision trains in fp32)")
    )
    results = {}
    for setting in settings:
        results[setting.name] = measure(args, setting, device, peak)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next setting's peak is its own
    handout, bf16, defaults, _ = (results[setting.name] for setting in settings)
    full_state, lora_state = (results[setting.name]["adamw_gib"] for setting in settings[2:])
    if peak is None:
        mfu = "GRPO step MFU n/a (no known peak)"
    else:
        mfu = (
            f"GRPO step MFU {100 * defaults['grpo_mfu']:.1f}% at the defaults ({settings[2].name}; bf16 "
            f"{100 * bf16['grpo_mfu']:.1f}%)"
        )
    print(
        f"gpu_train_step: {mfu}, {handout['grpo_seconds'] / defaults['grpo_seconds']:.2f}x the speed of the "
        f"handout's microbatches of 2; LoRA rank {args.lora_rank} AdamW state {lora_state / full_state:.3f}x full "
        "fine-tuning's"
    )


if __name__ == "__main__":
    main()

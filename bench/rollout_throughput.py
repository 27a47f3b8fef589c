"""Generation throughput: ``RolloutEngine`` (vLLM) against Hugging Face ``generate``, same model, same prompts.

Both generate from the tiny Qwen2 the pipeline builds (``reasonrl.models.prepare_base_model("tiny", ...)``: BPE
trained on GSM8K train, random weights) for the same 256 r1_zero prompts built from GSM8K train questions, sampling at
temperature 1. Two shapes, each the median of 3 timed runs after a warm-up, the two peers alternating run by run so
that a change in machine load hits both:

1. ``forced_128``: every sequence exactly 128 tokens (vLLM ``min_tokens = max_tokens = 128``; HF
   ``min_new_tokens = max_new_tokens = 128``). HF's best case: nothing to pad.
2. ``rl_shape``: each sequence as long as its question's reference solution (written the r1_zero way,
   ``reasoning </think> <answer> N </answer>``, tokenized with the tiny tokenizer). vLLM honours each request's
   length; HF generates in batches of 64 and must run every batch to its longest sequence. Only the useful tokens
   (the reference lengths) count, for both.

Run: ``python bench/rollout_throughput.py`` (5-10 minutes on 2 cores; ``--dtype float32`` is faster on CPUs without
native bf16). On a machine other jobs share, add ``--threads 1``: OpenMP threads that wait on busy cores slow both
peers down many times over. The last line is the headline ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl.config import DataConfig, EngineConfig, TinyModelSpec
from reasonrl.data import fetch_verified_gsm8k, parse_lines, resolve_source
from reasonrl.models import prepare_base_model
from reasonrl.prompts import load_prompt
from reasonrl.rollouts.engine import RolloutEngine


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256, help="number of GSM8K train questions")
    parser.add_argument("--forced-tokens", type=int, default=128, help="length of every sequence in shape 1")
    parser.add_argument("--hf-batch-size", type=int, default=64, help="HF generate batch size")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="both peers' dtype")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per peer and shape (median reported)")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache")
    parser.add_argument(
        "--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start; the tests' small runs)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads for both (default: torch's)")
    return parser.parse_args()


def reference_response(example) -> str:
    """The reference solution as an r1_zero completion (what the policy should learn to write)."""
    return f"{example.reasoning} </think> <answer> {example.answer} </answer>"


def hf_generate(model, tokenizer, prompts: list[str], lengths: list[int], batch_size: int) -> int:
    """Sample with HF ``generate`` in batches, each run to its longest length; returns the useful token count."""
    useful = 0
    for start in range(0, len(prompts), batch_size):
        batch_lengths = lengths[start : start + batch_size]
        longest = max(batch_lengths)
        inputs = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)  # left-padded
        with torch.no_grad():
            output = model.generate(
                **inputs,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                min_new_tokens=longest,
                max_new_tokens=longest,
                pad_token_id=tokenizer.pad_token_id,
            )
        assert output.shape[1] - inputs["input_ids"].shape[1] == longest  # [B, P + longest]
        useful += sum(batch_lengths)
    return useful


def vllm_generate(engine: RolloutEngine, prompts: list[str], lengths: list[int]) -> int:
    samples = engine.generate(prompts, temperature=1.0, min_tokens=lengths, max_tokens=lengths, stop=())
    generated = [len(per_prompt[0].token_ids) for per_prompt in samples]
    assert generated == lengths, "vLLM did not honour the per-request lengths"
    return sum(generated)


def tokens_per_second(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    tokens = run()
    return tokens / (time.perf_counter() - start)


def measure(peers: dict[str, Callable[[list[int]], int]], lengths: list[int], repeats: int) -> dict[str, float]:
    """Median tokens/s per peer after an untimed warm-up (every prompt, 8 tokens); peers alternate in each repeat."""
    for run in peers.values():
        run([8] * len(lengths))
    rates: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(repeats):
        for name, run in peers.items():
            rates[name].append(tokens_per_second(lambda run=run: run(lengths)))
    return {name: statistics.median(values) for name, values in rates.items()}


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # before the engine starts: its OpenMP kernels share torch's threads
    data = DataConfig()  # the official files, checksum-verified: from $GSM8K_MIRROR when set, else downloaded
    splits = fetch_verified_gsm8k(resolve_source(None, data.url), data.sha256, data.max_download_bytes)
    examples = parse_lines(splits["train"], "GSM8K train")
    chosen = examples[: args.prompts]

    with tempfile.TemporaryDirectory() as model_dir:
        # -- the model both peers load ---------------------------------------------------------------------------
        description = prepare_base_model("tiny", TinyModelSpec(), seed=0, train=examples, out_dir=Path(model_dir))
        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        prompt = load_prompt("r1_zero")
        prompts = [prompt.render(example.question, tokenizer) for example in chosen]
        reference_lengths = [len(ids) for ids in tokenizer([reference_response(e) for e in chosen])["input_ids"]]
        prompt_lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
        dtype = getattr(torch, args.dtype)
        max_model_len = max(prompt_lengths) + max(max(reference_lengths), args.forced_tokens) + 16
        engine = RolloutEngine(
            model_dir,
            EngineConfig(
                dtype=args.dtype,
                cpu_kv_cache_gib=args.kv_cache_gib,
                max_model_len=max_model_len,
                enforce_eager=args.enforce_eager,
            ),
        )
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

        print(f"model: {description}, {args.dtype} for both peers")
        print(f"prompts: {len(prompts)} r1_zero GSM8K questions, mean {statistics.mean(prompt_lengths):.0f} tokens")
        print(
            f"rl_shape lengths: mean {statistics.mean(reference_lengths):.0f}, median "
            f"{statistics.median(reference_lengths):.0f}, max {max(reference_lengths)} tokens; HF batch "
            f"{args.hf_batch_size}; torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}"
        )

        # -- the two shapes ----------------------------------------------------------------------------------------
        results = {}
        shapes = {
            f"forced_{args.forced_tokens}": [args.forced_tokens] * len(prompts),
            "rl_shape": reference_lengths,
        }
        peers = {
            "vllm": lambda lengths: vllm_generate(engine, prompts, lengths),
            "hf": lambda lengths: hf_generate(hf_model, tokenizer, prompts, lengths, args.hf_batch_size),
        }
        for shape, lengths in shapes.items():
            results[shape] = measure(peers, lengths, args.repeats)
            print(
                f"{shape}: RolloutEngine {results[shape]['vllm']:,.0f} tok/s, HF generate "
                f"{results[shape]['hf']:,.0f} tok/s (useful tokens, median of {args.repeats})"
            )

    forced = f"forced_{args.forced_tokens}"
    print(f"forced_{args.forced_tokens}_speedup_vs_hf_generate: {results[forced]['vllm'] / results[forced]['hf']:.1f}x")
    print(f"rl_shape_speedup_vs_hf_generate: {results['rl_shape']['vllm'] / results['rl_shape']['hf']:.1f}x")


if __name__ == "__main__":
    main()

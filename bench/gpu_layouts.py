"""Check ``RolloutEngine``'s GPU layouts on a GPU machine: ``colocate`` (engine and policy share cuda:0, the engine
sleeps while the policy trains) and ``split`` (engine on cuda:1, policy on cuda:0).

Needs the CUDA ``vllm`` package (``pip install -e '.[gpu]'``); the CPU path is covered by ``tests/test_rollout.py``.
Each layout runs in its own subprocess (one in-process vLLM engine per process) on the tiny Qwen2 built here, and:

1. starts the engine and checks where its memory went (``split``: cuda:1, not cuda:0) and (``split``) that the
   current CUDA device is the policy's cuda:0 again;
2. generates: ``n`` samples per prompt, per-prompt lengths honoured;
3. reruns a seeded ``generate`` after other calls and another numpy seed (vLLM's default GPU model runner seeds each
   request from numpy) and checks the samples repeat, and that ``generate`` leaves the caller's numpy state alone;
4. adds noise to the policy's (tied) embedding only, ``sleep()`` (``colocate``: checks the engine's memory comes back
   to cuda:0), then ``wake_up(policy)``, which loads the new weights between waking the weights and the KV cache;
   ``--sleep-level 2`` sleeps at vLLM's level 2 (``rollout.sleep_level``: the weights dropped, not copied to host
   memory), so that step 5 checks that the wake's reload refills them;
5. compares the engine with the HF policy on ``policy_device()``: greedy continuations token for token (``float32``;
   ``bfloat16`` reports the agreement only, as two kernels' rounding can flip near-ties) and the log-probs of sampled
   tokens (max |diff| below 1e-3 in ``float32``, 0.1 in ``bfloat16``).
   A stale output layer would be off by tens of nats.

``--dtype`` defaults to ``bfloat16``, the production engine's (``rollout.dtype`` in ``params.yaml``; vLLM's GPU
attention kernels want 16-bit); ``--dtype float32`` adds the exact greedy check.

Expected output on a machine with two GPUs (illustrative: no GPU with vLLM has run this script yet; the numbers are
placeholders)::

    colocate: engine started on cuda:0 in 25.3 s (bfloat16)
    colocate: ok   generate: 3 prompts x 4 samples, per-prompt lengths honoured
    colocate: ok   seeded generate repeats its samples (after other calls and another numpy seed)
    colocate: ok   generate leaves numpy's state as it was
    colocate: ok   sleep() released 41.9 GiB of cuda:0 (engine share 42.3 GiB), wake_up(policy) took 41.9 GiB back
    colocate: info greedy after sync == HF greedy, 3/3 prompts, 96/96 tokens (bfloat16: not required)
    colocate: ok   sampled-token log-probs after sync: max |engine - HF| 1.6e-02
    colocate: ok   a generation phase ends asleep (1.2 GiB in use)
    colocate: PASS
    split: engine started on cuda:1 in 24.8 s (bfloat16)
    split: ok   engine memory on cuda:1: 117.9 GiB, on cuda:0: 0.0 GiB
    ...
    split: PASS
    gpu_layouts: 2 passed, 0 failed, 0 skipped

On one GPU ``split`` prints ``split: SKIP (needs 2 CUDA devices, found 1)``; without CUDA (or without vLLM) the
script prints ``gpu_layouts: SKIP (...)`` and exits 0. Any failed check prints ``FAIL`` and the exit status is 1.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from reasonrl.config import EngineConfig, TinyModelSpec
from reasonrl.logprobs import get_response_log_probs
from reasonrl.rollouts.engine import RolloutEngine
from reasonrl.tiny_model import build_tiny_model, train_tokenizer

LAYOUTS = ("colocate", "split")
PROMPTS = [
    "Natalia sold 48/2 = 24 clips in May.",
    "Weng earns 12/60 = $0.2 per minute",
    "A conversation between User and Assistant.",
]
CORPUS = [
    "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether in April and May.",
    "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10.",
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it.",
    "</think> <answer> 72 </answer>",
] * 4
GREEDY_TOKENS = 32
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}
PRODUCTION_DTYPE = "bfloat16"
"""The engine dtype of a GPU run (``rollout.dtype`` in the committed ``params.yaml``; a test holds them equal)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--layout", choices=LAYOUTS, help="run one layout in this process (used by the driver)")
    parser.add_argument(
        "--dtype", default=PRODUCTION_DTYPE, choices=sorted(LOGPROB_TOLERANCE), help="engine and policy"
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="the engine's share of its GPU")
    parser.add_argument("--sleep-level", type=int, default=1, choices=(1, 2), help="rollout.sleep_level (colocate)")
    return parser.parse_args()


# -- driver: one subprocess per layout ------------------------------------------------------------------------------


def skip_reason(layout: str | None = None) -> str | None:
    if not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__}); run this on a GPU machine"
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        return f"vLLM is not importable ({error}); install the CUDA vllm package (pip install -e '.[gpu]')"
    if layout == "split" and torch.cuda.device_count() < 2:
        return f"needs 2 CUDA devices, found {torch.cuda.device_count()}"
    return None


def drive(args: argparse.Namespace) -> int:
    if reason := skip_reason():
        print(f"gpu_layouts: SKIP ({reason})")
        return 0
    passed = failed = skipped = 0
    for layout in LAYOUTS:
        if reason := skip_reason(layout):
            print(f"{layout}: SKIP ({reason})")
            skipped += 1
            continue
        command = [sys.executable, __file__, "--layout", layout, "--dtype", args.dtype]
        command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        command += ["--sleep-level", str(args.sleep_level)]
        if subprocess.run(command, check=False).returncode == 0:
            passed += 1
        else:
            failed += 1
    print(f"gpu_layouts: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


# -- one layout -----------------------------------------------------------------------------------------------------


class Checks:
    def __init__(self, layout: str) -> None:
        self.layout, self.failures = layout, 0

    def info(self, message: str) -> None:
        print(f"{self.layout}: {message}", flush=True)

    def check(self, ok: bool, message: str) -> None:
        self.failures += not ok
        self.info(f"{'ok  ' if ok else 'FAIL'} {message}")


def used_gib(device: int) -> float:
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30


def hf_greedy(policy, tokenizer, prompt: str, device: torch.device) -> list[int]:
    input_ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)  # [1, P]
    with torch.no_grad():
        output = policy.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            min_new_tokens=GREEDY_TOKENS,
            max_new_tokens=GREEDY_TOKENS,
            pad_token_id=tokenizer.pad_token_id,
        )
    return output[0, input_ids.shape[1] :].tolist()


def hf_log_probs(policy, tokenizer, prompt: str, response_ids: list[int], device: torch.device) -> torch.Tensor:
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + response_ids], device=device)  # [1, P + R]
    with torch.no_grad():
        log_probs = get_response_log_probs(policy, ids[:, :-1], ids[:, 1:])["log_probs"]  # [1, P + R - 1]
    return log_probs[0, len(prompt_ids) - 1 :].float().cpu()  # [R]


def run_layout(layout: str, dtype: str, gpu_memory_utilization: float, sleep_level: int = 1) -> int:
    checks = Checks(layout)
    with tempfile.TemporaryDirectory() as model_dir:
        tokenizer = train_tokenizer(CORPUS, vocab_size=300)
        build_tiny_model(tokenizer, TinyModelSpec(), seed=0).save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)

        # -- start: where does the engine's memory go? ---------------------------------------------------------
        before = [used_gib(index) for index in range(torch.cuda.device_count())]
        start = time.perf_counter()
        config = EngineConfig(
            layout=layout, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, sleep_level=sleep_level
        )
        engine = RolloutEngine(model_dir, config)
        engine_index = 0 if layout == "colocate" else int(config.engine_device.split(":")[1])
        checks.info(f"engine started on cuda:{engine_index} in {time.perf_counter() - start:.1f} s ({dtype})")
        grown = [used_gib(index) - before[index] for index in range(len(before))]
        if layout == "split":
            checks.check(
                grown[engine_index] > 1.0 and grown[0] < 1.0,
                f"engine memory on cuda:{engine_index}: {grown[engine_index]:.1f} GiB, on cuda:0: {grown[0]:.1f} GiB",
            )
            checks.check(torch.cuda.current_device() == 0, "the current CUDA device is the policy's cuda:0 again")
        device = engine.policy_device()
        policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()

        # -- generate ------------------------------------------------------------------------------------------
        lengths = [4, 9, 6]
        samples = engine.generate(PROMPTS, n=4, min_tokens=lengths, max_tokens=lengths, stop=())
        shape = [[len(sample.token_ids) for sample in per_prompt] for per_prompt in samples]
        checks.check(
            shape == [[length] * 4 for length in lengths],
            f"generate: {len(PROMPTS)} prompts x 4 samples, per-prompt lengths honoured",
        )
        first = engine.generate(PROMPTS, n=4, max_tokens=24, seed=11)
        engine.generate(PROMPTS[:1], max_tokens=8)
        np.random.seed(1234)  # vLLM's default GPU model runner seeds requests from numpy: the caller's must not matter
        again = engine.generate(PROMPTS, n=4, max_tokens=24, seed=11)
        same = [[s.token_ids for s in p] for p in first] == [[s.token_ids for s in p] for p in again]
        checks.check(same, "seeded generate repeats its samples (after other calls and another numpy seed)")
        np.random.seed(1234)
        caller_numpy = np.random.get_state()[1].copy()
        engine.generate(PROMPTS, n=2, max_tokens=8)
        engine.generate(PROMPTS, n=2, max_tokens=8, seed=5)
        checks.check(np.array_equal(np.random.get_state()[1], caller_numpy), "generate leaves numpy's state as it was")

        # -- sleep while the policy "trains" (an embedding-only change: the tied-weights trap), wake with it -----
        trained = copy.deepcopy(policy)
        generator = torch.Generator(device=device).manual_seed(0)
        with torch.no_grad():
            weight = trained.model.embed_tokens.weight  # [V, d], tied to lm_head
            weight.add_(0.05 * torch.randn(weight.shape, generator=generator, device=device, dtype=weight.dtype))
        awake, started = used_gib(0), time.perf_counter()
        engine.sleep()
        asleep, slept = used_gib(0), time.perf_counter()
        engine.wake_up(trained)  # the training loops' order: wake the weights, load the policy's, wake the KV cache
        woken, ended = used_gib(0), time.perf_counter()
        if layout == "colocate":
            share = gpu_memory_utilization * torch.cuda.mem_get_info(0)[1] / 2**30
            checks.check(
                awake - asleep > 0.5 * share and woken - asleep > 0.5 * share,
                f"sleep() at level {sleep_level} released {awake - asleep:.1f} GiB of cuda:0 (engine share "
                f"{share:.1f} GiB) in {slept - started:.2f} s, wake_up(policy) took {woken - asleep:.1f} GiB back in "
                f"{ended - slept:.2f} s",
            )
        else:
            checks.check(abs(awake - asleep) < 0.5, "sleep() leaves cuda:0 alone (the engine lives on its own GPU)")

        # -- compare with the HF policy ------------------------------------------------------------------------
        greedy = engine.generate(PROMPTS, temperature=0.0, min_tokens=GREEDY_TOKENS, max_tokens=GREEDY_TOKENS, stop=())
        expected = [hf_greedy(trained, tokenizer, prompt, device) for prompt in PROMPTS]
        got = [per_prompt[0].token_ids for per_prompt in greedy]
        same_prompts = sum(a == b for a, b in zip(got, expected, strict=True))
        same_tokens = sum(x == y for a, b in zip(got, expected, strict=True) for x, y in zip(a, b, strict=True))
        message = (
            f"greedy after sync == HF greedy, {same_prompts}/{len(PROMPTS)} prompts, "
            f"{same_tokens}/{len(PROMPTS) * GREEDY_TOKENS} tokens"
        )
        if dtype == "float32":
            checks.check(same_prompts == len(PROMPTS), message)
        else:
            checks.info(f"info {message} (bfloat16: not required)")
        # No min_tokens: over those tokens the engine's log-probs are of the distribution without EOS.
        sampled = engine.generate(PROMPTS, n=2, max_tokens=32, stop=(), seed=3, return_logprobs=True)
        max_diff = max(
            (hf_log_probs(trained, tokenizer, prompt, sample.token_ids, device) - torch.tensor(sample.logprobs))
            .abs()
            .max()
            .item()
            for prompt, per_prompt in zip(PROMPTS, sampled, strict=True)
            for sample in per_prompt
        )
        checks.check(
            max_diff < LOGPROB_TOLERANCE[dtype], f"sampled-token log-probs after sync: max |engine - HF| {max_diff:.1e}"
        )
        with engine.serving(trained):
            engine.generate(PROMPTS, n=2, max_tokens=8)
        if layout == "colocate":
            checks.check(used_gib(0) < asleep + 0.5, f"a generation phase ends asleep ({used_gib(0):.1f} GiB in use)")
        else:
            checks.check(torch.cuda.current_device() == 0, "the current CUDA device is still cuda:0 after generating")
    checks.info("PASS" if checks.failures == 0 else f"FAIL ({checks.failures} checks)")
    return 1 if checks.failures else 0


def main() -> int:
    args = parse_args()
    if args.layout is None:
        return drive(args)
    return run_layout(args.layout, args.dtype, args.gpu_memory_utilization, args.sleep_level)


if __name__ == "__main__":
    sys.exit(main())

"""Peak memory of response log-probs, forward and backward: ``get_response_log_probs`` against the naive path.

Both peers take a training step's worth of work on the same tiny Qwen2 (``TinyModelSpec`` shape: hidden 128, 2
layers, head_dim 64, tied embeddings, float32) widened to Qwen's vocabulary of 151,936, built here with a fixed seed:

- ``naive``: ``logits = model(input_ids).logits``; ``log_softmax(logits)`` gathered at the labels; the entropy from
  the same ``log_softmax`` under ``no_grad``;
- ``lean``: ``reasonrl.get_response_log_probs(model, input_ids, labels, return_token_entropy=True)`` (chunked output
  layer, logits recomputed in backward; default chunk size unless ``--chunk-size``);

then ``backward()`` of the masked mean log-prob over a right-padded response mask (gradients land in ``.grad``).

Each peer runs in a fresh subprocess, after a short warm-up step (so lazily loaded kernels count for neither), and
reports the peak memory *above* what the process held just before the step (model, inputs, interpreter):
on CPU the kernel's resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``; without that,
``ru_maxrss`` growth, which can only under-report); on CUDA ``torch.cuda.max_memory_allocated``. The subprocesses
save their log-probs, entropies and gradients, which are then compared.

Run: ``python bench/logprob_memory.py`` (about a minute on 2 cores, ~5 GiB at the naive peak). Exit status 1 when the
ratio misses the target or the values disagree. The last line is the headline ratio.
"""

from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from reasonrl import get_response_log_probs, masked_mean
from reasonrl.config import TinyModelSpec
from reasonrl.tiny_model import tiny_qwen2_config

PEERS = ("naive", "lean")
TARGET_RATIO = 1 / 3
LOG_PROB_TOLERANCE = 1e-5  # float32, absolute
ENTROPY_TOLERANCE = 1e-5  # relative to the largest entropy: the two formulas sum 151,936 terms in different orders
GRAD_TOLERANCE = 1e-4  # relative to the parameter's largest gradient entry


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=151_936)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=None, help="lean chunk, in positions (default: library's)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when present)")
    parser.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)  # set in the subprocesses
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def build_model(vocab_size: int, device: torch.device) -> Qwen2ForCausalLM:
    config = tiny_qwen2_config(TinyModelSpec(), vocab_size)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device).train()


def make_batch(vocab_size: int, batch_size: int, seq_len: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Random tokens; responses after a quarter-length prompt, the last row right-padded to 2/3 of its length."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)  # [B, T + 1]
    positions = torch.arange(seq_len)  # [T]
    ends = torch.full((batch_size,), seq_len)
    ends[-1] = 2 * seq_len // 3
    mask = (positions >= seq_len // 4) & (positions.unsqueeze(0) < ends.unsqueeze(1))  # [B, T]
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "response_mask": mask}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def naive_log_probs(model: Qwen2ForCausalLM, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    logits = model(input_ids).logits  # [B, T, V]
    log_softmax = torch.log_softmax(logits, dim=-1)  # [B, T, V]
    with torch.no_grad():
        entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1)  # [B, T]
    return {"log_probs": log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1), "token_entropy": entropy}


def step(model: Qwen2ForCausalLM, batch: dict[str, torch.Tensor], peer: str, chunk_size: int | None):
    if peer == "naive":
        result = naive_log_probs(model, batch["input_ids"], batch["labels"])
    else:
        result = get_response_log_probs(
            model, batch["input_ids"], batch["labels"], return_token_entropy=True, chunk_size=chunk_size
        )
    masked_mean(result["log_probs"], batch["response_mask"]).backward()
    return result


class PeakMemory:
    """Peak bytes above the level at ``start()``: CUDA allocator stats, else the resident-set high-water mark."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "VmHWM (clear_refs reset)"

    def start(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            self.method = "ru_maxrss growth (VmHWM reset unavailable: may under-report)"
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            return
        self.base = _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        if self.method.startswith("ru_maxrss"):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base
        return _status_kib("VmHWM") * 1024 - self.base


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_peer(args: argparse.Namespace) -> None:
    """One peer in this (fresh) process: warm up, measure one step, save what it computed."""
    device = torch.device(args.device)
    model = build_model(args.vocab_size, device)
    step(model, make_batch(args.vocab_size, args.batch_size, 16, device), args.peer, args.chunk_size)  # warm-up
    model.zero_grad(set_to_none=True)
    batch = make_batch(args.vocab_size, args.batch_size, args.seq_len, device)
    meter = PeakMemory(device)
    meter.start()
    started = time.perf_counter()
    result = step(model, batch, args.peer, args.chunk_size)
    peak = meter.peak()
    seconds = time.perf_counter() - started
    grads = {name: param.grad.cpu() for name, param in model.named_parameters() if param.grad is not None}
    outputs = {name: tensor.detach().cpu() for name, tensor in result.items()}
    record = {"peak": peak, "base": meter.base, "seconds": seconds, "method": meter.method, "grads": grads}
    torch.save({**record, **outputs}, args.out)


def main() -> None:
    args = parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.peer:
        run_peer(args)
        return

    with tempfile.TemporaryDirectory() as scratch:
        results = {}
        for peer in PEERS:
            out = Path(scratch) / f"{peer}.pt"
            command = [sys.executable, __file__, "--peer", peer, "--out", str(out), "--device", args.device]
            command += ["--vocab-size", str(args.vocab_size), "--seq-len", str(args.seq_len)]
            command += ["--batch-size", str(args.batch_size)]
            if args.chunk_size is not None:
                command += ["--chunk-size", str(args.chunk_size)]
            subprocess.run(command, check=True)
            results[peer] = torch.load(out)
    naive, lean = results["naive"], results["lean"]

    mib = 2**20
    chunk = args.chunk_size or "default"
    print(
        f"model: tiny Qwen2 (hidden 128, 2 layers, tied), vocab {args.vocab_size}, float32, {args.device}; "
        f"batch {args.batch_size} x seq {args.seq_len}, forward + backward of a masked mean"
    )
    print(f"memory: peak above the pre-step level, {naive['method']}, each peer in a fresh process")
    for peer, result in results.items():
        label = f"lean (chunk {chunk})" if peer == "lean" else "naive"
        print(
            f"{label}: peak {result['peak'] / mib:.1f} MiB above {result['base'] / mib:.1f} MiB held before, "
            f"step {result['seconds']:.1f} s"
        )
    log_prob_diff = (lean["log_probs"] - naive["log_probs"]).abs().max().item()
    entropy_diff = (lean["token_entropy"] - naive["token_entropy"]).abs().max().item()
    assert lean["grads"].keys() == naive["grads"].keys()
    grad_diffs = {
        name: (lean["grads"][name] - grad).abs().max().item() / grad.abs().max().clamp_min(1e-30).item()
        for name, grad in naive["grads"].items()
    }
    worst = max(grad_diffs, key=grad_diffs.get)
    print(f"max |log_probs diff|: {log_prob_diff:.2e} (tolerance {LOG_PROB_TOLERANCE:.0e})")
    entropy_scale = naive["token_entropy"].abs().max().item()
    print(
        f"max |token_entropy diff|: {entropy_diff:.2e} (entropies up to {entropy_scale:.2f} nats; tolerance "
        f"{ENTROPY_TOLERANCE:.0e} of that)"
    )
    print(
        f"max |grad diff| / max |grad| over {len(grad_diffs)} parameters: {grad_diffs[worst]:.2e} ({worst}; "
        f"tolerance {GRAD_TOLERANCE:.0e})"
    )
    ratio = lean["peak"] / naive["peak"]
    print(f"lean_peak_over_naive_peak: {ratio:.2f} (target <= {TARGET_RATIO:.2f})")
    agree = log_prob_diff <= LOG_PROB_TOLERANCE and entropy_diff <= ENTROPY_TOLERANCE * entropy_scale
    sys.exit(0 if ratio <= TARGET_RATIO and agree and grad_diffs[worst] <= GRAD_TOLERANCE else 1)


if __name__ == "__main__":
    main()

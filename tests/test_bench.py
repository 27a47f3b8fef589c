"""The GPU training bench runs on CPU at a small shape, so it cannot rot, and never imports vLLM (a bare GPU
machine has none)."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_train_step_runs_small_on_cpu_without_vllm(tmp_path):
    # A vllm package that refuses to load, ahead of the real one on the path.
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text('raise ImportError("bench/gpu_train_step.py imported vllm")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")])}
    command = [
        sys.executable, str(REPO / "bench/gpu_train_step.py"), "--shape", "small", "--device", "cpu",
        "--peak-tflops", "1", "--responses", "16", "--prompt-tokens", "16", "--response-tokens", "8", "40",
        "--microbatch-tokens", "256", "--old-log-probs-microbatch-tokens", "1024", "--steps", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    measured = [line for line in lines if line.startswith(("grpo step", "old log-probs", "sft step"))]
    assert len(measured) == 12 and all("MFU" in line and "tok/s" in line for line in measured)
    assert lines[-1].startswith("gpu_train_step: GRPO step MFU") and "handout" in lines[-1]
    # LoRA rank 16 on the small shape: adapters of 90k parameters beside 0.6M (1/6.5 of the AdamW state).
    lora_fraction = float(re.search(r"LoRA rank 16 AdamW state ([\d.]+)x", lines[-1]).group(1))
    assert 0.1 < lora_fraction < 0.2

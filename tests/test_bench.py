"""Every bench in ``bench/`` runs its own half here, on CPU at a small shape, so that a rename in the library cannot
break a bench unseen; a peer's half runs too where its packages are installed, and is skipped, with the reason,
where they are not. Nothing here checks a speed: the benches measure that, against their peers in the same run."""

import argparse
import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from reasonrl.config import GRPOConfig
from reasonrl.data import MIRROR_ENV_VAR

REPO = Path(__file__).resolve().parents[1]
TRL_MISSING = "TRL is not installed (bench/grpo_step.py's peer): `make bench-deps` installs it beside the lock"


@functools.cache
def load_bench(name: str):
    """A bench script as a module (its ``main`` is not run), registered as ``bench_<name>`` as an import would be:
    its dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def refusing_package(directory: Path, name: str) -> None:
    """A package ``name`` in ``directory`` that raises ImportError, to put ahead of the real one on the path."""
    (directory / name).mkdir()
    (directory / name / "__init__.py").write_text(f'raise ImportError("the bench imported {name}")\n')


def run_bench(name: str, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """Run ``bench/<name>.py`` as a user does; returns its stdout lines after checking it succeeded."""
    command = [sys.executable, str(REPO / "bench" / f"{name}.py"), *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout.strip().splitlines()


# ---------------------------------------------------------------------------------------------- gpu_train_step.py
GPU_TRAIN_STEP_SMALL = [
    "--shape", "small", "--device", "cpu", "--peak-tflops", "1", "--responses", "16", "--prompt-tokens", "16",
    "--response-tokens", "8", "40", "--microbatch-tokens", "256", "--old-log-probs-microbatch-tokens", "1024",
    "--steps", "1",
]  # fmt: skip


def test_gpu_train_step_runs_small_on_cpu_without_vllm(tmp_path):
    refusing_package(tmp_path, "vllm")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")])}
    lines = run_bench("gpu_train_step", GPU_TRAIN_STEP_SMALL, tmp_path, env)
    measured = [line for line in lines if line.startswith(("grpo step", "old log-probs", "sft step"))]
    assert len(measured) == 12 and all(re.search(r"MFU +\d+\.\d%", line) and "tok/s" in line for line in measured)
    assert lines[-1].startswith("gpu_train_step: GRPO step MFU") and "handout" in lines[-1]
    # LoRA rank 16 on the small shape: adapters of 90k parameters beside 0.6M (1/6.5 of the AdamW state).
    lora_fraction = float(re.search(r"LoRA rank 16 AdamW state ([\d.]+)x", lines[-1]).group(1))
    assert 0.1 < lora_fraction < 0.2


@pytest.mark.parametrize(
    ("device_name", "card", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),
        ("NVIDIA H200", "H200 SXM", 989.5),
        ("NVIDIA H200 141GB HBM3e", "H200 SXM", 989.5),
        ("NVIDIA H200 NVL", "H200 NVL", 835.5),
        ("NVIDIA GH200 480GB", "GH200", 989.5),
        ("NVIDIA H800", "H800 SXM", 989.5),
        ("NVIDIA H800 80GB HBM3", "H800 SXM", 989.5),
        ("NVIDIA H800 PCIe", "H800 PCIe", 756.5),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA A100-SXM4-40GB", "A100", 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
        ("NVIDIA A100 80GB PCIe", "A100", 312.0),
        ("NVIDIA L40S", "L40S", 362.05),
    ],
)
def test_gpu_train_step_peak_by_device_name(device_name, card, tflops):
    assert load_bench("gpu_train_step").known_card(device_name) == (card, tflops)


@pytest.mark.parametrize(
    "device_name",
    ["NVIDIA H100", "NVIDIA H20", "NVIDIA H800 NVL", "NVIDIA GeForce RTX 4090", "NVIDIA B200", "CPU"],
)
def test_gpu_train_step_unknown_boards_get_no_peak(device_name):
    """A board the table cannot tell apart (a bare "H100" could be any of three) or does not list gets no MFU."""
    assert load_bench("gpu_train_step").known_card(device_name) is None


def test_gpu_train_step_reports_no_mfu_without_a_peak(capsys):
    bench = load_bench("gpu_train_step")
    setting = bench.Setting("defaults", "mixed", 2, 8192, 65536)
    assert bench.report("grpo step", setting, 2.0, 1000, 4e12, None, 0.0) is None
    assert bench.report("grpo step", setting, 2.0, 1000, 4e12, 10.0, 0.0) == pytest.approx(0.2)
    without, with_peak = capsys.readouterr().out.splitlines()
    assert "MFU   n/a" in without and "MFU 20.0%" in with_peak


# ---------------------------------------------------------------------------------------------- gpu_layouts.py
def test_gpu_layouts_checks_the_production_engine_dtype(full_scale_params, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_layouts.py"])
    assert load_bench("gpu_layouts").parse_args().dtype == yaml.safe_load(full_scale_params)["rollout"]["dtype"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the driver runs the layouts (bench/gpu_layouts.py)")
def test_gpu_layouts_skips_without_cuda(tmp_path):
    assert run_bench("gpu_layouts", [], tmp_path)[-1].startswith("gpu_layouts: SKIP (CUDA is not available")


def test_gpu_layouts_hf_reference_on_cpu(tiny_model, tiny_tokenizer):
    """The HF side every layout is compared with, against one full-vocabulary ``log_softmax`` of the same tokens:
    greedy picks the argmax (but EOS, held back for ``GREEDY_TOKENS``), and the log-probs are those of the tokens."""
    bench = load_bench("gpu_layouts")
    cpu = torch.device("cpu")
    prompt = bench.PROMPTS[0]
    greedy = bench.hf_greedy(tiny_model, tiny_tokenizer, prompt, cpu)
    assert len(greedy) == bench.GREEDY_TOKENS
    ids = torch.tensor([tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"] + greedy])  # [1, P + R]
    with torch.no_grad():
        log_softmax = torch.log_softmax(tiny_model(ids).logits.float(), dim=-1)[0, -len(greedy) - 1 : -1]  # [R, V]
    chosen = torch.tensor(greedy)  # [R]
    argmax = log_softmax.argmax(dim=-1)  # [R]
    assert ((argmax == chosen) | (argmax == tiny_tokenizer.eos_token_id)).all()
    log_probs = bench.hf_log_probs(tiny_model, tiny_tokenizer, prompt, greedy, cpu)  # [R]
    torch.testing.assert_close(log_probs, log_softmax.gather(-1, chosen[:, None])[:, 0], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- logprob_memory.py
def test_logprob_memory_runs_small_on_cpu(tmp_path):
    """A vocabulary of 32,768 over 2 x 64 positions, chunks of 16: both peers in their subprocesses, values compared.

    The bench's exit status also says whether the memory ratio met its target, which only a full-size shape can: over
    few positions fixed costs (the tied embedding's gradient) weigh on the lean peak. So this checks that it ran to its
    headline and that the peers agree within the tolerances it prints, not its exit status."""
    command = [sys.executable, str(REPO / "bench/logprob_memory.py"), "--device", "cpu", "--vocab-size", "32768"]
    command += ["--seq-len", "64", "--batch-size", "2", "--chunk-size", "16"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr[-3000:]
    output = result.stdout
    assert re.search(r"^naive: peak [\d.]+ MiB", output, re.MULTILINE), output
    assert re.search(r"^lean \(chunk 16\): peak [\d.]+ MiB", output, re.MULTILINE), output
    number = r"([\d.]+(?:e[+-]\d+)?)"
    log_probs = re.search(rf"max \|log_probs diff\|: {number} \(tolerance {number}\)", output)
    entropy = re.search(
        rf"max \|token_entropy diff\|: {number} \(entropies up to {number} nats; tolerance {number}", output
    )
    grads = re.search(
        rf"max \|grad diff\| / max \|grad\| over 26 parameters: {number} \(.*tolerance {number}\)", output
    )
    assert float(log_probs[1]) <= float(log_probs[2])
    assert float(entropy[1]) <= float(entropy[2]) * float(entropy[3])
    assert float(grads[1]) <= float(grads[2])
    assert re.fullmatch(r"lean_peak_over_naive_peak: [\d.]+ \(target <= 0\.33\)", output.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- rollout_throughput.py
@pytest.mark.slow
def test_rollout_throughput_runs_small(tmp_path, gsm8k_mirror):
    env = {**os.environ, MIRROR_ENV_VAR: str(gsm8k_mirror)}
    args = ["--prompts", "4", "--forced-tokens", "8", "--hf-batch-size", "2", "--repeats", "1", "--dtype", "float32"]
    args.append("--enforce-eager")  # torch.compile would take most of this small run
    lines = run_bench("rollout_throughput", [*args, "--threads", "1"], tmp_path, env)
    assert sum(line.startswith(("forced_8: RolloutEngine", "rl_shape: RolloutEngine")) for line in lines) == 2
    assert re.fullmatch(r"forced_8_speedup_vs_hf_generate: [\d.]+x", lines[-2])
    assert re.fullmatch(r"rl_shape_speedup_vs_hf_generate: [\d.]+x", lines[-1])


# ---------------------------------------------------------------------------------------------- grpo_step.py
GRPO_STEP_SMALL = [
    "--questions", "2", "--group-size", "2", "--max-tokens", "8", "--gradient-accumulation-steps", "2",
    "--warmup-steps", "0", "--steps", "1", "--threads", "1", "--enforce-eager",
]  # fmt: skip


@pytest.mark.slow
def test_grpo_step_own_half_runs_small_without_trl(tmp_path, gsm8k_mirror):
    refusing_package(tmp_path, "trl")
    env = {
        **os.environ,
        MIRROR_ENV_VAR: str(gsm8k_mirror),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "src")]),
    }
    lines = run_bench("grpo_step", [*GRPO_STEP_SMALL, "--peers", "reasonrl"], tmp_path, env)
    assert any(line.startswith("reasonrl step 0:") for line in lines)
    assert re.match(r"reasonrl: [\d.]+ s/step \(rollout", lines[-1])
    assert not any("TRL" in line for line in lines)


@pytest.mark.slow
def test_grpo_step_against_trl_runs_small(tmp_path, gsm8k_mirror):
    if importlib.util.find_spec("trl") is None:
        pytest.skip(TRL_MISSING)
    env = {**os.environ, MIRROR_ENV_VAR: str(gsm8k_mirror)}
    lines = run_bench("grpo_step", GRPO_STEP_SMALL, tmp_path, env)
    assert any(line.startswith("TRL step 0:") for line in lines)
    assert any(line.startswith("reasonrl step 0:") for line in lines)
    assert re.fullmatch(r"grpo_step_speedup_vs_trl: [\d.]+x \(target >= 4x\)", lines[-1])


# ---------------------------------------------------------------------------------------------- async_grpo.py
@pytest.mark.slow
def test_async_grpo_own_half_runs_small(tmp_path):
    """The asynchronous peer (the engine's own process, pinned apart from the trainer) at a tiny shape."""
    args = ["--questions", "2", "--group-size", "2", "--max-tokens", "8", "--gradient-accumulation-steps", "2"]
    args += ["--warmup-steps", "1", "--steps", "1", "--peers", "async", "--enforce-eager"]
    lines = run_bench("async_grpo", args, tmp_path)
    assert any(
        re.match(r"async \(max_staleness 1\): [\d.]+ s/step \(rollout [\d.]+, .*engine [\d.]+", line) for line in lines
    )
    assert re.match(r"1\.5B on two GPUs, expected: .* ratio [\d.]+x$", lines[-1])
    assert any(line.startswith("1.5B inputs measured on one H200") for line in lines)
    assert any(line.startswith("1.5B inputs assumed: ") for line in lines)


def test_async_grpos_projection_charges_each_loop_the_passes_its_config_runs():
    """At 1.5B the default loss (reinforce_with_baseline) reads no π_old, and lag 1's correction takes it from the
    update's own forward (one optimizer step per rollout batch): neither loop is charged an old-log-prob pass. A KL
    penalty charges both its reference pass; two epochs would charge a ratio loss the old-log-prob pass."""
    bench = load_bench("async_grpo")
    args = argparse.Namespace(
        gpu_update_seconds=4.0, gpu_fixed_pass_seconds=2.0, gpu_loss_type="reinforce_with_baseline", gpu_kl_coef=0.0,
        gpu_tokens=100_000, engine_tokens_per_second=20_000.0,
    )  # fmt: skip
    lines = bench.projection(args)
    assert lines[-1].endswith("generation 5.0 s, synchronous 9.0 s/step, max_staleness 1 5.0 s/step, ratio 1.80x")
    assert "1.5B synchronous, reinforce_with_baseline: training 4.0 s (update)" in lines
    assert "1.5B max_staleness 1, reinforce_with_baseline: training 4.0 s (update)" in lines
    lines = bench.projection(argparse.Namespace(**{**vars(args), "gpu_loss_type": "grpo_clip", "gpu_kl_coef": 0.04}))
    assert "1.5B max_staleness 1, grpo_clip: training 6.0 s (update + KL reference pass)" in lines
    assert lines[-1].endswith("synchronous 11.0 s/step, max_staleness 1 6.0 s/step, ratio 1.83x")
    two_epochs = GRPOConfig(loss_type="grpo_clip", epochs_per_rollout_batch=2, max_staleness=1, rollout_is_cap=2.0)
    assert bench.fixed_passes(two_epochs) == ["old-log-prob pass"]

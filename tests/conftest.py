"""Shared fixtures: a tiny tokenizer and Qwen2 model built here (the HF hub is unreachable)."""

import os
import subprocess
from pathlib import Path

# Under pytest-xdist (`make test`: two workers) each worker gets its share of the cores, set before torch starts its
# thread pool and inherited by every stage, engine and torchrun it starts: OpenMP threads of two processes on the
# same cores stall at every barrier waiting for a displaced thread, which made kernels many times slower.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))

import pytest  # noqa: E402  (after the thread count: the imports below start torch)

from reasonrl.benchmarks import BENCHMARKS
from reasonrl.benchmarks import MIRROR_ENV_VAR as BENCHMARK_MIRROR_ENV_VAR
from reasonrl.config import DataConfig, TinyModelSpec
from reasonrl.data import MIRROR_ENV_VAR, SPLITS, DataFormatError, download, verify_sha256
from reasonrl.tiny_model import build_tiny_model, train_tokenizer

TOKENIZER_TEXTS = [
    "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether in April and May.",
    "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10.",
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it.",
    "</think> <answer> 72 </answer>",
] * 4


MIRRORED_BENCHMARKS = tuple(name for name in BENCHMARKS if name != "math500" and not BENCHMARKS[name].own_mirror)
"""The benchmarks with a copy in the benchmark mirror: not MATH-500 (its file is a Git LFS object, tested on hand-made
records), not GSM8K (read from GSM8K's mirror)."""


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(TOKENIZER_TEXTS, vocab_size=300, chat=True)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer, TinyModelSpec(), seed=0).eval()


@pytest.fixture(scope="session")
def gsm8k_mirror(request):
    """A directory with GSM8K's train.jsonl and test.jsonl: ``$GSM8K_MIRROR`` if set (CI points it at a local copy),
    else the official files downloaded once into pytest's cache, checksum-verified; offline, the test is skipped."""
    if MIRROR_ENV_VAR in os.environ:
        path = Path(os.environ[MIRROR_ENV_VAR])
        if not (path / "train.jsonl").is_file():
            pytest.fail(f"${MIRROR_ENV_VAR}={path} has no train.jsonl")
        return path
    cache = request.config.cache.mkdir("gsm8k")
    if not all((cache / f"{split}.jsonl").is_file() for split in SPLITS):
        defaults = DataConfig()
        for split in SPLITS:
            location, partial = f"{defaults.url}/{split}.jsonl", cache / f"{split}.jsonl.part"
            try:
                download(location, partial, defaults.max_download_bytes, "is this machine offline?")
            except DataFormatError as error:
                pytest.skip(f"GSM8K not reachable ({error}); set ${MIRROR_ENV_VAR} to a directory with its files")
            verify_sha256(partial, defaults.sha256[split], location, f"data.sha256.{split}")
            partial.replace(cache / f"{split}.jsonl")  # whole files only: a killed download leaves a .part
    return cache


@pytest.fixture(scope="session")
def benchmark_mirror(request):
    """A directory with ``<name>/test.jsonl`` of every benchmark that has an offline copy (all but MATH-500):
    ``$BENCHMARK_MIRROR`` if set (CI points it at a local copy), else the pinned files downloaded once into pytest's
    cache, checksum-verified; offline, the test is skipped."""
    if BENCHMARK_MIRROR_ENV_VAR in os.environ:
        path = Path(os.environ[BENCHMARK_MIRROR_ENV_VAR])
        missing = [name for name in MIRRORED_BENCHMARKS if not (path / name / "test.jsonl").is_file()]
        if missing:
            pytest.fail(f"${BENCHMARK_MIRROR_ENV_VAR}={path} has no {', '.join(missing)} (<name>/test.jsonl)")
        return path
    cache = request.config.cache.mkdir("benchmarks")
    for name in MIRRORED_BENCHMARKS:
        benchmark, final = BENCHMARKS[name], cache / name / "test.jsonl"
        if final.is_file():
            continue
        final.parent.mkdir(exist_ok=True)
        partial = final.with_suffix(".jsonl.part")
        try:
            download(benchmark.url, partial, DataConfig().max_download_bytes, "is this machine offline?")
        except DataFormatError as error:
            pytest.skip(f"benchmark {name} not reachable ({error}); set ${BENCHMARK_MIRROR_ENV_VAR} to a directory")
        verify_sha256(partial, benchmark.sha256, benchmark.url, "its pinned SHA-256", release=f"benchmark {name}")
        partial.replace(final)  # whole files only: a killed download leaves a .part
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer, tiny_model):
    """The tiny model and tokenizer saved in HF format, as vLLM and ``from_pretrained`` load them."""
    path = tmp_path_factory.mktemp("tiny_model")
    tiny_model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def full_scale_params() -> str:
    """The text of params.yaml as committed: the full-scale config. ``make demo`` writes the CPU preset into the
    workspace copy and ``dvc exp run -S`` rewrites it; neither may change what the tests check."""
    repo = Path(__file__).resolve().parents[1]
    shown = subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=repo, capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else (repo / "params.yaml").read_text(encoding="utf-8")


@pytest.fixture
def params_file(tmp_path, full_scale_params):
    """A copy of the committed params.yaml in a temporary directory."""
    path = tmp_path / "params.yaml"
    path.write_text(full_scale_params, encoding="utf-8")
    return path

"""Shared fixtures: a tiny tokenizer and Qwen2 model built here (the HF hub is unreachable)."""

import os
from pathlib import Path

import pytest

from reasonrl.tiny_model import TinyModelSpec, build_tiny_model, train_tokenizer

TOKENIZER_TEXTS = [
    "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether in April and May.",
    "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10.",
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it.",
    "</think> <answer> 72 </answer>",
] * 4


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(TOKENIZER_TEXTS, vocab_size=300)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer, TinyModelSpec(), seed=0).eval()


@pytest.fixture(scope="session")
def gsm8k_mirror():
    """The GSM8K mirror CI provides beside the checkout (GSM8K_MIRROR overrides)."""
    path = Path(os.environ.get("GSM8K_MIRROR", Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"))
    if not (path / "train.jsonl").is_file():
        pytest.skip(f"GSM8K mirror not found at {path}: set GSM8K_MIRROR to a directory with train/test.jsonl")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer, tiny_model):
    """The tiny model and tokenizer saved in HF format, as vLLM and ``from_pretrained`` load them."""
    path = tmp_path_factory.mktemp("tiny_model")
    tiny_model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path

"""prepare_model: the tiny model, a local directory, and a clear error for an unreachable hub id."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl.config import TinyModelSpec
from reasonrl.data import GSM8KExample
from reasonrl.models import ModelSourceError, prepare_base_model

EXAMPLES = [GSM8KExample("Tom has 3 cards and gets 4 more. How many?", "3 + 4 = 7", "7")] * 20


def test_tiny_model_is_built_saved_and_loadable(tmp_path):
    out = tmp_path / "base"
    description = prepare_base_model("tiny", TinyModelSpec(vocab_size=300), 0, EXAMPLES, out)
    assert description.startswith("tiny Qwen2")
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.decode(tokenizer("Tom has 34 cards.")["input_ids"]) == "Tom has 34 cards."
    assert tokenizer.tokenize("34") == ["3", "4"]  # digits one per token


def test_same_seed_same_weights(tmp_path):
    prepare_base_model("tiny", TinyModelSpec(vocab_size=300), 7, EXAMPLES, tmp_path / "a")
    prepare_base_model("tiny", TinyModelSpec(vocab_size=300), 7, EXAMPLES, tmp_path / "b")
    assert (tmp_path / "a/model.safetensors").read_bytes() == (tmp_path / "b/model.safetensors").read_bytes()


def test_local_directory_is_validated_and_copied(tmp_path):
    prepare_base_model("tiny", TinyModelSpec(vocab_size=300), 0, EXAMPLES, tmp_path / "src")
    prepare_base_model(str(tmp_path / "src"), TinyModelSpec(), 0, [], tmp_path / "copy")
    assert json.loads((tmp_path / "copy/config.json").read_text())["model_type"] == "qwen2"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="missing config.json, .*safetensors"):
        prepare_base_model(str(tmp_path / "empty"), TinyModelSpec(), 0, [], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_unreachable_hub_id_says_how_to_supply_a_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="set model.name to that directory"):
        prepare_base_model("Qwen/Qwen2.5-Math-1.5B", TinyModelSpec(), 0, [], tmp_path / "base")
    assert not (tmp_path / "base").exists()

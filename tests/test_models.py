"""prepare_model: the tiny model, a local directory, and a clear error for an unreachable hub id."""

import json
import re
import shutil

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl.config import TINY_MIN_VOCAB, EngineConfig, GRPOConfig, TinyModelSpec, load_params
from reasonrl.data import GSM8KExample
from reasonrl.models import ModelSourceError, load_tokenizer, prepare_base_model, tokenizer_corpus
from reasonrl.tiny_model import TAG_TOKENS, train_tokenizer
from reasonrl.training.policy import start_training

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


def test_the_tiny_tokenizer_carries_chatml_only_for_a_run_with_a_chat_prompt(tmp_path, params_file):
    """The chat tokens shift every id and so the initial weights: a run without a chat prompt gets the tokenizer
    and model it had before chat prompts existed; one with a chat prompt gets ChatML's tokens and template."""
    prepare_base_model("tiny", TinyModelSpec(vocab_size=300), 0, EXAMPLES, tmp_path / "plain")
    prepare_base_model("tiny", TinyModelSpec(vocab_size=300), 0, EXAMPLES, tmp_path / "chat", chat=True)
    plain, chat = (AutoTokenizer.from_pretrained(tmp_path / name) for name in ("plain", "chat"))
    assert plain.chat_template is None and "<|im_start|>" not in plain.get_vocab()
    assert plain.get_vocab() == train_tokenizer(tokenizer_corpus(EXAMPLES), 300).get_vocab()
    assert chat.chat_template and chat.tokenize("<|im_start|>user")[0] == "<|im_start|>"
    assert load_params(params_file).prompt_names == {"r1_zero", "question_only"}
    params_file.write_text(params_file.read_text().replace("  prompt: r1_zero ", "  prompt: r1_zero_chat ", 1))
    assert "r1_zero_chat" in load_params(params_file).prompt_names


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


def truncate(path):
    path.write_bytes(path.read_bytes()[:1000])  # the header's length now points past the end of the file


def link_outside(directory):
    outside = directory.parent / "secret.txt"
    outside.write_text("not a model file")
    (directory / "notes.txt").symlink_to(outside)


@pytest.mark.parametrize(
    ("damage", "culprit", "message"),
    [
        (lambda d: truncate(d / "model.safetensors"), "model.safetensors", "not a valid safetensors file"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 4096), "model.safetensors", "header too large"),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json", "not valid JSON"),
        (lambda d: (d / "config.json").write_text('{"hidden_size": 8}'), "config.json", "with a model_type"),
        (link_outside, "notes.txt", r"a symbolic link \(to .*secret.txt\)"),
    ],
    ids=["truncated-safetensors", "garbage-safetensors", "invalid-config", "config-without-model-type", "link"],
)
def test_broken_model_directory_is_refused_in_one_line_naming_the_file(
    tmp_path, tiny_model_dir, damage, culprit, message
):
    source = tmp_path / "source" / "model"
    shutil.copytree(tiny_model_dir, source)
    damage(source)
    with pytest.raises(ModelSourceError, match=message) as error:
        prepare_base_model(str(source), TinyModelSpec(), 0, [], tmp_path / "out" / "base")
    assert str(error.value).startswith(f"{source / culprit}: ") and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_linked_model_directory_is_refused(tmp_path, tiny_model_dir):
    (tmp_path / "link").symlink_to(tiny_model_dir)
    with pytest.raises(ModelSourceError, match=f"^{tmp_path / 'link'}: a symbolic link"):
        prepare_base_model(str(tmp_path / "link"), TinyModelSpec(), 0, [], tmp_path / "out" / "base")
    assert not (tmp_path / "out").exists()


def test_a_model_directory_without_its_tokenizer_is_refused_before_the_engine_starts(tmp_path, tiny_model_dir):
    """A trained model copied without its tokenizer's files: transformers makes an empty tokenizer from the config
    alone, and the stage stopped at its first generation, inside vLLM, after the engine's start. The training stages
    (start_training) and baseline and filter_cots (load_tokenizer) refuse it first, naming the files and the model."""
    bare = tmp_path / "trained"
    shutil.copytree(tiny_model_dir, bare)
    for file in [*bare.glob("tokenizer*"), bare / "chat_template.jinja"]:
        file.unlink()
    message = (
        rf"^{re.escape(str(bare))}: the model has no tokenizer, none of tokenizer.json, tokenizer.model, vocab.json"
    )
    engine = EngineConfig(cpu_kv_cache_gib=1, max_model_len=1024, enforce_eager=True)
    with pytest.raises(ModelSourceError, match=message):
        start_training(bare, GRPOConfig(), "grpo", engine)
    with pytest.raises(ModelSourceError, match=message):
        load_tokenizer(bare)
    assert len(load_tokenizer(tiny_model_dir)) == len(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_tiny_vocabulary_floor_is_what_the_tokenizer_holds_at_least():
    texts = [f"{e.question} {e.reasoning}" for e in EXAMPLES]
    smallest = len(train_tokenizer(texts, TINY_MIN_VOCAB))
    assert smallest == TINY_MIN_VOCAB + len(TAG_TOKENS)
    assert len(train_tokenizer(texts, 1)) == smallest  # below the floor the size is ignored: params refuse it
    assert len(train_tokenizer(texts, TINY_MIN_VOCAB + 1)) == smallest + 1

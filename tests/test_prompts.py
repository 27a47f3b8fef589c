"""Prompt templates: plain ones filled in, chat ones rendered through the tokenizer's chat template, the same text
wherever a prompt is formatted, and a chat prompt refused, naming the param and the model, for a tokenizer that has
no chat template."""

import shutil
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from reasonrl.config import GRPOConfig, SFTConfig, from_dict
from reasonrl.cot_filter import make_sft_pairs
from reasonrl.data import GSM8KExample
from reasonrl.errors import ConfigError
from reasonrl.prompts import REWARD_FNS, PromptError, check_prompt, load_prompt, parse_prompt
from reasonrl.training.policy import start_training

QUESTION = "Tom has {x} = 3 apples and buys 4 more. How many?"


def test_r1_zero_chat_is_r1_zero_split_into_the_system_and_user_turns(tiny_tokenizer):
    instructions = load_prompt("r1_zero").text.partition("\nUser:")[0]
    prompt = load_prompt("r1_zero_chat")
    assert (
        prompt.is_chat and prompt.assistant_prefix == "<think>" and REWARD_FNS["r1_zero_chat"] is REWARD_FNS["r1_zero"]
    )
    messages = [{"role": "system", "content": instructions}, {"role": "user", "content": QUESTION}]
    rendered = prompt.render(QUESTION, tiny_tokenizer)
    assert (
        rendered == tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
    )
    assert rendered == (
        f"<|im_start|>system\n{instructions}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    )  # ChatML, as Qwen2.5's instruct models write it
    ids = tiny_tokenizer(rendered)["input_ids"]
    assert ids.count(tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # one special token each


def test_worked_example_turns_go_to_the_template_and_the_last_user_turn_holds_the_question():
    text = "[user]\nWhat is 1+1?\n[assistant]\n2\n\n[user]\n{question}\n[assistant]\nAnswer:"
    prompt = parse_prompt("few_shot", text, "few_shot.prompt")
    assert prompt.turns == (("user", "What is 1+1?"), ("assistant", "2"), ("user", "{question}"))
    assert prompt.assistant_prefix == "Answer:"
    assert prompt.messages("q")[-1] == {"role": "user", "content": "q"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[system]\nhi\n[tool]\n{question}", r"x.prompt:3: unknown turn \[tool\]"),
        ("[system]\n\n[user]\n{question}", r"x.prompt:1: the \[system\] turn is empty"),
        ("[system]\n{question}\n[assistant]\n<think>", r"x.prompt: a chat prompt needs a \[user\] turn"),
        ("[user]\nno placeholder", r"x.prompt:1: \{question\} must stand once, in the last \[user\] turn"),
        ("[system]\n{question}\n[user]\n{question}", r"x.prompt:1: \{question\} must stand only in the last"),
        ("[user]\n{question}\n[assistant]\n{question}", r"x.prompt:3: \{question\} must stand only in the last"),
    ],
)
def test_a_malformed_chat_prompt_names_the_file_and_line(text, message):
    with pytest.raises(PromptError, match=f"^{message}"):
        parse_prompt("x", text, "x.prompt")


def test_a_plain_prompt_is_its_text_filled_in():
    assert parse_prompt("p", "[not a header] {question}", "p.prompt").render("q", tokenizer=None) == "[not a header] q"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"x.prompt: a plain template needs \{question\} once, where the question goes; it has none"),
        ("User: {questions}\nAssistant:", r"x.prompt:1: \{questions\} is no placeholder; the one placeholder is"),
        ("Q: { question }", r"x.prompt:1: \{ question \} is no placeholder"),
        ("no placeholder\nat all", r"x.prompt: a plain template needs \{question\} once"),
        ("{question}\nand again:\n{question}", r"x.prompt:3: \{question\} must stand once in a plain template"),
        ("[user]\n{question}\n[assistant]\n{answer}", r"x.prompt:4: \{answer\} is no placeholder"),
        ("[ system ]\nhi\n[user]\n{question}", r"x.prompt:1: '\[ system \]' looks like a turn header but is not"),
        ("\n[system] Solve it.\n[user]\n{question}", r"x.prompt:2: '\[system\] Solve it.' looks like a turn header"),
        ("[system]\nhi\n[ user]\n{question}", r"x.prompt:3: '\[ user\]' looks like a turn header"),
    ],
)
def test_a_template_that_would_mislead_the_model_names_the_file_and_line(text, message):
    """A template that renders the same prompt for every question, or sends a would-be header to the model as text."""
    with pytest.raises(PromptError, match=f"^{message}"):
        parse_prompt("x", text, "x.prompt")


@pytest.mark.parametrize(
    "text",
    [
        "\ufeff[system]\nhi\n[user]\n{question}",  # a UTF-8 byte order mark, as some editors write one
        "\n\n[system]\nhi\n[user]\n{question}",
        "[system] \nhi\n[user]\t\n{question}\n",
    ],
)
def test_a_chat_prompt_is_read_whatever_its_bom_blank_lines_and_trailing_spaces(text, tiny_tokenizer):
    prompt = parse_prompt("x", text, "x.prompt")
    assert prompt.turns == (("system", "hi"), ("user", "{question}"))
    assert "[system]" not in prompt.render("q", tiny_tokenizer)


def test_a_plain_template_keeps_other_braces_and_loses_its_bom():
    text = '\ufeffSolve {question}; answer in \\boxed{answer}; JSON: {"a": 1}, set {}.'
    prompt = parse_prompt("p", text, "p.prompt")
    assert prompt.render("q", tokenizer=None) == 'Solve q; answer in \\boxed{answer}; JSON: {"a": 1}, set {}.'


@pytest.mark.parametrize("name", ["r1_zero", "question_only", "r1_zero_chat"])
def test_a_bad_template_file_is_named_before_any_model_loads(name, tmp_path, monkeypatch, no_template_dir):
    """A user's template (a file in the prompts package) is checked where every stage first reads its prompt: the
    training stages' start, before the engine or the policy loads; the error names the file."""
    import reasonrl.prompts

    (tmp_path / f"{name}.prompt").write_text("User: {questions}\nAssistant:", encoding="utf-8")
    monkeypatch.setattr(reasonrl.prompts, "resources", SimpleNamespace(files=lambda package: tmp_path))
    with pytest.raises(PromptError, match=f"^{tmp_path / name}.prompt:1: \\{{questions\\}} is no placeholder"):
        start_training(no_template_dir, GRPOConfig(prompt=name), "grpo", rollout=None)


@pytest.fixture(scope="module")
def no_template_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a tokenizer that has no chat template (as many base models' tokenizers)."""
    path = tmp_path_factory.mktemp("no_template") / "base"
    shutil.copytree(tiny_model_dir, path)
    (path / "chat_template.jinja").unlink()
    assert AutoTokenizer.from_pretrained(path).chat_template is None
    return path


def test_a_chat_prompt_needs_a_tokenizer_with_a_chat_template(no_template_dir, tiny_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(no_template_dir)
    with pytest.raises(
        PromptError,
        match=f"^ei.prompt: r1_zero_chat is a chat prompt, .* but the tokenizer of {no_template_dir} has none",
    ):
        check_prompt("r1_zero_chat", "ei.prompt", tokenizer, no_template_dir)
    check_prompt("r1_zero", "ei.prompt", tokenizer, no_template_dir)  # a plain prompt needs none
    check_prompt("r1_zero_chat", "ei.prompt", tiny_tokenizer, "tiny")


def test_a_training_stage_refuses_a_chat_prompt_before_any_model_loads(no_template_dir):
    with pytest.raises(PromptError, match=f"^grpo.prompt: r1_zero_chat .* {no_template_dir} has none"):
        start_training(no_template_dir, GRPOConfig(prompt="r1_zero_chat"), "grpo", rollout=None)


def test_sft_pairs_carry_the_rendered_chat_prompt(tiny_tokenizer):
    (pair,) = make_sft_pairs([GSM8KExample(QUESTION, "3 + 4 = <<3+4=7>>7", "7")], "r1_zero_chat", tiny_tokenizer)
    assert pair.prompt == load_prompt("r1_zero_chat").render(QUESTION, tiny_tokenizer)
    assert pair.prompt.startswith("<|im_start|>system\n") and pair.drop_reason is None


def test_sft_prompt_must_answer_in_r1_zero_form():
    assert from_dict(SFTConfig, {"prompt": "r1_zero_chat"}, "sft").prompt == "r1_zero_chat"
    with pytest.raises(ConfigError, match="^sft.prompt: the SFT responses take r1_zero's answer form"):
        from_dict(SFTConfig, {"prompt": "question_only"}, "sft")

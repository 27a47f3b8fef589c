"""final_eval's model list: NAME=DIRECTORY pairs of loadable models that share one tokenizer."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "stages"))
from final_eval import parse_models, parse_prompts  # noqa: E402

from reasonrl.config import ConfigError  # noqa: E402
from reasonrl.models import ModelSourceError  # noqa: E402


def test_models_keep_their_order(tiny_model_dir):
    models = parse_models([f"sft={tiny_model_dir}", f"base={tiny_model_dir}"])
    assert list(models) == ["sft", "base"] and models["base"] == tiny_model_dir


@pytest.mark.parametrize("spec", ["base", "=models/base", "base=", "grpo=x=y"])
def test_malformed_or_missing_model_is_an_error_naming_it(spec):
    with pytest.raises((ConfigError, ModelSourceError), match="base|grpo|x=y"):
        parse_models([spec])


def test_a_name_given_twice_is_an_error(tiny_model_dir):
    with pytest.raises(ConfigError, match="expected a new NAME=DIRECTORY"):
        parse_models([f"base={tiny_model_dir}", f"base={tiny_model_dir}"])


def test_a_tokenizer_saved_again_is_the_same_vocabulary(tiny_model_dir, tmp_path):
    resaved = tmp_path / "resaved"
    shutil.copytree(tiny_model_dir, resaved)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(resaved)  # as the sft/ei/grpo stages save it
    assert list(parse_models([f"base={tiny_model_dir}", f"sft={resaved}"])) == ["base", "sft"]


def test_models_with_different_vocabularies_are_refused(tiny_model_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace("<think>", "<thinking>"))
    with pytest.raises(ConfigError, match=f"grpo={other}: its vocabulary differs"):
        parse_models([f"base={tiny_model_dir}", f"grpo={other}"])


def test_each_model_gets_its_training_prompt_and_r1_zero_by_default(tiny_model_dir):
    models = {"base": tiny_model_dir, "grpo": tiny_model_dir}
    assert parse_prompts(["grpo=question_only"], models) == {"base": "r1_zero", "grpo": "question_only"}
    assert parse_prompts([], models) == {"base": "r1_zero", "grpo": "r1_zero"}


@pytest.mark.parametrize(
    ("spec", "message"), [("grpo=tagged", "unknown prompt 'tagged'"), ("ppo=r1_zero", "NAME one of"), ("grpo", "NAME")]
)
def test_a_bad_prompt_spec_is_an_error_naming_it(tiny_model_dir, spec, message):
    with pytest.raises(ConfigError, match=f"--prompt '{spec}'.*{message}"):
        parse_prompts([spec], {"base": tiny_model_dir, "grpo": tiny_model_dir})


def test_stage_reports_bad_model_before_loading_anything(tmp_path, params_file):
    result = subprocess.run(
        [sys.executable, str(REPO / "stages/final_eval.py"), "--params", str(params_file),
         "--data", str(tmp_path), "--model", f"base={tmp_path / 'missing'}",
         "--metrics", str(tmp_path / "m.json"), "--generations", str(tmp_path / "g")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"error: {tmp_path / 'missing'}: not a Hugging Face model directory" in result.stderr
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "g").exists()

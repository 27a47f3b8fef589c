"""The model card a training stage saves beside its model (issue 23, item 7): its fields, a directory with it still
loads (``from_pretrained``, ``validate_model_dir``, vLLM), and the model's digest ignores it."""

import hashlib
import html
import subprocess

import pytest
import torch
from transformers import AutoModelForCausalLM

from reasonrl.config import EngineConfig, Params, from_dict, load_params
from reasonrl.model_card import changed_params, git_commit, render_card, route_sections
from reasonrl.models import MODEL_CARD, model_digest, validate_model_dir
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.policy import save_policy

CHANGED = {
    "model": {"name": "tiny"},
    "sft": {"learning_rate": 3.0e-4, "lr_schedule": "cosine"},
    "ei": {"n_steps": 2},  # not on the GRPO model's route: no row for it
    "grpo": {"init_model": "sft", "n_grpo_steps": 20},
}


def best_of(accuracy: float, step: int) -> BestCheckpoint:
    best = BestCheckpoint()
    best.accuracy, best.step = accuracy, step
    best.interval = {"low": 0.1234, "high": 0.4321, "method": "wilson", "effective_n": 40.0}
    return best


@pytest.fixture
def repository(tmp_path):
    """A git repository with one commit, as a stage (or a queued DVC experiment's copy) runs in."""
    repo = tmp_path / "repo"
    repo.mkdir()
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "params.yaml").write_text("{}\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", *identity, "commit", "-qm", "run"], cwd=repo, check=True)
    return repo


def test_a_saved_model_has_a_card_with_its_route_params_accuracy_data_and_commit(
    tiny_model, tiny_tokenizer, tmp_path, repository
):
    params = from_dict(Params, CHANGED)
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text('{"question": "1+1?", "answer": "2"}\n')
    val.write_text('{"question": "2+2?", "answer": "4"}\n')
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True).stdout
    card = render_card(params, "grpo", "the best step", best_of(0.25, 6), "step", [train, val], git_commit(repository))
    out = tmp_path / "grpo_best"
    save_policy(tiny_model, tiny_tokenizer, out, card=card)

    saved = (out / MODEL_CARD).read_text(encoding="utf-8")
    assert saved == card
    assert "- **Base model:** `tiny`" in saved
    assert "- **Route:** base → sft → grpo" in saved
    assert "- **Best validation accuracy:** 0.2500 (95% interval [0.1234, 0.4321], wilson) at step 6" in saved
    assert "`final_eval` stage measures it later" in saved  # the test accuracy: not known at save time
    assert f"- **Git commit:** `{commit.strip()}`" in saved and len(commit.strip()) == 40
    for row in (
        "| `model.name` | `'tiny'` | `'Qwen/Qwen2.5-Math-1.5B'` |",
        "| `sft.lr_schedule` | `'cosine'` | `'constant'` |",
        "| `sft.learning_rate` | `0.0003` | `2e-05` |",
        "| `grpo.init_model` | `'sft'` | `'base'` |",
        "| `grpo.n_grpo_steps` | `20` | `200` |",
    ):
        assert row in saved
    assert "ei.n_steps" not in saved and "grpo.learning_rate" not in saved  # off the route; unchanged
    for path in (train, val):
        assert f"| `{path.as_posix()}` | `{hashlib.sha256(path.read_bytes()).hexdigest()}` |" in saved

    # Still a model directory every loader takes, with the same weights.
    validate_model_dir(out)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_the_model_digest_leaves_the_card_out(tiny_model, tiny_tokenizer, tmp_path):
    """A card names the commit: the init model's digest (GRPO's resume fingerprint) must not change with it, and
    must still change with the weights."""
    carded, plain = tmp_path / "carded", tmp_path / "plain"
    save_policy(tiny_model, tiny_tokenizer, carded, card="commit aaaa\n")
    save_policy(tiny_model, tiny_tokenizer, plain)
    digest = model_digest(carded)
    assert digest == model_digest(plain)
    (carded / MODEL_CARD).write_text("commit bbbb\n")
    assert model_digest(carded) == digest
    (carded / "config.json").write_text((carded / "config.json").read_text() + " ")
    assert model_digest(carded) != digest


def test_the_commit_is_unknown_outside_a_repository(tmp_path):
    assert git_commit(tmp_path) == "unknown"


def test_params_on_the_route_only_and_none_changed():
    params = Params()
    assert route_sections(params, "grpo") == ["grpo"]
    assert route_sections(from_dict(Params, {"ei": {"init_model": "sft"}, "grpo": {"init_model": "ei"}}), "grpo") == [
        "grpo",
        "ei",
        "sft",
    ]
    assert changed_params(params, ["data", "model", "sft", "grpo"]) == []
    card = render_card(params, "sft", "the best step", BestCheckpoint(), "step", [], "unknown")
    assert "## Params that differ from the defaults\n\nNone.\n" in card
    assert "- **Best validation accuracy:** no validation evaluation" in card
    shaped = from_dict(Params, {"grpo": {"overlong_penalty": {"buffer": 64, "max_penalty": 0.5}}})
    assert changed_params(shaped, ["grpo"]) == [
        ("grpo.overlong_penalty.buffer", 64, None),
        ("grpo.overlong_penalty.max_penalty", 0.5, None),
    ]


def test_params_with_markup_stay_text_in_the_card(tmp_path):
    """Values ``load_params`` accepts, with backticks, table pipes and HTML, stay text in the card as a CommonMark
    renderer with GFM tables shows it: each value one code span in its own cell, no tag."""
    from markdown_it import MarkdownIt  # CommonMark with tables; installed with dvc (through rich)

    payload = "x`<img src=x onerror=alert(1)>` | injected | cell |"
    name = "org/m`x|<b>y"
    (tmp_path / "params.yaml").write_text(
        f'model:\n  name: "{name}"\neval:\n  stop: ["</answer>", "{payload}"]\n', encoding="utf-8"
    )
    params = load_params(tmp_path / "params.yaml")
    data = tmp_path / "a`b|c.jsonl"
    data.write_text("{}\n")
    card = render_card(params, "sft", "the best step", BestCheckpoint(), "step", [data], "unknown")
    shown = MarkdownIt("commonmark").enable("table").render(card).replace("&#x27;", "'")

    def row(*cells: str) -> str:
        return "<tr>\n" + "".join(f"<td><code>{html.escape(cell, quote=False)}</code></td>\n" for cell in cells)

    assert row("model.name", repr(name), repr("Qwen/Qwen2.5-Math-1.5B")) + "</tr>" in shown
    assert row("eval.stop", repr(["</answer>", payload]), repr(["</answer>"])) + "</tr>" in shown
    assert row(data.as_posix(), hashlib.sha256(data.read_bytes()).hexdigest()) + "</tr>" in shown
    assert f"<strong>Base model:</strong> <code>{html.escape(name, quote=False)}</code>" in shown
    assert "<img" not in shown and "<b>" not in shown and "injected</td>" not in shown


@pytest.mark.slow
def test_vllm_loads_a_model_directory_with_a_card(tiny_model, tiny_tokenizer, tmp_path):
    from reasonrl.rollouts.engine import RolloutEngine

    out = tmp_path / "model"
    save_policy(
        tiny_model, tiny_tokenizer, out, card=render_card(Params(), "sft", "x", BestCheckpoint(), "step", [], "u")
    )
    engine = RolloutEngine(out, EngineConfig(cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True))
    (group,) = engine.generate(["1+1="], n=1, temperature=0.0, max_tokens=4, stop=[])
    assert len(group) == 1 and group[0].length >= 1

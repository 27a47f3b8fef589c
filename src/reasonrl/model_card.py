"""The model card (``README.md``) a training stage saves beside its model, in the form the Hugging Face hub reads:
YAML front matter (base model, datasets, library, license, tags, pipeline tag), then what the model is, the prompt
it needs, how to run it with transformers and with vLLM, the params it was trained with, its data and the library
versions.

It records the git commit, which changes with every commit; :func:`reasonrl.models.model_digest` leaves the card out,
so a GRPO checkpoint made from a model stays resumable when only its card differs.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from reasonrl.config import ConfigError, Params, flat_dict, from_dict, parse_yaml
from reasonrl.data import file_sha256
from reasonrl.markdown import code, longest_backticks, md_inline
from reasonrl.models import MODEL_CARD, TINY
from reasonrl.prompts import PLACEHOLDER, Prompt, load_prompt
from reasonrl.repository import git_commit
from reasonrl.routes import ROUTE, evaluation_prompt, start_model
from reasonrl.synthetic import arithmetic_problem
from reasonrl.training import checkpoints

if TYPE_CHECKING:
    from reasonrl.training.best import BestCheckpoint

REPOSITORY_LICENSE = "mit"
"""The hub's identifier of this repository's license (``LICENSE``: the MIT License): a model's card states it when
the base model's own card names none, as for the tiny model the pipeline builds."""
LICENSE_KEYS = ("license", "license_name", "license_link")
"""The front-matter keys that state a license (``license: other`` comes with a name and a link)."""
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""A Hugging Face hub repository id, ``owner/name`` or a bare ``name``."""
METHOD_TAGS = {"sft": "sft", "ei": "expert-iteration", "grpo": "grpo"}
"""Each trained route's tag on the hub."""
GSM8K_DATASET = "openai/gsm8k"
GSM8K_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
    "did Natalia sell altogether in April and May?"
)
"""GSM8K's first train question: the usage snippets' example on GSM8K."""
OWN_DATA_QUESTION = "Tom has 3 apples and buys 4 more. How many apples does Tom have now?"
SFT_PAIRS = {
    "filtered": "SFT pairs: train questions with the reference reasoning the reward verifies (sft.dataset: filtered)",
    "full": "SFT pairs: every train question with its reference reasoning (sft.dataset: full)",
}
"""What each ``sft.dataset`` holds, as a card names it."""
TRAIN_SPLIT, VALIDATION_SPLIT = "the train split", "the validation split"
MODEL_PLACEHOLDER = "path/to/this/model"
"""What the usage snippets load: this directory, or the hub id it is uploaded as."""


@dataclass(frozen=True)
class DataFile:
    """A file a model was trained or selected on, and what it holds in words ("the validation split")."""

    path: Path
    holds: str


@dataclass(frozen=True)
class Provenance:
    """What every card of a stage's run shares, gathered once as it starts (:func:`gather_provenance`)."""

    commit: str
    """``git rev-parse HEAD`` where the stage ran, or ``unknown``."""
    committed: Params | None
    """The params file as committed at HEAD, which the card's params are compared with; None where there is none."""
    uncommitted: str
    """Why ``committed`` is None (the card then lists every param); empty otherwise."""
    start_license: dict[str, str]
    """The license keys of the start model's own card (a hub model's, or the card of the route it starts from);
    empty where it names none."""
    data_files: tuple[DataFile, ...]
    versions: dict[str, str]
    """Library → version (:func:`library_versions`)."""


def gather_provenance(params_file: str | Path, start_model_dir: str | Path, data_files: list[DataFile]) -> Provenance:
    """The commit and the committed params (of the repository ``params_file`` is in), the start model's license and
    the library versions, for the cards of a stage that reads ``params_file`` and trains the model in
    ``start_model_dir`` on ``data_files``."""
    committed, uncommitted = committed_params(Path(params_file))
    return Provenance(
        git_commit(Path(params_file).parent),
        committed,
        uncommitted,
        card_license(Path(start_model_dir) / MODEL_CARD),
        tuple(data_files),
        library_versions(),
    )


def committed_params(params_file: Path) -> tuple[Params | None, str]:
    """``params_file`` as committed at HEAD of the repository it is in (a DVC experiment, ``dvc exp run -S`` and the
    demo's preset change the working copy only), validated: ``(params, "")``, or ``(None, why not)``."""
    try:
        shown = subprocess.run(
            ["git", "show", f"HEAD:./{params_file.name}"],
            cwd=params_file.parent,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None, "git is not installed"
    if shown.returncode != 0:
        return None, f"{params_file} is not committed in a git repository"
    invalid = f"{params_file} as committed at HEAD is not valid params"
    try:
        raw = parse_yaml(shown.stdout)
        if not isinstance(raw, dict):
            return None, f"{invalid} (not a mapping of parameter sections)"
        return from_dict(Params, raw), ""
    except (yaml.YAMLError, ConfigError) as error:
        return None, f"{invalid} ({error})"


def front_matter(card: str) -> dict[str, Any]:
    """A card's YAML front matter (between a first line ``---`` and the next); empty where it has none or it is not
    a YAML mapping."""
    lines = card.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    end = next((index for index, line in enumerate(lines[1:], start=1) if line.strip() == "---"), None)
    if end is None:
        return {}
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def card_license(card: Path) -> dict[str, str]:
    """The license keys of the card at ``card`` (a model directory's ``README.md``); empty where there is none."""
    if not card.is_file():
        return {}
    meta = front_matter(card.read_text(encoding="utf-8", errors="replace"))
    if not isinstance(meta.get("license"), str):
        return {}
    return {key: meta[key] for key in LICENSE_KEYS if isinstance(meta.get(key), str)}


def library_versions() -> dict[str, str]:
    """Python's version, those of the libraries that compute a run's numbers (torch, transformers, vLLM ...: what a
    checkpoint's fingerprint holds) and reasonrl's."""
    versions = {"python": platform.python_version(), **checkpoints.library_versions()}
    try:
        return versions | {"reasonrl": importlib.metadata.version("reasonrl")}
    except importlib.metadata.PackageNotFoundError:
        return versions | {"reasonrl": "not installed (the source tree only)"}


def route_sections(params: Params, route: str) -> list[str]:
    """The params sections that shaped a model of trained ``route``: its own, then those of the model it started
    from."""
    start = start_model(params, route)
    return [route] + ([] if start == "base" else route_sections(params, start))


def _flatten(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    flat = {}
    for key, value in values.items():
        name = f"{prefix}.{key}"
        flat |= _flatten(value, name) if isinstance(value, dict) else {name: value}
    return flat


def section_params(params: Params, section: str) -> dict[str, Any]:
    """Dotted name → value of each param of ``section``."""
    return _flatten(flat_dict(getattr(params, section)), section)


def changed_params(params: Params, committed: Params, sections: list[str]) -> list[tuple[str, Any, Any]]:
    """``(dotted name, value, committed value)`` of each param of ``sections`` that differs from ``committed``; a
    mapping set where the committed value is null (``grpo.overlong_penalty``) by its keys, each committed as None."""
    changed = []
    for section in sections:
        before = section_params(committed, section)
        changed += [(name, value, before.get(name)) for name, value in section_params(params, section).items()]
    return [(name, value, before) for name, value, before in changed if value != before]


def yaml_value(value: Any) -> str:
    """``value`` as one line of YAML, as params.yaml writes it (``tiny``, ``null``, ``2.0e-05``, ``[</answer>]``);
    JSON, which YAML reads too, for text that spans lines."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True, sort_keys=False)
    text = text.removesuffix("\n").removesuffix("\n...")
    return text if "\n" not in text else json.dumps(value, ensure_ascii=False)


def hub_base_model(params: Params) -> str | None:
    """``model.name`` where it is a hub id (what the pipeline downloaded), None for the tiny model it builds or a
    local directory."""
    name = params.model.name
    if name == TINY or Path(name).expanduser().exists() or not HUB_ID.fullmatch(name):
        return None
    return name


def card_metadata(params: Params, route: str, license_keys: dict[str, str]) -> dict[str, Any]:
    """The card's front matter: the keys the hub reads."""
    meta: dict[str, Any] = {}
    base = hub_base_model(params)
    if base is not None:
        meta |= {"base_model": base, "base_model_relation": "finetune"}
    if params.data.name == "gsm8k":
        meta["datasets"] = [GSM8K_DATASET]
    meta |= {"library_name": "transformers", **(license_keys or {"license": REPOSITORY_LICENSE})}
    data_tag = {"gsm8k": ["gsm8k"], "arithmetic": ["arithmetic"]}.get(params.data.name, [])
    methods = [METHOD_TAGS[section] for section in reversed(route_sections(params, route))]
    meta |= {"pipeline_tag": "text-generation", "tags": ["reasonrl", *methods, "math", *data_tag]}
    return meta


def render_front_matter(meta: dict[str, Any]) -> str:
    dumped = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, default_flow_style=False, width=math.inf)
    return f"---\n{dumped}---\n"


def base_model_text(params: Params) -> str:
    name = params.model.name
    if hub_base_model(params) is not None:
        return f"{code(name)} ([on the Hugging Face hub](https://huggingface.co/{name}))"
    if name == TINY:
        return (
            f"the tiny Qwen2 model the pipeline builds ({code('model.name: tiny')}): randomly initialised (seed "
            f"{params.model.seed}), its tokenizer trained on the task's text; no hub model"
        )
    return f"the local model directory {code(name)}"


DATA_LABELS = {
    "gsm8k": f"GSM8K ({GSM8K_DATASET})",
    "arithmetic": "synthetic arithmetic word problems that reasonrl generates (not GSM8K)",
    "jsonl": "the run's own problems (data.jsonl)",
}
"""Each ``data.name`` in a few words; :func:`data_text` says more."""
DATA_SHORT = {"gsm8k": "GSM8K", "arithmetic": "synthetic arithmetic", "jsonl": "own problems"}
"""Each ``data.name`` as the data table's rows name it."""


def data_text(params: Params) -> str:
    """What the run trained on, named by what it is, in Markdown (the one value in it, a path, as a code span)."""
    data, held_out = params.data, f"less {params.data.val_size} questions held out for validation"
    if data.name == "gsm8k":
        return f"GSM8K's train split ([{GSM8K_DATASET}](https://huggingface.co/datasets/{GSM8K_DATASET})), {held_out}"
    if data.name == "arithmetic":
        arithmetic = data.arithmetic
        return (
            f"synthetic arithmetic word problems that reasonrl generates ({code('reasonrl.synthetic')}, in GSM8K's "
            f"format; neither GSM8K nor a hub dataset): {arithmetic.train_size} problems of 1 to "
            f"{arithmetic.max_steps} operations (+, −, ×) on numbers up to {arithmetic.max_value}, seed "
            f"{arithmetic.seed}, {held_out}"
        )
    return (
        f"the run's own problems, {code(str(data.jsonl.train.path))} (converted to GSM8K's format; not a hub "
        f"dataset), {held_out}"
    )


def license_text(license_keys: dict[str, str], start: str) -> str:
    if license_keys:
        return f"{code(license_keys['license'])}, as the card of the model it was trained from ({start}) states"
    return (
        f"{code(REPOSITORY_LICENSE)}, the reasonrl repository's ({code('LICENSE')}): the model it was trained from "
        f"({start}) has no card naming one"
    )


def validation_line(best: BestCheckpoint, unit: str) -> str:
    """The best validation accuracy, its 95% interval where the evaluation gave one, and when it was reached."""
    if best.step is None:
        return "no validation evaluation"
    line = f"{best.accuracy:.4f}"
    if best.interval is not None:
        interval = best.interval
        line += f" (95% interval [{interval['low']:.4f}, {interval['high']:.4f}], {interval['method']})"
    return f"{line} at {unit} {best.step}"


def _row(*cells: str) -> str:
    """A table row of code spans, escaped as the report escapes its tables (a param value may hold any text)."""
    return "| " + " | ".join(md_inline(code(cell), in_table=True) for cell in cells) + " |"


def _fenced(text: str, language: str) -> list[str]:
    """``text`` as a fenced code block, whatever backticks it holds."""
    fence = "`" * max(3, longest_backticks(text) + 1)
    return [f"{fence}{language}", text.rstrip("\n"), fence]


ANSWER_FORMATS = {
    "r1_zero": (
        "The model continues after `<think>` with its reasoning, then `</think> <answer> N </answer>`; generation "
        "stops at `</answer>`, which stays in the text. The answer is what the answer block holds."
    ),
    "question_only": "The model answers in free text; the answer is its last `\\boxed{…}`, else its last number.",
}
ANSWER_FORMATS["r1_zero_chat"] = ANSWER_FORMATS["r1_zero"]
"""How a model trained on each prompt answers, and where its answer stands."""
ANSWER_CODE = {
    "r1_zero": [
        "def answer_of(response):",
        '    match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)',
        "    return match.group(1).strip() if match else None",
    ],
    "question_only": [
        r"def answer_of(response):  # the last \boxed{...}, else the last number",
        r'    boxed = re.findall(r"\\boxed\{([^{}]*)\}", response)',
        r'    found = boxed or re.findall(r"-?\d[\d,]*(?:\.\d+)?", response)',
        "    return found[-1] if found else None",
    ],
}
ANSWER_CODE["r1_zero_chat"] = ANSWER_CODE["r1_zero"]
"""The snippets' reading of the answer, for each prompt's format (reasonrl grades it in ``reasonrl.grading``)."""


def prompt_section(params: Params, route: str) -> list[str]:
    """The prompt the model was trained and is evaluated with, verbatim, and the format of its answers."""
    name = evaluation_prompt(params, route)
    prompt = load_prompt(name)
    source = code(f"src/reasonrl/prompts/{name}.prompt")
    if prompt.is_chat:
        how = (
            f"a chat prompt: its {code('[system]')} and {code('[user]')} turns go through the tokenizer's chat "
            f"template (with the generation prompt), and the {code('[assistant]')} turn's text, "
            f"{code(prompt.assistant_prefix)}, starts the answer"
        )
    else:
        ending = "ends with a line break" if prompt.text.endswith("\n") else "ends without a line break"
        how = f"the model continues the text right where it ends (it {ending})"
    reward = flat_dict(params.rewards)[name]
    return [
        "## Prompt",
        "",
        f"Trained and evaluated with reasonrl's {code(name)} prompt ({source}), where {code(PLACEHOLDER)} stands for "
        f"the question; {how}:",
        "",
        *_fenced(prompt.text, "text"),
        "",
        f"{ANSWER_FORMATS[name]} reasonrl graded it with the reward {code(reward)} ({code(f'rewards.{name}')}).",
        "",
    ]


def example_question(params: Params) -> str:
    """A question like those the model was trained on, for the usage snippets: GSM8K's first, or the first
    synthetic problem the run's settings make."""
    if params.data.name == "gsm8k":
        return GSM8K_QUESTION
    if params.data.name == "arithmetic":
        arithmetic = params.data.arithmetic
        return arithmetic_problem(random.Random(arithmetic.seed), arithmetic.max_steps, arithmetic.max_value)[
            "question"
        ]
    return OWN_DATA_QUESTION


def _literal(text: str, indent: str = "") -> str:
    """``text`` as a double-quoted Python string literal (JSON's string syntax is Python's), a line of the text per
    line of code inside parentheses when it spans lines."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= 1:
        return json.dumps(text, ensure_ascii=False)
    inner = "".join(f"\n{indent}    {json.dumps(line, ensure_ascii=False)}" for line in lines)
    return f"({inner}\n{indent})"


def _literal_list(texts: list[str]) -> str:
    return "[" + ", ".join(_literal(text) for text in texts) + "]"


def template_code(prompt: Prompt, answer_code: list[str]) -> list[str]:
    """The snippets' prompt, ``render(question)`` (the text reasonrl gives the model) and ``answer_of(response)``."""
    question = _literal(PLACEHOLDER)
    if prompt.is_chat:
        turns = [f'    {{"role": "{role}", "content": {_literal(text, "    ")}}},' for role, text in prompt.turns]
        constants = ["MESSAGES = [", *turns, "]", f"ASSISTANT_PREFIX = {_literal(prompt.assistant_prefix)}"]
        render = [
            "def render(question):  # through the tokenizer's chat template",
            f'    turns = [{{**turn, "content": turn["content"].replace({question}, question)}} for turn in MESSAGES]',
            "    chat = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)",
            "    return chat + ASSISTANT_PREFIX",
        ]
    else:
        constants = [f"TEMPLATE = {_literal(prompt.text)}"]
        render = ["def render(question):", f"    return TEMPLATE.replace({question}, question)"]
    return [*constants, "", "", *render, "", "", *answer_code]


def transformers_snippet(params: Params, route: str) -> str:
    """Python that answers an example question with this model through transformers, as the pipeline samples."""
    name, sampling = evaluation_prompt(params, route), params.eval
    if sampling.temperature == 0:
        options = ["do_sample=False"]
    else:
        options = ["do_sample=True", f"temperature={sampling.temperature!r}", f"top_p={sampling.top_p!r}"]
    options += [f"max_new_tokens={sampling.max_tokens}"]
    options += [f"min_new_tokens={sampling.min_tokens}"] if sampling.min_tokens else []
    if sampling.stop:
        options += [f"stop_strings={_literal_list(sampling.stop)}", "tokenizer=tokenizer"]
    lines = [
        "import re",
        "",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"MODEL = {_literal(MODEL_PLACEHOLDER)}  # this directory, or the hub id it is uploaded as",
        *template_code(load_prompt(name), ANSWER_CODE[name]),
        "",
        "",
        "tokenizer = AutoTokenizer.from_pretrained(MODEL)",
        "model = AutoModelForCausalLM.from_pretrained(MODEL)",
        f"prompt = render({_literal(example_question(params))})",
        'inputs = tokenizer(prompt, return_tensors="pt")',
        "output = model.generate(",
        "    **inputs,",
        *[f"    {option}," for option in options],
        ")",
        'response = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)',
        "print(response)",
        'print("answer:", answer_of(response))',
    ]
    return "\n".join(lines)


def vllm_snippet(params: Params, route: str) -> str:
    """Python that answers an example question with this model through vLLM, with the pipeline's engine and
    sampling settings."""
    name, sampling, engine = evaluation_prompt(params, route), params.eval, params.rollout
    prompt = load_prompt(name)
    engine_options = [f'dtype="{engine.dtype}"', f"max_model_len={engine.max_model_len}"]
    engine_options += ["enforce_eager=True"] if engine.enforce_eager else []
    options = [
        f"temperature={sampling.temperature!r}",
        f"top_p={sampling.top_p!r}",
        f"max_tokens={sampling.max_tokens}",
    ]
    options += [f"min_tokens={sampling.min_tokens}"] if sampling.min_tokens else []
    options += [f"stop={_literal_list(sampling.stop)}", "include_stop_str_in_output=True"] if sampling.stop else []
    lines = [
        "import re",
        "",
        "from vllm import LLM, SamplingParams",
        "",
        f"MODEL = {_literal(MODEL_PLACEHOLDER)}  # this directory, or the hub id it is uploaded as",
        *template_code(prompt, ANSWER_CODE[name]),
        "",
        "",
        "# the engine as the pipeline ran it (params rollout.dtype, rollout.max_model_len, rollout.enforce_eager)",
        f"llm = LLM(model=MODEL, {', '.join(engine_options)})",
        *(["tokenizer = llm.get_tokenizer()"] if prompt.is_chat else []),
        f"sampling = SamplingParams({', '.join(options)})",
        f"questions = [{_literal(example_question(params))}]",
        "prompts = [render(question) for question in questions]",
        "for output in llm.generate(prompts, sampling):",
        "    response = output.outputs[0].text",
        "    print(response)",
        '    print("answer:", answer_of(response))',
    ]
    return "\n".join(lines)


def usage_section(params: Params, route: str) -> list[str]:
    sampling = params.eval
    settings = ", ".join(
        code(f"{key}: {yaml_value(getattr(sampling, key))}") for key in ("temperature", "top_p", "max_tokens", "stop")
    )
    return [
        "## Usage",
        "",
        f"Both snippets render the prompt above and sample as reasonrl evaluated the model ({settings}, params "
        f"{code('eval')}); set {code('MODEL')} to this directory or to the hub id it is uploaded as.",
        "",
        "With transformers:",
        "",
        *_fenced(transformers_snippet(params, route), "python"),
        "",
        "With vLLM:",
        "",
        *_fenced(vllm_snippet(params, route), "python"),
        "",
    ]


def params_section(params: Params, sections: list[str], provenance: Provenance) -> list[str]:
    """The params of ``sections`` that differ from the committed params file; every one, by section, where there is
    no committed file to compare with."""
    shaped = ", ".join(code(section) for section in sections)
    if provenance.committed is None:
        lines = [
            "## Params",
            "",
            f"Every param of the sections that shaped this model ({shaped}): {md_inline(provenance.uncommitted)}, so "
            "there is no committed params.yaml to compare with.",
        ]
        for section in sections:
            lines += ["", f"### {section}", "", "| param | value |", "|---|---|"]
            lines += [_row(name, yaml_value(value)) for name, value in section_params(params, section).items()]
        return [*lines, ""]
    lines = [
        "## Params that differ from params.yaml as committed",
        "",
        f"The params the stage ran with against params.yaml at the commit above (the demo's CPU preset and "
        f"{code('dvc exp run -S')} change the working copy only), in the sections that shaped this model ({shaped}):",
        "",
    ]
    changed = changed_params(params, provenance.committed, sections)
    if not changed:
        return [*lines, "None: the run used params.yaml as committed.", ""]
    lines += ["| param | value | committed |", "|---|---|---|"]
    lines += [_row(name, yaml_value(value), yaml_value(before)) for name, value, before in changed]
    return [*lines, ""]


def data_section(params: Params, files: tuple[DataFile, ...]) -> list[str]:
    text = data_text(params)
    lines = ["## Data", "", f"{text[:1].upper()}{text[1:]}.", ""]
    if not files:
        return lines
    lines += [
        "The files it read, each with its SHA-256 (the pipeline writes every data set, in GSM8K's format, under "
        "`data/gsm8k/`):",
        "",
        "| data | what | file | sha256 |",
        "|---|---|---|---|",
    ]
    data = DATA_SHORT[params.data.name]
    lines += [
        f"| {data} | {md_inline(file.holds, in_table=True)} {_row(file.path.as_posix(), file_sha256(file.path))}"
        for file in files
    ]
    return [*lines, ""]


def versions_section(versions: dict[str, str]) -> list[str]:
    rows = [_row(library, version) for library, version in versions.items()]
    return ["## Library versions", "", "| library | version |", "|---|---|", *rows, ""]


def render_card(
    params: Params, route: str, checkpoint: str, best: BestCheckpoint, unit: str, provenance: Provenance
) -> str:
    """The card's Markdown, front matter first. ``checkpoint`` says which of the run's policies this is (e.g. "the
    step with the best validation accuracy"); ``unit`` names what ``best.step`` counts (step, round)."""
    sections = route_sections(params, route)
    start = start_model(params, route)
    lines = [
        f"# reasonrl {route} model",
        "",
        f"Trained by the reasonrl pipeline: {ROUTE[route].method}; this directory holds {checkpoint}.",
        "",
        f"- **Base model:** {base_model_text(params)}",
        f"- **Route:** {' → '.join(['base', *reversed(sections)])}",
        f"- **Data:** {md_inline(DATA_LABELS[params.data.name])}",
        f"- **Best validation accuracy:** {validation_line(best, unit)}",
        "- **Test accuracy:** not known when the model was saved; the `final_eval` stage measures it later "
        "(`reports/final/metrics.json`).",
        f"- **License:** {license_text(provenance.start_license, start)}",
        f"- **Git commit:** `{provenance.commit}` (HEAD when the stage ran)",
        "",
        *prompt_section(params, route),
        *usage_section(params, route),
        *params_section(params, ["data", "model", "rollout", "eval", "rewards", *sections], provenance),
        *data_section(params, provenance.data_files),
        *versions_section(provenance.versions),
    ]
    meta = card_metadata(params, route, provenance.start_license)
    return render_front_matter(meta) + "\n" + "\n".join(lines).rstrip("\n") + "\n"

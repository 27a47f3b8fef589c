"""The documentation: the MkDocs site builds strictly, the README's links into it exist, and every command the README
and the docs show names a real module, script, make target and param, with arguments its parser accepts.

The commands are checked, not run (the demo → ablation → comparison flow is run by its own test): each
``python -m reasonrl.X``, ``python stages/X.py`` and ``python bench/X.py`` shown in a code block runs up to its
argument parser, in tests/parse_commands.py; one named inline in the prose runs with ``--help``.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL_BLOCKS = {"", "bash", "sh", "console", "shell"}
PYTHON = re.compile(r"^(.*/)?python(3(\.\d+)?)?$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SUBSTITUTION = re.compile(r"\$\(\(.*?\)\)|\$\(([^()]*)\)|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
REPO_PATH = re.compile(r"`((?:tests|bench|stages|src|examples|rewards|profiles|requirements)/[^`\s]+)`")
# The pages the issue asks the site for, by their nav titles in mkdocs.yml.
REQUIRED_PAGES = [
    "Quickstart",
    "Results",
    "Experiments & comparison",
    "Full scale on GPUs",
    "Multi-GPU & SLURM",
    "Own data and rewards",
    "Algorithms",
    "Resume and checkpoints",
    "Reproducibility",
    "Benchmarks",
    "Library API",
]


def split_code(text: str) -> tuple[list[str], str]:
    """The shell code blocks of a Markdown page, and its prose (everything outside code blocks)."""
    blocks = [body for language, body in FENCE.findall(text) if language in SHELL_BLOCKS]
    return blocks, FENCE.sub("", text)


def shell_lines(block: str) -> list[str]:
    """A code block's command lines, backslash continuations joined, the `$ ` of a console prompt dropped."""
    joined = block.replace("\\\n", " ")
    return [line.strip().removeprefix("$ ") for line in joined.splitlines() if line.strip()]


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, each as its words: a substitution `$(…)` is a command of its own and a
    word `X` in its place, a variable `$x` or `$((…))` the word `1`; lists split at `;`, `&&`, `||` and `|`."""
    inner = [match.group(1) for match in SUBSTITUTION.finditer(line) if match.group(1)]
    line = SUBSTITUTION.sub(lambda match: "X" if match.group(1) else "1", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if set(token) <= set(";&|"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    for text in inner:
        commands.extend(simple_commands(text))
    return [words for words in commands if words]


def program(words: list[str]) -> list[str]:
    """A command's words without its leading environment assignments (`PYTHONPATH=src python …`)."""
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    return words


def parse_check(words: list[str], help_only: bool) -> list[dict] | None:
    """What tests/parse_commands.py runs for a `python` command (a launch command: the launcher and its stage), or
    None for any other program."""
    if not words or not PYTHON.match(words[0]) or len(words) < 2:
        return None
    if words[1] == "-m":
        if not words[2].startswith("reasonrl"):
            return None  # another module (json.tool, pytest): not ours to check
        target, argv = {"module": words[2]}, words[3:]
    elif words[1].endswith(".py"):
        target, argv = {"script": words[1]}, words[2:]
    else:
        return None
    if help_only:
        return [{**target, "argv": ["--help"]}]
    checks = [{**target, "argv": argv}]
    if target.get("module") == "reasonrl.launch":  # the launcher passes the stage its own arguments
        script = next(index for index, word in enumerate(argv) if word.endswith(".py"))
        checks.append({"script": argv[script], "argv": argv[script + 1 :]})
    return checks


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(page, words, shown in a code block) for every command the README and the docs show, in code blocks and in
    inline code spans of the prose that start with `python -m reasonrl`, `python stages/`, `python bench/` or
    `make`."""
    found = []
    for page in PAGES:
        blocks, prose = split_code(page.read_text(encoding="utf-8"))
        for block in blocks:
            for line in shell_lines(block):
                if not line.startswith("#"):
                    found += [(page.name, program(words), True) for words in simple_commands(line)]
        for span in re.findall(r"`([^`\n]+)`", prose):
            words = program(span.split())
            if words and (parse_check(words, True) or words[0] == "make"):
                found.append((page.name, words, False))
    return found


def run_parse_checks(checks: list[dict]) -> list[dict]:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "parse_commands.py")],
        input=json.dumps(checks),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav or a docstring mkdocstrings
    cannot render stops it (mkdocs.yml's `validation` turns each into a warning)."""
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "WARNING" not in completed.stderr, completed.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="reasonrl.losses.compute_grpo_clip_loss"' in api  # the API page is generated from the docstrings


def test_the_nav_has_every_page_the_site_promises():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    titles = [title for entry in nav for title in entry]
    assert [page for page in REQUIRED_PAGES if page not in titles] == []


def test_every_link_of_the_readme_exists():
    """Each relative link of the README (docs/…, CHANGELOG.md) names a file that exists, and an anchor a heading of
    that page (as MkDocs and GitHub slug it)."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))
    relative = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in relative)
    for link in relative:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).is_file(), f"README.md links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {slugify(heading, "-") for heading in headings}, f"README.md: no heading #{anchor}"


def test_every_documented_command_parses():
    """Each `python -m reasonrl.X`, stage or bench command of a code block runs up to its parser, which accepts the
    arguments shown; one named in the prose answers `--help`. Every parser's description is a whole sentence."""
    checks, shown = [], []
    for page, words, in_block in documented_commands():
        for check in parse_check(words, help_only=not in_block) or []:
            checks.append(check)
            shown.append(f"{page}: {shlex.join(words)}")
    assert any(check.get("module") == "reasonrl.compare" for check in checks)  # the extraction found the flow
    results = list(zip(shown, run_parse_checks(checks), strict=True))
    failures = [f"{where}\n    {result['error']}" for where, result in results if not result["ok"]]
    assert failures == [], "\n".join(failures)
    # `--help` opens with the parser's description: a whole sentence, not one cut at the docstring's first line break
    cut = [f"{where}: {result['description']}" for where, result in results if result["description"]]
    assert [line for line in cut if not line.rstrip().endswith(".")] == []


def test_every_documented_make_target_exists():
    targets = {words[1] for _, words, _ in documented_commands() if words[0] == "make" and len(words) > 1}
    targets = {target for target in targets if not target.startswith("-")}  # `snakemake --cores …` is not make
    assert {"setup", "demo", "test"} <= targets
    for target in sorted(targets):
        completed = subprocess.run(["make", "-n", target], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert completed.returncode == 0, f"make {target}: {completed.stderr}"


def test_every_documented_parameter_exists(full_scale_params):
    """Each `-S key=value` of a documented `dvc exp run` names a param of params.yaml (a typo would make DVC add
    a new key that no stage reads); so does `-S ++key=value`, Hydra's way of filling a param that is an empty
    mapping (`eval.protocols`)."""
    params = yaml.safe_load(full_scale_params)
    keys = []
    for _, words, in_block in documented_commands():
        if in_block and Path(words[0]).name == "dvc":
            keys += [after.split("=")[0] for option, after in zip(words[:-1], words[1:], strict=True) if option == "-S"]
            keys += [word[2:].split("=")[0] for word in words if word.startswith("-S") and len(word) > 2]
    assert "grpo.loss_type" in keys
    for key in keys:
        node = params
        for part in key.removeprefix("++").split("."):
            assert isinstance(node, dict) and part in node, f"-S {key}: params.yaml has no {key}"
            node = node[part]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_repository_path_the_docs_name_exists(page):
    """A file named in the docs (`tests/…`, `bench/…`, `src/…`, …) exists; placeholders (`<name>`, `*`) are not
    checked."""
    for path in REPO_PATH.findall(page.read_text(encoding="utf-8")):
        if not re.search(r"[<>*{}$…]", path):
            assert (ROOT / path.rstrip("/")).exists(), f"{page.name} names {path}, which does not exist"


def test_every_queued_experiment_is_named():
    """A queued `dvc exp run` without `--name` gets a random name, which neither reasonrl.compare nor the docs'
    later commands can know."""
    queued = [(page, words) for page, words, _ in documented_commands() if words[:3] == ["dvc", "exp", "run"]]
    queued = [(page, words) for page, words in queued if "--queue" in words]
    assert len(queued) > 10
    for page, words in queued:
        assert "--name" in words or any(word.startswith("--name=") for word in words), f"{page}: {' '.join(words)}"


def test_the_quickstart_counts_the_cpu_preset_right(full_scale_params):
    """The Quickstart says how many params the CPU preset sets and how many of them differ from params.yaml."""
    text = " ".join((DOCS / "quickstart.md").read_text(encoding="utf-8").split())
    stated_total = int(re.search(r"dotted overrides of `params.yaml`: (\d+) params", text).group(1))
    stated_differing = int(re.search(r"(\d+) of which differ from `params.yaml`'s values", text).group(1))
    preset = yaml.safe_load((ROOT / "src/reasonrl/presets/cpu.yaml").read_text(encoding="utf-8"))
    params = yaml.safe_load(full_scale_params)

    def value(key):
        node = params
        for part in key.split("."):
            node = node[part]
        return node

    assert stated_total == len(preset)
    assert stated_differing == sum(value(key) != preset[key] for key in preset)

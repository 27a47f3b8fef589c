"""The report stage: the summary verdict, run details, numbers in the tables, figures as real PNGs (shared y-axes
where routes are compared, colour-blind-safe, marked when the run is a toy), a self-contained HTML page that fits a
phone's screen, the same report whatever experiment runs it, and clear errors for missing inputs."""

import base64
import dataclasses
import json
import re
import runpy
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import reasonrl.report.environment
import reasonrl.report.sections
from reasonrl.cli import open_live
from reasonrl.cost import CostLedger, Device, Tokens, cost_report
from reasonrl.evaluation import paired_comparison, summarize
from reasonrl.report.document import Figure, png_size, render_html, render_markdown
from reasonrl.report.environment import RunEnvironment, cpu_name
from reasonrl.report.headline import headline_metrics
from reasonrl.report.inputs import (
    ReportInputError,
    by_grpo_step,
    flatten,
    grpo_evaluations,
    pick_example_files,
    read_params,
)
from reasonrl.report.page import ReportInputs, build_report
from reasonrl.report.tables import format_accuracy, per_question_table, percent
from reasonrl.report.verdict import format_p_value, paired_sentences
from reasonrl.routes import ROUTES
from reasonrl.statistics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# (correct, format_only, neither) per route, and the response length of each category.
COUNTS = {"base": (0, 3, 7), "sft": (3, 5, 2), "ei": (4, 5, 1), "grpo": (6, 3, 1)}
BASELINE_COUNTS = {"r1_zero": (1, 2, 7), "question_only": (2, 0, 8)}
LENGTHS = {"correct": 40, "format_only": 60, "neither": 100}
# GRPO as run_grpo logs it: 2 optimizer steps per GRPO step, evaluation every 2 GRPO steps and at the end.
GRPO_STEPS, OPTIMIZER_STEPS_PER_STEP, GRPO_EVAL_EVERY, SECONDS_PER_STEP = 6, 2, 2, 1.5
WALL_CLOCK_SECONDS = {"sft": 61.5, "ei": 40.25, "grpo": 95.0}  # each stage's metrics.json
CORE_HOURS = {"sft": 0.5, "ei": 0.25, "grpo": 1.5}  # each stage's cost.json: 4 cores, priced at 2 per core-hour
GRPO_ACCURACY = {0: 0.1, 2: 0.2, 4: 0.25, 6: 0.4}


def disagreement(index: int, ground_truth: str, answer: str, ours: bool) -> dict:
    return {"question_index": index, "ground_truth": ground_truth, "answer": answer, "ours_correct": ours,
            "math_verify_correct": not ours}  # fmt: skip


# The answers math-verify grades differently from ours, per route, as final_eval writes them.
CROSSCHECK = {
    "base": [],
    "sft": [disagreement(4, "5", "2+3", False)],
    "ei": [],
    "grpo": [
        disagreement(1, "-3", "\u22123", True),
        disagreement(7, "3", "x | y\n" + "9" * 100, True),  # a pipe, a newline, and too long for a cell
        disagreement(8, "12", "12 or 13", False),
    ],
}


def final_summaries() -> dict[str, dict]:
    """Each route's summary with its cross-check and, as final_eval adds it, its paired comparison against the model
    it started from, all from the hand-made answers above (10 per route)."""
    summaries = {}
    for route, counts in COUNTS.items():
        found = len(CROSSCHECK[route])
        summaries[route] = summarize(graded(*counts)) | {
            "grader_agreement": (sum(counts) - found) / sum(counts),
            "grader_disagreements": found,
        }
    for route, reference in STARTS.items():
        paired = paired_comparison(graded(*COUNTS[route]), graded(*COUNTS[reference]))
        summaries[route]["paired"] = {"reference": reference, **paired}
    return summaries


STARTS = {"sft": "base", "ei": "sft", "grpo": "sft"}


def graded(correct: int, format_only: int, neither: int) -> list[dict]:
    records = [{"reward": 1.0, "format_reward": 1.0, "length": LENGTHS["correct"]}] * correct
    records += [{"reward": 0.0, "format_reward": 1.0, "length": LENGTHS["format_only"]}] * format_only
    records += [{"reward": 0.0, "format_reward": 0.0, "length": LENGTHS["neither"]}] * neither
    return [{**record, "question_index": index} for index, record in enumerate(records)]  # one sample per question


def generations(route: str, counts: tuple[int, int, int]) -> list[dict]:
    """The graded test answers final_eval writes for ``route`` (``final/generations/<route>.jsonl``)."""
    return [
        record | {"question": f"What is {index} + 1?", "ground_truth": str(index + 1),
                  "response": f"{route} answers #{index} <answer> ? </answer>"}
        for record in graded(*counts) for index in [record["question_index"]]
    ]  # fmt: skip


def write_sft_live(live_dir: Path) -> None:
    with open_live(str(live_dir)) as live:
        for step in range(1, 7):
            live.step = step
            live.log_metric("train/loss", 2.0 / step)
            live.log_metric("train/entropy", 1.5 - 0.1 * step)
            if step % 3 == 0:
                live.log_metric("eval/accuracy", 0.05 * step)
                live.log_metric("eval/format_rate", 0.1 * step)
                live.log_metric("eval/response_length_all", 50 + step)
            live.next_step()


def write_ei_live(live_dir: Path) -> None:
    with open_live(str(live_dir)) as live:
        for round_index in range(1, 4):
            live.step = round_index
            live.log_metric("rollout/response_length", 70 - round_index)
            if round_index != 2:  # a round that kept no pairs logs no training metrics
                live.log_metric("train/entropy", 1.0 / round_index)
            live.log_metric("eval/accuracy", 0.1 * round_index)
            live.next_step()


def rollout_reward(step: int) -> float:
    return 0.1 * step


def zero_variance_share(step: int) -> float:
    return 0.5 + 0.05 * step


def write_grpo_live(live_dir: Path) -> None:
    """The logging pattern of ``reasonrl.grpo.run_grpo``, with example files at every evaluation."""
    optimizer_steps, elapsed = 0, 0.0
    with open_live(str(live_dir)) as live:

        def evaluate(step: int) -> None:
            live.step = optimizer_steps
            live.log_metric("eval/accuracy", GRPO_ACCURACY[step])
            live.log_metric("eval/format_rate", 0.9)
            live.log_metric("time/elapsed_seconds", elapsed)
            live.log_metric("grpo_step", step)
            examples = [
                {"step": step, "prompt": "Q?", "question": f"How many at step {step}, example {i}?",
                 "ground_truth": "5", "response": f"step {step} #{i} <answer> 5 </answer> & ```", "reward": i}
                for i in range(4)
            ]  # fmt: skip
            (live_dir / "examples").mkdir(parents=True, exist_ok=True)
            (live_dir / "examples" / f"step_{step:06d}.json").write_text(json.dumps(examples), encoding="utf-8")
            live.sync()

        for step in range(GRPO_STEPS):
            if step % GRPO_EVAL_EVERY == 0:
                evaluate(step)
            for _ in range(OPTIMIZER_STEPS_PER_STEP):
                optimizer_steps += 1
                live.step = optimizer_steps
                logged = {"train/loss": 0.1, "train/entropy": 0.8 - 0.1 * (optimizer_steps % 2),
                          "rollout/response_length": 90.0, "rollout/reward": rollout_reward(step),
                          "rollout/zero_variance_group_fraction": zero_variance_share(step)}  # fmt: skip
                for name, value in logged.items():
                    live.log_metric(name, value)
            elapsed += SECONDS_PER_STEP
            live.log_metric("time/rollout_seconds", 1.0)
            live.log_metric("grpo_step", step + 1)
            live.sync()
        evaluate(GRPO_STEPS)


@pytest.fixture(scope="module")
def reports_dir(tmp_path_factory) -> Path:
    reports = tmp_path_factory.mktemp("reports")
    (reports / "final").mkdir()
    (reports / "final" / "metrics.json").write_text(json.dumps(final_summaries()))
    (reports / "final" / "grader_crosscheck.json").write_text(json.dumps(CROSSCHECK))
    (reports / "final" / "generations").mkdir()
    for route, counts in COUNTS.items():
        lines = [json.dumps(record) for record in generations(route, counts)]
        (reports / "final" / "generations" / f"{route}.jsonl").write_text("\n".join(lines) + "\n")
    (reports / "baseline").mkdir()
    baseline = {name: summarize(graded(*c)) for name, c in BASELINE_COUNTS.items()}
    (reports / "baseline" / "metrics.json").write_text(json.dumps(baseline))
    write_sft_live(reports / "sft" / "live")
    write_ei_live(reports / "ei" / "live")
    write_grpo_live(reports / "grpo" / "live")
    for stage, seconds in WALL_CLOCK_SECONDS.items():
        metrics = {"best_val_accuracy": 0.4, "best_step": 6} if stage == "grpo" else {"best_val_accuracy": 0.3}
        metrics["trainable_parameters"] = 590_080
        (reports / stage / "metrics.json").write_text(json.dumps(metrics | {"wall_clock_seconds": seconds}))
        (reports / stage / "cost.json").write_text(json.dumps(stage_cost(CORE_HOURS[stage])))
    return reports


def stage_cost(core_hours: float) -> dict:
    """A CPU stage's cost.json: 100 + 200 tokens generated in 10 s, 50 + 150 trained in 20 s, on 4 cores."""
    ledger = CostLedger()
    ledger.add_seconds("rollout", 10.0)
    ledger.add_tokens("rollout", "generated", Tokens(100, 200))
    ledger.add_seconds("train", 20.0)
    ledger.add_tokens("train", "trained", Tokens(50, 150))
    return cost_report(ledger, core_hours * 3600 / 4, Device("cpu", 4, "by hand"), price=2.0)


@pytest.fixture(scope="module")
def report_params_file(tmp_path_factory) -> Path:
    """Just a few params (the conftest's ``params_file`` is the full config): a real model on GSM8K."""
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text("grpo:\n  learning_rate: 1.0e-5\n  loss_type: reinforce_with_baseline\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toy_params_file(tmp_path_factory) -> Path:
    """The CPU demo's kind of run: the tiny, randomly initialised model on synthetic arithmetic."""
    path = tmp_path_factory.mktemp("toy") / "params.yaml"
    path.write_text(
        "model:\n  name: tiny\ndata:\n  name: arithmetic\n  arithmetic:\n    train_size: 5000\n    test_size: 500\n"
        "sft:\n  lora_rank: 0\n  learning_rate: 2.0e-3\ngrpo:\n  loss_type: reinforce_with_baseline\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def undrawn_figures(monkeypatch):
    """For the tests that read the Markdown only: each figure is built but not drawn (drawing them is most of the
    report's time; the tests of the figures draw them)."""
    from matplotlib.figure import Figure as MplFigure

    monkeypatch.setattr(MplFigure, "savefig", lambda figure, buffer, **options: buffer.write(PNG_MAGIC))


# The date, commit and machine as the report stage would read them where it runs.
ENVIRONMENT = RunEnvironment("2025-06-01 14:03 UTC", "0123456789abcdef", "Test CPU 9000", 16, ("NVIDIA H200",) * 2)


@pytest.fixture(scope="module")
def toy_report(reports_dir, toy_params_file):
    """The report of a toy run built once, with both renderings as the stage writes them beside ``reports_dir``."""
    report = build_report(ReportInputs(reports_dir, toy_params_file, ENVIRONMENT))
    markdown = render_markdown(report.blocks, "figures", reports_dir)
    return report, markdown, render_html(report.blocks, report.figures, page_dir=reports_dir)


def test_wilson_interval_hand_checked():
    # p = 0.3, n = 10: centre (0.3 + 1.96²/20) / (1 + 1.96²/10) = 0.3555, half-width 0.2477.
    assert wilson_interval(0.3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    # p = 0: the normal interval collapses to a point; Wilson's upper end is z² / (n + z²) = 0.2775.
    assert wilson_interval(0.0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)


def test_grpo_evaluations_join_accuracy_time_and_grpo_step(reports_dir):
    evaluations = grpo_evaluations(reports_dir / "grpo" / "live")
    expected = [(step, step * SECONDS_PER_STEP, accuracy) for step, accuracy in GRPO_ACCURACY.items()]
    assert [(e.grpo_step, e.elapsed_seconds, e.accuracy) for e in evaluations] == expected  # exact in binary


def test_example_files_first_middle_last(reports_dir):
    files = pick_example_files(reports_dir / "grpo" / "live" / "examples")
    assert [f.name for f in files] == ["step_000000.json", "step_000004.json", "step_000006.json"]


def accuracy_cell(correct: int, n: int) -> str:
    low, high = wilson_interval(correct / n, n)
    return f"{100 * correct / n:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def test_report_tables_figures_and_html(toy_report):
    report, markdown, page = toy_report

    # Test accuracy and baseline tables: numbers from the graded records.
    for name, (correct, format_only, neither) in (COUNTS | BASELINE_COUNTS).items():
        n = correct + format_only + neither
        incorrect = (format_only * LENGTHS["format_only"] + neither * LENGTHS["neither"]) / (format_only + neither)
        everything = (correct * LENGTHS["correct"] + (format_only + neither) * incorrect) / n
        lengths = [f"{everything:.1f}", f"{LENGTHS['correct']:.1f}" if correct else "—", f"{incorrect:.1f}"]
        row = (
            f"| {name} | {n} | {accuracy_cell(correct, n)} | {100 * (correct + format_only) / n:.1f}% "
            f"| {correct} / {format_only} / {neither} | {' / '.join(lengths)} |"
        )
        assert row in markdown, row
    assert "Error bars: 95% Wilson score interval over the n graded answers, one per question." in markdown
    assert "clustered" not in markdown
    accuracy = {name: counts[0] / sum(counts) for name, counts in COUNTS.items()}
    for route, reference in (("sft", "base"), ("ei", "sft"), ("grpo", "sft")):
        points = 100 * (accuracy[route] - accuracy[reference])
        assert f"{route.upper()} vs {reference.upper()} {points:+.1f} points" in markdown

    # Figures: valid PNGs, linked relatively from Markdown, inline in HTML.
    expected = {
        "test_accuracy", "validation_curves", "grpo_rollouts", "grpo_wallclock", "training_dynamics", "categories"
    }  # fmt: skip
    assert set(report.figures) == {f"{name}.png" for name in expected}
    for name, png in report.figures.items():
        assert png.startswith(PNG_MAGIC) and len(png) > 1000
        assert f"](figures/{name})" in markdown
    inline = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(inline) == len(expected)
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for data in inline)
    assert 'src="figures/' not in page and "<link" not in page

    # Example rollouts: first, middle and last evaluation, two each, escaped in HTML and fenced in Markdown.
    for step in (0, 4, 6):
        assert f"### GRPO step {step}" in markdown
        assert f"step {step} #1 " in markdown and f"step {step} #2 " not in markdown
    assert "### GRPO step 2" not in markdown
    assert "step 6 #0 &lt;answer&gt; 5 &lt;/answer&gt; &amp; ```" in page
    assert "````text\nstep 6 #0 <answer> 5 </answer> & ```\n````" in markdown

    # Grader cross-check: agreement per route from the metrics, every disagreement listed (none over the cap).
    assert "## Grader cross-check (math-verify)" in markdown
    for route, row in {"base": "100.0% | 0", "sft": "90.0% | 1", "ei": "100.0% | 0", "grpo": "70.0% | 3"}.items():
        assert f"| {route} | {row} |" in markdown
    assert '| sft | 4 | 5 | "2+3" | wrong | right |' in markdown
    assert '| grpo | 1 | -3 | "\u22123" | right | wrong |' in markdown
    clipped = '"x \\| y\\n' + "9" * 71 + "…"  # JSON-escaped and clipped to 80 characters, then the pipe escaped
    assert f"| grpo | 7 | 3 | {clipped} | right | wrong |" in markdown
    assert "<td>&quot;2+3&quot;</td><td>wrong</td><td>right</td>" in page
    assert "At most 10 per route are listed; all are in" in markdown and "more for" not in markdown


# ---------------------------------------------------------------------------------------- the page (issue 31)
def test_summary_gives_the_verdict_of_the_paired_tests(toy_report):
    """The summary names the best route and tests it against the second on their graded answers (GRPO 6 of 10
    right, EI 4: GRPO right on 2 questions EI missed and never the reverse; McNemar's exact p = 2 · 0.5² = 0.5),
    then each route against its start (SFT right on 3 questions BASE missed: p = 2 · 0.5³ = 0.25)."""
    _, markdown, _ = toy_report
    summary = markdown[markdown.index("## Summary") : markdown.index("## Run details")]
    assert (
        f"GRPO is the most accurate route on the test set, {accuracy_cell(6, 10)}, 20.0 points ahead of EI, "
        f"{accuracy_cell(4, 10)}. The lead is not significant: the test does not tell the two apart (McNemar's exact "
        "test on the same test questions: 2 answers right only for GRPO, 0 only for EI, p = 5.0e-01)." in summary
    )
    assert "SFT vs BASE +30.0 points, p = 2.5e-01, no significant change" in summary
    assert "each of the 4 tests on its own (no correction for making several)" in summary
    # A toy run says so before any number can read as a finding.
    note = summary[summary.index("> **Note:**") :]
    assert "the base model is `tiny`, a randomly initialised model of 0.59 M parameters" in note
    assert "synthetic arithmetic" in note


def test_verdict_of_a_significant_lead_and_of_missing_answers():
    from reasonrl.report.verdict import format_p_value, top_two_sentence

    final = {"ei": summarize(graded(40, 0, 60)), "grpo": summarize(graded(70, 0, 30))}
    paired = paired_comparison(graded(70, 0, 30), graded(40, 0, 60))  # 30 discordant, all for GRPO: p = 2 / 2³⁰
    assert paired["p_value"] == 2 / 2**30 and format_p_value(paired["p_value"]) == "1.9e-09"
    sentence = top_two_sentence(final, paired, "")
    assert "The lead is significant (McNemar's exact test on the same test questions: 30 answers right only" in sentence
    missing = top_two_sentence(final, None, "`x.jsonl` missing")
    assert missing.endswith("; no paired test of GRPO and EI: `x.jsonl` missing.")
    tied = {"base": summarize(graded(0, 0, 10)), "sft": summarize(graded(0, 1, 9)), "ei": summarize(graded(1, 0, 9))}
    tied["grpo"] = tied["ei"]
    paired = paired_comparison(graded(1, 0, 9), graded(1, 0, 9))
    assert top_two_sentence(tied, paired, "") == (
        f"EI, GRPO tie for the highest test accuracy, {accuracy_cell(1, 10)} (McNemar's exact test on the same test "
        "questions: 0 answers right only for EI, 0 only for GRPO, p = 1.0e+00)."
    )


def test_run_details_and_links(toy_report, reports_dir):
    _, markdown, page = toy_report
    details = markdown[markdown.index("## Run details") : markdown.index("## Test accuracy per route")]
    for row in (
        "| rendered | 2025-06-01 14:03 UTC |",
        "| git commit | `0123456789abcdef` |",
        "| machine | Test CPU 9000 (16 logical CPUs); GPUs: 2 × NVIDIA H200 |",
        "| wall clock per training stage | SFT 1 min 02 s, EI 40 s, GRPO 1 min 35 s |",  # 61.5 s rounds to even
        "| model | `tiny` (randomly initialised) |",
        "| data | synthetic arithmetic word problems (5000 train / 500 test) |",
    ):
        assert row in details, row
    assert "| sft | `learning_rate` 0.002 · " in details and "`loss_type` reinforce_with_baseline" in details
    # Links relative to the page, which the stage writes into the reports directory (the model cards' links, which
    # lie outside it, are checked on the stage's own run below).
    generations = (reports_dir / "final" / "generations").as_posix()
    assert "| ei | [models/ei/README.md](" in details
    assert f"| [{generations}/ei.jsonl](final/generations/ei.jsonl) |" in details
    assert '<a href="final/generations/base.jsonl">' in page


def test_examples_show_the_question_and_gold_answer(toy_report):
    _, markdown, page = toy_report
    routes = markdown[markdown.index("## Answers per route") : markdown.index("## GRPO example rollouts")]
    assert "Question: What is 1 + 1?\n\nGold answer: 2" in routes
    assert "GRPO, reward 1:\n\n```text\ngrpo answers #1 <answer> ? </answer>\n```" in routes
    assert "BASE, reward 0:" in routes and "Test question 3" not in routes
    grpo = markdown[markdown.index("## GRPO example rollouts") :]
    assert "Question: How many at step 4, example 1?\n\nGold answer: 5\n\nGRPO after 4 steps, reward 1:" in grpo
    assert (
        '<div class="example"><h4>Example 2 (step 6)</h4><div><p><strong>Question:</strong> How many at step 6, '
        "example 1?</p>" in page
    )


def test_markdown_writes_each_caption_once(toy_report):
    report, markdown, _ = toy_report
    captions = [block.caption for block in report.blocks if isinstance(block, Figure)]
    assert len(captions) == len(report.figures)
    for caption in captions:
        assert markdown.count(caption[:60]) == 1, caption


class PageStructure(HTMLParser):
    """What a layout check needs of a page: its meta tags, style sheet, and each element's open ancestors."""

    def __init__(self) -> None:
        super().__init__()
        self.meta: list[dict[str, str]] = []
        self.style = ""
        self.elements: list[tuple[str, dict[str, str], list[tuple[str, dict[str, str]]]]] = []
        self.open: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        self.elements.append((tag, attributes, list(self.open)))
        if tag == "meta":
            self.meta.append(attributes)
        elif tag not in ("img", "br", "link"):
            self.open.append((tag, attributes))

    def handle_endtag(self, tag):
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self.open and self.open[-1][0] == "style":
            self.style += data


def css_rules(style: str) -> dict[str, dict[str, str]]:
    """``{selector: {property: value}}`` of a style sheet's top-level rules (a media query's are left out)."""
    top_level = re.sub(r"@media[^{]*\{(?:[^{}]*\{[^{}]*\})*[^{}]*\}", "", style)
    rules: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", top_level):
        declarations = dict(
            (name.strip(), value.strip()) for name, _, value in (d.partition(":") for d in body.split(";")) if value
        )
        for selector in selectors.split(","):
            rules.setdefault(selector.strip(), {}).update(declarations)
    return rules


def test_page_fits_a_390px_screen(toy_report):
    """The page at a phone's 390 px: a viewport, so the phone lays it out at its own width; every figure no wider than
    its container and every table scrolling inside its own box, by the CSS rules the page carries. No headless
    browser is installed here (no chromium, chrome, firefox or playwright), so the rules are read, not rendered."""
    _, _, page = toy_report
    structure = PageStructure()
    structure.feed(page)
    viewport = [m["content"] for m in structure.meta if m.get("name") == "viewport"]
    assert viewport and "width=device-width" in viewport[0] and "initial-scale=1" in viewport[0]
    assert "<h2>Summary</h2>\n<p>GRPO is the most accurate route" in page
    rules = css_rules(structure.style)

    assert rules["img"]["max-width"] == "100%" and rules["img"]["height"] == "auto"
    images = [(attributes, ancestors) for tag, attributes, ancestors in structure.elements if tag == "img"]
    assert len(images) == 6
    for attributes, ancestors in images:
        assert [tag for tag, _ in ancestors][-1] == "figure" and "style" not in attributes
        # Shown at half its pixels (2× resolution), shrunk further by max-width on a narrower screen.
        png = base64.b64decode(attributes["src"].removeprefix("data:image/png;base64,"))
        assert (int(attributes["width"]), int(attributes["height"])) == tuple(size // 2 for size in png_size(png))
    assert rules["figure"]["max-width"] == "100%"

    tables = [ancestors for tag, _, ancestors in structure.elements if tag == "table"]
    assert len(tables) >= 5
    for ancestors in tables:
        tag, attributes = ancestors[-1]
        assert tag == "div" and attributes["class"] == "table-scroll"
    assert rules[".table-scroll"]["overflow-x"] == "auto" and rules["pre"]["overflow-x"] == "auto"
    # Nothing sets a width a phone cannot give: no fixed or minimum width in pixels anywhere in the sheet.
    assert not re.search(r"(?<![-\w])(min-)?width\s*:\s*\d+px", structure.style)
    assert rules["body"]["max-width"] == "70rem" and "padding" in rules["body"]
    assert rules[".example"]["grid-template-columns"].startswith("minmax(0, 1fr)")
    assert "@media (max-width: 40rem)" in structure.style  # an example's question above its answers on a phone


def test_routes_compared_share_their_y_axes(reports_dir, toy_report):
    """The figures that set routes side by side give them one y-axis from zero (an EI curve of two points is not
    drawn on a zoomed axis of its own), and the report embeds exactly these figures."""
    from reasonrl.report.curves import validation_series
    from reasonrl.report.figures import curves_figure, png

    live = {route: reports_dir / route / "live" for route in ("sft", "ei", "grpo")}
    series, missing = validation_series(live)
    assert not missing and [s.xlabel for s in series] == ["SFT optimizer step", "EI round", "GRPO step"]
    figure = curves_figure([series], "Validation accuracy", "tiny model, synthetic data")
    axes = [a for a in figure.axes if a.get_visible()]
    assert len(axes) == 3
    assert all(axes[0].get_shared_y_axes().joined(axes[0], other) for other in axes[1:])
    for shown in axes:  # from zero to the highest point, GRPO's 0.4, and a tenth more
        assert shown.get_ylim() == pytest.approx((0.0, 0.44))
    texts = [text.get_text() for text in figure.findobj(lambda artist: hasattr(artist, "get_text"))]
    assert "tiny model, synthetic data" in texts
    report, _, _ = toy_report
    assert report.figures["validation_curves.png"] == png(figure)
    assert png_size(report.figures["validation_curves.png"]) == (3 * 420 * 2, 340 * 2)  # 12.6 × 3.4 in at 200 dpi


def test_grpo_curves_by_grpo_step():
    # Two optimizer steps per GRPO step; evaluations after 0 and 2 steps repeat grpo_step; step 3 never finished.
    grpo_step = [(0, 0), (2, 1), (2, 1), (4, 2), (4, 2), (6, 3)]
    reward = [(1, 0.2), (2, 0.2), (3, 0.4), (4, 0.6), (5, 0.9), (6, 0.7), (7, 0.1)]
    assert by_grpo_step(reward, grpo_step) == [(0, 0.2), (1, 0.5), (2, pytest.approx(0.8))]


def test_grpo_rollout_figure_and_the_zero_variance_share(toy_report):
    report, markdown, _ = toy_report
    section = markdown[markdown.index("## GRPO rollouts") : markdown.index("## GRPO validation accuracy against")]
    last = GRPO_STEPS - 1
    assert (
        f"At the last step ({last}) {100 * zero_variance_share(last):.1f}% of the groups had zero variance." in section
    )
    assert "](figures/grpo_rollouts.png)" in section


def test_noisy_curves_are_smoothed_over_the_faint_raw_ones():
    from reasonrl.report.figures import OKABE_ITO, Series, curves_figure, moving_average, smoothing_window

    assert moving_average([0, 3, 6, 3, 0], 3) == [1.5, 3, 4, 3, 1.5]
    assert smoothing_window(80) == 9 and smoothing_window(12) == 3
    noisy = [(step, (step % 2) * 0.5) for step in range(40)]
    few = [(step, 0.1 * step) for step in range(3)]
    figure = curves_figure(
        [[Series("GRPO", "GRPO step", "reward", noisy), Series("EI", "EI round", "reward", few)]], "t"
    )
    smoothed, plain = (a.get_lines() for a in figure.axes[:2])
    assert [line.get_alpha() for line in smoothed] == [0.3, None]
    assert list(smoothed[0].get_ydata()) == [y for _, y in noisy]
    assert list(smoothed[1].get_ydata()) == moving_average([y for _, y in noisy], 5)
    assert len(plain) == 1 and plain[0].get_marker() == "o"
    assert {line.get_color() for line in smoothed + plain} <= set(OKABE_ITO)


def test_bars_use_the_colour_blind_safe_palette(toy_report, reports_dir):
    from reasonrl.report.figures import OKABE_ITO, accuracy_figure, categories_figure
    from reasonrl.report.inputs import load_summaries

    final = load_summaries(reports_dir / "final" / "metrics.json")
    for figure in (accuracy_figure(final), categories_figure(final)):
        colours = {to_hex(bar.get_facecolor()) for bar in figure.axes[0].patches}
        assert colours <= {colour.lower() for colour in OKABE_ITO}
        assert "tiny model" not in [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]


def to_hex(rgba) -> str:
    from matplotlib.colors import to_hex as hex_of

    return hex_of(rgba)


def test_cpu_name_and_machine_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\n", encoding="utf-8")
    assert cpu_name(cpuinfo) == "AMD EPYC 7763 64-Core Processor"
    machine = RunEnvironment("", "", "X", 4, ("A100", "A100", "H100")).machine()
    assert machine == "X (4 logical CPUs); GPUs: 2 × A100, 1 × H100"
    assert RunEnvironment("", "", "X", 4, ()).machine() == "X (4 logical CPUs); GPUs: none found (nvidia-smi)"


def test_missing_optional_inputs_are_named(reports_dir, report_params_file, tmp_path, undrawn_figures):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    shutil.rmtree(reports / "ei" / "live")
    (reports / "baseline" / "metrics.json").unlink()
    shutil.rmtree(reports / "grpo" / "live" / "examples")
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file, ENVIRONMENT)).blocks)
    assert f"Missing: `{(reports / 'ei' / 'live' / 'plots/metrics/eval/accuracy.tsv').as_posix()}`" in markdown
    assert "ei `train/entropy`" in markdown and "ei `rollout/response_length`" in markdown
    assert f"`{(reports / 'baseline' / 'metrics.json').as_posix()}` is missing" in markdown
    assert "Not available: no `step_*.json`" in markdown
    # A route without its curve leaves its column empty: each column stays one route's.
    from reasonrl.report.curves import validation_series
    from reasonrl.report.figures import curves_figure

    series, _ = validation_series({route: reports / route / "live" for route in ("sft", "ei", "grpo")})
    assert [shown and shown.title for shown in series] == ["SFT", None, "GRPO"]
    axes = curves_figure([series], "Validation accuracy").axes
    assert [a.get_visible() and a.get_title() for a in axes] == ["SFT", False, "GRPO"]


def test_disagreements_over_the_cap_are_counted(reports_dir, report_params_file, monkeypatch, undrawn_figures):
    monkeypatch.setattr(reasonrl.report.sections, "DISAGREEMENTS_SHOWN", 2)
    markdown = render_markdown(build_report(ReportInputs(reports_dir, report_params_file, ENVIRONMENT)).blocks)
    assert "| grpo | 1 | -3 |" in markdown and "| grpo | 7 | 3 |" in markdown
    assert "| grpo | 8 | 12 |" not in markdown
    assert "At most 2 per route are listed, and 1 more for GRPO; all are in" in markdown


def test_missing_or_malformed_crosscheck(reports_dir, report_params_file, tmp_path, undrawn_figures):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    crosscheck = reports / "final" / "grader_crosscheck.json"
    crosscheck.unlink()
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file, ENVIRONMENT)).blocks)
    assert "| grpo | 70.0% | 3 |" in markdown
    assert f"Disagreements not listed: `{crosscheck.as_posix()}` is missing." in markdown
    crosscheck.write_text(json.dumps({"grpo": [{"question_index": 1}]}))
    with pytest.raises(ReportInputError, match=f"{re.escape(str(crosscheck))}: grpo: expected a list of disagreements"):
        build_report(ReportInputs(reports, report_params_file, ENVIRONMENT))


def test_final_metrics_without_a_crosscheck_say_so(reports_dir, report_params_file, tmp_path, undrawn_figures):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    (reports / "final" / "metrics.json").write_text(json.dumps({r: summarize(graded(*c)) for r, c in COUNTS.items()}))
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file, ENVIRONMENT)).blocks)
    assert "Not available: no route in `final/metrics.json` records `grader_agreement`." in markdown


def test_answers_of_another_run_or_malformed_are_named(reports_dir, report_params_file, tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    answers = reports / "final" / "generations" / "ei.jsonl"
    answers.write_text("".join(answers.read_text().splitlines(keepends=True)[:9]))
    with pytest.raises(
        ReportInputError, match=f"{re.escape(str(answers))}: 9 answers, but final/metrics.json counts n = 10"
    ):
        build_report(ReportInputs(reports, report_params_file, ENVIRONMENT))
    answers.write_text('{"question_index": 0}\n')
    with pytest.raises(ReportInputError, match=f"{re.escape(str(answers))}:1: expected a graded answer with keys"):
        build_report(ReportInputs(reports, report_params_file, ENVIRONMENT))


def test_grpo_examples_without_their_question_are_named(tmp_path):
    from reasonrl.report.inputs import load_examples

    path = tmp_path / "step_000002.json"
    path.write_text(json.dumps([{"step": 2, "prompt": "Q?", "response": "5", "reward": 1.0}]))  # as written before
    with pytest.raises(ReportInputError, match=f"{re.escape(str(path))}: expected a list of examples with keys"):
        load_examples(path)


def test_missing_final_metrics_names_the_file(tmp_path, report_params_file):
    with pytest.raises(ReportInputError, match=re.escape(str(tmp_path / "final" / "metrics.json"))):
        build_report(ReportInputs(tmp_path, report_params_file, ENVIRONMENT))


def run_stage_script(monkeypatch, cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
    monkeypatch.chdir(cwd)
    for name in ("DVC_ROOT", "DVC_EXP_NAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["stages/report.py", *args])
    runpy.run_path(str(ROOT / "stages" / "report.py"), run_name="__main__")


STAGE_ARGS = (
    "--reports", "reports", "--out", "reports/report.md", "--html", "reports/report.html",
    "--headline", "reports/headline.json",
)  # fmt: skip
OUTPUTS = ("report.md", "report.html", "headline.json", "figures")


def outputs(reports: Path) -> dict[str, bytes]:
    """The stage's outputs, every file's bytes by its path under ``reports``."""
    files = [reports / name for name in OUTPUTS if (reports / name).is_file()]
    files += [path for path in sorted((reports / "figures").iterdir())]
    return {path.relative_to(reports).as_posix(): path.read_bytes() for path in files}


def test_stage_writes_everything_and_the_same_whatever_experiment_runs_it(
    reports_dir, tmp_path, monkeypatch, full_scale_params
):
    """The report is a function of its deps: run as a DVC experiment of another name, in another repository, it
    writes the same bytes (an earlier report listed the repository's experiments, which DVC never refreshed)."""
    capture = reasonrl.report.environment.capture_environment
    monkeypatch.setattr(  # the clock alone differs between the two runs
        reasonrl.report.environment, "capture_environment", lambda: dataclasses.replace(capture(), rendered_at="then")
    )
    runs = {}
    for name, env in {"plain": {}, "experiment": {"DVC_EXP_NAME": "q-clip", "DVC_ROOT": str(ROOT)}}.items():
        shutil.copytree(reports_dir, tmp_path / name / "reports")
        (tmp_path / name / "params.yaml").write_text(full_scale_params, encoding="utf-8")
        run_stage_script(monkeypatch, tmp_path / name, *STAGE_ARGS, "--figures", "reports/figures", env=env)
        runs[name] = outputs(tmp_path / name / "reports")
    assert runs["plain"] == runs["experiment"]

    reports = tmp_path / "plain" / "reports"
    markdown = (reports / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((figures/[a-z_]+\.png)\)", markdown)
    assert len(links) == 6
    for link in links:
        assert (reports / link).read_bytes().startswith(PNG_MAGIC)
    page = (reports / "report.html").read_text(encoding="utf-8")
    assert "data:image/png;base64," in page
    # The run details: where the stage ran, read there; the links relative to the page, in the repository's layout.
    assert f"| machine | {cpu_name()} (" in markdown and "| rendered | then |" in markdown
    assert "| git commit | `unknown` |" in markdown  # a directory outside any git repository
    assert "| sft | [models/sft/README.md](../models/sft/README.md) | " in markdown
    assert "| [reports/final/generations/grpo.jsonl](final/generations/grpo.jsonl) |" in markdown
    assert '<a href="../models/grpo/best/README.md">models/grpo/best/README.md</a>' in page
    headline = json.loads((reports / "headline.json").read_text(encoding="utf-8"))
    assert headline == headline_metrics(reports_dir) and headline["test_accuracy"]["grpo"] == 0.6


def test_stage_without_final_metrics_exits_with_the_file_name(tmp_path, monkeypatch, capsys, params_file):
    with pytest.raises(SystemExit) as exit_info:
        run_stage_script(monkeypatch, tmp_path, *STAGE_ARGS, "--figures", "reports/figures")
    assert exit_info.value.code == 2
    assert "error: reports/final/metrics.json: missing" in capsys.readouterr().err


def test_params_read_as_dvc_writes_them(tmp_path):
    # `dvc exp run -S grpo.lr=3.0e-5` writes `3e-05`, a string to YAML 1.1, a float to dvc exp show (YAML 1.2).
    path = tmp_path / "params.yaml"
    path.write_text("grpo:\n  lr: 3e-05\n  betas: [0.9, 0.95]\n  name: '1e3'\n  steps: 200\n", encoding="utf-8")
    assert flatten(read_params(path)) == {
        "grpo.lr": 3e-05,
        "grpo.betas": [0.9, 0.95],
        "grpo.name": "1e3",
        "grpo.steps": 200,
    }


def sampled(right_per_question: list[int], samples: int = 4) -> list[dict]:
    """``samples`` well-formed answers per question: the first ``right`` of them "1", right; the rest "2", wrong."""
    return [
        {"question_index": q, "answer": "1" if i < right else "2", "reward": float(i < right), "format_reward": 1.0,
         "length": 4}
        for q, right in enumerate(right_per_question) for i in range(samples)
    ]  # fmt: skip


def test_several_samples_per_question_add_a_pass_at_k_table():
    table = per_question_table({"sft": summarize(sampled([0, 1, 4])), "grpo": summarize(sampled([2, 3, 4]))})
    assert table.headers == ["route", "samples per question", "mean accuracy", "pass@1", "pass@2", "pass@4",
                            "majority vote"]  # fmt: skip
    # sft: pass@2 of 0, 1 and 4 right of 4 is (0 + 1/2 + 1) / 3; majority: wrong, wrong ("2" outvotes "1"), right
    assert table.rows[0] == ["sft", "4", "41.7%", "41.7%", "50.0%", "66.7%", "33.3%"]
    # grpo: 2 right of 4 ties its vote, which goes to the answer seen first ("1", right)
    assert table.rows[1] == ["grpo", "4", "75.0%", "75.0%", "94.4%", "100.0%", "100.0%"]
    assert per_question_table({"sft": summarize(graded(1, 1, 1))}) is None


def test_paired_comparisons_are_reported_per_route():
    final = {
        "base": summarize(graded(0, 1, 1)),
        "sft": {"paired": {"reference": "base", "only_this_right": 41, "only_reference_right": 12,
                           "questions_this_better": 41, "questions_reference_better": 12, "test": "mcnemar_exact",
                           "p_value": 4.1e-05}},
        "grpo": {"paired": {"reference": "sft", "only_this_right": 60, "only_reference_right": 20,
                            "questions_this_better": 25, "questions_reference_better": 9,
                            "test": "sign_flip_exact_by_question", "p_value": 0.0061}},
    }  # fmt: skip
    assert paired_sentences(final) == [
        "SFT vs BASE: 41 answers right only for SFT, 12 only for BASE, p = 4.1e-05",
        "GRPO vs SFT: more right answers for GRPO on 25 questions, for SFT on 9 (60 answers right only for GRPO, "
        "20 only for SFT), p = 6.1e-03",
    ]


def test_several_samples_per_question_are_reported_clustered_by_question(
    reports_dir, report_params_file, tmp_path, undrawn_figures
):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    rights = {"base": [0, 0, 1, 0], "sft": [4, 0, 2, 0], "ei": [4, 1, 2, 1], "grpo": [4, 4, 0, 3]}
    records = {route: sampled(right) for route, right in rights.items()}
    final = {route: summarize(records[route]) for route in ROUTES}
    final["sft"]["paired"] = {"reference": "base", **paired_comparison(records["sft"], records["base"])}
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    for route, graded_answers in records.items():
        answers = [r | {"question": "Q?", "ground_truth": "1", "response": r["answer"]} for r in graded_answers]
        lines = "".join(json.dumps(answer) + "\n" for answer in answers)
        (reports / "final" / "generations" / f"{route}.jsonl").write_text(lines)
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file, ENVIRONMENT)).blocks)

    # sft: 6 of 16 right; Σ (right − 6/16 · 4)² = 2.5² + 1.5² + 0.5² + 1.5² = 11; n_eff = (6/16)(10/16) 16² / 11
    low, high = wilson_interval(6 / 16, 6 * 10 / 11)
    assert f"| sft | 16 | 37.5% [{100 * low:.1f}, {100 * high:.1f}] |" in markdown
    assert "Error bars: 95% Wilson score interval clustered by question (samples of one question" in markdown
    assert "Accuracy with its 95% Wilson score interval clustered by question in brackets" in markdown
    # Per question 4 − 0, 0 − 0, 2 − 1 and 0 − 0 right answers: sign patterns of (4, 1) sum to ±5 and ±3; 2 of 4 ≥ 5
    assert (
        "Paired against the model each route started from (the same questions, samples and seed), the exact "
        "sign-flip test over questions (each question's difference in right answers keeps or flips its sign as a "
        "whole, since samples of one question are not independent): SFT vs BASE: more right answers for SFT on 2 "
        "questions, for BASE on 0 (5 answers right only for SFT, 0 only for BASE), p = 5.0e-01." in markdown
    )
    # The two best, GRPO and EI, per question 4 − 4, 4 − 1, 0 − 2, 3 − 1: of the sign patterns of (3, 2, 2), those
    # whose positive part is at most 2 are 3 of 8, two-sided 6 of 8.
    assert (
        "The lead is not significant: the test does not tell the two apart (exact sign-flip test over questions on "
        "the same test questions: more right answers for GRPO on 2 questions, for EI on 1 (5 answers right only for "
        "GRPO, 2 only for EI), p = 7.5e-01)." in markdown
    )
    assert "McNemar" not in markdown and "one per question" not in markdown


# ---------------------------------------------------------------------------------------- headline metrics
def test_headline_is_read_from_the_route_metrics(reports_dir, tmp_path):
    headline = headline_metrics(reports_dir)
    cost = headline.pop("cost")
    assert headline == {
        "test_accuracy": {route: counts[0] / sum(counts) for route, counts in COUNTS.items()},
        "grpo_best_val_accuracy": 0.4,
        "wall_clock_seconds": WALL_CLOCK_SECONDS,
    }
    assert cost["device_hours"] == pytest.approx(CORE_HOURS)
    assert cost["tokens"] == {"sft": 500, "ei": 500, "grpo": 500}
    assert cost["price"] == pytest.approx({"sft": 1.0, "ei": 0.5, "grpo": 3.0})
    # Over the model each started from: SFT 0.3 over base's 0.0 in half an hour, EI 0.1 over SFT's in a quarter,
    # GRPO 0.3 over SFT's in an hour and a half.
    assert cost["accuracy_gain_per_device_hour"] == pytest.approx({"sft": 0.6, "ei": 0.4, "grpo": 0.2})
    # In reading order, which is the order `dvc exp show` gives the columns: routes as final_eval runs them.
    assert list(headline_metrics(reports_dir)) == [
        "test_accuracy",
        "grpo_best_val_accuracy",
        "wall_clock_seconds",
        "cost",
    ]
    assert list(headline["wall_clock_seconds"]) == ["sft", "ei", "grpo"]
    assert list(headline["test_accuracy"]) == list(ROUTES)

    # Other metrics, other headline; without GRPO's files its numbers are null.
    reports = tmp_path / "reports"
    (reports / "final").mkdir(parents=True)
    final = final_summaries()
    final["grpo"]["accuracy"] = 0.77
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    headline = headline_metrics(reports)
    assert headline["test_accuracy"]["grpo"] == 0.77
    assert headline["grpo_best_val_accuracy"] is None
    assert headline["wall_clock_seconds"] == {"sft": None, "ei": None, "grpo": None}
    assert all(value is None for by_route in headline["cost"].values() for value in by_route.values())


# Issue 23: extra held-out sets (eval.test_sets), (correct, format_only, neither) per route on each.
TEST_SET_COUNTS = {"shifted": {"base": (0, 1, 9), "sft": (1, 6, 3), "ei": (2, 6, 2), "grpo": (3, 5, 2)}}


def test_extra_test_sets_get_a_table_each_in_the_report_and_their_accuracy_in_the_headline(
    reports_dir, report_params_file, tmp_path, undrawn_figures
):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    final = final_summaries()
    for route in ROUTES:  # as final_eval writes them: each route's summary on each set, under its test_sets
        final[route]["test_sets"] = {name: summarize(graded(*c[route])) for name, c in TEST_SET_COUNTS.items()}
    (reports / "final" / "metrics.json").write_text(json.dumps(final))

    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file, ENVIRONMENT)).blocks, "figures")
    section = markdown[markdown.index("## Extra held-out test sets") : markdown.index("## Grader cross-check")]
    assert "### Test set `shifted`" in section
    for route, (correct, format_only, neither) in TEST_SET_COUNTS["shifted"].items():
        categories = f"{correct} / {format_only} / {neither}"
        row = f"| {route} | 10 | {accuracy_cell(correct, 10)} | {10 * (correct + format_only):.1f}% | {categories} |"
        assert row in section
    assert "Change in `shifted` accuracy: SFT vs BASE +10.0 points; EI vs SFT +10.0 points" in section

    headline = headline_metrics(reports)
    assert list(headline) == [
        "test_accuracy",
        "test_set_accuracy",
        "grpo_best_val_accuracy",
        "wall_clock_seconds",
        "cost",
    ]
    assert headline["test_set_accuracy"] == {"shifted": {"base": 0.0, "sft": 0.1, "ei": 0.2, "grpo": 0.3}}

    del final["ei"]["test_sets"]  # a route without a set the others have: the file is not what final_eval writes
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    with pytest.raises(ReportInputError, match=r"metrics.json: ei: test_sets \[\], expected \['shifted'\]"):
        headline_metrics(reports)


# Issue 33: benchmarks and named protocols, (correct, format_only, neither) per route on svamp.
SVAMP_COUNTS = {"base": (0, 2, 8), "sft": (4, 4, 2), "ei": (5, 4, 1), "grpo": (9, 1, 0)}
BENCHMARK_SUMMARY = {
    "ngram": 13,
    "decontaminate": False,
    "benchmarks": {"svamp": {"answer_format": "number", "records": 1000, "ungradable": 0, "questions": 1000,
                             "contaminated": 3, "contaminated_lines": [7, 70, 700]}},
}  # fmt: skip


def test_benchmarks_and_protocols_get_a_table_per_protocol_and_their_accuracy_in_the_headline(
    reports_dir, report_params_file, tmp_path, undrawn_figures
):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    final = final_summaries()
    svamp = {route: summarize(graded(*counts)) for route, counts in SVAMP_COUNTS.items()}
    for route, reference in STARTS.items():
        paired = paired_comparison(graded(*SVAMP_COUNTS[route]), graded(*SVAMP_COUNTS[reference]))
        svamp[route]["paired"] = {"reference": reference, **paired}
    avg4 = {route: summarize(sampled([4, 2, 0, 1, 3], samples=4)) for route in ROUTES}
    for route in ROUTES:  # as final_eval writes them (reasonrl.protocols.route_summaries)
        greedy = {**final[route], "protocol": {"temperature": 0.0, "top_p": 1.0, "samples": 1}}
        sampled_summary = {**avg4[route], "protocol": {"temperature": 0.6, "top_p": 0.95, "samples": 4}}
        final[route]["benchmarks"] = {"svamp": svamp[route]}
        final[route]["protocols"] = {
            "greedy": greedy | {"benchmarks": {"svamp": svamp[route]}},
            "avg4": sampled_summary | {"benchmarks": {"svamp": avg4[route]}},
        }
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    (reports / "download").mkdir()
    (reports / "download" / "benchmarks.json").write_text(json.dumps(BENCHMARK_SUMMARY))
    params = report_params_file  # eval.* left at its defaults, as the unnamed protocol's title says

    markdown = render_markdown(build_report(ReportInputs(reports, params, ENVIRONMENT)).blocks, "figures")
    section = markdown[markdown.index("## Benchmarks and protocols") : markdown.index("## Validation accuracy")]
    titles = [line for line in section.splitlines() if line.startswith("### ")]
    assert titles == [
        "### `eval.*`: temperature 1, top-p 1, 1 sample per question",
        "### `greedy`: temperature 0, top-p 1, 1 sample per question",
        "### `avg4`: temperature 0.6, top-p 0.95, 4 samples per question",
        "### The benchmarks' questions and contamination",
    ]
    unnamed = section[: section.index("### `greedy`")]
    assert "| route | `test` | `svamp` |" in unnamed
    grpo_test = format_accuracy(final["grpo"])
    assert f"| grpo | {grpo_test} | {accuracy_cell(9, 10)} |" in unnamed
    svamp_p = format_p_value(svamp["grpo"]["paired"]["p_value"])
    assert f"| grpo | p = {format_p_value(final['grpo']['paired']['p_value'])} (vs SFT) | p = {svamp_p} (vs SFT) |" in (
        unnamed
    )
    sampled_part = section[section.index("### `avg4`") :]
    k4 = percent(avg4["grpo"]["pass_at_k"]["4"])
    assert f"| grpo | {k4} / {percent(avg4['grpo']['majority_accuracy'])} |" in sampled_part
    assert "avg@k" in sampled_part and "clustered by question" in sampled_part
    assert "| `svamp` | number | 1000 | 0 | 1000 | 3 |" in section
    assert "13-word sequence" in section and "`eval.decontaminate: true` leaves them out" in section

    headline = headline_metrics(reports)
    assert list(headline) == ["test_accuracy", "benchmark_accuracy", "protocols", "grpo_best_val_accuracy",
                              "wall_clock_seconds", "cost"]  # fmt: skip
    assert headline["benchmark_accuracy"] == {"svamp": {"base": 0.0, "sft": 0.4, "ei": 0.5, "grpo": 0.9}}
    assert headline["protocols"]["avg4"]["benchmark_accuracy"]["svamp"]["grpo"] == avg4["grpo"]["accuracy"]
    assert headline["protocols"]["greedy"]["test_accuracy"] == headline["test_accuracy"]

    assert "first" not in section  # every question asked
    capped = tmp_path / "capped.yaml"
    capped.write_text("eval:\n  benchmark_questions: 40\n", encoding="utf-8")
    markdown = render_markdown(build_report(ReportInputs(reports, capped, ENVIRONMENT)).blocks, "figures")
    assert "Each benchmark's first 40 questions only (`eval.benchmark_questions`): a quick look" in markdown

    (reports / "download" / "benchmarks.json").unlink()
    markdown = render_markdown(build_report(ReportInputs(reports, params, ENVIRONMENT)).blocks, "figures")
    assert "Contamination not shown: `" in markdown and "download/benchmarks.json` is missing." in markdown


def test_headline_without_final_metrics_names_the_file(tmp_path):
    with pytest.raises(ReportInputError, match=re.escape(str(tmp_path / "final" / "metrics.json"))):
        headline_metrics(tmp_path)


def test_headline_is_the_one_metric_file_dvc_lists(tmp_path, full_scale_params):
    """`dvc exp show` and `dvc metrics show` list the headline's few columns alone; each stage's metrics.json is a
    plain output (some 180 columns in all, with DVC's p-values rounded to 0.0)."""
    from dvc.repo import Repo

    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(full_scale_params, encoding="utf-8")
    with Repo(str(tmp_path), uninitialized=True) as repo:
        metrics = [out.def_path for out in repo.index.metrics]
        outs = {out.def_path for out in repo.index.outs}
    assert metrics == ["reports/headline.json"]
    assert {"reports/baseline/metrics.json", "reports/final/metrics.json", "reports/grpo/metrics.json"} <= outs


# Issue 20: model answers and params in report.md as raw HTML, and backticks breaking out of code spans.
MARKUP_PAYLOADS = [
    "<script>alert(1)</script>",
    "a`b",
    "```",
    "x | y",
    '"<img src=x onerror=alert(1)>"',
    "[link](javascript:alert(1)) ![pixel](http://example.com/p.png)",
    "&amp; *em* _em_ ~~gone~~ \\* trailing \\",
    "r1_zero, a__b_c and _em_",
    "# heading",
    "- item",
    "1. item",
    "---",
    "[ref]: http://example.com",
    "` spaced `` ",
    "two\nlines",
]


@pytest.mark.parametrize("payload", MARKUP_PAYLOADS)
def test_markdown_shows_every_text_as_the_html_does(payload):
    """report.md rendered by a CommonMark renderer (with GFM tables) shows what report.html shows: the text as
    text, code spans as code, whatever characters the answers and params hold."""
    import html

    from markdown_it import MarkdownIt  # CommonMark with tables; installed with dvc (through rich)

    from reasonrl.markdown import code
    from reasonrl.report.document import Heading, Paragraph, Table

    blocks = [
        Heading(2, f"{payload} heading"),
        Paragraph(payload),
        Paragraph(f"Model `{payload}` in the old style, then {code(payload)} whole, then {payload}."),
        Table(["question", payload], [[payload, code(payload)]]),
    ]
    page = render_html(blocks, {})
    body = page[page.index("<body>\n") + len("<body>\n") : page.index("\n</body>")]
    shown = MarkdownIt("commonmark").enable("table").render(render_markdown(blocks))

    def displayed(fragment: str) -> str:
        """The HTML as a browser shows it (no blank space at a block's edges), "'" unescaped as markdown-it has it."""
        fragment = fragment.replace("\n", "").replace("&#x27;", "'")
        fragment = re.sub(r'<div class="table-scroll">(<table>.*?</table>)</div>', r"\1", fragment)
        return re.sub(r"(<(?:p|td|th|h2)>)\s+|\s+(</(?:p|td|th|h2)>)", r"\1\2", fragment)

    assert displayed(shown) == displayed(body)
    assert "<script" not in body and "<img" not in body and "<a " not in body
    assert f"<code>{html.escape(payload.replace(chr(10), ' '))}</code>" in body  # code() holds it whole


def test_the_cost_table_shows_each_stages_cost_json(toy_report):
    _, markdown, _ = toy_report
    section = markdown[markdown.index("## What each stage cost") : markdown.index("## Entropy and response length")]
    # SFT: half a core-hour on 4 cores; 100 + 200 tokens generated in 10 s (20 response tokens/s), 50 + 150 trained
    # in 20 s (7.5/s, shown as 8); price 2 per core-hour; no plan on the CPU.
    sft = next(line for line in section.splitlines() if line.startswith("| sft |"))
    cells = [cell.strip() for cell in sft.strip("|").split("|")]
    assert cells[:6] == ["sft", "0.5 core-h (4 cores)", "100 + 200", "20", "50 + 150", "8"]
    assert cells[6].endswith("RSS") or "RSS, child" in cells[6]
    assert cells[7:] == ["—", "1"]
    # the fixture's run has no baseline or final_eval cost.json: said, not zero
    assert "| baseline | not recorded |" in section and "| final_eval | not recorded |" in section

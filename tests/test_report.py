"""The report stage: numbers in the tables, figures as real PNGs, a self-contained HTML page, the same report
whatever experiment runs it (a function of its deps), and clear errors for missing inputs."""

import base64
import json
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest

import reasonrl.report
from reasonrl.cli import open_live
from reasonrl.evaluation import paired_comparison, summarize
from reasonrl.report import ReportInputs, build_report, paired_sentences
from reasonrl.report.document import render_html, render_markdown
from reasonrl.report.headline import headline_metrics
from reasonrl.report.inputs import (
    ReportInputError,
    flatten,
    grpo_evaluations,
    pick_example_files,
    read_params,
)
from reasonrl.report.tables import per_question_table
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
    """Each route's summary with its cross-check, both from the hand-made answers above (10 per route)."""
    summaries = {}
    for route, counts in COUNTS.items():
        found = len(CROSSCHECK[route])
        summaries[route] = summarize(graded(*counts)) | {
            "grader_agreement": (sum(counts) - found) / sum(counts),
            "grader_disagreements": found,
        }
    return summaries


def graded(correct: int, format_only: int, neither: int) -> list[dict]:
    records = [{"reward": 1.0, "format_reward": 1.0, "length": LENGTHS["correct"]}] * correct
    records += [{"reward": 0.0, "format_reward": 1.0, "length": LENGTHS["format_only"]}] * format_only
    records += [{"reward": 0.0, "format_reward": 0.0, "length": LENGTHS["neither"]}] * neither
    return [{**record, "question_index": index} for index, record in enumerate(records)]  # one sample per question


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
                {"step": step, "prompt": "Q?", "response": f"step {step} #{i} <answer> 5 </answer> & ```", "reward": i}
                for i in range(4)
            ]
            (live_dir / "examples").mkdir(parents=True, exist_ok=True)
            (live_dir / "examples" / f"step_{step:06d}.json").write_text(json.dumps(examples), encoding="utf-8")
            live.sync()

        for step in range(GRPO_STEPS):
            if step % GRPO_EVAL_EVERY == 0:
                evaluate(step)
            for _ in range(OPTIMIZER_STEPS_PER_STEP):
                optimizer_steps += 1
                live.step = optimizer_steps
                for name, value in {"train/loss": 0.1, "train/entropy": 0.8, "rollout/response_length": 90.0}.items():
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
    (reports / "baseline").mkdir()
    baseline = {name: summarize(graded(*c)) for name, c in BASELINE_COUNTS.items()}
    (reports / "baseline" / "metrics.json").write_text(json.dumps(baseline))
    write_sft_live(reports / "sft" / "live")
    write_ei_live(reports / "ei" / "live")
    write_grpo_live(reports / "grpo" / "live")
    for stage, seconds in WALL_CLOCK_SECONDS.items():
        metrics = {"best_val_accuracy": 0.4, "best_step": 6} if stage == "grpo" else {"best_val_accuracy": 0.3}
        (reports / stage / "metrics.json").write_text(json.dumps(metrics | {"wall_clock_seconds": seconds}))
    return reports


@pytest.fixture
def report_params_file(tmp_path) -> Path:
    """Just a few params (the conftest's ``params_file`` is the full config)."""
    path = tmp_path / "params.yaml"
    path.write_text("grpo:\n  learning_rate: 1.0e-5\n  loss_type: reinforce_with_baseline\n", encoding="utf-8")
    return path


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


def test_report_tables_figures_and_html(reports_dir, report_params_file):
    report = build_report(ReportInputs(reports_dir, report_params_file))
    markdown = render_markdown(report.blocks, "figures")
    page = render_html(report.blocks, report.figures)

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
    expected = {"test_accuracy", "validation_curves", "grpo_wallclock", "training_dynamics", "categories"}
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


def test_missing_optional_inputs_are_named(reports_dir, report_params_file, tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    shutil.rmtree(reports / "ei" / "live")
    (reports / "baseline" / "metrics.json").unlink()
    shutil.rmtree(reports / "grpo" / "live" / "examples")
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file)).blocks)
    assert f"Missing: `{(reports / 'ei' / 'live' / 'plots/metrics/eval/accuracy.tsv').as_posix()}`" in markdown
    assert "ei `train/entropy`" in markdown and "ei `rollout/response_length`" in markdown
    assert f"`{(reports / 'baseline' / 'metrics.json').as_posix()}` is missing" in markdown
    assert "Not available: no `step_*.json`" in markdown


def test_disagreements_over_the_cap_are_counted(reports_dir, report_params_file, monkeypatch):
    monkeypatch.setattr(reasonrl.report, "DISAGREEMENTS_SHOWN", 2)
    markdown = render_markdown(build_report(ReportInputs(reports_dir, report_params_file)).blocks)
    assert "| grpo | 1 | -3 |" in markdown and "| grpo | 7 | 3 |" in markdown
    assert "| grpo | 8 | 12 |" not in markdown
    assert "At most 2 per route are listed, and 1 more for GRPO; all are in" in markdown


def test_missing_or_malformed_crosscheck(reports_dir, report_params_file, tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    crosscheck = reports / "final" / "grader_crosscheck.json"
    crosscheck.unlink()
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file)).blocks)
    assert "| grpo | 70.0% | 3 |" in markdown
    assert f"Disagreements not listed: `{crosscheck.as_posix()}` is missing." in markdown
    crosscheck.write_text(json.dumps({"grpo": [{"question_index": 1}]}))
    with pytest.raises(ReportInputError, match=f"{re.escape(str(crosscheck))}: grpo: expected a list of disagreements"):
        build_report(ReportInputs(reports, report_params_file))


def test_final_metrics_without_a_crosscheck_say_so(reports_dir, report_params_file, tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    (reports / "final" / "metrics.json").write_text(json.dumps({r: summarize(graded(*c)) for r, c in COUNTS.items()}))
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file)).blocks)
    assert "Not available: no route in `final/metrics.json` records `grader_agreement`." in markdown


def test_missing_final_metrics_names_the_file(tmp_path, report_params_file):
    with pytest.raises(ReportInputError, match=re.escape(str(tmp_path / "final" / "metrics.json"))):
        build_report(ReportInputs(tmp_path, report_params_file))


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


def test_stage_writes_everything_and_the_same_whatever_experiment_runs_it(reports_dir, tmp_path, monkeypatch):
    """The report is a function of its deps: run as a DVC experiment of another name, in another repository, it
    writes the same bytes (an earlier report listed the repository's experiments, which DVC never refreshed)."""
    runs = {}
    for name, env in {"plain": {}, "experiment": {"DVC_EXP_NAME": "q-clip", "DVC_ROOT": str(ROOT)}}.items():
        shutil.copytree(reports_dir, tmp_path / name / "reports")
        shutil.copy(ROOT / "params.yaml", tmp_path / name / "params.yaml")
        run_stage_script(monkeypatch, tmp_path / name, *STAGE_ARGS, "--figures", "reports/figures", env=env)
        runs[name] = outputs(tmp_path / name / "reports")
    assert runs["plain"] == runs["experiment"]

    reports = tmp_path / "plain" / "reports"
    markdown = (reports / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((figures/[a-z_]+\.png)\)", markdown)
    assert len(links) == 5
    for link in links:
        assert (reports / link).read_bytes().startswith(PNG_MAGIC)
    assert "data:image/png;base64," in (reports / "report.html").read_text(encoding="utf-8")
    headline = json.loads((reports / "headline.json").read_text(encoding="utf-8"))
    assert headline == headline_metrics(reports_dir) and headline["test_accuracy"]["grpo"] == 0.6


def test_stage_without_final_metrics_exits_with_the_file_name(tmp_path, monkeypatch, capsys):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
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
        "20 only for SFT), p = 0.0061",
    ]


def test_several_samples_per_question_are_reported_clustered_by_question(reports_dir, report_params_file, tmp_path):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    rights = {"base": [0, 0, 1, 0], "sft": [4, 0, 2, 0], "ei": [4, 1, 2, 1], "grpo": [4, 4, 0, 3]}
    records = {route: sampled(right) for route, right in rights.items()}
    final = {route: summarize(records[route]) for route in ROUTES}
    final["sft"]["paired"] = {"reference": "base", **paired_comparison(records["sft"], records["base"])}
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file)).blocks)

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
        "questions, for BASE on 0 (5 answers right only for SFT, 0 only for BASE), p = 0.5." in markdown
    )
    assert "McNemar" not in markdown and "one per question" not in markdown


# ---------------------------------------------------------------------------------------- headline metrics
def test_headline_is_read_from_the_route_metrics(reports_dir, tmp_path):
    headline = headline_metrics(reports_dir)
    assert headline == {
        "test_accuracy": {route: counts[0] / sum(counts) for route, counts in COUNTS.items()},
        "grpo_best_val_accuracy": 0.4,
        "wall_clock_seconds": WALL_CLOCK_SECONDS,
    }
    # In reading order, which is the order `dvc exp show` gives the columns: routes as final_eval runs them.
    assert list(headline) == ["test_accuracy", "grpo_best_val_accuracy", "wall_clock_seconds"]
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


# Issue 23: extra held-out sets (eval.test_sets), (correct, format_only, neither) per route on each.
TEST_SET_COUNTS = {"shifted": {"base": (0, 1, 9), "sft": (1, 6, 3), "ei": (2, 6, 2), "grpo": (3, 5, 2)}}


def test_extra_test_sets_get_a_table_each_in_the_report_and_their_accuracy_in_the_headline(
    reports_dir, report_params_file, tmp_path
):
    reports = tmp_path / "reports"
    shutil.copytree(reports_dir, reports)
    final = final_summaries()
    for route in ROUTES:  # as final_eval writes them: each route's summary on each set, under its test_sets
        final[route]["test_sets"] = {name: summarize(graded(*c[route])) for name, c in TEST_SET_COUNTS.items()}
    (reports / "final" / "metrics.json").write_text(json.dumps(final))

    markdown = render_markdown(build_report(ReportInputs(reports, report_params_file)).blocks, "figures")
    section = markdown[markdown.index("## Extra held-out test sets") : markdown.index("## Grader cross-check")]
    assert "### Test set `shifted`" in section
    for route, (correct, format_only, neither) in TEST_SET_COUNTS["shifted"].items():
        categories = f"{correct} / {format_only} / {neither}"
        row = f"| {route} | 10 | {accuracy_cell(correct, 10)} | {10 * (correct + format_only):.1f}% | {categories} |"
        assert row in section
    assert "Change in `shifted` accuracy: SFT vs BASE +10.0 points; EI vs SFT +10.0 points" in section

    headline = headline_metrics(reports)
    assert list(headline) == ["test_accuracy", "test_set_accuracy", "grpo_best_val_accuracy", "wall_clock_seconds"]
    assert headline["test_set_accuracy"] == {"shifted": {"base": 0.0, "sft": 0.1, "ei": 0.2, "grpo": 0.3}}

    del final["ei"]["test_sets"]  # a route without a set the others have: the file is not what final_eval writes
    (reports / "final" / "metrics.json").write_text(json.dumps(final))
    with pytest.raises(ReportInputError, match=r"metrics.json: ei: test_sets \[\], expected \['shifted'\]"):
        headline_metrics(reports)


def test_headline_without_final_metrics_names_the_file(tmp_path):
    with pytest.raises(ReportInputError, match=re.escape(str(tmp_path / "final" / "metrics.json"))):
        headline_metrics(tmp_path)


def test_headline_is_the_first_metric_file_dvc_lists(tmp_path, full_scale_params):
    """`dvc exp show` and `dvc metrics show` list metric files in the order of DVC's index (dvc.yaml's declaration
    order), so the headline's columns come first."""
    from dvc.repo import Repo

    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(full_scale_params, encoding="utf-8")
    with Repo(str(tmp_path), uninitialized=True) as repo:
        metrics = [out.def_path for out in repo.index.metrics]
    assert metrics[0] == "reports/headline.json" and "reports/baseline/metrics.json" in metrics[1:]


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
        return re.sub(r"(<(?:p|td|th|h2)>)\s+|\s+(</(?:p|td|th|h2)>)", r"\1\2", fragment)

    assert displayed(shown) == displayed(body)
    assert "<script" not in body and "<img" not in body and "<a " not in body
    assert f"<code>{html.escape(payload.replace(chr(10), ' '))}</code>" in body  # code() holds it whole

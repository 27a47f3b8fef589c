"""``python -m reasonrl.compare``: the changed params, test accuracy with intervals and paired tests per route of
hand-made experiments, and experiments read through DVC from a real repository (a commit and the workspace)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.compare import (
    CompareError,
    Experiment,
    build_comparison,
    build_settings_comparison,
    comparison_rows,
    cost_panels,
    load_experiment,
    main,
    paired_row,
    params_table,
    parse_final,
    parse_generations,
    setting_route,
)
from reasonrl.evaluation import summarize
from reasonrl.protocols import BENCHMARK_SETS, TEST, UNNAMED_TEST, Slot
from reasonrl.report.document import render_html, render_markdown
from reasonrl.report.tables import format_accuracy
from reasonrl.routes import ROUTES
from reasonrl.statistics import minimum_detectable_difference, seed_variance_components, seeds_and_questions_interval

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def graded(right: list[int], samples: int = 1, questions: str = "q") -> list[dict]:
    """``samples`` answers per question, the first ``right[q]`` of them right; question texts ``{questions}{q}``."""
    return [
        {"question_index": q, "question": f"{questions}{q}", "reward": float(i < r), "format_reward": 1.0,
         "answer": "1", "length": 5}
        for q, r in enumerate(right) for i in range(samples)
    ]  # fmt: skip


REFERENCE = [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # 2 of 10 right
BETTER = [1, 0, 1, 1, 1, 1, 1, 0, 0, 0]  # 6 of 10: right alone on 5 questions, wrong alone on 1


def experiment(
    name: str, params: dict, right: dict[str, list[int]], samples: int = 1, costs: dict | None = None
) -> Experiment:
    generations = {route: graded(right.get(route, REFERENCE), samples) for route in ROUTES}
    final = {route: summarize(records) for route, records in generations.items()}
    curves = {"sft": [(2, 0.1), (4, 0.3)], "ei": None, "grpo": None}
    return Experiment(name, params, final, {UNNAMED_TEST: generations}, curves, costs or {})


def core_hours(hours: float) -> dict:
    """A training stage's cost.json, as far as compare reads it."""
    return {"device_hours": hours, "device_hours_unit": "cpu_core_hours"}


def test_params_table_lists_only_the_params_that_differ():
    a = experiment("a", {"grpo.loss_type": "grpo_clip", "grpo.lr": 1e-5, "eval.stop": ["</answer>"]}, {})
    b = experiment("b", {"grpo.loss_type": "no_baseline", "grpo.lr": 1e-5, "eval.stop": ["</answer>"]}, {})
    c = experiment("c", {"grpo.loss_type": "grpo_clip", "grpo.lr": 1e-5, "eval.stop": ["</answer>"], "x.y": 2}, {})
    table = params_table([a, b, c])
    assert table.headers == ["param", "`a`", "`b`", "`c`"]
    assert table.rows == [
        ["`grpo.loss_type`", "`grpo_clip`", "`no_baseline`", "`grpo_clip`"],
        ["`x.y`", "—", "—", "`2`"],  # a param one experiment has and the others lack differs too
    ]
    assert params_table([a, a]) is None


def test_paired_row_counts_and_p_value_against_the_reference():
    reference = experiment("ref", {}, {})
    this = experiment("new", {}, {"grpo": BETTER})
    # McNemar's exact test on 5 vs 1 discordant answers: 2 · P(X ≤ 1), X ~ Bin(6, 1/2) = 2 · 7/64.
    assert paired_row("grpo", this, reference) == ["grpo", "`new`", "`ref`", "5 / 1", "5 / 1", "McNemar exact",
                                                   f"{14 / 64:.3g}"]  # fmt: skip
    assert paired_row("sft", this, reference)[3:] == ["0 / 0 (the same answers)", "0 / 0", "McNemar exact", "1"]


def test_paired_row_with_several_samples_flips_whole_questions():
    reference = experiment("ref", {}, {"grpo": [0, 0, 0, 1]}, samples=2)
    this = experiment("new", {}, {"grpo": [2, 2, 1, 0]}, samples=2)
    # Per-question differences +2, +2, +1, −1 (sum 4): of the 16 sign patterns of 2, 2, 1, 1, those with |sum| ≥ 4
    # are +2+2 with +1+1 (6) or with the ones of opposite signs (4, two ways), and their mirrors: p = 6/16.
    assert paired_row("grpo", this, reference)[3:] == ["5 / 1", "3 / 1", "exact sign-flip by question", "0.375"]


def test_paired_row_says_why_there_is_no_test():
    reference = experiment("ref", {}, {})
    other_questions = experiment("other", {}, {})
    other_questions.generations[UNNAMED_TEST]["grpo"] = graded(BETTER, questions="another question ")
    assert paired_row("grpo", other_questions, reference)[3] == (
        "not paired: different test questions or samples per question"
    )
    no_answers = experiment("old", {}, {})
    no_answers.generations[UNNAMED_TEST]["ei"] = None
    assert paired_row("ei", no_answers, reference)[3] == (
        "not paired: no `reports/final/generations/ei.jsonl` in `old`"
    )


def test_the_page_leads_with_params_then_accuracy_then_paired_tests():
    reference = experiment("reference", {"grpo.loss_type": "grpo_clip"}, {})
    odd = "no|base`line <b>"  # a name with a table pipe, a backtick and HTML: escaped wherever it shows
    other = experiment(odd, {"grpo.loss_type": "no_baseline"}, {"grpo": BETTER})
    report = build_comparison([reference, other])
    markdown = render_markdown(report.blocks, "figures")
    headings = [line for line in markdown.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Params that differ",
        "## Test accuracy per route",
        "## Paired tests against `reference`",
        "## Validation accuracy during training",
        "## Test accuracy against training cost",
    ]
    assert "Not available: no experiment holds a training stage's `cost.json`." in markdown
    assert "| `grpo.loss_type` | `grpo_clip` | `no_baseline` |" in markdown
    for route in ROUTES:
        cells = [format_accuracy(e.final[route]) for e in (reference, other)]
        assert f"| {route} | {cells[0]} | {cells[1]} |" in markdown
    assert "| grpo | 20.0% [" in markdown and "] | 60.0% [" in markdown and "95% Wilson score interval" in markdown
    assert "| grpo | ``no\\|base`line <b>`` | `reference` | 5 / 1 | 5 / 1 | McNemar exact | 0.219 |" in markdown
    page = render_html(report.blocks, report.figures)
    assert "<code>no|base`line &lt;b&gt;</code>" in page and "<b>" not in page
    assert report.figures["validation_curves.png"].startswith(PNG_MAGIC)


EVAL_PARAMS = {"eval.temperature": 1.0, "eval.top_p": 1.0, "eval.samples_per_question": 1}
GREEDY = {"temperature": 0.0, "top_p": 1.0, "samples": 1}


def with_benchmark(base: Experiment, svamp_grpo: list[int]) -> Experiment:
    """``base`` with the benchmark svamp under ``eval.*`` and the test split and svamp under the protocol greedy:
    every route answers as on the test split, but GRPO gets ``svamp_grpo`` right on svamp."""
    generations = dict(base.generations)
    test = base.generations[UNNAMED_TEST]
    svamp = {route: graded(svamp_grpo) if route == "grpo" else test[route] for route in ROUTES}
    for slot, answers in {Slot(None, BENCHMARK_SETS, "svamp"): svamp, Slot("greedy", TEST): test,
                          Slot("greedy", BENCHMARK_SETS, "svamp"): svamp}.items():  # fmt: skip
        generations[slot] = answers
    final = {}
    for route, summary in base.final.items():
        benchmarks = {"svamp": summarize(svamp[route])}
        greedy = summary | {"protocol": GREEDY, "benchmarks": benchmarks}
        final[route] = summary | {"benchmarks": benchmarks, "protocols": {"greedy": greedy}}
    return Experiment(base.name, {**base.params, **EVAL_PARAMS}, final, generations, base.curves)


def test_benchmarks_and_protocols_get_a_table_each_with_the_paired_test_per_benchmark():
    demo = experiment("demo", EVAL_PARAMS, {})  # no benchmark, no protocol
    ref = with_benchmark(experiment("ref", {}, {}), REFERENCE)
    new = with_benchmark(experiment("new", {}, {}), BETTER)
    markdown = render_markdown(build_comparison([ref, new], figures=False).blocks)
    section = markdown[markdown.index("## Benchmarks and protocols") :]
    assert [line for line in section.splitlines() if line.startswith("### ")] == [
        "### `eval.*`: temperature 1, top-p 1, 1 sample per question",
        "### `greedy`: temperature 0, top-p 1, 1 sample per question",
    ]
    unnamed, greedy = section.split("### `greedy`")
    better, reference = (format_accuracy(summarize(graded(right))) for right in (BETTER, REFERENCE))
    assert f"| `svamp` | grpo | {reference} | {better} |" in unnamed
    assert "| `svamp` | grpo | `new` | `ref` | 5 / 1 | 5 / 1 | McNemar exact | 0.219 |" in unnamed
    assert "| `test` |" not in unnamed  # the unnamed test split is the page's first table
    assert "| `test` | grpo | `new` | `ref` | 0 / 0 (the same answers) | 0 / 0 | McNemar exact | 1 |" in greedy
    assert "| `svamp` | grpo | `new` | `ref` | 5 / 1 | 5 / 1 | McNemar exact | 0.219 |" in greedy

    against_demo = render_markdown(build_comparison([demo, new], figures=False).blocks)
    assert f"| `svamp` | grpo | — | {better} |" in against_demo
    assert "| `svamp` | grpo | `new` | `demo` | not paired: `demo` has no svamp (benchmark) | — | — | — |" in (
        against_demo
    )
    assert "## Benchmarks and protocols" not in render_markdown(build_comparison([demo, demo], figures=False).blocks)


def test_answers_are_read_a_line_per_newline_whatever_the_model_wrote():
    """A model's answer may hold U+2028 or U+0085, which JSON leaves unescaped and ``str.splitlines`` would split."""
    records = [{"question_index": 0, "response": "a\u2028b\x85c\x1c"}, {"question_index": 1, "response": "d"}]
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    assert parse_generations(text) == records


def test_experiment_names_are_drawn_as_written(monkeypatch):
    """Names DVC accepts with a ``$`` (matplotlib's mathtext) or a leading ``_`` (which a legend leaves out) are
    legend entries as written."""
    from reasonrl.report import figures

    names = ["reference", "x$_$", "x${$", "$$", "_hidden", "a\\$b"]
    drawn, png = [], figures.png
    monkeypatch.setattr(figures, "png", lambda figure: drawn.append(figure) or png(figure))
    build_comparison([experiment(name, {}, {}) for name in names])
    (figure,) = drawn  # the validation curves; none of them has a cost.json to plot
    legend = figure.axes[0].get_legend()  # the SFT panel: every experiment logged a curve
    # What each entry shows: Text._preprocess_math is how matplotlib reads a string before drawing it.
    shown = [text._preprocess_math(text.get_text()) for text in legend.get_texts()]
    assert shown == [(name, False) for name in names]


def test_accuracy_is_plotted_against_each_training_stages_device_hours(monkeypatch):
    from reasonrl.report import figures

    reference = experiment("reference", {}, {}, costs={"sft": core_hours(0.5), "grpo": core_hours(2.0)})
    better = experiment("better", {}, {"grpo": BETTER}, costs={"sft": core_hours(0.5), "grpo": core_hours(3.0)})
    unrecorded = experiment("unrecorded", {}, {})  # made before cost.json existed: left out, not drawn at 0
    panels = {panel.title: panel for panel in cost_panels([reference, better, unrecorded])}
    assert panels["GRPO"].curves == {"reference": [(2.0, 0.2)], "better": [(3.0, 0.6)]}
    assert panels["SFT"].curves == {"reference": [(0.5, 0.2)], "better": [(0.5, 0.2)]}
    assert panels["EI"].curves == {}
    assert panels["GRPO"].xlabel == "device-hours (core-h)" and not panels["GRPO"].integer_x

    drawn, png = [], figures.png
    monkeypatch.setattr(figures, "png", lambda figure: drawn.append(figure) or png(figure))
    report = build_comparison([reference, better, unrecorded])
    assert report.figures["accuracy_vs_cost.png"].startswith(PNG_MAGIC)
    grpo_axes = drawn[-1].axes[2]
    points = [tuple(line.get_xydata()[0]) for line in grpo_axes.get_lines()]
    assert points == [(2.0, 0.2), (3.0, 0.6)]


def test_a_page_needs_a_baseline_and_an_experiment_and_every_route():
    with pytest.raises(CompareError, match="a baseline and at least one experiment"):
        build_comparison([experiment("a", {}, {})])
    with pytest.raises(CompareError, match="no test summary for ei, grpo"):
        parse_final(json.dumps({"base": {"accuracy": 0.1, "accuracy_interval": {}}, "sft": {"accuracy": 0,
                                "accuracy_interval": {}}}), "x")  # fmt: skip


# ------------------------------------------------------------------------------------------------- through DVC


def write_run(root: Path, loss_type: str, grpo_right: list[int]) -> None:
    """The files compare reads, as the pipeline writes them: params, test summaries and answers, GRPO's curves."""
    (root / "params.yaml").write_text(f"grpo:\n  loss_type: {loss_type}\n  lr: 1.0e-05\n", encoding="utf-8")
    final = root / "reports" / "final"
    (final / "generations").mkdir(parents=True, exist_ok=True)
    summaries = {}
    for route in ROUTES:
        records = graded(grpo_right if route == "grpo" else REFERENCE)
        summaries[route] = summarize(records)
        (final / "generations" / f"{route}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (final / "metrics.json").write_text(json.dumps(summaries))
    (root / "reports" / "grpo").mkdir(parents=True, exist_ok=True)
    (root / "reports" / "grpo" / "cost.json").write_text(json.dumps(core_hours(0.5 if loss_type == "grpo_clip" else 1)))
    curves = root / "reports" / "grpo" / "live" / "plots" / "metrics"
    for name, rows in {
        "eval/accuracy": [(0, 0.1), (4, 0.5)],  # DVCLive steps: optimizer steps, two per GRPO step
        "time/elapsed_seconds": [(0, 0.0), (4, 3.0)],
        "grpo_step": [(0, 0), (2, 1), (4, 2)],
    }.items():
        (curves / name).parent.mkdir(parents=True, exist_ok=True)
        column = name.rsplit("/", 1)[-1]
        (curves / f"{name}.tsv").write_text(f"step\t{column}\n" + "".join(f"{s}\t{v}\n" for s, v in rows))


@pytest.fixture
def dvc_repo(tmp_path, monkeypatch):
    """A DVC repository: a commit with one run's files, the workspace with another's."""
    monkeypatch.chdir(tmp_path)

    def run(*command: str) -> None:
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    run("git", "init", "-q", "-b", "main")
    run(sys.executable, "-m", "dvc", "init", "-q")
    write_run(tmp_path, "grpo_clip", REFERENCE)
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a run")
    write_run(tmp_path, "no_baseline", BETTER)
    return tmp_path


def test_a_commit_and_the_workspace_compared_through_dvc(dvc_repo, capsys):
    committed = load_experiment("HEAD")
    assert committed.params == {"grpo.loss_type": "grpo_clip", "grpo.lr": 1e-05}
    assert committed.final["grpo"]["accuracy"] == 0.2
    assert committed.curves["grpo"] == [(0, 0.1), (2, 0.5)]  # by GRPO step, joined as the report joins them
    assert committed.curves["sft"] is None and committed.generations[UNNAMED_TEST]["grpo"] == graded(REFERENCE)
    assert committed.costs == {"grpo": core_hours(0.5)}  # SFT and EI wrote none

    main(["workspace", "--against", "main", "--out", "compare.md", "--html", "compare.html"])
    markdown = (dvc_repo / "compare.md").read_text(encoding="utf-8")
    assert "| `grpo.loss_type` | `grpo_clip` | `no_baseline` |" in markdown
    assert "`grpo.lr`" not in markdown
    assert "| grpo | `workspace` | `main` | 5 / 1 | 5 / 1 | McNemar exact | 0.219 |" in markdown
    assert "](compare_figures/validation_curves.png)" in markdown
    assert (dvc_repo / "compare_figures" / "validation_curves.png").read_bytes().startswith(PNG_MAGIC)
    assert (dvc_repo / "compare_figures" / "accuracy_vs_cost.png").read_bytes().startswith(PNG_MAGIC)
    assert "data:image/png;base64," in (dvc_repo / "compare.html").read_text(encoding="utf-8")
    assert capsys.readouterr().out == "compare: compare.md, compare.html\n"

    main(["workspace", "--against", "HEAD"])  # no file asked for: Markdown on stdout, without figures
    printed = capsys.readouterr().out
    assert printed.startswith("# Experiments compared with `HEAD`: `workspace`") and ".png" not in printed


def exp_save(name: str) -> None:
    subprocess.run([sys.executable, "-m", "dvc", "exp", "save", "--name", name, "--quiet"], check=True, timeout=120)


def test_one_experiment_is_compared_with_the_demo(dvc_repo, capsys):
    """``compare EXP`` sets EXP beside ``demo``, the experiment ``make demo`` records (here the workspace's run, saved
    as DVC saves it); without one, the error says what records it."""
    with pytest.raises(CompareError, match=r"^no experiment named 'demo' to compare against: `make demo` records it; "
                                           r"or name another baseline with --against"):  # fmt: skip
        main(["workspace"])
    exp_save("demo")
    write_run(dvc_repo, "grpo_clip", REFERENCE)  # the workspace now holds the committed run again
    main(["workspace"])
    printed = capsys.readouterr().out
    assert printed.startswith("# Experiments compared with `demo`: `workspace`\n")
    assert "| `grpo.loss_type` | `no_baseline` | `grpo_clip` |" in printed
    assert "| grpo | `workspace` | `demo` | 1 / 5 | 1 / 5 | McNemar exact | 0.219 |" in printed
    main(["demo", "workspace"])  # of several, the first is the baseline
    assert capsys.readouterr().out == printed
    main(["HEAD", "workspace", "--against", "demo"])  # the baseline among them: compared once
    assert capsys.readouterr().out.startswith("# Experiments compared with `demo`: `HEAD`, `workspace`\n")
    with pytest.raises(CompareError, match=r"^nothing to compare: 'demo' is the baseline; name another experiment"):
        main(["demo"])


def test_what_has_no_results_says_what_to_run(dvc_repo):
    """The workspace before a run, a git revision that records no results and an experiment that did not reach
    final_eval: each error names the case and the command that makes results."""
    for path in (dvc_repo / "reports").rglob("*.json"):
        path.unlink()
    subprocess.run(["git", "rm", "-q", "--cached", "-r", "reports"], check=True, timeout=120)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "no results"], check=True)
    with pytest.raises(CompareError, match=r"^workspace: no reports/final/metrics.json on disk: `dvc repro` writes "):
        main(["workspace", "--against", "HEAD~1"])
    with pytest.raises(CompareError) as commit:
        main(["HEAD~1", "--against", "HEAD"])
    assert str(commit.value).startswith(
        "'HEAD' is a git revision without the pipeline's results (its dvc.lock records no reports/final/metrics.json): "
        "compare experiments instead: `make demo` records 'demo', `dvc exp run --name NAME -S key=value` an ablation"
    )
    exp_save("sft-only")
    with pytest.raises(CompareError, match=r"^experiment 'sft-only' has no reports/final/metrics.json: it did not "):
        main(["sft-only", "--against", "HEAD~1"])


def test_an_unknown_experiment_is_named(dvc_repo):
    done = subprocess.run(
        [sys.executable, "-m", "reasonrl.compare", "no-such-exp", "--against", "main"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "error: unknown experiment 'no-such-exp': not an experiment name, a git revision or 'workspace'" in (
        done.stderr
    )


# Settings over seeds: three settings of three seeds each, on 10 test questions with one sample each. GRPO's right
# answers per seed (its accuracy: ref 0.2, 0.3, 0.4; clip 0.5, 0.6, 0.7; lr 0.3, 0.4, 0.5); the other routes answer as
# REFERENCE in every seed (no seed-to-seed spread).
SEEDED_GRPO = {
    "ref": [[1, 1] + [0] * 8, [1, 1, 1] + [0] * 7, [1, 1, 1, 1] + [0] * 6],
    "clip": [[1] * 5 + [0] * 5, [1] * 6 + [0] * 4, [0] + [1] * 7 + [0] * 2],
    "lr": [[1, 1, 1] + [0] * 7, [0] * 6 + [1] * 4, [1] * 5 + [0] * 5],
}
SEEDED_PARAMS = {"ref": "reinforce_with_baseline", "clip": "grpo_clip", "lr": "reinforce_with_baseline"}


def seeded(setting: str) -> list[Experiment]:
    params = {"grpo.loss_type": SEEDED_PARAMS[setting], "grpo.learning_rate": 3e-5 if setting == "lr" else 1e-5}
    return [
        experiment(f"{setting}-seed{seed}", {**params, "grpo.seed": seed, "sft.seed": seed}, {"grpo": right})
        for seed, right in enumerate(SEEDED_GRPO[setting])
    ]


def two_sided_t4(t: float) -> float:
    """P(|T| ≥ t) with 4 degrees of freedom, in closed form: 1 − (3x − x³) / 2, x = t / √(4 + t²)."""
    x = t / math.sqrt(4 + t * t)
    return 1 - (3 * x - x**3) / 2


def test_settings_are_summarised_over_their_seeds_by_hand():
    routes = {route: [setting_route(s, seeded(s), route) for s in ("ref", "clip", "lr")] for route in ROUTES}
    ref, clip, lr = routes["grpo"]
    assert ref.accuracies == [0.2, 0.3, 0.4] and clip.accuracies == [0.5, 0.6, 0.7] and lr.accuracies == [0.3, 0.4, 0.5]
    assert (ref.mean, clip.mean, lr.mean) == pytest.approx((0.3, 0.6, 0.4))
    assert (ref.sd, clip.sd, lr.sd) == pytest.approx((0.1, 0.1, 0.1))  # √(((−0.1)² + 0 + 0.1²) / 2)
    assert clip.per_question[2] == [0.0] + [1.0] * 7 + [0.0] * 2
    # The interval over seeds and questions (its coverage is tests/test_statistics.py's): 3 seeds of 10 questions,
    # wide; at least the t-interval on the seed means, 0.6 ± t₀.₉₇₅(2) · 0.1 / √3.
    assert clip.interval == seeds_and_questions_interval(clip.per_question)
    low, high = clip.interval
    assert low <= 0.6 - 4.302653 * 0.1 / math.sqrt(3) and high >= 0.6 + 4.302653 * 0.1 / math.sqrt(3)

    rows = {row["setting"]: row for row in comparison_rows({"grpo": routes["grpo"]})}
    # Equal variances, 3 seeds each: t = difference / √(0.01/3 + 0.01/3) with 4 degrees of freedom.
    stderr = math.sqrt(0.02 / 3)
    assert rows["clip"]["difference"] == pytest.approx(0.3) and rows["clip"]["df"] == pytest.approx(4.0)
    p_clip, p_lr = two_sided_t4(0.3 / stderr), two_sided_t4(0.1 / stderr)  # 0.0213, 0.288
    assert rows["clip"]["p_value"] == pytest.approx(p_clip) and rows["lr"]["p_value"] == pytest.approx(p_lr)
    # Holm over the two comparisons: the smaller p doubled, the larger max(that, itself · 1).
    assert rows["clip"]["holm_p_value"] == pytest.approx(2 * p_clip)
    assert rows["lr"]["holm_p_value"] == pytest.approx(max(2 * p_clip, p_lr))
    between, within = (
        (a + b) / 2 for a, b in zip(*(seed_variance_components(s.per_question) for s in (clip, ref)), strict=True)
    )
    assert rows["clip"]["detectable"] == pytest.approx(minimum_detectable_difference(between, within, 3, 10))

    base_rows = comparison_rows({"base": routes["base"]})
    assert all(math.isnan(row["p_value"]) and row["difference"] == pytest.approx(0) for row in base_rows)  # no test


def test_the_settings_page_shows_mean_sd_interval_and_corrected_p():
    report = build_settings_comparison({s: seeded(s) for s in ("ref", "clip", "lr")})
    markdown = render_markdown(report.blocks, "figures")
    assert "| `grpo.learning_rate` | `1e-05` | `1e-05` | `3e-05` |" in markdown
    assert "| `grpo.loss_type` | `reinforce_with_baseline` | `grpo_clip` | `reinforce_with_baseline` |" in markdown
    assert "grpo.seed" not in markdown.split("## Test accuracy")[0]  # the seeds are no setting's param
    assert "| grpo | `clip` | 3 | 60.0% ± 10.0 | [" in markdown and "| 50.0, 60.0, 70.0 |" in markdown
    p_clip = two_sided_t4(0.3 / math.sqrt(0.02 / 3))
    assert f"| grpo | `clip` | `ref` | +30.0 pts | 3.67 (4.0) | {p_clip:.3g} | {2 * p_clip:.3g} |" in markdown
    assert "| base | `clip` | `ref` | +0.0 pts | no seed-to-seed spread | — | — | — |" in markdown
    # The page says how its interval and its detectable difference are obtained.
    assert "the seeds' part with the t quantile of seeds − 1 degrees of freedom" in markdown
    assert "Detectable: the smallest true difference Welch's test at level 0.05 detects 80% of the time" in markdown
    assert report.figures["seeds.png"].startswith(PNG_MAGIC)
    # Two settings: one comparison per route, nothing to correct, no Holm column.
    two = render_markdown(build_settings_comparison({s: seeded(s) for s in ("ref", "clip")}, figures=False).blocks)
    assert "p (Holm)" not in two and "| grpo | `clip` | `ref` | +30.0 pts |" in two


def test_a_setting_whose_seeds_differ_in_more_than_seeds_is_refused():
    mixed = seeded("ref")
    mixed[1] = seeded("lr")[1]
    with pytest.raises(CompareError, match=r"setting 'ref': its experiments differ in grpo.learning_rate, not only"):
        build_settings_comparison({"ref": mixed, "clip": seeded("clip")})


def test_settings_take_no_experiments_and_no_baseline(capsys):
    for argv in (["--settings", "a", "b", "--against", "x"], ["exp", "--settings", "a", "b"], []):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
    assert "name an experiment to compare (EXP), or settings with --settings" in capsys.readouterr().err

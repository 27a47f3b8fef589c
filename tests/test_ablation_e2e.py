"""Ablations end to end, as a user runs them: ``make demo`` (the whole pipeline recorded as the DVC experiment
``demo``) on the CPU preset's synthetic task, shrunk; a second experiment with another GRPO loss, then
``python -m reasonrl.compare`` and ``dvc metrics diff``; then the other recipes as experiments."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pipeline_repo import (
    EXAMPLE_DATA,
    EXAMPLE_FIELDS,
    EXAMPLE_SHA256,
    REPO,
    TINY_PIPELINE_OVERRIDES,
    check_cost,
    make_pipeline_repo,
    run,
)

from reasonrl.presets import apply_to_file
from reasonrl.routes import ROUTES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_pipeline_repo(tmp_path_factory.mktemp("ablation"), TINY_PIPELINE_OVERRIDES)


def experiment_names(clone, env) -> set[str]:
    """The experiments of the current commit, as ``dvc exp show --json`` lists them."""
    shown = json.loads(run(["dvc", "exp", "show", "--json"], clone, env))
    return {
        exp["name"] for commit in shown for experiment in commit.get("experiments") or [] for exp in experiment["revs"]
    }


def run_all_output(command: list[str], clone, env) -> subprocess.CompletedProcess:
    """``command`` with its stdout and stderr together, as a terminal shows them."""
    return subprocess.run(command, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def readme_flow() -> list[str]:
    """The commands of the README's "From the demo to an ablation and its comparison" block, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## From the demo to an ablation and its comparison\n", 1)[1].split("```bash\n", 1)[1]
    return [line.split("  #", 1)[0].strip() for line in block.split("```", 1)[0].splitlines()]


def in_users_shell(command: str, clone, env) -> subprocess.CompletedProcess:
    """``command`` in bash after the README's ``source .venv/bin/activate``, from a PATH without this venv's bin (a
    user's shell): a stage command's ``python`` is found only through the activation."""
    venv_bin = Path(sys.executable).parent
    path = [entry for entry in env["PATH"].split(":") if Path(entry) != venv_bin]
    (clone / ".venv").unlink(missing_ok=True)
    (clone / ".venv").symlink_to(venv_bin.parent)  # what `make setup` makes; git-ignored
    shell = {**env, "PATH": ":".join(path)}
    return run_all_output(["bash", "-c", f"source .venv/bin/activate && {command}"], clone, shell)


def make_demo(clone, env) -> subprocess.CompletedProcess:
    """``make demo`` on the params the clone committed (the shrunk preset: ``PRESET=`` writes none), with this
    interpreter's venv (``-o setup``: `make setup` would install into it)."""
    venv = Path(sys.executable).parent.parent
    return run_all_output(["make", "-o", "setup", "demo", "PRESET=", f"VENV={venv}"], clone, env)


def test_the_demo_then_an_ablation_then_its_comparison_as_the_readme_runs_them(repo, tmp_path):
    """The three commands of the README's flow: ``make demo`` (every stage, recorded as the DVC experiment ``demo``,
    ending with the headline table, no warnings), ``dvc exp run --name no-baseline -S grpo.loss_type=no_baseline``
    (the GRPO stages rerun) and ``python -m reasonrl.compare no-baseline`` (against ``demo``)."""
    from reasonrl.demo import format_p
    from reasonrl.evaluation import paired_comparison
    from reasonrl.report.tables import format_accuracy

    clone, env = repo
    demo = make_demo(clone, env)
    print(demo.stdout)
    assert demo.returncode == 0, demo.stdout
    assert not re.search("(?i)warning", demo.stdout)  # DVC's empty test_sets directory, vLLM's start-up notices
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    first_grpo_answers = (clone / "reports/final/generations/grpo.jsonl").read_text()
    assert set(final) == set(ROUTES)
    for summary in final.values():  # the whole test split, every route, same sampling
        assert summary["n"] == 24 and sum(summary["categories"].values()) == 24
    for name in ROUTES:
        assert len((clone / f"reports/final/generations/{name}.jsonl").read_text().splitlines()) == 24
    html = (clone / "reports/report.html").read_text()
    assert "data:image/png;base64," in html and 'src="figures/' not in html
    costs = {stage: check_cost(clone / "reports", stage) for stage in ("baseline", "sft", "ei", "grpo", "final")}
    headline_cost = json.loads((clone / "reports/headline.json").read_text())["cost"]
    assert headline_cost["device_hours"] == {route: costs[route]["device_hours"] for route in ("sft", "ei", "grpo")}
    assert all(hours > 0 for hours in headline_cost["device_hours"].values())
    assert headline_cost["price"] == {"sft": None, "ei": None, "grpo": None}  # cost.device_hour_price: null
    table = demo.stdout[demo.stdout.index("Test accuracy on 24 answers to 24 test questions") :]
    rows = {line.split()[0]: line for line in table.splitlines()[3:7]}
    assert list(rows) == list(ROUTES)
    for route, summary in final.items():
        paired = summary.get("paired")
        cells = [format_accuracy(summary)] + (
            [] if paired is None else [paired["reference"], format_p(paired["p_value"])]
        )
        assert all(f"  {cell}  " in rows[route] for cell in cells), rows[route]
    assert "recorded as the DVC experiment `demo`" in table
    assert "demo" in experiment_names(clone, env)

    again = make_demo(clone, env)  # twice in a row: nothing reruns, `demo` is recorded anew
    assert again.returncode == 0 and "Running stage" not in again.stdout, again.stdout
    assert again.stdout[again.stdout.index("Test accuracy on") :].splitlines()[:7] == table.splitlines()[:7]

    demo_line, activate, ablation, comparison = readme_flow()
    assert demo_line == "make setup && make demo" and activate == "source .venv/bin/activate"
    assert ablation == "dvc exp run --name no-baseline -S grpo.loss_type=no_baseline"  # what this test checks
    assert comparison == "python -m reasonrl.compare no-baseline"
    ablated = in_users_shell(ablation, clone, env)
    assert ablated.returncode == 0, ablated.stdout
    assert {"demo", "no-baseline"} <= experiment_names(clone, env)
    refused = make_demo(clone, env)  # the ablation's value left in params.yaml would become the demo's
    assert refused.returncode != 0 and 'params.yaml sets grpo.loss_type: "no_baseline", unlike' in refused.stdout

    compared = in_users_shell(comparison, clone, env)
    print(compared.stdout)
    assert compared.returncode == 0, compared.stdout
    page = compared.stdout
    assert page.startswith("# Experiments compared with `demo`: `no-baseline`\n")
    changed = page[page.index("## Params that differ") : page.index("## Test accuracy")]
    rows = [line for line in changed.splitlines() if line.startswith("| `")]
    assert rows == ["| `grpo.loss_type` | `reinforce_with_baseline` | `no_baseline` |"]
    second = json.loads((clone / "reports/final/metrics.json").read_text())
    for route in ROUTES:
        assert f"| {route} | {format_accuracy(final[route])} | {format_accuracy(second[route])} |" in page
    for route in ("base", "sft", "ei"):  # reused by DVC: the same answers, nothing to test
        assert second[route] == final[route]
        same = "0 / 0 (the same answers) | 0 / 0 | McNemar exact | 1"
        assert f"| {route} | `no-baseline` | `demo` | {same} |" in page
    answers = [(clone / "reports/final/generations/grpo.jsonl").read_text(), first_grpo_answers]
    paired = paired_comparison(*([json.loads(line) for line in text.splitlines()] for text in answers))
    assert (
        f"| grpo | `no-baseline` | `demo` | {paired['only_this_right']} / {paired['only_reference_right']}"
    ) in page and f"| McNemar exact | {paired['p_value']:.3g} |" in page

    # experiment names are revisions to DVC, as a user types them; a stage's metrics file on request
    targets = ["--targets", "reports/final/metrics.json"]
    diff = json.loads(run(["dvc", "metrics", "diff", "demo", "no-baseline", *targets, "--all", "--json"], clone, env))
    grpo_accuracy = diff["reports/final/metrics.json"]["grpo.accuracy"]
    assert (grpo_accuracy["old"], grpo_accuracy["new"]) == (final["grpo"]["accuracy"], second["grpo"]["accuracy"])
    # The headline is the one metrics file `dvc exp show` and `dvc metrics diff` list.
    shown = json.loads(run(["dvc", "exp", "show", "--json"], clone, env))
    assert list(shown[0]["data"]["metrics"]) == ["reports/headline.json"]
    headline = json.loads(run(["dvc", "metrics", "diff", "demo", "no-baseline", "--all", "--json"], clone, env))
    assert list(headline) == ["reports/headline.json"]
    assert headline["reports/headline.json"]["test_accuracy.grpo"] == grpo_accuracy

    # The cached report describes its own run; the page with figures is compare's, on request.
    assert "no-baseline" not in (clone / "reports/report.md").read_text()
    out, html_page = tmp_path / "compare.md", tmp_path / "compare.html"
    run(["python", "-m", "reasonrl.compare", "no-baseline", "--out", str(out), "--html", str(html_page)], clone, env)
    assert out.read_text().startswith(page.removesuffix("\n"))  # the same page, figures added
    assert (tmp_path / "compare_figures/validation_curves.png").read_bytes().startswith(b"\x89PNG")
    assert "data:image/png;base64," in html_page.read_text()
    # DVC's own figures: one per curve, each with both experiments
    plots = json.loads(run(["dvc", "plots", "diff", "demo", "no-baseline", "--json"], clone, env))
    assert "errors" not in plots
    assert list(plots["data"]) == ["SFT validation accuracy", "EI validation accuracy", "GRPO validation accuracy",
                                   "GRPO train reward", "GRPO response length", "SFT training loss"]  # fmt: skip
    assert all(figure[0]["revisions"] == ["demo", "no-baseline"] for figure in plots["data"].values())
    assert "Data and pipelines are up to date" in run(["dvc", "status"], clone, env)


PROTOCOLS = "{greedy: {temperature: 0}, avg2: {temperature: 0.6, top_p: 0.95, samples: 2}}"


def test_benchmarks_under_two_protocols_as_an_experiment_beside_the_demo(repo, benchmark_mirror, tmp_path):
    """Issue 33 as a user runs it: ``dvc exp run -S eval.benchmarks=[svamp,aime24] -S ++eval.protocols=…`` reruns
    download, final_eval and the report only; every route is evaluated on the test split and both benchmarks under
    ``eval.*`` and each protocol, and the metrics, the headline, the report and ``reasonrl.compare`` (against the
    demo) hold them, each accuracy with its interval and the paired tests."""
    from reasonrl.report.tables import format_accuracy

    clone, env = repo
    run(["git", "checkout", "--", "params.yaml"], clone, env)  # the preset, without the earlier tests' -S values
    demo = json.loads((clone / "reports/final/metrics.json").read_text())  # the no-baseline run's, but for GRPO
    env = {**env, "BENCHMARK_MIRROR": str(benchmark_mirror)}
    # `++`: eval.protocols is an empty mapping in params.yaml, to which Hydra (DVC's -S) adds keys only so; svamp's
    # first 16 questions of 1000 keep the test short
    overrides = ["-S", "eval.benchmarks=[svamp,aime24]", "-S", f"++eval.protocols={PROTOCOLS}"]
    overrides += ["-S", "eval.benchmark_questions=16"]
    ran = run_all_output(["dvc", "exp", "run", "--name", "benchmarks", *overrides], clone, env)
    assert ran.returncode == 0, ran.stdout
    assert re.findall(r"Running stage '(\w+)'", ran.stdout) == ["download", "final_eval", "report"], ran.stdout

    download = json.loads((clone / "reports/download/benchmarks.json").read_text())["benchmarks"]
    assert download["svamp"]["records"] == download["svamp"]["questions"] == 1000  # eval.decontaminate is off
    questions = {"test": 24, "svamp": 16, "aime24": 16}
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    for route in ROUTES:
        summary = final[route]
        # eval.* on the test split: what the run gave before protocols and benchmarks existed
        unchanged = {key: value for key, value in summary.items() if key not in ("benchmarks", "protocols")}
        if route != "grpo":  # GRPO is the demo's here, the no-baseline run's in the file read above
            assert unchanged == demo[route]
        assert list(summary["protocols"]) == ["avg2", "greedy"]  # metrics.json sorts its keys
        slots = {None: summary, **summary["protocols"]}
        for protocol, entry in slots.items():
            samples = 2 if protocol == "avg2" else 1
            sets = {"test": entry, **entry["benchmarks"]}
            assert list(sets) == ["test", "aime24", "svamp"]
            for name, result in sets.items():
                assert result["questions"] == questions[name] and result["n"] == samples * questions[name]
                interval = result["accuracy_interval"]  # a Wilson bound at 0 may round to 1e-17
                assert interval["low"] <= result["accuracy"] + 1e-12 and result["accuracy"] <= interval["high"]
                assert ("paired" in result) == (route != "base"), (route, protocol, name)
                directory = "/".join(filter(None, [protocol and f"protocols/{protocol}",
                                                   name != "test" and f"benchmarks/{name}"]))  # fmt: skip
                answers = (clone / "reports/final/generations" / directory / f"{route}.jsonl").read_text()
                assert answers.count("\n") == result["n"]  # splitlines would split a tiny model's "\x1c" too
        assert summary["protocols"]["greedy"]["protocol"] == {"temperature": 0.0, "top_p": 1.0, "samples": 1}
        avg2 = summary["protocols"]["avg2"]["benchmarks"]["svamp"]
        assert set(avg2["pass_at_k"]) == {"1", "2"} and 0 <= avg2["majority_accuracy"] <= 1
        assert avg2["accuracy_interval"]["method"] == "wilson_clustered_by_question"

    headline = json.loads((clone / "reports/headline.json").read_text())
    assert headline["benchmark_accuracy"]["svamp"] == {route: final[route]["benchmarks"]["svamp"]["accuracy"]
                                                       for route in ROUTES}  # fmt: skip
    greedy = headline["protocols"]["greedy"]
    assert greedy["test_accuracy"]["grpo"] == final["grpo"]["protocols"]["greedy"]["accuracy"]
    assert set(greedy["benchmark_accuracy"]) == {"svamp", "aime24"}

    report = (clone / "reports/report.md").read_text()
    section = report[report.index("## Benchmarks and protocols") :]
    assert "Each benchmark's first 16 questions only (`eval.benchmark_questions`)" in section
    for title in ("### `eval.*`: temperature 1, top-p 1, 1 sample per question",
                  "### `greedy`: temperature 0, top-p 1, 1 sample per question",
                  "### `avg2`: temperature 0.6, top-p 0.95, 2 samples per question"):  # fmt: skip
        assert title in section
    grpo_svamp = final["grpo"]["protocols"]["avg2"]["benchmarks"]["svamp"]
    assert f"| {format_accuracy(grpo_svamp)} |" in section[section.index("### `avg2`") :]
    contaminated = download["svamp"]["contaminated"]
    assert f"| `svamp` | number | 1000 | 0 | 1000 | {contaminated} |" in section

    compared = run_all_output(["python", "-m", "reasonrl.compare", "benchmarks"], clone, env)
    assert compared.returncode == 0, compared.stdout
    page = compared.stdout
    changed = page[page.index("## Params that differ") : page.index("## Test accuracy")]
    assert '| `eval.benchmarks` | `[]` | `["svamp", "aime24"]` |' in changed
    for route in ("base", "sft", "ei"):  # the demo's models: the same test answers under eval.*
        assert f"| {route} | `benchmarks` | `demo` | 0 / 0 (the same answers) | 0 / 0 | McNemar exact | 1 |" in page
    protocols = page[page.index("## Benchmarks and protocols") :]
    svamp = final["sft"]["benchmarks"]["svamp"]
    assert f"| `svamp` | sft | — | {format_accuracy(svamp)} |" in protocols  # the demo ran no benchmark
    assert "| `svamp` | sft | `benchmarks` | `demo` | not paired: `demo` has no svamp (benchmark) |" in protocols


def test_a_prompt_edit_makes_exactly_the_stages_that_read_it_stale(repo):
    """A template is read by name at run time, by the stages that sample with it and by the tiny tokenizer's
    prepare_model: an edit makes those stale in `dvc status`, and no other (not download, not the report)."""
    clone, env = repo
    run(["dvc", "repro"], clone, env)
    assert "Data and pipelines are up to date" in run(["dvc", "status"], clone, env)
    readers = {  # with grpo.prompt: r1_zero, as the CPU preset has it
        "r1_zero": {"prepare_model", "baseline", "filter_cots", "sft", "expert_iteration", "grpo", "final_eval"},
        "question_only": {"prepare_model", "baseline"},
        "r1_zero_chat": {"prepare_model", "baseline"},
    }
    for name, expected in readers.items():
        prompt = clone / f"src/reasonrl/prompts/{name}.prompt"
        original = prompt.read_text()
        try:
            prompt.write_text(f"Be brief. {original}")
            stale = set(json.loads(run(["dvc", "status", "--json"], clone, env)))
        finally:
            prompt.write_text(original)
        assert stale == expected, (name, stale)


# The model deps of the grpo and expert_iteration stages as DVC resolves dvc.yaml's templating (in a fresh process:
# DVC caches the params it read within one).
MODEL_DEPS = """
import json

import yaml
from dvc.repo import Repo
with Repo() as repo:
    stages = {name: repo.stage.collect(name)[0] for name in ("grpo", "expert_iteration")}
    print(json.dumps({name: sorted(d.def_path for d in s.deps if d.def_path.startswith("models/"))
                      for name, s in stages.items()}))
"""


def test_a_stage_depends_on_the_model_it_starts_from_only(repo):
    """With ``grpo.init_model: base`` (and ``ei.init_model: base``) DVC itself resolves the stage's model dep to
    models/base alone, so an SFT change leaves GRPO and EI cached; switching to ``sft`` makes it models/sft."""
    clone, env = repo
    params = clone / "params.yaml"
    original = params.read_text()
    try:
        for init in ("base", "sft"):
            apply_to_file({"grpo.init_model": init, "ei.init_model": init}, params)
            resolved = json.loads(run(["python", "-c", MODEL_DEPS], clone, env))
            assert resolved == {"grpo": [f"models/{init}"], "expert_iteration": [f"models/{init}"]}, init
    finally:
        params.write_text(original)


def test_the_recipes_beyond_the_handout_run_together_as_one_experiment(repo):
    """Clip-higher, the KL penalty, dynamic sampling, overlong filtering, LoRA, two samples per question, the
    question_only prompt for GRPO and the chat prompt r1_zero_chat for SFT and EI (the tiny tokenizer's ChatML), all
    on at once in one ``dvc exp run``: each shows up in the curves or the metrics it promises, and the final
    evaluation grades each route with the prompt it trained with."""
    clone, env = repo
    recipes = {
        "grpo.loss_type": "grpo_clip", "grpo.epochs_per_rollout_batch": 2, "grpo.cliprange_high": 0.28,
        "grpo.kl_coef": 0.1, "grpo.dynamic_sampling": "true", "grpo.max_sampling_rounds": 2,
        "grpo.mask_truncated": "true", "eval.samples_per_question": 2, "grpo.lora_rank": 8,
        "grpo.prompt": "question_only", "sft.prompt": "r1_zero_chat", "ei.prompt": "r1_zero_chat",
    }  # fmt: skip
    overrides = [arg for key, value in recipes.items() for arg in ("-S", f"{key}={value}")]
    run(["dvc", "exp", "run", "--name", "recipes", *overrides], clone, env)
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    for route in ROUTES:
        assert final[route]["n"] == 48 and final[route]["samples_per_question"] == 2
        assert set(final[route]["pass_at_k"]) == {"1", "2"} and 0 <= final[route]["majority_accuracy"] <= 1
    assert final["grpo"]["paired"]["reference"] == "sft"  # the CPU preset's grpo.init_model
    grpo = json.loads((clone / "reports/grpo/metrics.json").read_text())
    sft = json.loads((clone / "reports/sft/metrics.json").read_text())
    assert 0 < grpo["trainable_parameters"] < 0.2 * sft["trainable_parameters"]  # adapters vs the full model
    assert not list((clone / "models/grpo/best").glob("adapter_*"))  # merged: final_eval loaded a plain HF model
    curves = clone / "reports/grpo/live/plots/metrics"
    for metric in ("train/kl", "train/clip_fraction_high", "train/clip_fraction_low", "rollout/sampling_rounds",
                   "rollout/dropped_groups", "rollout/truncated_fraction"):  # fmt: skip
        assert len((curves / f"{metric}.tsv").read_text().splitlines()) > 1, metric
    report = (clone / "reports/report.md").read_text()
    assert "pass@2" in report and "grpo `question_only`" in report
    assert {route: summary["prompt"] for route, summary in final.items()} == {
        "base": "r1_zero_chat",  # sft.prompt: the prompt SFT starts it on
        "sft": "r1_zero_chat",
        "ei": "r1_zero_chat",
        "grpo": "question_only",
    }
    records = [json.loads(line) for line in (clone / "reports/final/generations/grpo.jsonl").open()]
    assert "<think>" not in records[0]["prompt"]  # the bare question, as GRPO trained on it
    chat_start, chat_end = "<|im_start|>system\nA conversation between User", "<|im_start|>assistant\n<think>"
    pairs = [json.loads(line) for line in (clone / "data/sft/filtered.jsonl").open()]
    for route in ("base", "sft", "ei"):
        records = [json.loads(line) for line in (clone / f"reports/final/generations/{route}.jsonl").open()]
        assert records[0]["prompt"].startswith(chat_start) and records[0]["prompt"].endswith(chat_end)
    assert pairs[0]["prompt"].startswith(chat_start) and pairs[0]["prompt"].endswith(chat_end)  # what SFT trained on


def test_grpo_on_two_ranks_is_an_experiment_like_any_other(repo):
    """``-S distributed.nproc_per_node=2``: the same DVC command runs the grpo stage under torchrun, two gloo ranks
    with an engine each; rank 0 logs and writes the models, which the final evaluation loads like any other."""
    clone, env = repo
    run(["git", "checkout", "--", "params.yaml"], clone, env)  # the preset, without the earlier tests' -S values
    run(["dvc", "exp", "run", "--name", "two-ranks", "-S", "distributed.nproc_per_node=2"], clone, env)
    curves = clone / "reports/grpo/live/plots/metrics"
    steps = len((curves / "rollout/reward.tsv").read_text().splitlines()) - 1
    evaluations = len((curves / "eval/accuracy.tsv").read_text().splitlines()) - 1
    assert (steps, evaluations) == (2, 3)  # grpo.n_grpo_steps of one optimizer step each, logged once (rank 0)
    grpo = json.loads((clone / "reports/grpo/metrics.json").read_text())
    assert grpo["best_step"] in (0, 1, 2) and grpo["wall_clock_seconds"] > 0
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    assert final["grpo"]["n"] == 24 and 0 <= final["grpo"]["accuracy"] <= 1
    assert not list((clone / "models/grpo_checkpoints").iterdir())  # a completed run removes its checkpoints


def test_asynchronous_grpo_is_an_experiment_like_any_other(repo):
    """``-S grpo.max_staleness=1``: the grpo stage trains each step on rollouts its engine's own process drew with
    the previous step's weights, corrected by the truncated importance weight; without the cap it is refused
    before any model loads, naming the param."""
    clone, env = repo
    run(["git", "checkout", "--", "params.yaml"], clone, env)  # the preset, without the earlier tests' -S values
    refused = subprocess.run(
        ["dvc", "exp", "run", "--name", "uncorrected", "-S", "grpo.max_staleness=1"],
        cwd=clone, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "grpo.rollout_is_cap: must be set with grpo.max_staleness 1 > 0" in refused.stdout + refused.stderr
    assert "Loading weights" not in refused.stdout + refused.stderr
    run(["git", "checkout", "--", "params.yaml"], clone, env)
    overrides = ["-S", "grpo.max_staleness=1", "-S", "grpo.rollout_is_cap=2.0"]
    run(["dvc", "exp", "run", "--name", "async", *overrides], clone, env)
    curves = clone / "reports/grpo/live/plots/metrics"
    lags = [row.split("\t")[1] for row in (curves / "rollout/policy_lag.tsv").read_text().splitlines()[1:]]
    assert lags == ["0", "1"]  # grpo.n_grpo_steps 2, one optimizer step each
    # The importance weights come from the update's own forward (one optimizer step per rollout batch): their figures
    # are logged for each step that trained, none for a step without learning signal.
    zero_signal = float((curves / "train/zero_signal_steps.tsv").read_text().splitlines()[-1].split("\t")[-1])
    for name in ("is_log_prob_gap_mean", "is_log_prob_gap_max", "is_weight_mean", "is_truncated_fraction"):
        curve = curves / f"train/{name}.tsv"
        logged = len(curve.read_text().splitlines()) - 1 if curve.exists() else 0
        assert logged == 2 - zero_signal, name
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    assert final["grpo"]["n"] == 24 and 0 <= final["grpo"]["accuracy"] <= 1
    assert "async" in experiment_names(clone, env)
    assert not list((clone / "models/grpo_checkpoints").iterdir())


REPORT_EDIT = """

_render_markdown = render_markdown


def render_markdown(*args, **kwargs):
    return _render_markdown(*args, **kwargs) + "A queued edit.\\n"
"""


def test_a_queued_experiment_runs_the_code_it_records_and_keeps_its_policies(repo):
    """``dvc exp run --queue`` records the workspace, code included, and the queue runs it later in a copy of the
    repository. Edit the report's code, queue, revert, run the queue: the experiment's report holds the edit (its
    stages import the copy's package, not the live checkout's), and only the report reran (GRPO's checkpoints are
    no output that a fresh copy could miss). A second experiment, run at the same time, keeps GRPO's policy every
    step: they outlive its copy, in the workspace under its name."""
    clone, env = repo
    run(["dvc", "exp", "apply", "demo"], clone, env)  # not the two-ranks run the test before left
    run(["git", "add", "-A"], clone, env)
    run(["git", "commit", "-qm", "demo results"], clone, env)  # the queue's copies check the outputs out
    assert "Data and pipelines are up to date" in run(["dvc", "status"], clone, env)
    module = clone / "src/reasonrl/report/document.py"
    original = module.read_text()
    module.write_text(original + REPORT_EDIT)
    run(["dvc", "exp", "run", "--queue", "--name", "queued-edit"], clone, env)
    module.write_text(original)
    run(["dvc", "exp", "run", "--queue", "--name", "queued-kept", "-S", "grpo.keep_every=1"], clone, env)
    run(["dvc", "exp", "run", "--run-all", "-j", "2"], clone, env)  # starts workers, follows the queue to its end
    log = run(["dvc", "queue", "logs", "queued-edit"], clone, env)
    assert [line for line in log.splitlines() if line.startswith("Running stage")] == ["Running stage 'report':"], log
    kept = clone / "models/kept/queued-kept/grpo"
    assert sorted(path.name for path in kept.iterdir()) == ["step_000001", "step_000002"]  # grpo.n_grpo_steps 2
    assert "the policy after step 2" in (kept / "step_000002/README.md").read_text(encoding="utf-8")
    assert (kept / "step_000002/model.safetensors").stat().st_size > 0
    assert not (clone / "models/kept/grpo").exists() and not (clone / "models/kept/queued-edit").exists()
    run(["dvc", "exp", "apply", "queued-edit"], clone, env)
    assert "A queued edit." in (clone / "reports/report.md").read_text()
    assert module.read_text() == original + REPORT_EDIT  # the experiment records the code it ran


MARK = 1 / 32
MARKED_REWARD = "rewards.marked:marked_reward"
MARKED = f'''"""The shipped example reward, marked: {MARK} where it gives 0, which no built-in gives (0 or 1)."""

from rewards.tolerant import tolerant_reward


def marked_reward(response: str, ground_truth: str) -> dict[str, float]:
    return {{key: value or {MARK} for key, value in tolerant_reward(response, ground_truth).items()}}
'''
GRADERS = {"baseline", "filter_cots", "sft", "expert_iteration", "grpo", "final_eval"}


def add_marked_reward(clone) -> str:
    """Write the marked reward into the clone's rewards/ (beside the example it imports); its spec.

    The tiny pipeline's few steps leave the models' answers malformed, which any sensible reward, the example's
    included, grades 0 as the built-in does: only a mark shows who graded."""
    (clone / "rewards/marked.py").write_text(MARKED)
    return MARKED_REWARD


def assert_graded_by_user_reward(clone) -> None:
    """After a run with ``rewards.r1_zero`` = :data:`MARKED_REWARD`: every r1_zero response was graded by it, in
    baseline, GRPO's rollouts and validation, and final_eval (right answers 1.0 as before, the rest marked), the
    question_only ones by their built-in, and DVC recorded the spec as a param of the stages that grade."""

    def records(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    def assert_marked(graded, where):
        values = {r[key] for r in graded for key in ("format_reward", "answer_reward", "reward")}
        assert values <= {1.0, MARK} and MARK in values, (where, values)

    assert_marked(records(clone / "reports/baseline/generations/r1_zero.jsonl"), "baseline r1_zero")
    built_in = {r["reward"] for r in records(clone / "reports/baseline/generations/question_only.jsonl")}
    assert built_in <= {0.0, 1.0}
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    for route, summary in final.items():
        if summary["prompt"] == "r1_zero":
            graded = records(clone / f"reports/final/generations/{route}.jsonl")
            assert_marked(graded, route)
            assert summary["accuracy"] == sum(r["reward"] == 1.0 for r in graded) / len(graded)
    if final["grpo"]["prompt"] == "r1_zero":
        curve = clone / "reports/grpo/live/plots/metrics/rollout/reward.tsv"
        assert all(float(line.split("\t")[-1]) >= MARK for line in curve.read_text().splitlines()[1:])
        examples = [
            e for path in (clone / "reports/grpo/live/examples").iterdir() for e in json.loads(path.read_text())
        ]
        assert {e["reward"] for e in examples} <= {1.0, MARK}
    lock = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    for stage in GRADERS:
        params = lock[stage]["params"]["params.yaml"]
        spec = params["rewards.r1_zero"] if "rewards.r1_zero" in params else params["rewards"]["r1_zero"]
        assert spec == MARKED_REWARD, stage
        assert any(dep["path"] == "rewards" for dep in lock[stage]["deps"]), stage


def test_own_data_and_reward_with_an_extra_test_set_as_one_experiment(repo):
    """The README's "Your own data" and "Your own reward" runs as one experiment (each reruns every stage):
    ``data.name=jsonl`` on the shipped example (``problem``/``solution`` fields, boxed answers), its shifted set as
    ``eval.test_sets`` and ``rewards.r1_zero=rewards.<module>:<function>``, all set with ``-S`` as a user types them.
    Every stage runs on the converted data; final_eval grades each route on the test split and on the shifted set,
    and the metrics, the headline, the report and the generations hold both; the user's function, loaded from the
    repository's rewards/, grades wherever the r1_zero prompt is used, and an edit to rewards/ makes exactly the
    stages that grade stale."""
    clone, env = repo
    run(["git", "checkout", "--", "params.yaml"], clone, env)  # the preset, without the earlier tests' -S values
    fields = ", ".join(f"{key}: {value}" for key, value in EXAMPLE_FIELDS.items())
    shifted = f"[{{name: shifted, path: {EXAMPLE_DATA}/shifted.jsonl, sha256: {EXAMPLE_SHA256['shifted']}, {fields}}}]"
    reward = add_marked_reward(clone)
    overrides = {"data.name": "jsonl", "eval.test_sets": shifted, "rewards.r1_zero": reward} | {
        f"data.jsonl.{k}": v for k, v in EXAMPLE_FIELDS.items()
    }
    for split in ("train", "test"):
        overrides |= {f"data.jsonl.{split}.path": f"{EXAMPLE_DATA}/{split}.jsonl"}
        overrides |= {f"data.jsonl.{split}.sha256": EXAMPLE_SHA256[split]}
    arguments = [arg for key, value in overrides.items() for arg in ("-S", f"{key}={value}")]
    run(["dvc", "exp", "run", "--name", "own-data", *arguments], clone, env)

    data = clone / "data/gsm8k"
    sizes = {name: len((data / f"{name}.jsonl").read_text().splitlines()) for name in ("train", "val", "test")}
    assert sizes == {"train": 300 - 16, "val": 16, "test": 60}  # data.val_size 16 carved from the example's train
    assert len((clone / "data/test_sets/shifted.jsonl").read_text().splitlines()) == 60
    stats = json.loads((clone / "reports/filter_cots/stats.json").read_text())
    assert stats["examples"] == 284 and stats["dropped"]["no_reasoning"] == 0  # boxed answers carry reasoning

    final = json.loads((clone / "reports/final/metrics.json").read_text())
    for route in ROUTES:
        on_shifted = final[route]["test_sets"]["shifted"]
        assert final[route]["n"] == 60 and on_shifted["n"] == 60 and on_shifted["prompt"] == final[route]["prompt"]
        interval = on_shifted["accuracy_interval"]
        assert interval["level"] == 0.95 and interval["low"] <= on_shifted["accuracy"] <= interval["high"]
        records = (clone / f"reports/final/generations/test_sets/shifted/{route}.jsonl").read_text().splitlines()
        assert len(records) == 60 and json.loads(records[0])["question"].startswith(
            json.loads((clone / EXAMPLE_DATA / "shifted.jsonl").read_text().splitlines()[0])["problem"]
        )
    assert final["grpo"]["test_sets"]["shifted"]["paired"]["reference"] == "sft"

    headline = json.loads((clone / "reports/headline.json").read_text())
    assert headline["test_set_accuracy"] == {
        "shifted": {r: final[r]["test_sets"]["shifted"]["accuracy"] for r in ROUTES}
    }
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], clone, env))
    assert "test_set_accuracy" in next(iter(shown.values()))["data"]["reports/headline.json"]["data"]

    from reasonrl.report.tables import format_accuracy

    report = (clone / "reports/report.md").read_text()
    section = report[report.index("### Test set `shifted`") : report.index("## Grader cross-check")]
    for route in ROUTES:
        assert f"| {route} | 60 | {format_accuracy(final[route]['test_sets']['shifted'])} |" in section
    assert f"`{EXAMPLE_DATA}/train.jsonl`" in report
    print({route: (final[route]["accuracy"], final[route]["test_sets"]["shifted"]["accuracy"]) for route in ROUTES})

    # Another test set after the run: download (the same data/gsm8k), final_eval and the report are stale, no
    # stage that trains or samples on the splits.
    params = clone / "params.yaml"
    original = params.read_text()
    assert original.count("name: shifted\n") == 1
    try:
        params.write_text(original.replace("name: shifted\n", "name: shifted-again\n"))
        stale = set(json.loads(run(["dvc", "status", "--json"], clone, env)))
    finally:
        params.write_text(original)
    assert stale == {"download", "final_eval", "report"}

    assert_graded_by_user_reward(clone)
    module = clone / "rewards/marked.py"
    try:
        module.write_text(MARKED + "# an edit\n")
        assert set(json.loads(run(["dvc", "status", "--json"], clone, env))) == GRADERS
    finally:
        module.write_text(MARKED)

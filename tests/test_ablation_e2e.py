"""Ablations end to end, as a user runs them: the whole pipeline as a DVC experiment on the CPU preset's synthetic
task, a second experiment with another GRPO loss, then ``dvc metrics diff`` and the report's ablation table."""

import json

import pytest
from pipeline_repo import make_pipeline_repo, run

pytestmark = pytest.mark.slow

# The CPU preset, smaller still: every stage runs for real, in seconds.
E2E_OVERRIDES = {
    "data.arithmetic.train_size": 400,
    "data.arithmetic.test_size": 24,
    "data.val_size": 16,
    "eval.max_tokens": 32,
    "sft.max_steps": 4,
    "sft.eval_every": 2,
    "sft.eval_examples": 8,
    "sft.batch_size": 8,
    "sft.microbatch_size": 8,
    "ei.n_steps": 1,
    "ei.questions_per_step": 8,
    "ei.num_rollouts": 2,
    "ei.max_tokens": 32,
    "ei.eval_examples": 8,
    "ei.batch_size": 8,
    "ei.microbatch_size": 8,
    "grpo.n_grpo_steps": 2,
    "grpo.rollout_batch_size": 16,
    "grpo.group_size": 4,
    "grpo.train_batch_size": 16,
    "grpo.gradient_accumulation_steps": 2,
    "grpo.max_tokens": 32,
    "grpo.eval_every": 1,
    "grpo.eval_examples": 8,
    "grpo.checkpoint_every": 1,
}
ROUTES = ("base", "sft", "ei", "grpo")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_pipeline_repo(tmp_path_factory.mktemp("ablation"), E2E_OVERRIDES)


def experiment_names(clone, env) -> set[str]:
    """The experiments of the current commit, as ``dvc exp show --json`` lists them."""
    shown = json.loads(run(["dvc", "exp", "show", "--json"], clone, env))
    return {
        exp["name"] for commit in shown for experiment in commit.get("experiments") or [] for exp in experiment["revs"]
    }


def test_two_experiments_then_metrics_diff_and_ablation_table(repo):
    clone, env = repo
    run(["dvc", "exp", "run", "--name", "reference"], clone, env)
    final = json.loads((clone / "reports/final/metrics.json").read_text())
    assert set(final) == set(ROUTES)
    for summary in final.values():  # the whole test split, every route, same sampling
        assert summary["n"] == 24 and sum(summary["categories"].values()) == 24
    for name in ROUTES:
        assert len((clone / f"reports/final/generations/{name}.jsonl").read_text().splitlines()) == 24
    html = (clone / "reports/report.html").read_text()
    assert "data:image/png;base64," in html and 'src="figures/' not in html

    run(["dvc", "exp", "run", "--name", "no-baseline", "-S", "grpo.loss_type=no_baseline"], clone, env)
    assert {"reference", "no-baseline"} <= experiment_names(clone, env)

    # experiment names are revisions to DVC, as a user types them
    diff = json.loads(run(["dvc", "metrics", "diff", "reference", "no-baseline", "--all", "--json"], clone, env))
    grpo_accuracy = diff["reports/final/metrics.json"]["grpo.accuracy"]
    assert grpo_accuracy["old"] == final["grpo"]["accuracy"]
    second = json.loads((clone / "reports/final/metrics.json").read_text())
    assert grpo_accuracy["new"] == second["grpo"]["accuracy"]
    # base, SFT and EI did not change: DVC reused them, so their results are identical
    for route in ("base", "sft", "ei"):
        assert second[route] == final[route]

    report = (clone / "reports/report.md").read_text()
    table = report[report.index("## Ablations") :]
    assert "reference" in table and "no-baseline" in table and "no_baseline" in table
    assert "Data and pipelines are up to date" in run(["dvc", "status"], clone, env)

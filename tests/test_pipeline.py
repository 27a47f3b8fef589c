"""The real DVC pipeline on the CPU preset, in a temporary git repository holding this working tree."""

import json
import os
import stat
import subprocess

import pytest
from pipeline_repo import check_cost, make_pipeline_repo, run

# The CPU preset on GSM8K (the preset's own data is synthetic), smaller still: this checks the plumbing.
TEST_OVERRIDES = {
    "data.name": "gsm8k",
    "eval.num_examples": 12,
    "eval.max_tokens": 24,
    "data.val_size": 50,
    "sft.max_steps": 4,
    "sft.eval_every": 2,
    "sft.eval_examples": 8,
    "sft.batch_size": 8,
    "sft.microbatch_size": 8,
    "ei.n_steps": 2,
    "ei.questions_per_step": 8,
    "ei.num_rollouts": 2,
    "ei.max_tokens": 24,
    "ei.eval_examples": 8,
    "ei.batch_size": 8,
    "ei.microbatch_size": 8,
    "grpo.n_grpo_steps": 3,
    "grpo.rollout_batch_size": 16,
    "grpo.group_size": 4,
    "grpo.train_batch_size": 16,
    "grpo.gradient_accumulation_steps": 2,
    "grpo.max_tokens": 24,
    "grpo.eval_every": 2,
    "grpo.eval_examples": 8,
    "grpo.checkpoint_every": 2,
}


@pytest.fixture(scope="module")
def pipeline_repo(tmp_path_factory, gsm8k_mirror):
    return make_pipeline_repo(tmp_path_factory.mktemp("repo"), TEST_OVERRIDES, gsm8k_mirror)


def without_nulls(tree):
    if isinstance(tree, dict):
        return {key: without_nulls(value) for key, value in tree.items() if value is not None}
    return tree


@pytest.mark.slow
def test_dvc_repro_baseline_on_cpu_preset(pipeline_repo):
    clone, env = pipeline_repo
    run(["dvc", "repro", "baseline"], clone, env)

    metrics = json.loads((clone / "reports/baseline/metrics.json").read_text())
    assert set(metrics) == {"r1_zero", "question_only"}
    for prompt, summary in metrics.items():
        assert summary["n"] == 12
        assert sum(summary["categories"].values()) == 12
        assert 0.0 <= summary["accuracy"] <= summary["format_rate"] <= 1.0
        records = [json.loads(line) for line in (clone / f"reports/baseline/generations/{prompt}.jsonl").open()]
        assert len(records) == 12
        assert {"question", "prompt", "response", "ground_truth", "reward", "length"} <= set(records[0])
        assert all(record["length"] <= 24 for record in records)
    cost = check_cost(clone / "reports", "baseline")
    assert cost["phases"]["evaluation"]["response_tokens"] >= sum(r["length"] for r in records)  # + final EOS
    splits = {name: len((clone / f"data/gsm8k/{name}.jsonl").read_text().splitlines()) for name in ("train", "val")}
    assert splits == {"train": 7473 - 50, "val": 50}

    assert "Data and pipelines are up to date" in run(["dvc", "status", "baseline"], clone, env)
    # a stage's metrics file is a plain output, which DVC shows on request (the headline is the declared metric)
    shown = json.loads(run(["dvc", "metrics", "show", "reports/baseline/metrics.json", "--json"], clone, env))
    assert shown[""]["data"]["reports/baseline/metrics.json"]["data"] == without_nulls(metrics)  # DVC drops nulls
    shown = json.loads(run(["dvc", "metrics", "show", "reports/baseline/cost.json", "--json"], clone, env))
    assert shown[""]["data"]["reports/baseline/cost.json"]["data"]["device_hours"] == cost["device_hours"]
    # git sees only DVC's bookkeeping; the data, model and reports themselves are git-ignored DVC outputs
    status = run(["git", "status", "--porcelain", "--untracked-files=all"], clone, env).splitlines()
    assert sorted(line[3:] for line in status) == [
        "data/.gitignore",
        "dvc.lock",
        "models/.gitignore",
        "reports/baseline/.gitignore",
        "reports/download/.gitignore",
    ]


@pytest.mark.slow
def test_dvc_repro_expert_iteration_then_sft_size_experiment(pipeline_repo):
    clone, env = pipeline_repo
    stale = clone / "models/.sft.0f3a9c1b.tmp"  # what a killed sft stage left beside its output
    stale.mkdir(parents=True)
    run(["dvc", "repro", "expert_iteration"], clone, env)
    assert not stale.exists()
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((clone / "models/sft").stat().st_mode) == 0o777 & ~umask  # as mkdir makes it (was 0o700)
    stats = json.loads((clone / "reports/filter_cots/stats.json").read_text())
    assert stats["examples"] == 7473 - 50 and stats["kept"] + sum(stats["dropped"].values()) == stats["examples"]
    sft = json.loads((clone / "reports/sft/metrics.json").read_text())
    assert sft["train_pairs"] == stats["kept"] and sft["best_step"] in (2, 4)
    for model in ("models/sft", "models/ei"):
        assert (clone / model / "model.safetensors").is_file() and (clone / model / "tokenizer.json").is_file()
    # the curves DVC declares: train loss every step, validation accuracy at steps 2 and 4
    loss = (clone / "reports/sft/live/plots/metrics/train/loss.tsv").read_text().splitlines()
    accuracy = (clone / "reports/sft/live/plots/metrics/eval/accuracy.tsv").read_text().splitlines()
    assert len(loss) == 1 + 4 and len(accuracy) == 1 + 2
    check_cost(clone / "reports", "sft")
    check_cost(clone / "reports", "ei")
    rounds = (clone / "reports/ei/live/plots/metrics/eval/accuracy.tsv").read_text().splitlines()
    assert len(rounds) == 1 + 2
    assert "Data and pipelines are up to date" in run(["dvc", "status", "expert_iteration"], clone, env)
    # dvc.yaml's figures of SFT and EI draw; GRPO's, whose stage has not run yet, are the only ones missing
    shown = json.loads(run(["dvc", "plots", "show", "--json"], clone, env))
    assert {"SFT validation accuracy", "EI validation accuracy", "SFT training loss"} <= set(shown["data"])
    assert {error["name"] for error in shown.get("errors", [])} <= {
        "GRPO validation accuracy",
        "GRPO train reward",
        "GRPO response length",
    }

    run(["git", "add", "-A"], clone, env)
    run(["git", "commit", "-qm", "pipeline results"], clone, env)
    run(["dvc", "exp", "run", "-S", "sft.num_examples=128", "sft"], clone, env)
    params = json.loads(run(["dvc", "params", "diff", "--json"], clone, env))
    assert params["params.yaml"]["sft.num_examples"] == {"old": None, "new": 128}
    diff = json.loads(run(["dvc", "metrics", "diff", "--targets", "reports/sft/metrics.json", "--json"], clone, env))
    changed = diff["reports/sft/metrics.json"]["train_pairs"]
    assert (changed["old"], changed["new"]) == (stats["kept"], 128)


@pytest.mark.slow
def test_dvc_repro_grpo(pipeline_repo):
    """The grpo stage on GSM8K. (A GRPO ablation as a DVC experiment, ``-S grpo.loss_type=no_baseline``, is
    test_ablation_e2e's, with its params and metrics compared.)"""
    clone, env = pipeline_repo
    checkpoints = clone / "models/grpo_checkpoints"
    (checkpoints / ".step-000001.0f3a9c1b.tmp").mkdir(parents=True)  # a killed run's half-written checkpoint
    run(["dvc", "repro", "grpo"], clone, env)
    assert not list(checkpoints.iterdir())  # a completed run leaves neither checkpoints nor temporaries
    assert (clone / "models/.grpo_checkpoints.lock").is_file()
    assert "grpo_checkpoints.lock" not in run(["git", "status", "--porcelain", "--untracked-files=all"], clone, env)
    grpo = json.loads((clone / "reports/grpo/metrics.json").read_text())
    assert grpo["best_step"] in (0, 2, 3)
    cost = check_cost(clone / "reports", "grpo")
    # 3 steps of 16 rollouts, each trained on once, of at most 24 generated tokens: what it trained it drew
    assert cost["tokens_trained"]["response"] <= cost["phases"]["rollout"]["response_tokens"] <= 3 * 16 * 24
    for kind in ("best", "final"):
        assert (clone / "models/grpo" / kind / "model.safetensors").is_file()
    reward = (clone / "reports/grpo/live/plots/metrics/rollout/reward.tsv").read_text().splitlines()
    assert len(reward) == 1 + 3  # one optimizer step per GRPO step here
    assert sorted(p.name for p in (clone / "reports/grpo/live/examples").iterdir()) == [
        "step_000000.json",
        "step_000002.json",
        "step_000003.json",
    ]
    assert "Data and pipelines are up to date" in run(["dvc", "status", "grpo"], clone, env)
    assert "reports/grpo/metrics.json" in run(["dvc", "metrics", "show", "reports/grpo/metrics.json"], clone, env)


@pytest.mark.slow
def test_sft_refuses_more_examples_than_the_data_has(pipeline_repo):
    clone, env = pipeline_repo
    run(["dvc", "repro", "filter_cots"], clone, env)
    result = subprocess.run(
        ["dvc", "exp", "run", "-S", "sft.num_examples=100000", "sft"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "sft.num_examples: asks for 100000 pairs but data/sft/filtered.jsonl has" in result.stderr + result.stdout

"""A temporary git repository holding this working tree with a params preset applied: where the DVC pipeline runs
in the end-to-end tests."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from reasonrl.presets import apply_to_file, load_preset

REPO = Path(__file__).resolve().parents[1]

# The CPU preset, smaller still: every stage runs for real, in seconds.
TINY_PIPELINE_OVERRIDES = {
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

# The example of a user's own data (README "Your own data"): each file and the SHA-256 the README gives for it.
EXAMPLE_DATA = "examples/word_problems"
EXAMPLE_SHA256 = {
    "train": "547433c75387fa29a9b154364e44e4478032a985a7c0f819bc89cfd012869e3a",
    "test": "992e0f3b3dc66fffe92231a9a907afd5191e657c851a95cedb3f3255c724691c",
    "shifted": "36f001e4a0cdcbf6811c3e3fa64721111949a2d81ce5c00c427d307a85e30961",
}
EXAMPLE_FIELDS = {"question_field": "problem", "answer_field": "solution", "answer_format": "boxed"}


STAGE_PHASES = {
    "baseline": {"engine_start", "evaluation"},
    "sft": {"start", "train", "validation", "save"},
    "ei": {"start", "rollout", "validation", "save"},  # and train, where a round kept a correct rollout
    "grpo": {"start", "rollout", "weight_sync", "scoring", "train", "validation", "save"},
    "final": {"engine_start", "evaluation"},
}
"""The phases each stage's ``reports/<dir>/cost.json`` times on the CPU, lag 0 (reasonrl.cost); GRPO's
``old_log_prob`` too where a step runs a pass before its update (a separate π_old pass, or π_ref's)."""
OPTIONAL_PHASES = {"train", "old_log_prob"}


def check_cost(reports: Path, stage: str) -> dict[str, Any]:
    """``reports/<stage>/cost.json`` of a CPU run: its phases timed, the tokens they handled counted, every figure
    measured and positive, and each null one with its reason; returns it."""
    cost = json.loads((reports / stage / "cost.json").read_text())
    phases = cost["phases"]
    assert STAGE_PHASES[stage] <= set(phases) <= STAGE_PHASES[stage] | OPTIONAL_PHASES, phases
    assert phases["engine_start" if "engine_start" in phases else "start"]["seconds"] > 0  # never instant
    for name, phase in phases.items():
        # GRPO's old_log_prob and train phases take next to nothing when no group has a learning signal
        assert phase["seconds"] >= 0, (name, phase)
        if "tokens" in phase:
            assert phase["seconds"] > 0, (name, phase)
            assert phase["response_tokens"] > 0 and phase["prompt_tokens"] > 0, (name, phase)
            assert phase["tokens_per_second"] > phase["response_tokens_per_second"] > 0, (name, phase)
    for kind in ("generated", "trained"):
        counted = [phase for phase in phases.values() if phase.get("tokens") == kind]
        total = {part: sum(phase[f"{part}_tokens"] for phase in counted) for part in ("prompt", "response")}
        assert cost[f"tokens_{kind}"] == total | {"total": sum(total.values())}
    assert cost["tokens_generated"]["response"] > 0 and cost["tokens_generated"]["prompt"] > 0
    if stage == "sft":  # every step trains (GRPO and EI skip what has no learning signal: a tiny model's may all)
        assert cost["tokens_trained"]["response"] > 0
    wall_clock, cores = cost["wall_clock_seconds"], cost["device"]["count"]
    # The phases run one at a time, but for the engine's own time beside the trainer (GRPO, max_staleness ≥ 1)
    in_turn = sum(phase["seconds"] for name, phase in phases.items() if name != "engine")
    assert wall_clock >= in_turn - 0.01
    assert cost["device"]["kind"] == "cpu" and cost["device_hours_unit"] == "cpu_core_hours" and cores >= 1
    assert abs(cost["device_hours"] - cores * wall_clock / 3600) <= cores * 0.001 / 3600  # wall clock: rounded
    assert cost["memory"]["peak_rss_bytes"] > 2**20
    nulls = {key for key, value in (cost["memory"] | {"price": cost["price"]}).items() if value is None}
    assert nulls == set(cost["reasons"]) and all(cost["reasons"].values())
    assert {"peak_cuda_allocated_bytes", "planned_training_bytes", "price"} <= nulls
    return cost


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def is_pipeline_result(name: str) -> bool:
    """What `dvc repro` (e.g. `make demo`) leaves in the workspace for git to see: its lock file and the
    .gitignore files beside the outputs under data/, models/ and reports/."""
    return name == "dvc.lock" or name.split("/", 1)[0] in ("data", "models", "reports")


def make_pipeline_repo(
    clone: Path, overrides: dict[str, Any], gsm8k_mirror: Path | None = None
) -> tuple[Path, dict[str, str]]:
    """This working tree (tracked and untracked-but-not-ignored files, less the results of earlier pipeline runs)
    committed into a fresh git repo at ``clone``, with the CPU preset and then ``overrides`` written into its
    params.yaml."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file() and not is_pipeline_result(name):
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    # As a user's shell runs them: without what an in-process engine of this test process (pytest-xdist runs other
    # test files in it first) left in its environment, VLLM_DIST_IDENT, which every stage's vLLM would warn about.
    inherited = {name: value for name, value in os.environ.items() if name != "VLLM_DIST_IDENT"}
    env = {
        **inherited,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    if gsm8k_mirror is not None:
        env["GSM8K_MIRROR"] = str(gsm8k_mirror)
    apply_to_file({**load_preset("cpu"), **overrides}, clone / "params.yaml")
    run(["git", "init", "-q"], clone, env)
    run(["git", "add", "-A"], clone, env)
    run(["git", "commit", "-qm", "pipeline under test"], clone, env)
    return clone, env

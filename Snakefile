# Snakemake runs the pipeline dvc.yaml declares: one rule per stage, built from dvc.yaml itself (reasonrl.pipeline),
# so the two runners execute the same commands on the same inputs and outputs. This file adds only what DVC does
# not know: logs, and what a scheduler must give each stage (GPUs, threads, memory, run time).
#
#   snakemake --cores 2                        locally (e.g. on the CPU preset)
#   snakemake --cores all --resources gpu=2    a 2-GPU workstation
#   snakemake --profile profiles/slurm         SLURM (see profiles/slurm/config.yaml)
from pathlib import Path

from snakemake.common.configfile import load_configfile
from snakemake.exceptions import WorkflowError

from reasonrl.config import LAYOUT_GPUS, ConfigError, load_params
from reasonrl.pipeline import read_pipeline


configfile: "params.yaml"


def changed_keys(given, written, prefix=""):
    """The dotted keys whose values differ between two params trees."""
    if not (isinstance(given, dict) and isinstance(written, dict)):
        return [prefix.rstrip(".")] if given != written else []
    keys = sorted(set(given) | set(written), key=str)
    return [k for key in keys for k in changed_keys(given.get(key), written.get(key), f"{prefix}{key}.")]


# The stage scripts read params.yaml themselves (`--params params.yaml` in each command), so `--config` or
# `--configfile` would change Snakemake's rerun decisions but not what the stages compute. Writing them into
# params.yaml from here would make even a dry run edit the workspace, and Snakemake's --config cannot name a
# dotted key and reads nested values as strings.
OVERRIDDEN = changed_keys(config, load_configfile("params.yaml"))
if OVERRIDDEN:
    raise WorkflowError(
        f"--config/--configfile set {', '.join(OVERRIDDEN)}, which the stages would not see: they read params.yaml. "
        "Set the values in params.yaml (by hand, or a preset: python -m reasonrl.presets NAME --apply), then run "
        "snakemake; for a variant beside this run, do that in a git worktree of its own (docs/multi-gpu.md, 'Snakemake')"
    )
# Every param checked before any rule is built, as each stage checks its own again: a bad value stops here with the
# stage's one-line message, not as a missing input (templated paths such as prompts/${grpo.prompt}.prompt).
try:
    load_params("params.yaml")
except ConfigError as error:
    raise WorkflowError(f"error: {error}") from None

STAGES = read_pipeline("dvc.yaml", config)
PRODUCED = {out for stage in STAGES.values() for out in stage.outs}


def input_files(dep):
    """A directory of the source tree as its files: Snakemake compares a directory input by the directory's own
    mtime, which an in-place edit of a file inside leaves alone (and a new file or a checkout changes, rerunning
    every rule that reads any of it). Bytecode caches are no input: Python writes them as a stage runs, and
    .dvcignore keeps them out of DVC's hash of the directory too. A stage's directory output stays one input."""
    if dep in PRODUCED or not Path(dep).is_dir():
        return [dep]
    return sorted(str(path) for path in Path(dep).rglob("*") if path.is_file() and "__pycache__" not in path.parts)


# A distributed grpo (params: distributed) holds a GPU per rank (colocate; none on the cpu layout) on each of
# distributed.nnodes nodes. Several nodes: one SLURM job of --nodes=M with gres gpu:N per node, in which
# `python -m reasonrl.launch` starts a torchrun agent per node through srun.
DISTRIBUTED = config.get("distributed", {})
NPROC_PER_NODE, NNODES = DISTRIBUTED.get("nproc_per_node", 1), DISTRIBUTED.get("nnodes", 1)


def gpu_resources(stage_name):
    if stage_name not in MODEL_STAGE_RUNTIME:
        return {"gpu": 0}
    gpus = LAYOUT_GPUS[config["rollout"]["layout"]]
    if stage_name != "grpo" or NPROC_PER_NODE * NNODES == 1:
        return {"gpu": gpus}
    if NNODES == 1:
        return {"gpu": gpus * NPROC_PER_NODE}
    return {"nodes": NNODES, "gres": f"gpu:{gpus * NPROC_PER_NODE}"} if gpus else {"nodes": NNODES}


# Model stages hold rollout.layout's GPUs (colocate 1, split 2, cpu 0). Run times in minutes, sized for the
# full-scale run (Qwen2.5-Math-1.5B, handout settings); threads become --cpus-per-task on SLURM and, locally, keep
# model stages from sharing a small machine (Snakemake caps threads at --cores).
MODEL_STAGE_RUNTIME = {"baseline": 120, "sft": 360, "expert_iteration": 720, "grpo": 1440, "final_eval": 240}
MODEL_THREADS = 8
# Documents the software of every rule for `--software-deployment-method conda`; without that flag the jobs use
# the Python environment Snakemake was started from (the project's .venv).
ENV = "profiles/envs/reasonrl.yaml"


# download and prepare_model fetch from the internet, which cluster compute nodes often cannot reach; report
# takes seconds. These run on the submitting host under a cluster executor.
localrules:
    all,
    download,
    prepare_model,
    report,


# GRPO's resumable checkpoints (models/grpo_checkpoints) are no output of dvc.yaml, so of no rule here: Snakemake
# deletes a failed job's outputs, and a retried or rerun grpo resumes from them.
for stage_name, stage in STAGES.items():
    is_model_stage = stage_name in MODEL_STAGE_RUNTIME

    rule:
        name:
            stage_name
        input:
            [path for dep in stage.deps for path in input_files(dep)],
        output:
            [directory(out) if out in stage.directories else out for out in stage.outs],
        params:
            # Snakemake reruns a rule when these change. The command is a param because the shell directive runs
            # after this loop, when `stage` is the last stage.
            **{key.replace(".", "_"): value for key, value in stage.params.items()},
            cmd=stage.cmd,
        log:
            f"logs/{stage_name}.log",
        threads: MODEL_THREADS if is_model_stage else 1
        resources:
            **gpu_resources(stage_name),
            mem_mb=64000 if is_model_stage else 8000,
            runtime=MODEL_STAGE_RUNTIME.get(stage_name, 30),
        conda:
            ENV
        shell:
            "{params.cmd} > {log} 2>&1"


rule all:
    default_target: True
    input:
        STAGES["report"].outs,

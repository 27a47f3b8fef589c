# Snakemake runs the pipeline dvc.yaml declares: one rule per stage, built from dvc.yaml itself (reasonrl.pipeline),
# so the two runners execute the same commands on the same inputs and outputs. This file adds only what DVC does
# not know: logs, and what a scheduler must give each stage (GPUs, threads, memory, run time).
#
#   snakemake --cores 2                        locally (e.g. on the CPU preset)
#   snakemake --cores all --resources gpu=2    a 2-GPU workstation
#   snakemake --profile profiles/slurm         SLURM (see profiles/slurm/config.yaml)
from snakemake.common.configfile import load_configfile
from snakemake.exceptions import WorkflowError

from reasonrl.config import LAYOUT_GPUS
from reasonrl.pipeline import read_pipeline


configfile: "params.yaml"


# The stage scripts read params.yaml themselves, so `--config`/`--configfile` would change Snakemake's rerun
# decisions but not the run. Edit params.yaml instead (or apply a preset: `python -m reasonrl.presets cpu --apply`).
if config != load_configfile("params.yaml"):
    raise WorkflowError("params.yaml is the only config: drop --config/--configfile and edit params.yaml instead")
if config["rollout"]["layout"] not in LAYOUT_GPUS:
    raise WorkflowError(f"params.yaml: rollout.layout must be one of {sorted(LAYOUT_GPUS)}")

STAGES = read_pipeline("dvc.yaml", config)
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


for stage_name, stage in STAGES.items():
    is_model_stage = stage_name in MODEL_STAGE_RUNTIME

    rule:
        name:
            stage_name
        input:
            stage.deps,
        output:
            [directory(out) if out in stage.directories else out for out in stage.outs],
        params:
            # Snakemake reruns a rule when these change. `kept` (resumable GRPO checkpoints) is no output:
            # Snakemake deletes a failed job's outputs, and a rerun or retry resumes from them. The command is a
            # param because the shell directive runs after this loop, when `stage` is the last stage.
            **{key.replace(".", "_"): value for key, value in stage.params.items()},
            kept=stage.kept,
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

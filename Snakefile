# The Snakemake twin of dvc.yaml: the same stage scripts with the same command lines, inputs and outputs, so the
# pipeline can run locally (`snakemake --cores N`) or on a cluster (`snakemake --profile profiles/slurm`).
# tests/test_snakefile.py fails as soon as the two graphs diverge: change both files together.
#
# Each rule: the script and library modules it runs, the data/models it reads (= dvc.yaml deps); its outputs
# (= dvc.yaml outs + metrics); the params.yaml sections it reads as params (= dvc.yaml params), which makes
# Snakemake rerun the stage when one of them changes; a log; GPU rules also declare what a scheduler must give them.
from snakemake.common.configfile import load_configfile
from snakemake.exceptions import WorkflowError


configfile: "params.yaml"


# The stage scripts read params.yaml themselves, so `--config`/`--configfile` would change Snakemake's rerun
# decisions but not the run. Edit params.yaml instead (or apply a preset: `python -m reasonrl.presets cpu --apply`).
if config != load_configfile("params.yaml"):
    raise WorkflowError("params.yaml is the only config: drop --config/--configfile and edit params.yaml instead")

# GPUs a model stage holds, from rollout.layout: the vLLM engine shares the policy's GPU (colocate) or has its
# own (split: engine on rollout.engine_device, policy on cuda:0).
LAYOUT_GPUS = {"cpu": 0, "colocate": 1, "split": 2}
if config["rollout"]["layout"] not in LAYOUT_GPUS:
    raise WorkflowError(f"params.yaml: rollout.layout must be one of {sorted(LAYOUT_GPUS)}")
GPUS = LAYOUT_GPUS[config["rollout"]["layout"]]

# Documents the software of every rule for `--software-deployment-method conda`; without that flag the jobs use
# the Python environment Snakemake was started from (the project's .venv).
ENV = "profiles/envs/reasonrl.yaml"

# download and prepare_model fetch from the internet, which cluster compute nodes often cannot reach; report
# takes seconds. These run on the submitting host under a cluster executor.
localrules: all, download, prepare_model, report


# Sized for the full-scale run (Qwen2.5-Math-1.5B, handout settings, rollout.layout split). runtime in minutes;
# threads become --cpus-per-task on SLURM and, locally, keep model stages from sharing a small machine
# (Snakemake caps threads at --cores).
MODEL_THREADS = 8


rule download:
    input:
        script="stages/download.py",
        code=["src/reasonrl/data.py", "src/reasonrl/synthetic.py", "src/reasonrl/atomic.py"],
    output:
        data=directory("data/gsm8k"),
    params:
        data=config["data"],
    log:
        "logs/download.log",
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --out {output.data} > {log} 2>&1"


rule prepare_model:
    input:
        script="stages/prepare_model.py",
        code=["src/reasonrl/models.py", "src/reasonrl/tiny_model.py"],
        data="data/gsm8k",
    output:
        model=directory("models/base"),
    params:
        model=config["model"],
    log:
        "logs/prepare_model.log",
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --data {input.data} --out {output.model} > {log} 2>&1"


rule baseline:
    input:
        script="stages/baseline.py",
        code=[
            "src/reasonrl/evaluation.py",
            "src/reasonrl/grading.py",
            "src/reasonrl/rollout.py",
            "src/reasonrl/prompts",
        ],
        model="models/base",
        data="data/gsm8k",
    output:
        generations=directory("reports/baseline/generations"),
        metrics="reports/baseline/metrics.json",
    params:
        rollout=config["rollout"],
        eval=config["eval"],
        baseline=config["baseline"],
    log:
        "logs/baseline.log",
    threads: MODEL_THREADS
    resources:
        gpu=GPUS,
        mem_mb=64000,
        runtime=120,
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --model {input.model} --data {input.data}"
        " --metrics {output.metrics} --generations {output.generations} > {log} 2>&1"


rule filter_cots:
    input:
        script="stages/filter_cots.py",
        code=["src/reasonrl/cot_filter.py", "src/reasonrl/grading.py", "src/reasonrl/prompts"],
        data="data/gsm8k",
        model="models/base",
    output:
        pairs=directory("data/sft"),
        stats="reports/filter_cots/stats.json",
    log:
        "logs/filter_cots.log",
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --data {input.data} --model {input.model}"
        " --out {output.pairs} --stats {output.stats} > {log} 2>&1"


rule sft:
    input:
        script="stages/sft.py",
        code=[
            "src/reasonrl/sft.py",
            "src/reasonrl/losses.py",
            "src/reasonrl/logprobs.py",
            "src/reasonrl/tokenization.py",
            "src/reasonrl/evaluation.py",
            "src/reasonrl/rollout.py",
        ],
        pairs="data/sft",
        data="data/gsm8k",
        model="models/base",
    output:
        model=directory("models/sft"),
        live=directory("reports/sft/live"),
        metrics="reports/sft/metrics.json",
    params:
        sft=config["sft"],
        rollout=config["rollout"],
        eval=config["eval"],
    log:
        "logs/sft.log",
    threads: MODEL_THREADS
    resources:
        gpu=GPUS,
        mem_mb=64000,
        runtime=360,
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --model {input.model} --pairs {input.pairs} --data {input.data}"
        " --out {output.model} --metrics {output.metrics} --live {output.live} > {log} 2>&1"


rule expert_iteration:
    input:
        script="stages/expert_iteration.py",
        code=[
            "src/reasonrl/expert_iteration.py",
            "src/reasonrl/sft.py",
            "src/reasonrl/losses.py",
            "src/reasonrl/grading.py",
            "src/reasonrl/evaluation.py",
            "src/reasonrl/rollout.py",
        ],
        data="data/gsm8k",
        base="models/base",
        sft="models/sft",
    output:
        model=directory("models/ei"),
        live=directory("reports/ei/live"),
        metrics="reports/ei/metrics.json",
    params:
        ei=config["ei"],
        rollout=config["rollout"],
        eval=config["eval"],
    log:
        "logs/expert_iteration.log",
    threads: MODEL_THREADS
    resources:
        gpu=GPUS,
        mem_mb=64000,
        runtime=720,
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --base {input.base} --sft {input.sft} --data {input.data}"
        " --out {output.model} --metrics {output.metrics} --live {output.live} > {log} 2>&1"


rule grpo:
    input:
        script="stages/grpo.py",
        code=[
            "src/reasonrl/grpo.py",
            "src/reasonrl/losses.py",
            "src/reasonrl/logprobs.py",
            "src/reasonrl/tokenization.py",
            "src/reasonrl/grading.py",
            "src/reasonrl/evaluation.py",
            "src/reasonrl/rollout.py",
        ],
        data="data/gsm8k",
        base="models/base",
        sft="models/sft",
        ei="models/ei",
    output:
        model=directory("models/grpo"),
        live=directory("reports/grpo/live"),
        metrics="reports/grpo/metrics.json",
    params:
        # Not an output: Snakemake deletes a failed job's outputs, and these checkpoints are what a rerun (or a
        # retry, see profiles/slurm) resumes from. dvc.yaml declares them persist: true, cache: false.
        checkpoints="models/grpo_checkpoints",
        grpo=config["grpo"],
        rollout=config["rollout"],
        eval=config["eval"],
    log:
        "logs/grpo.log",
    threads: MODEL_THREADS
    resources:
        gpu=GPUS,
        mem_mb=64000,
        runtime=1440,
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --base {input.base} --sft {input.sft} --ei {input.ei}"
        " --data {input.data} --out {output.model} --checkpoints {params.checkpoints} --metrics {output.metrics}"
        " --live {output.live} > {log} 2>&1"


rule final_eval:
    input:
        script="stages/final_eval.py",
        code=[
            "src/reasonrl/evaluation.py",
            "src/reasonrl/grading.py",
            "src/reasonrl/rollout.py",
            "src/reasonrl/prompts",
        ],
        data="data/gsm8k",
        base="models/base",
        sft="models/sft",
        ei="models/ei",
        grpo="models/grpo",
    output:
        generations=directory("reports/final/generations"),
        metrics="reports/final/metrics.json",
    params:
        rollout=config["rollout"],
        eval=config["eval"],
    log:
        "logs/final_eval.log",
    threads: MODEL_THREADS
    resources:
        gpu=GPUS,
        mem_mb=64000,
        runtime=240,
    conda:
        ENV
    shell:
        "python {input.script} --params params.yaml --data {input.data}"
        " --model base={input.base} --model sft={input.sft} --model ei={input.ei} --model grpo={input.grpo}/best"
        " --metrics {output.metrics} --generations {output.generations} > {log} 2>&1"


rule report:
    input:
        script="stages/report.py",
        code="src/reasonrl/report.py",
        final="reports/final/metrics.json",
        baseline="reports/baseline/metrics.json",
        sft_live="reports/sft/live",
        ei_live="reports/ei/live",
        grpo_live="reports/grpo/live",
    output:
        markdown="reports/report.md",
        html="reports/report.html",
        figures=directory("reports/figures"),
    log:
        "logs/report.log",
    conda:
        ENV
    shell:
        # --reports is the folder the script collects every stage's metrics from.
        "python {input.script} --params params.yaml --reports reports --out {output.markdown}"
        " --html {output.html} --figures {output.figures} > {log} 2>&1"


rule all:
    default_target: True
    input:
        rules.report.output,

"""params.yaml validation: every error names the dotted parameter; presets only touch existing parameters."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from reasonrl.config import (
    ConfigError,
    GRPOConfig,
    OverlongPenalty,
    Params,
    SFTConfig,
    flat_dict,
    from_dict,
    load_params,
    parse_yaml,
)
from reasonrl.presets import apply_overrides, checked_overrides, load_preset

REPO = Path(__file__).resolve().parents[1]
SHA = "ab" * 32
TEST_SET = {"name": "x", "path": "x.jsonl", "sha256": SHA}
JSONL_FILES = {split: {"path": f"{split}.jsonl", "sha256": SHA} for split in ("train", "test")}


def test_repository_params_are_valid_full_scale(params_file):
    params = load_params(params_file)
    assert params.model.name == "Qwen/Qwen2.5-Math-1.5B"
    assert params.rollout.layout == "split"
    assert (params.eval.temperature, params.eval.top_p, params.eval.max_tokens) == (1.0, 1.0, 1024)
    assert params.eval.stop == ["</answer>"]
    assert params.eval.num_examples is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"eval": {"temperature": -1}}, "eval.temperature: must be ≥ 0"),
        ({"eval": {"top_p": 0}}, r"eval.top_p: must be in \(0, 1\]"),
        ({"eval": {"max_tokens": "many"}}, "eval.max_tokens: must be int"),
        ({"eval": {"min_tokens": 2000}}, "eval.min_tokens: must be in"),
        ({"eval": {"tempreature": 1.0}}, "eval.tempreature: unknown parameter"),
        ({"rollout": {"layout": "tpu"}}, "rollout.layout: must be one of"),
        ({"baseline": {"prompts": ["cot"]}}, r"baseline.prompts: unknown \['cot'\]"),
        ({"data": {"val_size": 0}}, "data.val_size: must be ≥ 1"),
        ({"data": {"sha256": {"train": "x"}}}, "data.sha256: needs exactly the keys train and test"),
        ({"model": {"tiny": {"hidden_size": 96}}}, "model.tiny: hidden_size/num_heads must be 64"),
        ({"report": {}}, "report: unknown parameter"),
        (
            {"grpo": {"train_batch_size": 100}},
            r"grpo.train_batch_size: \(100\) must be divisible by grpo.gradient_accumulation_steps \(128\)",
        ),
        (
            {"grpo": {"rollout_batch_size": 250}},
            r"grpo.rollout_batch_size: \(250\) must be divisible by grpo.group_size \(8\)",
        ),
        ({"grpo": {"loss_type": "ppo"}}, "grpo.loss_type: must be one of"),
        ({"eval": {"num_examples": True}}, "eval.num_examples: must be int"),
        ({"grpo": {"microbatch_tokens": 0}}, "grpo.microbatch_tokens: must be a number of tokens ≥ 1 or null"),
        ({"sft": {"microbatch_tokens": -5}}, "sft.microbatch_tokens: must be a number of tokens ≥ 1 or null"),
        ({"ei": {"precision": "fp16"}}, r"ei.precision: must be one of \['mixed', 'bf16'\]"),
        (
            {"rollout": {"gpu_memory_utilization": 1.5}},
            r"rollout.gpu_memory_utilization: must be a fraction in \(0, 1\]",
        ),
        (
            {"grpo": {"cliprange_high": 0.28}},
            "grpo.cliprange_high: only grpo_clip or gspo or gspo_token or cispo clips",
        ),
        ({"grpo": {"kl_coef": -0.1}}, "grpo.kl_coef: must be ≥ 0"),
        ({"grpo": {"kl_estimator": "k1"}}, r"grpo.kl_estimator: must be one of \['k2', 'k3', 'k3_k2grad'\]"),
        # Issue 32: the advantage estimator, the reference refresh and the overlong penalty.
        ({"grpo": {"advantage_estimator": "loo"}}, r"grpo.advantage_estimator: must be one of \['group_mean_std', 'rl"),
        ({"grpo": {"advantage_estimator": "rloo"}}, "grpo.use_std_normalization: must be false with grpo.advantage_e"),
        ({"grpo": {"ref_update_every": 3}}, "grpo.ref_update_every: refreshes the KL reference, but grpo.kl_coef is 0"),
        ({"grpo": {"ref_update_every": -1, "kl_coef": 0.1}}, "grpo.ref_update_every: must be ≥ 0 "),
        (
            {"grpo": {"ref_update_every": 2, "kl_coef": 0.1, "lora_rank": 8}},
            "grpo.ref_update_every: needs grpo.lora_rank 0",
        ),
        (
            {"grpo": {"overlong_penalty": {"buffer": 2048, "max_penalty": 1.0}}},
            r"grpo.overlong_penalty.buffer: must be ≤ grpo.max_tokens \(1024\)",
        ),
        ({"grpo": {"overlong_penalty": {"max_penalty": 1.0}}}, "grpo.overlong_penalty.buffer: must be a number of tok"),
        (
            {"grpo": {"overlong_penalty": {"buffer": 64, "max_penalty": 0}}},
            "grpo.overlong_penalty.max_penalty: must be >",
        ),
        (
            {"grpo": {"overlong_penalty": {"buffer": 64, "factor": 1.0}}},
            "grpo.overlong_penalty.factor: unknown parameter",
        ),
        ({"grpo": {"overlong_penalty": 64}}, "grpo.overlong_penalty: must be a mapping, got 64"),
        # Issue 20: params that used to fail late, in vLLM or in the middle of a stage, or never.
        ({"eval": {"stop": ["</answer>", ""]}}, r"eval.stop\[1\]: must be a non-empty string"),
        ({"eval": {"temperature": float("inf")}}, "eval.temperature: must be a finite number, got inf"),
        ({"eval": {"top_p": float("nan")}}, "eval.top_p: must be a finite number, got nan"),
        ({"sft": {"learning_rate": float("inf")}}, "sft.learning_rate: must be a finite number, got inf"),
        ({"grpo": {"learning_rate": float("inf")}}, "grpo.learning_rate: must be a finite number, got inf"),
        ({"grpo": {"kl_coef": float("inf")}}, "grpo.kl_coef: must be a finite number, got inf"),
        ({"grpo": {"betas": [0.9, float("nan")]}}, r"grpo.betas\[1\]: must be a finite number, got nan"),
        ({"grpo": {"max_grad_norm": 10**400}}, "grpo.max_grad_norm: must be a finite number"),
        ({"rollout": {"max_model_len": 16}}, r"rollout.max_model_len: \(16\) must exceed eval.max_tokens \(1024\)"),
        (
            {"rollout": {"max_model_len": 1200}, "grpo": {"max_tokens": 1200}},
            r"rollout.max_model_len: \(1200\) must exceed grpo.max_tokens \(1200\)",
        ),
        (
            {"model": {"name": "tiny"}, "rollout": {"max_model_len": 4096}},
            r"rollout.max_model_len: \(4096\) must be ≤ model.tiny.max_position_embeddings \(2048\)",
        ),
        ({"model": {"tiny": {"vocab_size": 1}}}, "model.tiny.vocab_size: must be ≥ 257"),
        ({"model": {"tiny": {"num_layers": 0}}}, "model.tiny.num_layers: must be ≥ 1, got 0"),
        ({"model": {"tiny": {"num_heads": 0}}}, "model.tiny.num_heads: must be ≥ 1, got 0"),
        # Issue 23: learning-rate schedules.
        (
            {"grpo": {"lr_schedule": "exponential"}},
            r"grpo.lr_schedule: must be one of \['constant', 'linear', 'cosine'\]",
        ),
        ({"sft": {"lr_schedule": "step"}}, r"sft.lr_schedule: must be one of \['constant', 'linear', 'cosine'\]"),
        ({"grpo": {"warmup_steps": -1}}, r"grpo.warmup_steps: must be in \[0, 200\] .*, got -1"),
        (
            {"grpo": {"warmup_steps": 201}},
            r"grpo.warmup_steps: must be in \[0, 200\] \(the run's optimizer steps: grpo.n_grpo_steps × .*, got 201",
        ),
        (
            {"grpo": {"warmup_steps": 401, "epochs_per_rollout_batch": 2, "loss_type": "grpo_clip"}},
            r"grpo.warmup_steps: must be in \[0, 400\]",
        ),
        (
            {"data": {"name": "arithmetic", "val_size": 5000}},
            r"data.val_size: must be less than data.arithmetic.train_size \(5000\)",
        ),
        # Issue 23: your own data.
        ({"data": {"name": "jsonl"}}, "data.jsonl.train.path: required with data.name: jsonl"),
        (
            {"data": {"name": "jsonl", "jsonl": {"train": {"path": "t.jsonl", "sha256": SHA}, "test": {"path": "u"}}}},
            r"data.jsonl.test.sha256: required with data.name: jsonl: the file's SHA-256 .*\(`sha256sum u`\), got None",
        ),
        (
            {"data": {"jsonl": {"answer_format": "tex"}}},
            r"data.jsonl.answer_format: must be one of \['gsm8k', 'number', 'boxed', 'latex'\]",
        ),
        # Issue 33: benchmarks by name, symbolic answers.
        ({"eval": {"benchmarks": ["math"]}}, r"eval.benchmarks\[0\]: must be one of \['math500', 'aime24', "),
        ({"eval": {"benchmarks": ["svamp", "aime24", "svamp"]}}, r"eval.benchmarks\[2\]: 'svamp' is listed twice"),
        (
            {"eval": {"benchmarks": ["svamp"], "test_sets": [{**TEST_SET, "name": "svamp"}]}},
            r"eval.test_sets\[0\].name: 'svamp' names a benchmark of eval.benchmarks too",
        ),
        ({"eval": {"decontaminate": "yes"}}, "eval.decontaminate: must be bool"),
        (
            {"data": {"name": "jsonl", "jsonl": {**JSONL_FILES, "answer_format": "latex"}}},
            r"rewards.question_only: the built-in question_only grades one number, but data.jsonl.answer_format is "
            r"latex: set rewards.question_only: math_verify",
        ),
        (
            {"rewards": {"r1_zero": "math_verify_reward"}},
            r"rewards.r1_zero: 'math_verify_reward' is neither a built-in "
            r"reward \(r1_zero, question_only, r1_zero_chat, math_verify\) nor module:function",
        ),
        ({"eval": {"test_sets": [{**TEST_SET, "name": "a.b"}]}}, "eval.test_sets\\[0\\].name: must be letters, digits"),
        (
            {"eval": {"test_sets": [TEST_SET, {**TEST_SET, "name": "x"}]}},
            "eval.test_sets\\[1\\].name: 'x' names an earlier test set too",
        ),
        (
            {"eval": {"test_sets": [{**TEST_SET, "sha256": SHA.upper()}]}},
            "eval.test_sets\\[0\\].sha256: required for each test set: the file's SHA-256 as 64 lowercase",
        ),
        ({"eval": {"test_sets": [{**TEST_SET, "answer_field": 3}]}}, "eval.test_sets\\[0\\].answer_field: must be str"),
        ({"distributed": {"timeout_minutes": 0}}, "distributed.timeout_minutes: must be a positive number of minutes"),
        ({"rollout": {"sleep_level": 3}}, r"rollout.sleep_level: must be 1 \(weights to host memory\) or 2"),
        # Stale rollouts and their truncated importance-sampling correction.
        ({"grpo": {"max_staleness": -1}}, "grpo.max_staleness: must be ≥ 0 .*got -1"),
        ({"grpo": {"max_staleness": True}}, "grpo.max_staleness: must be int"),
        ({"grpo": {"rollout_is_cap": 0.5}}, r"grpo.rollout_is_cap: must be ≥ 1 or null \(off\), got 0.5"),
        (
            {"grpo": {"max_staleness": 2}},
            "grpo.rollout_is_cap: must be set with grpo.max_staleness 2 > 0: an uncorrected stale gradient is biased; "
            "set e.g. 2.0",
        ),
        (
            {"grpo": {"rollout_is_cap": 2.0, "old_log_probs_from": "engine"}},
            "grpo.old_log_probs_from: must be policy with grpo.rollout_is_cap 2.0: .*weight would always be 1",
        ),
        (
            {"grpo": {"max_staleness": 1, "rollout_is_cap": 2.0}, "rollout": {"sleep_level": 2}},
            "rollout.sleep_level: must be 1 with grpo.max_staleness 1 > 0: the engine's process loads each weight",
        ),
        (
            {"grpo": {"max_staleness": 1, "rollout_is_cap": 2.0}, "rollout": {"layout": "colocate"}},
            r"rollout.layout: must not be colocate .*the engine must own its device: use split \(two GPUs\) or cpu",
        ),
        (
            {"grpo": {"max_staleness": 1, "rollout_is_cap": 2.0}, "distributed": {"nproc_per_node": 2}},
            "rollout.layout: must be colocate",  # torchrun's own check comes first for split
        ),
        (
            {
                "grpo": {"max_staleness": 1, "rollout_is_cap": 2.0},
                "rollout": {"layout": "cpu"},
                "distributed": {"nproc_per_node": 2},
            },
            r"distributed.nproc_per_node: × nnodes \(world size 2\) must be 1 .*torchrun runs are synchronous",
        ),
        (
            {
                "grpo": {"max_staleness": 1, "rollout_is_cap": 2.0},
                "rollout": {"layout": "cpu"},
                "distributed": {"nnodes": 2},
            },
            r"distributed.nproc_per_node: × nnodes \(world size 2\) must be 1",
        ),
    ],
)
def test_invalid_params_name_the_parameter(tmp_path, full_scale_params, override, message):
    tree = yaml.safe_load(full_scale_params)
    for section, values in override.items():
        tree.setdefault(section, {}).update(values)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=message) as error:
        load_params(path)
    assert str(error.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    "override",
    [
        {"grpo": {"max_staleness": 1, "rollout_is_cap": 2.0}},  # split, the committed layout
        {"grpo": {"max_staleness": 3, "rollout_is_cap": 1}, "rollout": {"layout": "cpu"}},  # an int cap, the floor
        {"grpo": {"rollout_is_cap": 5.0, "loss_type": "grpo_clip"}},  # TIS on a synchronous run
        {"grpo": {"rollout_is_cap": None, "old_log_probs_from": "engine"}},
        {"rollout": {"layout": "colocate"}, "distributed": {"nproc_per_node": 2}},  # synchronous torchrun
    ],
)
def test_valid_staleness_and_importance_cap_combinations_load(tmp_path, full_scale_params, override):
    tree = yaml.safe_load(full_scale_params)
    for section, values in override.items():
        tree.setdefault(section, {}).update(values)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    grpo = load_params(path).grpo
    expected = override.get("grpo", {})
    assert grpo.asynchrony.max_staleness == expected.get("max_staleness", 0)
    assert grpo.asynchrony.rollout_is_cap == expected.get("rollout_is_cap")
    assert grpo.asynchrony.rollout_is_cap is None or isinstance(grpo.asynchrony.rollout_is_cap, float)


def test_staleness_and_importance_cap_default_to_off(params_file):
    assert (Params().grpo.asynchrony.max_staleness, Params().grpo.asynchrony.rollout_is_cap) == (0, None)
    grpo = load_params(params_file).grpo  # the committed params.yaml agrees with the code's defaults
    assert (grpo.asynchrony.max_staleness, grpo.asynchrony.rollout_is_cap) == (0, None)


def test_cpu_preset_selects_tiny_model_synthetic_task_and_cpu_layout(params_file):
    overrides = checked_overrides("cpu", params_file)
    tree = yaml.safe_load(params_file.read_text())
    apply_overrides(tree, overrides)
    params = from_dict(Params, tree)
    assert params.model.name == "tiny"
    assert params.rollout.layout == "cpu"
    assert params.data.name == "arithmetic"
    assert params.eval.max_tokens < 1024


def test_preset_cannot_invent_parameters():
    with pytest.raises(ConfigError, match="no parameter 'nme'"):
        apply_overrides({"model": {"name": "x"}}, {"model.nme": "tiny"})
    with pytest.raises(ConfigError, match="unknown preset 'gpu9'"):
        load_preset("gpu9")


def test_exponent_without_dot_is_a_number(tmp_path, full_scale_params):
    """PyYAML reads ``5e-5`` as a string (YAML 1.1); ``dvc exp run -S grpo.learning_rate=5e-5`` writes exactly that."""
    path = tmp_path / "params.yaml"
    path.write_text(full_scale_params.replace("learning_rate: 1.0e-5", "learning_rate: 5e-5"))
    assert load_params(path).grpo.optimizer.learning_rate == 5e-5
    path.write_text(full_scale_params.replace("learning_rate: 1.0e-5", "learning_rate: fast"))
    with pytest.raises(ConfigError, match="grpo.learning_rate: must be a number, got 'fast'"):
        load_params(path)


@pytest.mark.parametrize("section", ["sft", "ei", "grpo"])
def test_a_training_section_is_flat_in_params_yaml_and_grouped_in_code(full_scale_params, section):
    """params.yaml lists every key of a training section, flat; each reaches its group, and flat_dict gives the
    section back as params.yaml names it."""
    raw = parse_yaml(full_scale_params)[section]
    config = getattr(from_dict(Params, parse_yaml(full_scale_params)), section)
    assert flat_dict(config) == raw
    assert sorted(flat_dict(getattr(Params(), section))) == sorted(raw)


def test_a_training_section_takes_flat_keys_its_groups_or_both():
    flat = GRPOConfig(temperature=0.5, loss_type="grpo_clip", learning_rate=3e-6)
    assert (flat.sampling.temperature, flat.loss.loss_type, flat.optimizer.learning_rate) == (0.5, "grpo_clip", 3e-6)
    assert flat.optimizer.betas == [0.9, 0.95]  # the section's defaults of the group, where a key does not say
    assert GRPOConfig(sampling=flat.sampling, loss=flat.loss, optimizer=flat.optimizer) == flat
    changed = dataclasses.replace(flat, kl_coef=0.1)
    assert changed.loss == dataclasses.replace(flat.loss, kl_coef=0.1) and changed.sampling == flat.sampling
    assert GRPOConfig(**{**flat.__dict__, "mask_truncated": True}).loss.mask_truncated
    with pytest.raises(ConfigError, match="^grpo.temperature: must be > 0"):
        dataclasses.replace(flat, temperature=0.0)
    with pytest.raises(TypeError, match="tempreature"):
        GRPOConfig(tempreature=0.5)
    assert SFTConfig(betas=[0.8, 0.9]).optimizer.betas == [0.8, 0.9] and SFTConfig().optimizer.betas == [0.9, 0.999]


def test_the_overlong_penalty_is_a_mapping_in_params_yaml_and_a_dataclass_in_code(tmp_path, full_scale_params):
    tree = yaml.safe_load(full_scale_params)
    tree["grpo"]["overlong_penalty"] = {"buffer": 256, "max_penalty": 1}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tree))
    grpo = load_params(path).grpo
    assert grpo.sampling.overlong_penalty == OverlongPenalty(buffer=256, max_penalty=1.0)
    assert isinstance(grpo.sampling.overlong_penalty.max_penalty, float)
    assert flat_dict(grpo)["overlong_penalty"] == {"buffer": 256, "max_penalty": 1.0}  # the fingerprint's, the card's
    assert Params().grpo.sampling.overlong_penalty is None  # off by default, as in the committed params.yaml

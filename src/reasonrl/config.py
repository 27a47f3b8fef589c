"""The typed, validated view of ``params.yaml``: one dataclass per section, mirroring the file.

``load_params`` rejects unknown keys, wrong types and out-of-range values with an error that names the dotted
parameter (``eval.temperature``), before any stage loads a model.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from reasonrl.prompts import PROMPT_NAMES
from reasonrl.rollout import EngineConfig
from reasonrl.tiny_model import TinyModelSpec


class ConfigError(ValueError):
    """A parameter is missing, unknown, mistyped or out of range; the message names it."""


def _require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


@dataclass(frozen=True)
class DataConfig:
    """``data``: where GSM8K comes from and how train is split into train/val."""

    name: Literal["gsm8k"] = "gsm8k"
    """Data set; GSM8K's official jsonl files."""
    url: str = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
    """Base URL of the official upstream files (used when no mirror is given)."""
    mirror: str | None = None
    """Local directory holding train.jsonl/test.jsonl; null → env GSM8K_MIRROR, else download from ``url``."""
    sha256: dict[str, str] = field(
        default_factory=lambda: {
            "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
            "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
        }
    )
    """Expected SHA-256 of each upstream file (train, test): a mismatch stops the download stage."""
    val_size: int = 500
    """Questions carved from train for model selection; the test set is only for baseline and final eval."""
    split_seed: int = 0
    """Seed of the train/val shuffle."""

    def __post_init__(self) -> None:
        _require(set(self.sha256) == {"train", "test"}, "data.sha256", "needs exactly the keys train and test")
        _require(self.val_size >= 1, "data.val_size", f"must be ≥ 1, got {self.val_size}")


@dataclass(frozen=True)
class ModelConfig:
    """``model``: the base model the routes start from."""

    name: str = "Qwen/Qwen2.5-Math-1.5B"
    """A hub id (downloaded), a local HF model directory, or ``tiny`` (built here, for tests and the CPU demo)."""
    tiny: TinyModelSpec = field(default_factory=TinyModelSpec)
    """Shape of the ``tiny`` model (ignored otherwise)."""
    seed: int = 0
    """Initialisation seed of the ``tiny`` model."""


@dataclass(frozen=True)
class EvalConfig:
    """``eval``: sampling for every evaluation (baseline, validation during training, final)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    min_tokens: int = 0
    stop: list[str] = field(default_factory=lambda: ["</answer>"])
    """Stop strings, kept in the output (the grader needs the closing tag)."""
    num_examples: int | None = None
    """Evaluate the first N questions of the split; null = all."""
    samples_per_question: int = 1
    """Samples per question; accuracy averages over all of them (more samples → smaller standard error)."""

    def __post_init__(self) -> None:
        _require(self.temperature >= 0, "eval.temperature", f"must be ≥ 0, got {self.temperature}")
        _require(0 < self.top_p <= 1, "eval.top_p", f"must be in (0, 1], got {self.top_p}")
        _require(self.max_tokens >= 1, "eval.max_tokens", f"must be ≥ 1, got {self.max_tokens}")
        _require(
            0 <= self.min_tokens <= self.max_tokens,
            "eval.min_tokens",
            f"must be in [0, eval.max_tokens={self.max_tokens}], got {self.min_tokens}",
        )
        _require(
            self.num_examples is None or self.num_examples >= 1,
            "eval.num_examples",
            f"must be ≥ 1 or null, got {self.num_examples}",
        )
        _require(self.samples_per_question >= 1, "eval.samples_per_question", "must be ≥ 1")


@dataclass(frozen=True)
class BaselineConfig:
    """``baseline``: the zero-shot evaluation of the base model on the test set."""

    prompts: list[str] = field(default_factory=lambda: list(PROMPT_NAMES))
    """Prompt templates to evaluate, each scored with its own reward function."""

    def __post_init__(self) -> None:
        unknown = [name for name in self.prompts if name not in PROMPT_NAMES]
        _require(not unknown, "baseline.prompts", f"unknown {unknown}; choose from {list(PROMPT_NAMES)}")
        _require(bool(self.prompts), "baseline.prompts", "must name at least one prompt")


@dataclass(frozen=True)
class SFTOptimization:
    """Optimisation of one supervised fine-tuning run (shared by ``sft`` and each expert-iteration round)."""

    learning_rate: float = 2e-5
    """AdamW peak learning rate (linear warm-up, then constant)."""
    warmup_ratio: float = 0.05
    """Fraction of the optimizer steps spent warming the learning rate up from 0."""
    batch_size: int = 32
    """Sequences per optimizer step (the effective batch)."""
    microbatch_size: int = 4
    """Sequences per forward/backward; batch_size / microbatch_size = gradient accumulation steps."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm)."""
    weight_decay: float = 0.0
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory for long sequences, ~30% slower."""
    seed: int = 0
    """Data order and any training randomness."""

    def _validate_optimization(self, section: str) -> None:
        _require(self.learning_rate > 0, f"{section}.learning_rate", f"must be > 0, got {self.learning_rate}")
        _require(0 <= self.warmup_ratio < 1, f"{section}.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        _require(self.microbatch_size >= 1, f"{section}.microbatch_size", "must be ≥ 1")
        _require(
            self.batch_size >= 1 and self.batch_size % self.microbatch_size == 0,
            f"{section}.batch_size",
            f"must be a positive multiple of {section}.microbatch_size={self.microbatch_size}, got {self.batch_size}",
        )
        _require(self.max_grad_norm > 0, f"{section}.max_grad_norm", "must be > 0")
        _require(self.weight_decay >= 0, f"{section}.weight_decay", "must be ≥ 0")

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.batch_size // self.microbatch_size


@dataclass(frozen=True)
class SFTConfig(SFTOptimization):
    """``sft``: supervised fine-tuning of the base model on reference chains of thought (handout Algorithm 1)."""

    dataset: Literal["full", "filtered"] = "filtered"
    """``full``: every GSM8K train example; ``filtered``: those whose reference CoT is verified correct."""
    num_examples: int | None = None
    """Train on the first N pairs (the handout's sweep: 128, 256, 512, 1024); null = all."""
    epochs: int = 1
    max_steps: int | None = None
    """Stop after this many optimizer steps (null: run all epochs)."""
    eval_every: int = 50
    """Optimizer steps between validation evaluations (one more at the end)."""
    eval_examples: int = 500
    """Validation questions per evaluation."""

    def __post_init__(self) -> None:
        self._validate_optimization("sft")
        _require(self.num_examples is None or self.num_examples >= 1, "sft.num_examples", "must be ≥ 1 or null")
        _require(self.epochs >= 1, "sft.epochs", "must be ≥ 1")
        _require(self.max_steps is None or self.max_steps >= 1, "sft.max_steps", "must be ≥ 1 or null")
        _require(self.eval_every >= 1, "sft.eval_every", "must be ≥ 1")
        _require(self.eval_examples >= 1, "sft.eval_examples", "must be ≥ 1")


@dataclass(frozen=True)
class EIConfig(SFTOptimization):
    """``ei``: expert iteration (handout Algorithm 2): sample, keep the correct answers, fine-tune on them."""

    init_model: Literal["base", "sft"] = "base"
    """Model the rounds start from."""
    n_steps: int = 5
    """Rounds of sample → filter → SFT."""
    questions_per_step: int = 512
    """Train questions sampled per round (the handout's batch size Db)."""
    num_rollouts: int = 4
    """Responses per question (G)."""
    sft_epochs: int = 1
    """SFT epochs over each round's kept pairs."""
    temperature: float = 1.0
    min_tokens: int = 4
    """Rollouts shorter than this cannot end: no empty answers."""
    max_tokens: int = 1024
    eval_examples: int = 500
    """Validation questions evaluated after each round."""

    def __post_init__(self) -> None:
        self._validate_optimization("ei")
        for name in ("n_steps", "questions_per_step", "num_rollouts", "sft_epochs", "max_tokens", "eval_examples"):
            _require(getattr(self, name) >= 1, f"ei.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        _require(self.temperature > 0, "ei.temperature", "must be > 0 (sampling)")
        _require(0 <= self.min_tokens <= self.max_tokens, "ei.min_tokens", "must be in [0, ei.max_tokens]")


@dataclass(frozen=True)
class Params:
    """All of ``params.yaml``."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: EngineConfig = field(default_factory=EngineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    ei: EIConfig = field(default_factory=EIConfig)


def _convert(value: Any, annotation: Any, name: str) -> Any:
    """Check ``value`` against a (resolved) type annotation; build nested dataclasses."""
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        _require(isinstance(value, dict), name, f"must be a mapping, got {value!r}")
        return from_dict(annotation, value, name)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None:
            _require(type(None) in options, name, "must not be null")
            return None
        (inner,) = [option for option in options if option is not type(None)]
        return _convert(value, inner, name)
    if origin is Literal:
        choices = typing.get_args(annotation)
        _require(value in choices, name, f"must be one of {list(choices)}, got {value!r}")
        return value
    if origin is list:
        _require(isinstance(value, list), name, f"must be a list, got {value!r}")
        (inner,) = typing.get_args(annotation)
        return [_convert(item, inner, f"{name}[{index}]") for index, item in enumerate(value)]
    if origin is dict:
        _require(isinstance(value, dict), name, f"must be a mapping, got {value!r}")
        _, inner = typing.get_args(annotation)
        return {str(key): _convert(item, inner, f"{name}.{key}") for key, item in value.items()}
    if annotation is float:
        _require(
            isinstance(value, int | float) and not isinstance(value, bool), name, f"must be a number, got {value!r}"
        )
        return float(value)
    if annotation in (int, str, bool):
        _require(
            isinstance(value, annotation) and (annotation is bool or not isinstance(value, bool)),
            name,
            f"must be {annotation.__name__}, got {value!r}",
        )
        return value
    raise TypeError(f"{name}: unsupported annotation {annotation!r}")  # a bug in this module, not in the params


def from_dict(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping; unset fields take their defaults, unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    known = sorted(f.name for f in dataclasses.fields(cls))
    kwargs = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        _require(key in known, name, f"unknown parameter; {prefix or 'the top level'} has {known}")
        kwargs[key] = _convert(value, hints[key], name)
    try:
        return cls(**kwargs)
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{prefix or 'params'}: {error}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; every error names the file and the dotted parameter."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of parameter sections")
    try:
        return from_dict(Params, raw)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None

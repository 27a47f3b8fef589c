"""The GPU memory plan of a training stage, checked before any model loads.

A stage that trains holds, on the policy's GPU: the weights, their gradients and AdamW's two moments (4 bytes each per
parameter in ``mixed`` precision, where autocast also caches a bf16 copy of the weights; 2 bytes each in ``bf16``),
the activations of one microbatch, and in ``colocate`` the rollout engine's share (with LoRA, gradients and AdamW
state are the adapters' alone). Two moments matter there:

- generating (engine awake): the policy's weights and optimizer state stay resident beside the engine's
  ``gpu_memory_utilization`` share (gradients are freed after every optimizer step);
- training (engine asleep, with ``enable_sleep``): everything of the policy, with the whole GPU but a reserve.

Activations per token of a decoder layer are ``(10·hidden + 4·intermediate) × 2`` bytes (bf16; × 1.25 for ``mixed``,
whose residual stream and norms stay fp32), or ``hidden × 2`` with gradient checkpointing, which keeps only each
layer's input and recomputes one layer at a time. Calibrated against one H200 (Qwen2.5-Math-1.5B's shape, bf16,
one GRPO step of 256 responses, reserve not counted): 8k-token microbatches 36.4 GB planned / 35 GB measured, 16k
59.9 / 57, 16k with checkpointing 16.0 / 15.5 (``tests/test_memory.py``). ``mixed`` is not measured yet: its
activation factor is an estimate.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from reasonrl.config import LAYOUT_GPUS, ConfigError, EngineConfig, Precision

GIB = 2**30
RESERVE_BYTES = 3 * GIB
"""Not the plan's to give away: the CUDA context, allocator fragmentation, and what a sleeping engine keeps (CUDA
graphs, sampler buffers)."""
LOGITS_WORKSPACE_BYTES = 512 * 2**20
"""The chunked output layer's float32 logits buffers (see ``reasonrl.logprobs.CHUNK_LOGITS_BYTES``)."""
BYTES_PER_PARAMETER = {"mixed": (4, 4, 8, 2), "bf16": (2, 2, 4, 0)}
"""Weights, gradients, AdamW state, and autocast's bf16 copy of the weights, per parameter."""
MIXED_ACTIVATION_FACTOR = 1.25


class TrainingMemorySettings(Protocol):
    """The params of a training section (``sft``, ``ei``, ``grpo``) that the plan reads."""

    precision: Precision
    microbatch_size: int
    microbatch_tokens: int | None
    gradient_checkpointing: bool
    lora_rank: int
    lora_target_modules: list[str]


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs to know of a model, read from its directory without loading it."""

    parameters: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    linear_weights: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The linear layers' weight matrices, name → (out, in): what LoRA can adapt."""

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelShape:
        """From ``config.json`` and the safetensors headers (the parameter count, whatever the architecture)."""
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        tensors = tensor_shapes(model_dir)
        # The 2-D weights but the vocabulary-sized ones (the embedding and the output layer, tied in small models:
        # an adapter there would change one and not the other).
        linear_weights = {
            name: (shape[0], shape[1])
            for name, shape in tensors.items()
            if name.endswith(".weight") and len(shape) == 2 and config["vocab_size"] not in shape
        }
        return cls(
            parameters=sum(math.prod(shape) for shape in tensors.values()),
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            intermediate_size=config["intermediate_size"],
            linear_weights=linear_weights,
        )

    @property
    def linear_modules(self) -> set[str]:
        """The names LoRA targets them by: the last component of each linear layer's module name."""
        return {_module_leaf(name) for name in self.linear_weights}

    def lora_parameters(self, rank: int, target_modules: list[str]) -> int:
        """Parameters of rank-``rank`` adapters on the matrices of ``target_modules``: r × (in + out) each."""
        targets = set(target_modules)
        return sum(
            rank * (rows + columns)
            for name, (rows, columns) in self.linear_weights.items()
            if _module_leaf(name) in targets
        )


def _module_leaf(weight_name: str) -> str:
    return weight_name.removesuffix(".weight").rpartition(".")[2]


def tensor_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Every tensor's shape in a model directory's safetensors files, from their JSON headers (an 8-byte length,
    then the header): sizes without loading a weight."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{model_dir}: no *.safetensors weights to read the model's shape from")
    shapes = {}
    for path in files:
        with path.open("rb") as stream:
            (header_length,) = struct.unpack("<Q", stream.read(8))
            header = json.loads(stream.read(header_length))
        shapes.update((name, entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return shapes


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on the policy's GPU, by use."""

    weights: int
    gradients: int
    optimizer: int
    autocast_weights: int
    reference: int
    """A copy of the init model (in the policy's dtype) for ``grpo.kl_coef > 0``."""
    activations: int
    engine: int
    """The engine's share while it generates (``colocate`` only; 0 in ``split``)."""
    engine_while_training: int
    """The engine's share while the policy trains: 0 when it sleeps or lives on another GPU."""
    device: int

    @property
    def generating(self) -> int:
        return self.weights + self.optimizer + self.reference + self.engine + RESERVE_BYTES

    @property
    def training(self) -> int:
        policy = self.weights + self.gradients + self.optimizer + self.autocast_weights + self.activations
        policy += self.reference
        return policy + self.engine_while_training + RESERVE_BYTES

    def summary(self) -> str:
        parts = {
            "weights": self.weights,
            "gradients": self.gradients,
            "AdamW": self.optimizer,
            "reference": self.reference,
            "activations": self.activations + self.autocast_weights,
            "engine": self.engine,
        }
        listed = ", ".join(f"{name} {_gib(size)}" for name, size in parts.items() if size)
        return (
            f"GPU memory plan of {_gib(self.device)}: training {_gib(self.training)}, generating "
            f"{_gib(self.generating)} ({listed}, reserve {_gib(RESERVE_BYTES)})"
        )


def plan_memory(
    shape: ModelShape, settings: TrainingMemorySettings, engine: EngineConfig, device_bytes: int, shards: int = 1
) -> MemoryPlan:
    """The plan of a policy of ``shape`` trained with ``settings`` beside an engine laid out as ``engine``; its
    weights, gradients and AdamW state split in ``shards`` (FSDP2 over that many ranks: one GPU's share)."""
    weight_bytes, gradient_bytes, optimizer_bytes, autocast_bytes = BYTES_PER_PARAMETER[settings.precision]
    lora = settings.lora_rank > 0
    adapters = shape.lora_parameters(settings.lora_rank, settings.lora_target_modules) if lora else 0
    trained = adapters if lora else shape.parameters
    # The longest microbatch: the token budget, or the fixed microbatch at the longest sequence the engine allows;
    # a sequence longer than the budget is a microbatch of its own.
    tokens = max(settings.microbatch_tokens or settings.microbatch_size * engine.max_model_len, engine.max_model_len)
    per_layer = (10 * shape.hidden_size + 4 * shape.intermediate_size) * 2
    if settings.gradient_checkpointing:
        per_token = shape.num_layers * shape.hidden_size * 2 + per_layer  # layer inputs + one layer recomputed
    else:
        per_token = shape.num_layers * per_layer
    factor = MIXED_ACTIVATION_FACTOR if settings.precision == "mixed" else 1.0
    activations = int(tokens * per_token * factor) + LOGITS_WORKSPACE_BYTES
    engine_share = int(engine.engine_memory_fraction * device_bytes) if engine.layout == "colocate" else 0
    sleeps = engine.layout != "colocate" or engine.enable_sleep
    return MemoryPlan(
        weights=weight_bytes * (shape.parameters + adapters) // shards,
        gradients=gradient_bytes * trained // shards,
        optimizer=optimizer_bytes * trained // shards,
        autocast_weights=autocast_bytes * shape.parameters // shards,
        # The reference copies the policy's weights, in their dtype; a LoRA policy with its adapters off is the
        # reference: no copy.
        reference=weight_bytes * shape.parameters if getattr(settings, "kl_coef", 0.0) > 0 and not lora else 0,
        activations=activations,
        engine=engine_share,
        engine_while_training=0 if sleeps else engine_share,
        device=device_bytes,
    )


def check_memory_plan(plan: MemoryPlan, section: str, engine: EngineConfig) -> None:
    """Raise a :class:`ConfigError` naming the params to change when a phase of ``plan`` does not fit its GPU."""
    if plan.generating > plan.device:
        room = (plan.device - plan.weights - plan.optimizer - RESERVE_BYTES) / plan.device
        fits = f"at most {room:.2f} fits" if room > 0 else "no share fits"
        raise ConfigError(
            f"rollout.gpu_memory_utilization: while the engine generates, the policy keeps {_gib(plan.weights)} of "
            f"weights and {_gib(plan.optimizer)} of AdamW state beside the engine's "
            f"{engine.engine_memory_fraction:.2f} × {_gib(plan.device)} on cuda:0 ({fits}); lower "
            f"rollout.gpu_memory_utilization, set {section}.precision=bf16, or use rollout.layout=split on two GPUs"
        )
    if plan.training > plan.device:
        advice = f"lower {section}.microbatch_tokens"
        if not plan.engine_while_training == 0:
            advice = "set rollout.enable_sleep=true, " + advice
        raise ConfigError(
            f"{section}.microbatch_tokens: training needs {_gib(plan.training)} on a {_gib(plan.device)} GPU "
            f"(weights, gradients and AdamW {_gib(plan.weights + plan.gradients + plan.optimizer)}, activations "
            f"{_gib(plan.activations + plan.autocast_weights)}, engine {_gib(plan.engine_while_training)}); {advice}, "
            f"set {section}.gradient_checkpointing=true, or {section}.precision=bf16"
        )


def _gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


def check_gpu_memory(
    model_dir: str | Path, settings: TrainingMemorySettings, section: str, engine: EngineConfig, shards: int = 1
) -> str | None:
    """Check the plan on this machine's GPUs before any model loads (``cpu`` layout: nothing to check, ``None``);
    returns the plan's one-line summary. ``shards``: the ranks FSDP2 splits the policy over."""
    if engine.layout == "cpu":
        return None
    import torch  # GPU-only from here on

    needed = LAYOUT_GPUS[engine.layout]
    found = torch.cuda.device_count()
    if found < needed:
        raise ConfigError(f"rollout.layout: {engine.layout} needs {needed} CUDA GPU(s); this machine has {found}")
    if engine.layout == "split" and torch.device(engine.engine_device).index >= found:
        raise ConfigError(f"rollout.engine_device: no {engine.engine_device} on this machine ({found} GPUs)")
    device_bytes = torch.cuda.get_device_properties(0).total_memory
    plan = plan_memory(ModelShape.from_dir(model_dir), settings, engine, device_bytes, shards)
    check_memory_plan(plan, section, engine)
    return plan.summary()

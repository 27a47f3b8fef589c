"""The GPU memory plan of a training stage, checked before any model loads.

A stage that trains holds, on the policy's GPU: the weights, their gradients and AdamW's two moments (4 bytes each per
parameter in ``mixed`` precision; 2 bytes each in ``bf16``), in ``mixed`` autocast's bf16 copy of the decoder layers'
weights (each saved for the backward pass), the activations of one microbatch, the chunked output layer's backward
buffers (:func:`output_layer_backward_bytes`), in ``colocate`` the rollout engine's share (with LoRA, gradients
and AdamW state are the adapters' alone), and with the engine in its own process (``grpo.max_staleness`` ≥ 1) the
weight hand-off (:func:`weight_transfer_bytes`). Two moments matter there:

- generating (engine awake): the policy's weights and optimizer state stay resident beside the engine's
  ``gpu_memory_utilization`` share (gradients are freed after every optimizer step);
- training (engine asleep, with ``enable_sleep``): everything of the policy, with the whole GPU but a reserve.

Under torchrun each rank's GPU holds more. DDP keeps its gradient buckets, a second copy of the gradients, for the
whole run: ``gradient_as_bucket_view`` would make the gradients views into them, but the loops free the gradients
after every step (``zero_grad(set_to_none=True)``), so the next step's accumulate into fresh tensors beside the
buckets (as torch documents under DDP's ``batched_grad_copy``). FSDP2 shards weights, gradients and AdamW state, but
gathers the root (embeddings and final norm, kept unsharded from forward to backward) and a decoder layer at a time
(two with the next one prefetched) and holds that layer's unsharded gradient; autocast's bf16 copies, cast from the
gathered layers and saved for the backward pass, are whole. What a stage saves (kept policies, the final and best
weights, checkpoints) every rank gathers a tensor at a time, and only rank 0 keeps each, in host memory
(:func:`reasonrl.training.best.whole_weights`): no more than the gathered layers' room on any GPU.

Activations per token of a decoder layer are ``(10·hidden + 4·intermediate) × 2`` bytes (bf16; × 1.25 for ``mixed``,
whose residual stream and norms stay fp32), or ``hidden × 2`` with gradient checkpointing, which keeps only each
layer's input and recomputes one layer at a time. Calibrated against one H200 (Qwen2.5-Math-1.5B's shape, bf16,
one GRPO step of 256 responses, reserve not counted): 8k-token microbatches 37.3 GB planned / 35 GB measured, 16k
60.8 / 57, 16k with checkpointing 16.9 / 15.5 (``tests/test_memory.py``). ``mixed`` is not measured yet: its
activation factor is an estimate.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.config import LAYOUT_GPUS, ConfigError, EngineConfig, GRPOConfig, Precision, SFTOptimization
from reasonrl.logprobs import CHUNK_LOGITS_BYTES

BUCKET_BYTES = 256 * 2**20
"""The most one transfer of the weight stream to the engine's own process carries
(:mod:`reasonrl.rollouts.channel`; vLLM's and TRL's weight-update examples bucket similarly)."""

GIB = 2**30
RESERVE_BYTES = 3 * GIB
"""Not the plan's to give away: the CUDA context, allocator fragmentation, and what a sleeping engine keeps (CUDA
graphs, sampler buffers)."""
BYTES_PER_PARAMETER = {"mixed": (4, 4, 8, 2), "bf16": (2, 2, 4, 0)}
ENGINE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Weights, gradients, AdamW state, and autocast's bf16 copy of the weights, per parameter."""
MIXED_ACTIVATION_FACTOR = 1.25


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs to know of a model, read from its directory without loading it."""

    parameters: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    layer_parameters: int
    """The largest decoder layer's parameters: FSDP2's unit (``reasonrl.distributed.wrap_for_training``)."""
    linear_weights: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The linear layers' weight matrices, name → (out, in): what LoRA can adapt."""

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelShape:
        """From ``config.json`` and the safetensors headers (the parameter count, whatever the architecture)."""
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        tensors = tensor_shapes(model_dir)
        vocab_size = config["vocab_size"]
        # The 2-D weights but the vocabulary-sized ones (the embedding and the output layer, tied in small models:
        # an adapter there would change one and not the other).
        linear_weights = {
            name: (shape[0], shape[1])
            for name, shape in tensors.items()
            if name.endswith(".weight") and len(shape) == 2 and vocab_size not in shape
        }
        parameters = sum(math.prod(shape) for shape in tensors.values())
        layers: dict[str, int] = {}
        for name, shape in tensors.items():
            if match := re.search(r"\.layers\.(\d+)\.", name):  # HF decoders: model.layers.<i>.*
                layers[match[1]] = layers.get(match[1], 0) + math.prod(shape)
        layer_parameters = max(layers.values(), default=0)
        if not layer_parameters:  # other names: all but the vocabulary-sized tensors, split evenly
            vocab_parameters = sum(math.prod(shape) for shape in tensors.values() if vocab_size in shape)
            layer_parameters = (parameters - vocab_parameters) // config["num_hidden_layers"]
        return cls(
            parameters=parameters,
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            intermediate_size=config["intermediate_size"],
            vocab_size=vocab_size,
            layer_parameters=layer_parameters,
            linear_weights=linear_weights,
        )

    @property
    def root_parameters(self) -> int:
        """What is not in a decoder layer: the embeddings (and an untied output layer), the final norm."""
        return self.parameters - self.num_layers * self.layer_parameters

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
    """``mixed``: autocast's bf16 copies of the decoder layers' weights, saved for the backward pass."""
    reference: int
    """A copy of the init model (in the policy's dtype) for ``grpo.kl_coef > 0``."""
    activations: int
    output_layer: int
    """The chunked output layer's backward buffers (:func:`output_layer_backward_bytes`)."""
    ddp_buckets: int
    """DDP's gradient buckets: a second copy of the gradients, allocated for the whole run."""
    gathered: int
    """FSDP2: the unsharded root, two unsharded decoder layers and one layer's unsharded gradient."""
    engine: int
    """The engine's share while it generates (``colocate`` only; 0 in ``split``)."""
    engine_while_training: int
    """The engine's share while the policy trains: 0 when it sleeps or lives on another GPU."""
    device: int
    weight_transfer: int = 0
    """The weights handed to the engine's own process (:func:`weight_transfer_bytes`)."""

    @property
    def resident(self) -> int:
        """What the policy keeps while the engine generates."""
        return self.weights + self.optimizer + self.reference + self.ddp_buckets

    @property
    def generating(self) -> int:
        return self.resident + self.engine + RESERVE_BYTES

    @property
    def training(self) -> int:
        policy = self.resident + self.gradients + self.autocast_weights + self.activations + self.output_layer
        # The hand-off's packed copies wait while the policy trains; its packing, between two steps, is counted here
        # too (it never meets the activations: a bound, not an estimate).
        return policy + self.gathered + self.engine_while_training + self.weight_transfer + RESERVE_BYTES

    def parts(self, engine: int) -> dict[str, int]:
        """The plan's uses by name, with ``engine`` as the engine's share."""
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "DDP buckets": self.ddp_buckets,
            "AdamW": self.optimizer,
            "reference": self.reference,
            "activations": self.activations + self.autocast_weights,
            "output layer": self.output_layer,
            "FSDP2 gathered": self.gathered,
            "weight hand-off": self.weight_transfer,
            "engine": engine,
        }

    def summary(self) -> str:
        return (
            f"GPU memory plan of {_gib(self.device)}: training {_gib(self.training)}, generating "
            f"{_gib(self.generating)} ({_listing(self.parts(self.engine))}, reserve {_gib(RESERVE_BYTES)})"
        )


def output_layer_backward_bytes(shape: ModelShape, precision: Precision) -> int:
    """The peak of the chunked output layer's backward pass (``reasonrl.logprobs``), which runs while every
    activation is still held: the float32 gradient of its ``[V, H]`` weight, the 16-bit weight it multiplies by (a
    cast in ``mixed``, the weight itself in ``bf16``), and for one chunk of ``C`` positions either its ``[C, V]``
    logits in float32 beside their 16-bit form and the previous chunk's 16-bit gradient (``8·C·V`` bytes), or its
    16-bit ``[C, V]`` gradient beside the 16-bit ``[V, H]`` product that is added to the weight gradient."""
    vocab_hidden = shape.vocab_size * shape.hidden_size
    rows = max(1, CHUNK_LOGITS_BYTES // (shape.vocab_size * 4))  # get_response_log_probs's default chunk
    chunk = rows * shape.vocab_size
    cast = 2 * vocab_hidden if precision == "mixed" else 0
    return 4 * vocab_hidden + cast + max(8 * chunk, 2 * chunk + 2 * vocab_hidden)


def weight_transfer_bytes(shape: ModelShape, engine: EngineConfig, max_staleness: int) -> int:
    """What the trainer holds to hand its weights to the engine's own process (``max_staleness`` ≥ 1;
    :class:`reasonrl.rollouts.process.RolloutProcess`): the bucket being packed beside the tensor being copied into
    it (each at most the larger of a bucket and the largest tensor, the ``[V, H]`` embedding, in the engine's dtype;
    ``mixed`` casts that tensor first), and ``max_staleness − 1`` packed copies of the weights waiting for the
    engine, which carry the output layer's weight even when it is tied to the embedding."""
    if max_staleness == 0:
        return 0
    element = ENGINE_DTYPE_BYTES[engine.dtype]
    vocab_hidden = shape.vocab_size * shape.hidden_size
    packing = 2 * max(BUCKET_BYTES, element * vocab_hidden)
    return packing + (max_staleness - 1) * element * (shape.parameters + vocab_hidden)


def plan_memory(
    shape: ModelShape,
    settings: SFTOptimization | GRPOConfig,
    engine: EngineConfig,
    device_bytes: int,
    shards: int = 1,
    ddp: bool = False,
) -> MemoryPlan:
    """The plan of a policy of ``shape`` trained with ``settings`` beside an engine laid out as ``engine``; its
    weights, gradients and AdamW state split in ``shards`` (FSDP2 over that many ranks: one GPU's share), or whole
    beside DDP's buckets (``ddp``)."""
    weight_bytes, gradient_bytes, optimizer_bytes, autocast_bytes = BYTES_PER_PARAMETER[settings.precision]
    lora = settings.lora.lora_rank > 0
    adapters = shape.lora_parameters(settings.lora.lora_rank, settings.lora.lora_target_modules) if lora else 0
    trained = adapters if lora else shape.parameters
    # The longest microbatch: the token budget, or the fixed microbatch at the longest sequence the engine allows;
    # a sequence longer than the budget is a microbatch of its own.
    batching = settings.batching
    tokens = max(batching.microbatch_tokens or batching.microbatch_size * engine.max_model_len, engine.max_model_len)
    per_layer = (10 * shape.hidden_size + 4 * shape.intermediate_size) * 2
    if settings.gradient_checkpointing:
        per_token = shape.num_layers * shape.hidden_size * 2 + per_layer  # layer inputs + one layer recomputed
    else:
        per_token = shape.num_layers * per_layer
    factor = MIXED_ACTIVATION_FACTOR if settings.precision == "mixed" else 1.0
    engine_share = int(engine.engine_memory_fraction * device_bytes) if engine.layout == "colocate" else 0
    sleeps = engine.layout != "colocate" or engine.enable_sleep
    # GRPO alone has a KL penalty (a reference model) and an engine in its own process.
    grpo = settings if isinstance(settings, GRPOConfig) else None
    gathered = 0
    if shards > 1:
        layer_gradient = 0 if lora else gradient_bytes * shape.layer_parameters
        gathered = weight_bytes * (shape.root_parameters + 2 * shape.layer_parameters) + layer_gradient
    return MemoryPlan(
        weights=weight_bytes * (shape.parameters + adapters) // shards,
        gradients=gradient_bytes * trained // shards,
        optimizer=optimizer_bytes * trained // shards,
        # Whole under FSDP2 too: each layer's copy is cast from its gathered weights. The embeddings are looked up
        # in fp32 and the output layer casts its own weight (in output_layer).
        autocast_weights=autocast_bytes * shape.num_layers * shape.layer_parameters,
        # The reference copies the policy's weights, in their dtype; a LoRA policy with its adapters off is the
        # reference: no copy.
        reference=weight_bytes * shape.parameters if grpo and grpo.loss.kl_coef > 0 and not lora else 0,
        activations=int(tokens * per_token * factor),
        output_layer=output_layer_backward_bytes(shape, settings.precision),
        ddp_buckets=gradient_bytes * trained if ddp else 0,
        gathered=gathered,
        engine=engine_share,
        engine_while_training=0 if sleeps else engine_share,
        device=device_bytes,
        weight_transfer=weight_transfer_bytes(shape, engine, grpo.asynchrony.max_staleness if grpo else 0),
    )


def check_memory_plan(plan: MemoryPlan, section: str, engine: EngineConfig) -> None:
    """Raise a :class:`ConfigError` naming the params to change when a phase of ``plan`` does not fit its GPU."""
    if plan.generating > plan.device:
        room = (plan.device - plan.resident - RESERVE_BYTES) / plan.device
        fits = f"at most {room:.2f} fits" if room > 0 else "no share fits"
        resident = {
            "weights": plan.weights,
            "AdamW": plan.optimizer,
            "DDP buckets": plan.ddp_buckets,
            "reference": plan.reference,
        }
        # Under torchrun (DDP buckets, FSDP2 gathers) every rank holds its own engine: split is single-process.
        split = "" if plan.ddp_buckets or plan.gathered else ", or use rollout.layout=split on two GPUs"
        raise ConfigError(
            f"rollout.gpu_memory_utilization: while the engine generates, the policy keeps {_gib(plan.resident)} "
            f"({_listing(resident)}) beside the engine's {engine.engine_memory_fraction:.2f} × {_gib(plan.device)} "
            f"on cuda:0 ({fits}); lower rollout.gpu_memory_utilization or set {section}.precision=bf16{split}"
        )
    if plan.training > plan.device:
        advice = f"lower {section}.microbatch_tokens"
        if not plan.engine_while_training == 0:
            advice = "set rollout.enable_sleep=true, " + advice
        if plan.weight_transfer:
            advice += ", lower grpo.max_staleness"
        raise ConfigError(
            f"{section}.microbatch_tokens: training needs {_gib(plan.training)} on a {_gib(plan.device)} GPU "
            f"({_listing(plan.parts(plan.engine_while_training))}); {advice}, set "
            f"{section}.gradient_checkpointing=true, or {section}.precision=bf16"
        )


def _listing(parts: dict[str, int]) -> str:
    return ", ".join(f"{name} {_gib(size)}" for name, size in parts.items() if size)


def _gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


def check_gpus(engine: EngineConfig, device_count: int) -> None:
    """Raise a :class:`ConfigError` naming ``rollout.layout`` (or ``rollout.engine_device``) when this machine's
    ``device_count`` visible CUDA GPUs cannot hold ``engine``'s layout. The memory plan checks it, and so does
    :class:`reasonrl.rollouts.engine.RolloutEngine` before anything touches CUDA: the evaluation stages start an
    engine without a plan, and vLLM's own failure (``invalid device ordinal`` for ``split`` on one GPU) names
    nothing."""
    needed = LAYOUT_GPUS[engine.layout]
    if device_count < needed:
        instead = "colocate (engine and policy share cuda:0)" if device_count == 1 else "cpu"
        raise ConfigError(
            f"rollout.layout: {engine.layout} needs {needed} CUDA GPU{'s' * (needed > 1)}, this machine has "
            f"{device_count}; set rollout.layout={instead}"
        )
    if engine.layout == "split" and int(engine.engine_device.split(":")[1]) >= device_count:
        raise ConfigError(
            f"rollout.engine_device: this machine has no {engine.engine_device} ({device_count} GPUs, cuda:0 is the "
            f"policy's); set rollout.engine_device to {' or '.join(f'cuda:{i}' for i in range(1, device_count))}"
        )


def check_gpu_memory(
    model_dir: str | Path, settings: SFTOptimization | GRPOConfig, section: str, engine: EngineConfig, shards: int = 1
) -> MemoryPlan | None:
    """Check the plan on this machine's GPUs before any model loads (``cpu`` layout: nothing to check, ``None``);
    returns the plan. ``shards``: the ranks FSDP2 splits the policy over."""
    if engine.layout == "cpu":
        return None
    import torch  # GPU-only from here on

    check_gpus(engine, torch.cuda.device_count())
    device_bytes = torch.cuda.get_device_properties(0).total_memory
    # Ranks that FSDP2 does not shard train under DDP (reasonrl.distributed.wrap_for_training); the process group
    # exists by now (stages/grpo.py makes it before the engine).
    ddp = shards == 1 and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    plan = plan_memory(ModelShape.from_dir(model_dir), settings, engine, device_bytes, shards, ddp)
    check_memory_plan(plan, section, engine)
    return plan

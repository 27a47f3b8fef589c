"""LoRA fine-tuning (arXiv:2106.09685) through ``peft``, invisible outside the training loop.

The adapters are injected into the HF model itself (``peft.inject_adapter_in_model``, no ``PeftModel`` wrapper), so
the policy keeps its class, its ``.model`` and ``.lm_head`` and every code path that takes a policy. Everything that
leaves the training loop sees merged weights under the base model's names: the engine at every weight load (vLLM
needs no LoRA support), the best checkpoint and the saved model directories (the next stage and ``final_eval`` load
them like any other). Merging is computed, W + (α/r)·B·A per adapted matrix, never done in place: merging and
unmerging would round the base weights a little at every sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from reasonrl.config import ConfigError, LoRAConfig
from reasonrl.distributed import full_tensor

ADAPTER = "default"
"""peft's name for the one adapter a policy carries."""


def add_lora(policy: torch.nn.Module, lora: LoRAConfig) -> torch.nn.Module:
    """Inject rank-``lora_rank`` adapters into ``policy``'s ``lora_target_modules`` in place and freeze every other
    parameter. B starts at zero, so the policy's outputs are unchanged until the first step."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=lora.lora_rank,
        lora_alpha=lora.lora_alpha,
        target_modules=list(lora.lora_target_modules),
        lora_dropout=0.0,  # the merged weights the engine samples from are exactly the policy that is trained
        bias="none",
    )
    return inject_adapter_in_model(config, policy, adapter_name=ADAPTER)


def lora_layers(policy: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The policy's LoRA-wrapped modules by name (empty for a fully fine-tuned policy)."""
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in policy.named_modules() if isinstance(module, LoraLayer)}


def merged_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``policy``'s weights under the base model's names, each adapted matrix with its LoRA update folded in; one
    tensor at a time, so a caller streaming them (the engine's reload) never holds a second copy of the model.
    For a policy without LoRA, exactly ``state_dict()``; whole tensors under FSDP2."""
    adapted = lora_layers(policy)
    for name, tensor in policy.state_dict().items():
        tensor = full_tensor(tensor)  # an FSDP2 shard gathered (every rank iterates, in the same order)
        if not adapted:
            yield name, tensor
            continue
        if ".lora_" in name:
            continue
        module_name, _, leaf = name.rpartition(".base_layer.")
        if not module_name:
            yield name, tensor
            continue
        if leaf == "weight":
            with torch.no_grad():
                delta = full_tensor(adapted[module_name].get_delta_weight(ADAPTER))
            tensor = tensor + delta.to(tensor.dtype)
        yield f"{module_name}.{leaf}", tensor


@contextlib.contextmanager
def adapters_disabled(policy: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``policy`` as the model it started from (its adapters off), e.g. the KL reference of a LoRA run at no extra
    memory; a policy without LoRA is left as it is."""
    layers = list(lora_layers(policy).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield policy
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def trainable_parameters(policy: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer updates: every parameter, or the adapters alone once LoRA has frozen the rest."""
    return [parameter for parameter in policy.parameters() if parameter.requires_grad]


def trainable_parameter_count(policy: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in trainable_parameters(policy))


def check_lora_targets(model_dir: str | Path, lora: LoRAConfig, section: str) -> None:
    """Before any model loads: each of ``lora_target_modules`` names a weight matrix of the model in ``model_dir``
    (read from its safetensors headers), or a :class:`ConfigError` names the param and lists the candidates."""
    if lora.lora_rank == 0:
        return
    from reasonrl.memory import ModelShape  # the headers are read in one place

    modules = ModelShape.from_dir(model_dir).linear_modules
    missing = sorted(set(lora.lora_target_modules) - modules)
    if missing:
        raise ConfigError(
            f"{section}.lora_target_modules: {', '.join(missing)} name no weight matrix of {model_dir} "
            f"(its linear layers: {', '.join(sorted(modules))})"
        )

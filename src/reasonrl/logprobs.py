"""Per-token log-probabilities and entropies of a causal LM's responses.

Memory is the point of this module. The naive path — ``log_softmax(model(input_ids).logits)`` gathered at the labels
— holds several ``[B, T, V]`` float tensors at once (logits, log-softmax, their gradients): at Qwen's vocabulary of
151,936 that is 1.2 GB per tensor for 2 × 1,024 tokens, far more than the rest of a small model's activations.
``get_response_log_probs`` never builds the full logits: it runs the decoder body to hidden states ``[B, T, H]`` and
applies the output layer a chunk of positions at a time, keeping only each position's log-normaliser; the backward
pass recomputes each chunk's logits (one more output-layer matmul) instead of storing them.
``bench/logprob_memory.py`` measures the two paths against each other.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

CHUNK_LOGITS_BYTES = 128 * 2**20
"""Default size of one chunk's float32 logits: a few such buffers are alive at once, whatever the sequence length."""

# Causal-LM classes whose forward computes ``logits = lm_head(decoder(input_ids).last_hidden_state)`` and nothing
# more (read in transformers 5.19): no logit scaling or softcapping, so the chunked head reproduces them exactly.
# Anything else (Gemma's softcapping, Cohere's or Granite's logit scale, a wrapped or compiled model) takes the plain
# ``model(input_ids).logits`` path: correct, but it materialises ``[B, T, V]``.
_PLAIN_HEAD_FORWARDS = frozenset(
    f"transformers.models.{module}.modeling_{module}.{name}ForCausalLM.forward"
    for module, name in (("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("llama", "Llama"), ("mistral", "Mistral"))
)


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position, ``[..., V]`` → ``[...]``.

    Uses ``H = logsumexp(z) - sum(softmax(z) * z)``: no log of a probability that underflows to 0, so the
    result stays finite for extreme logits where ``-sum(p * log p)`` gives NaN.
    """
    log_normalizer = torch.logsumexp(logits, dim=-1)  # [...]
    probs = torch.softmax(logits, dim=-1)  # [..., V]
    return log_normalizer - (probs * logits).sum(dim=-1)


def get_response_log_probs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    return_token_entropy: bool = False,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    entropy_grad: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probabilities ``log p(labels[t] | input_ids[:t+1])`` under ``model``, ``[B, T]``, float32.

    ``temperature``: of the distribution ``softmax(logits / temperature)``, the one a sampler at that temperature
    draws from (log-probs, entropy and gradient alike); at 1.0 the logits are not divided at all.

    ``token_entropy`` (``[B, T]``, when asked) is a diagnostic: ``compute_entropy`` of each position's logits,
    computed without gradient, so it costs no activation memory in the backward pass. With ``entropy_grad`` it is
    differentiable (an entropy bonus in the loss, ``grpo.entropy_coef``), from the same forward: the chunked path's
    backward adds ``dH/dz = -p (log p + H)`` to each recomputed chunk's gradient.

    For Qwen2/Qwen3/Llama/Mistral causal LMs the full ``[B, T, V]`` logits never exist: the output layer runs over
    ``chunk_size`` positions (of the flattened ``B * T``) at a time and is recomputed in backward. The default
    ``chunk_size`` keeps one chunk's float32 logits near ``CHUNK_LOGITS_BYTES``; smaller saves memory, larger saves
    per-chunk overhead. Other models go through ``model(input_ids).logits`` (see ``_PLAIN_HEAD_FORWARDS``).
    Logits are reduced in float32 whatever the model's dtype: a 151,936-way log-normaliser in bfloat16 keeps
    barely two significant digits.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of positions; got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature!r}")
    head = model.get_output_embeddings()
    plain_head = f"{type(model).forward.__module__}.{type(model).forward.__qualname__}" in _PLAIN_HEAD_FORWARDS
    if not (plain_head and isinstance(head, nn.Linear)):
        return _full_logits_log_probs(model, input_ids, labels, return_token_entropy, temperature, entropy_grad)

    hidden = model.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, T, H]
    if chunk_size is None:
        chunk_size = max(1, CHUNK_LOGITS_BYTES // (head.out_features * 4))
    log_probs, entropy = _ChunkedLinearLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]),  # [B*T, H]
        head.weight,  # [V, H]
        head.bias,  # [V] or None
        labels.reshape(-1),  # [B*T]
        chunk_size,
        return_token_entropy,
        temperature,
        return_token_entropy and entropy_grad,
    )
    result = {"log_probs": log_probs.view(labels.shape)}  # [B, T]
    if return_token_entropy:
        result["token_entropy"] = entropy.view(labels.shape)  # [B, T]
    return result


def _full_logits_log_probs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    return_token_entropy: bool,
    temperature: float,
    entropy_grad: bool,
) -> dict[str, torch.Tensor]:
    """The fallback for heads the chunked path cannot reproduce: full logits, but still no full ``log_softmax``."""
    logits = model(input_ids).logits.float()  # [B, T, V]
    if temperature != 1.0:
        logits = logits / temperature  # not in place: the model's own graph may have saved its logits
    label_logits = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [B, T]
    result = {"log_probs": label_logits - torch.logsumexp(logits, dim=-1)}  # [B, T]
    if return_token_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            result["token_entropy"] = compute_entropy(logits)  # [B, T]
    return result


class _ChunkedLinearLogProbs(torch.autograd.Function):
    """``log_softmax((hidden @ weight.T + bias) / temperature)`` at ``labels``, by chunks of rows, logits recomputed
    in backward.

    One Function over all chunks (rather than a checkpoint per chunk) lets backward accumulate the ``[V, H]`` weight
    gradient into a single buffer, and it needs only one ``[C, V]`` buffer per chunk: the recomputed logits are turned
    into their own gradient in place (``d log p(y) / d z = onehot(y) - softmax(z)``).

    ``entropy_grad``: the entropy is differentiable too (``d H / d z = -p (log p + H)``, one more ``[C, V]`` buffer in
    backward); otherwise it is marked non-differentiable and backward is the log-probs' alone.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size, with_entropy, temperature, entropy_grad):
        rows = hidden.shape[0]
        log_probs = hidden.new_empty(rows, dtype=torch.float32)  # [N]
        log_normalizer = hidden.new_empty(rows, dtype=torch.float32)  # [N]
        entropy = hidden.new_empty(rows if with_entropy else 0, dtype=torch.float32)  # [N] or [0]
        # Under autocast (``mixed`` precision) the matmuls run in its dtype, in backward too, which autocast does not
        # reach: the weights are cast once per call, not once per chunk.
        ctx.compute_dtype = _compute_dtype(hidden, weight)
        weight_c, bias_c = _cast(weight, ctx.compute_dtype), _cast(bias, ctx.compute_dtype)
        for rows_slice in _chunks(rows, chunk_size):
            logits = _tempered(_logits(hidden[rows_slice].to(ctx.compute_dtype), weight_c, bias_c), temperature)
            chunk_labels = labels[rows_slice].unsqueeze(-1)  # [C, 1]
            log_normalizer[rows_slice] = torch.logsumexp(logits, dim=-1)
            log_probs[rows_slice] = logits.gather(-1, chunk_labels).squeeze(-1) - log_normalizer[rows_slice]
            if with_entropy:  # compute_entropy's formula, with one [C, V] buffer instead of two
                probs = (logits - log_normalizer[rows_slice].unsqueeze(-1)).exp_()  # [C, V]
                entropy[rows_slice] = log_normalizer[rows_slice] - probs.mul_(logits).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, labels, log_normalizer, entropy)
        ctx.chunk_size, ctx.temperature, ctx.entropy_grad = chunk_size, temperature, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, bias, labels, log_normalizer, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None  # [N, H]
        # Summed over chunks in float32 even for a 16-bit model: one rounding at the end, not one per chunk.
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None  # [V, H]
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None  # [V]
        # d/dz of log_softmax(z / T) is (onehot - softmax(z / T)) / T: the 1/T rides on the incoming gradient.
        grad_log_probs = grad_log_probs.float() / ctx.temperature  # [N], exact at 1.0
        if ctx.entropy_grad:
            grad_entropy = grad_entropy.float() / ctx.temperature  # [N]
        compute_dtype = ctx.compute_dtype
        weight_c, bias_c = _cast(weight, compute_dtype), _cast(bias, compute_dtype)
        for rows_slice in _chunks(hidden.shape[0], ctx.chunk_size):
            chunk_hidden = hidden[rows_slice].to(compute_dtype)  # [C, H]
            chunk_grad = grad_log_probs[rows_slice].unsqueeze(-1)  # [C, 1]
            grad_logits = _tempered(_logits(chunk_hidden, weight_c, bias_c), ctx.temperature)  # [C, V], recomputed
            if ctx.entropy_grad:  # -g·p - g_H·p·(log p + H) = -p·(g + g_H·(log p + H))
                log_p = grad_logits.sub_(log_normalizer[rows_slice].unsqueeze(-1))  # [C, V], in place
                probs = log_p.exp()  # [C, V]
                chunk_grad_entropy = grad_entropy[rows_slice].unsqueeze(-1)  # [C, 1]
                log_p.add_(entropy[rows_slice].unsqueeze(-1)).mul_(chunk_grad_entropy).add_(chunk_grad)
                grad_logits = log_p.mul_(probs).neg_()
            else:
                grad_logits.sub_(log_normalizer[rows_slice].unsqueeze(-1)).exp_().mul_(-chunk_grad)  # -g * softmax
            grad_logits.scatter_add_(-1, labels[rows_slice].unsqueeze(-1), chunk_grad)  # + g * onehot(label)
            if need_bias:
                grad_bias += grad_logits.sum(dim=0)
            grad_logits = grad_logits.to(compute_dtype)
            if need_hidden:
                grad_hidden[rows_slice] = grad_logits @ weight_c
            if need_weight and compute_dtype == torch.float32:
                grad_weight.addmm_(grad_logits.T, chunk_hidden)
            elif need_weight:
                grad_weight += grad_logits.T @ chunk_hidden  # 16-bit matmul, float32 sum
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        if need_bias:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run the output layer in: its own when it is on for this device, else the weight's."""
    device_type = hidden.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype


def _cast(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(dtype)


def _chunks(rows: int, chunk_size: int) -> list[slice]:
    return [slice(start, min(start + chunk_size, rows)) for start in range(0, rows, chunk_size)]


def _tempered(values: torch.Tensor, temperature: float) -> torch.Tensor:
    """Fresh logits divided by ``temperature`` in place (no second ``[C, V]`` buffer); untouched at 1.0."""
    return values if temperature == 1.0 else values.div_(temperature)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The output layer on ``[C, H]`` hidden states, as float32 ``[C, V]`` (a fresh tensor: safe to edit in place)."""
    logits = torch.nn.functional.linear(hidden, weight, bias)  # [C, V]
    return logits.float() if logits.dtype != torch.float32 else logits

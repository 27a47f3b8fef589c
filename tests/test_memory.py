"""The GPU memory plan: sizes read from a model directory, calibrated against H200 measurements, and the defaults
of every layout fitting an 80 GB card with Qwen2.5-Math-1.5B; a plan that does not fit names the params to change."""

import dataclasses

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import AutoModelForCausalLM

from reasonrl import memory
from reasonrl.config import ConfigError, EngineConfig, GRPOConfig, Params, from_dict, parse_yaml
from reasonrl.logprobs import _ChunkedLinearLogProbs
from reasonrl.memory import (
    GIB,
    RESERVE_BYTES,
    ModelShape,
    check_memory_plan,
    output_layer_backward_bytes,
    plan_memory,
    weight_transfer_bytes,
)
from reasonrl.rollouts.channel import WeightLayout, pack

# Qwen2.5-Math-1.5B: hidden 1536, 28 layers, MLP 8960, vocabulary 151,936 with tied embeddings, 12 heads and 2 KV
# heads of 128. A decoder layer: q and o 1536 × 1536 (q with a bias of 1536), k and v 256 × 1536 (biases of 256),
# gate, up and down 8960 × 1536 each, two norms of 1536 = 46,797,824 parameters.
QWEN_1_5B = ModelShape(
    parameters=1_543_714_304,
    hidden_size=1536,
    num_layers=28,
    intermediate_size=8960,
    vocab_size=151_936,
    layer_parameters=46_797_824,
)
CARD_80GB = 85_045_231_616  # what torch reports as an 80 GB H100's total memory (79.2 GiB)


def test_the_qwen_shape_adds_up():
    layer = 2 * (1536 * 1536) + 1536 + 2 * (256 * 1536 + 256) + 3 * 8960 * 1536 + 2 * 1536
    assert layer == QWEN_1_5B.layer_parameters
    assert QWEN_1_5B.root_parameters == 151_936 * 1536 + 1536  # the tied embedding and the final norm
    assert 28 * layer + QWEN_1_5B.root_parameters == QWEN_1_5B.parameters


def test_shape_is_read_from_the_directory_without_loading_the_model(tiny_model_dir):
    shape = ModelShape.from_dir(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.parameters == sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert (shape.hidden_size, shape.num_layers) == (model.config.hidden_size, model.config.num_hidden_layers)
    assert shape.vocab_size == model.config.vocab_size
    assert shape.layer_parameters == sum(p.numel() for p in model.model.layers[0].parameters())
    assert shape.root_parameters == model.model.embed_tokens.weight.numel() + model.model.norm.weight.numel()


def test_a_directory_without_safetensors_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 8}')
    with pytest.raises(ConfigError, match=str(tmp_path)):
        ModelShape.from_dir(tmp_path)


# One GRPO step of 256 responses on an H200, Qwen2.5-Math-1.5B's shape in pure bf16: peak GB measured by
# torch.cuda.max_memory_allocated, by microbatch token budget and gradient checkpointing.
MEASURED_PEAK_GB = {(8192, False): 35.0, (16384, False): 57.0, (16384, True): 15.5}


@pytest.mark.parametrize(("tokens", "checkpointing"), list(MEASURED_PEAK_GB))
def test_plan_matches_the_peaks_measured_on_a_gpu(tokens, checkpointing):
    settings = GRPOConfig(microbatch_tokens=tokens, gradient_checkpointing=checkpointing, precision="bf16")
    plan = plan_memory(QWEN_1_5B, settings, EngineConfig(layout="split"), CARD_80GB)
    planned = (plan.training - RESERVE_BYTES) / 1e9
    measured = MEASURED_PEAK_GB[tokens, checkpointing]
    print(f"{tokens} tokens, checkpointing {checkpointing}: planned {planned:.1f} GB, measured {measured} GB")
    assert measured <= planned <= 1.1 * measured


@pytest.fixture
def full_scale(full_scale_params) -> Params:
    return from_dict(Params, parse_yaml(full_scale_params))


@pytest.mark.parametrize("layout", ["colocate", "split"])
@pytest.mark.parametrize("section", ["sft", "ei", "grpo"])
def test_the_committed_defaults_fit_an_80gb_card_in_every_layout(full_scale, layout, section):
    engine = dataclasses.replace(full_scale.rollout, layout=layout)
    plan = plan_memory(QWEN_1_5B, getattr(full_scale, section), engine, CARD_80GB)
    print(f"{section}, {layout}: {plan.summary()}")
    check_memory_plan(plan, section, engine)


def test_the_figures_of_the_readmes_memory_table(full_scale):
    split = plan_memory(QWEN_1_5B, full_scale.grpo, full_scale.rollout, CARD_80GB)
    engine = dataclasses.replace(full_scale.rollout, layout="colocate")
    colocate = plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB)
    gib = [round(size / GIB, 1) for size in (split.training, split.generating, colocate.training, colocate.generating)]
    assert gib == [57.6, 20.3, 57.6, 44.0]
    parts = [split.weights, split.gradients, split.optimizer, split.activations + split.autocast_weights]
    assert [round(size / GIB, 1) for size in [*parts, split.output_layer]] == [5.8, 5.8, 11.5, 29.8, 1.8]
    greedy = dataclasses.replace(engine, gpu_memory_utilization=0.85)
    plan = plan_memory(QWEN_1_5B, full_scale.grpo, greedy, CARD_80GB)
    assert round(plan.generating / GIB, 1) == 87.6
    with pytest.raises(ConfigError, match="at most 0.74 fits"):
        check_memory_plan(plan, "grpo", greedy)


def test_an_engine_share_that_leaves_the_policy_no_room_names_the_share(full_scale):
    engine = dataclasses.replace(full_scale.rollout, layout="colocate", gpu_memory_utilization=0.85)
    plan = plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB)
    with pytest.raises(ConfigError, match=r"^rollout.gpu_memory_utilization: .*at most 0\.\d\d fits"):
        check_memory_plan(plan, "grpo", engine)


def test_a_token_budget_too_large_names_the_budget_and_the_remedies(full_scale):
    settings = dataclasses.replace(full_scale.grpo, microbatch_tokens=65536)
    plan = plan_memory(QWEN_1_5B, settings, full_scale.rollout, CARD_80GB)
    with pytest.raises(ConfigError, match=r"^grpo.microbatch_tokens: .*grpo.gradient_checkpointing=true"):
        check_memory_plan(plan, "grpo", full_scale.rollout)
    checkpointed = dataclasses.replace(settings, gradient_checkpointing=True)
    check_memory_plan(plan_memory(QWEN_1_5B, checkpointed, full_scale.rollout, CARD_80GB), "grpo", full_scale.rollout)


def test_an_engine_that_stays_awake_while_training_is_counted(full_scale):
    awake = dataclasses.replace(full_scale.rollout, layout="colocate", enable_sleep=False)
    asleep = dataclasses.replace(awake, enable_sleep=True)
    plans = [plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB) for engine in (awake, asleep)]
    assert plans[0].training - plans[1].training == plans[0].engine > 0


def test_fsdp2_splits_the_policy_state_over_its_ranks(full_scale):
    engine = dataclasses.replace(full_scale.rollout, layout="colocate")
    whole, shard = (plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB, shards) for shards in (1, 8))
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(shard, part) == getattr(whole, part) // 8
    for part in ("activations", "output_layer", "engine"):  # per GPU either way
        assert getattr(shard, part) == getattr(whole, part)


def test_fsdp2_counts_the_gathered_layers_and_whole_autocast_copies(full_scale):
    """``mixed`` over 8 ranks at 1.5B: autocast's bf16 copy of every decoder layer, cast from the gathered weights
    and saved for the backward pass, is whole on each rank (2 × 28 × 46,797,824 bytes, not an eighth of it); the
    root (embedding and final norm, 233,375,232 parameters) stays gathered in fp32 from forward to backward, beside
    two gathered layers (the one computing, the one prefetched) and one layer's unsharded fp32 gradient."""
    engine = dataclasses.replace(full_scale.rollout, layout="colocate")
    whole, shard = (plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB, shards) for shards in (1, 8))
    assert shard.autocast_weights == whole.autocast_weights == 2 * 28 * 46_797_824 == 2_620_678_144  # 2.44 GiB
    assert whole.gathered == 0
    assert shard.gathered == 4 * (233_375_232 + 2 * 46_797_824) + 4 * 46_797_824 == 1_495_074_816  # 1.39 GiB
    print(f"\nFSDP2 over 8 ranks: {shard.summary()}")
    assert round(shard.training / GIB, 1) == 38.9


def test_ddp_keeps_a_second_copy_of_the_gradients_for_the_whole_run(full_scale):
    """Its buckets: the loops free ``.grad`` after every step, so gradients are never views into them. At 1.5B in
    ``mixed``: 4 bytes × 1,543,714,304 = 5.75 GiB on every rank, while training and while the engine generates;
    torchrun's colocate layout still fits an 80 GB card."""
    engine = dataclasses.replace(full_scale.rollout, layout="colocate")
    alone, ranked = (plan_memory(QWEN_1_5B, full_scale.grpo, engine, CARD_80GB, ddp=ddp) for ddp in (False, True))
    assert ranked.ddp_buckets == 4 * 1_543_714_304 == 6_174_857_216
    assert ranked.training - alone.training == ranked.generating - alone.generating == ranked.ddp_buckets
    print(f"\nDDP rank: {ranked.summary()}")
    assert (round(ranked.training / GIB, 1), round(ranked.generating / GIB, 1)) == (63.3, 49.8)
    check_memory_plan(ranked, "grpo", engine)
    greedy = dataclasses.replace(engine, gpu_memory_utilization=0.85)
    with pytest.raises(ConfigError) as error:  # each rank has its own engine: no split layout to suggest
        check_memory_plan(plan_memory(QWEN_1_5B, full_scale.grpo, greedy, CARD_80GB, ddp=True), "grpo", greedy)
    assert "DDP buckets 5.8 GiB" in str(error.value) and "at most 0.67 fits" in str(error.value)
    assert "rollout.layout=split" not in str(error.value)


@pytest.mark.parametrize(("precision", "expected"), [("mixed", 1_933_841_408), ("bf16", 1_467_094_016)])
def test_the_output_layers_backward_buffers_at_qwen_shape(precision, expected):
    """V × H = 151,936 × 1536 = 233,373,696; a chunk is 128 MiB // (151,936 × 4) = 220 positions, C × V =
    33,425,920. The float32 weight gradient 4·V·H = 933,494,784; ``mixed`` casts the fp32 weight to bf16 (2·V·H =
    466,747,392); per chunk the 16-bit gradient beside the 16-bit V × H product (2·C·V + 2·V·H = 533,599,232)
    outweighs the float32 logits beside two 16-bit [C, V] (8·C·V = 267,407,360)."""
    assert output_layer_backward_bytes(QWEN_1_5B, precision) == expected  # 1.80 GiB in mixed, 1.37 GiB in bf16


@pytest.mark.parametrize("precision", ["mixed", "bf16"])
@pytest.mark.parametrize("hidden", [32, 256])  # the chunk's logits (8·C·V) outweigh the V × H product, or not
def test_the_output_layer_formula_is_the_backward_pass_measured_on_cpu(precision, hidden, monkeypatch):
    """The chunked output layer's real backward pass, with CPU autocast standing in for CUDA's: its peak beyond
    what existed before is the formula plus the gradient it hands the decoder ([N, H], which the activation estimate
    covers) and a few [C, H] and [N] buffers."""
    vocab, rows, tokens = 4096, 64, 512
    monkeypatch.setattr(memory, "CHUNK_LOGITS_BYTES", rows * vocab * 4)  # chunks of `rows` positions
    dtype = torch.float32 if precision == "mixed" else torch.bfloat16
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, hidden, generator=generator, dtype=dtype).requires_grad_()  # [V, H]
    states = torch.randn(tokens, hidden, generator=generator, dtype=dtype).requires_grad_()  # [N, H]
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed"):
        log_probs, _ = _ChunkedLinearLogProbs.apply(states, weight, None, labels, rows, False, 1.0, False)
    loss = log_probs.sum()
    tracker = MemTracker()
    tracker.track_external(weight, states, loss)
    with tracker:
        before = tracker.get_tracker_snapshot()[torch.device("cpu")]["Total"]
        loss.backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] - before
    shape = dataclasses.replace(QWEN_1_5B, vocab_size=vocab, hidden_size=hidden)
    planned = output_layer_backward_bytes(shape, precision) + states.numel() * states.element_size()
    print(f"\n{precision}, H = {hidden}: planned {planned:,} bytes, measured peak {peak:,}")
    assert planned <= peak <= planned + 4 * rows * hidden + 16 * tokens


def test_the_weight_hand_off_to_the_engines_process_is_in_the_plan(full_scale):
    """``grpo.max_staleness`` ≥ 1 at 1.5B, bf16 on the engine: packing holds a bucket beside the tensor copied into
    it, each at most the 151,936 × 1536 embedding (2 × 466,747,392 bytes); every lag step beyond the first keeps a
    packed copy of the weights, the tied output layer streamed too (1,543,714,304 + 233,373,696 parameters × 2 bytes),
    while the policy trains."""
    plans = [
        plan_memory(
            QWEN_1_5B, dataclasses.replace(full_scale.grpo, max_staleness=lag, rollout_is_cap=2.0), full_scale.rollout,
            CARD_80GB,
        )
        for lag in (0, 1, 2)
    ]  # fmt: skip
    assert plans[0].weight_transfer == 0
    assert plans[1].weight_transfer == 2 * 466_747_392 == 933_494_784
    assert plans[2].weight_transfer - plans[1].weight_transfer == 2 * (1_543_714_304 + 233_373_696) == 3_554_176_000
    assert plans[2].training - plans[0].training == plans[2].weight_transfer
    assert plans[2].generating == plans[0].generating  # split: the engine generates on its own GPU
    print(f"\nmax_staleness 2: {plans[2].summary()}")
    assert "weight hand-off 4.2 GiB" in plans[2].summary()
    check_memory_plan(plans[2], "grpo", full_scale.rollout)


@pytest.mark.parametrize("staged", [False, True])
def test_the_weight_hand_off_measured_on_cpu_is_the_plans(staged, monkeypatch):
    """``reasonrl.rollouts.channel.pack`` on float32 weights cast to bfloat16 as ``engine_weights`` casts them, the
    embedding larger than a bucket: streamed, its peak beyond the weights is the plan's packing (the embedding's
    bucket beside its cast copy); packed aside (``staged``), the bf16 weights with the tied output layer."""
    vocab, hidden, bucket = 4096, 64, 64 * 2**10
    monkeypatch.setattr(memory, "BUCKET_BYTES", bucket)
    generator = torch.Generator().manual_seed(0)
    weights = {"embed": torch.randn(vocab, hidden, generator=generator)}
    weights |= {f"layer{index}": torch.randn(64, 64, generator=generator) for index in range(8)}
    weights["lm_head"] = weights["embed"]  # tied, as a state dict holds it

    def cast():
        for name, tensor in weights.items():
            yield name, tensor.to(torch.bfloat16)

    layout = WeightLayout.of(cast(), "bfloat16", bucket)
    tracker = MemTracker()
    tracker.track_external(*weights.values())
    with tracker:
        before = tracker.get_tracker_snapshot()[torch.device("cpu")]["Total"]
        if staged:
            kept = list(pack(cast(), layout, torch.device("cpu")))
        else:
            for buffer in pack(cast(), layout, torch.device("cpu")):
                del buffer
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] - before
    parameters = vocab * hidden + 8 * 64 * 64  # tied: the embedding once
    shape = dataclasses.replace(QWEN_1_5B, vocab_size=vocab, hidden_size=hidden, parameters=parameters)
    engine = EngineConfig(dtype="bfloat16")
    packing = weight_transfer_bytes(shape, engine, 1)
    print(f"\nstaged {staged}: measured peak {peak:,} bytes; planned packing {packing:,}")
    if staged:
        held = sum(buffer.numel() * buffer.element_size() for buffer in kept)
        assert held == weight_transfer_bytes(shape, engine, 2) - packing
        assert held < peak <= held + packing
    else:
        assert packing == 2 * 2 * vocab * hidden
        assert peak == packing

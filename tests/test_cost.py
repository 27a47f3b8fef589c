"""The cost ledger (reasonrl.cost) on hand-made numbers: phases, token totals and rates, device-hours, price, and
nulls with reasons where a figure cannot be measured."""

import json
import os
import time

import pytest
import torch

from reasonrl.batching import trained_tokens
from reasonrl.config import ConfigError, Params, from_dict
from reasonrl.cost import CostLedger, Device, Tokens, cost_report, stage_device, write_cost
from reasonrl.memory import MemoryPlan
from reasonrl.rollouts.types import Sample, samples_tokens

CPU_4 = Device("cpu", 4, "four cores, by hand")


def ledger_of_a_step() -> CostLedger:
    ledger = CostLedger()
    ledger.add_seconds("rollout", 2.0)
    ledger.add_tokens("rollout", "generated", Tokens(prompt=30, response=70))
    ledger.add_seconds("train", 4.0)
    ledger.add_tokens("train", "trained", Tokens(prompt=30, response=50))
    ledger.add_seconds("scoring", 0.5)
    ledger.add_seconds("validation", 1.0)
    ledger.add_tokens("validation", "generated", Tokens(prompt=10, response=10))
    return ledger


def test_phases_report_their_seconds_tokens_and_rates():
    report = cost_report(ledger_of_a_step(), 9.0, CPU_4, price=None)
    rollout = report["phases"]["rollout"]
    assert rollout == {
        "seconds": 2.0,
        "tokens": "generated",
        "prompt_tokens": 30,
        "response_tokens": 70,
        "tokens_per_second": 50.0,
        "response_tokens_per_second": 35.0,
    }
    assert report["phases"]["train"]["tokens_per_second"] == 20.0
    assert report["phases"]["scoring"] == {"seconds": 0.5}  # no tokens counted: no rate, not a zero one
    assert report["tokens_generated"] == {"prompt": 40, "response": 80, "total": 120}
    assert report["tokens_trained"] == {"prompt": 30, "response": 50, "total": 80}


def test_device_hours_and_price():
    report = cost_report(ledger_of_a_step(), 1800.0, CPU_4, price=0.05)
    assert report["device_hours"] == pytest.approx(2.0)  # 4 cores × half an hour
    assert report["device_hours_unit"] == "cpu_core_hours"
    assert report["price"] == pytest.approx(0.1)
    assert "price" not in report["reasons"]
    gpus = cost_report(CostLedger(), 7200.0, Device("cuda", 2, "by hand"), price=3.0)
    assert gpus["device_hours"] == pytest.approx(4.0) and gpus["device_hours_unit"] == "gpu_hours"
    assert gpus["price"] == pytest.approx(12.0)


def test_what_cannot_be_measured_is_null_with_a_reason():
    report = cost_report(ledger_of_a_step(), 9.0, CPU_4, price=None)
    memory, reasons = report["memory"], report["reasons"]
    assert report["price"] is None and "cost.device_hour_price" in reasons["price"]
    for field in ("peak_cuda_allocated_bytes", "planned_training_bytes", "planned_generating_bytes"):
        assert memory[field] is None and reasons[field]
    # This process's own peak is measured: at least what torch and Python hold now.
    assert memory["peak_rss_bytes"] > 50 * 2**20
    children = memory["peak_rss_children_bytes"]
    assert (children is None) == ("peak_rss_children_bytes" in reasons)
    assert all(value is None or value > 0 for value in memory.values())


def test_the_memory_plan_stands_beside_the_peak():
    parts = dict.fromkeys(
        ("weights", "gradients", "optimizer", "autocast_weights", "reference", "activations", "output_layer"), 1000
    )
    plan = MemoryPlan(
        **parts, ddp_buckets=0, gathered=0, engine=500, engine_while_training=0, device=10**9, weight_transfer=0
    )
    memory = cost_report(CostLedger(), 1.0, CPU_4, None, plan)["memory"]
    assert memory["planned_training_bytes"] == plan.training
    assert memory["planned_generating_bytes"] == plan.generating


def test_a_phase_counts_one_kind_of_tokens():
    ledger = CostLedger()
    ledger.add_tokens("rollout", "generated", Tokens(1, 2))
    with pytest.raises(ValueError, match="rollout"):
        ledger.add_tokens("rollout", "trained", Tokens(1, 2))


def test_timed_adds_the_blocks_seconds():
    ledger = CostLedger()
    for _ in range(2):
        with ledger.timed("rollout"):
            time.sleep(0.01)
    assert 0.02 <= ledger.phases["rollout"].seconds < 1.0


def test_samples_count_their_prompt_and_generated_tokens():
    samples = [
        Sample("a", [5, 6, 2], None, [1, 2, 3, 4], "eos"),  # the final EOS is generated: it counts
        Sample("b", [7], None, [1, 2, 3, 4], "length"),
    ]
    assert samples_tokens(samples) == Tokens(prompt=8, response=4)


def test_trained_tokens_count_each_rows_prompt_and_response_without_padding():
    mask = torch.tensor(
        [
            [0, 0, 1, 1, 1, 0],  # 2 prompt tokens, 3 response, 1 padding
            [0, 0, 0, 1, 0, 0],  # 3 prompt, 1 response
        ],
        dtype=torch.bool,
    )
    assert trained_tokens(mask) == Tokens(prompt=5, response=4)
    assert trained_tokens(mask, [1]) == Tokens(prompt=3, response=1)


def test_stage_device_counts_the_layouts_gpus_or_the_cores(tmp_path):
    cpu = stage_device(Params())
    assert cpu.kind == "cpu" and cpu.count == len(os.sched_getaffinity(0))
    split = stage_device(from_dict(Params, {"rollout": {"layout": "split"}}), ranks=1)
    assert (split.kind, split.count) == ("cuda", 2)
    colocate = stage_device(from_dict(Params, {"rollout": {"layout": "colocate"}}), ranks=4)
    assert (colocate.kind, colocate.count) == ("cuda", 4)


def test_write_cost_writes_the_report(tmp_path):
    params = from_dict(Params, {"cost": {"device_hour_price": 2.0}})
    report = write_cost(tmp_path / "cost.json", ledger_of_a_step(), time.perf_counter() - 3.0, params)
    assert json.loads((tmp_path / "cost.json").read_text()) == report
    assert report["wall_clock_seconds"] >= 3.0
    assert report["price"] == pytest.approx(report["device_hours"] * 2.0)


@pytest.mark.parametrize("price", [0, -1.5, float("inf")])
def test_the_price_must_be_positive(price):
    with pytest.raises(ConfigError, match="cost.device_hour_price"):
        from_dict(Params, {"cost": {"device_hour_price": price}})


def test_system_monitoring_is_asked_for_on_a_gpu_layout_only():
    """The training stages pass ``rollout.on_gpu`` to DVCLive's ``monitor_system``: on the CPU its sampling thread
    would compete with the run for the cores (and, without NVML, log an error every sample)."""
    assert not Params().rollout.on_gpu
    for layout in ("colocate", "split"):
        assert from_dict(Params, {"rollout": {"layout": layout}}).rollout.on_gpu


def test_a_grpo_step_counts_its_phases_and_every_sample_it_drew():
    """All rounds' samples count (dynamic sampling drops groups, but the engine drew them); the step's total is not
    a phase; where the engine drew beside the trainer, its tokens go to its own time, not the trainer's wait."""
    from reasonrl.grpo import STEP_PHASES, account_step
    from reasonrl.rollouts.types import DrawnRollouts, StepRollouts
    from reasonrl.training.timers import PhaseTimer

    kept = Sample("a", [5, 6], None, [1, 2, 3], "eos")
    dropped = Sample("b", [7, 8, 9], None, [1, 2], "length")
    drawn = DrawnRollouts([], [], [kept], [], [], [kept, dropped], [], sampling_rounds=2, dropped_groups=1)
    timer = PhaseTimer(STEP_PHASES)
    for phase, seconds in {"rollout": 2.0, "scoring": 0.5, "old_log_prob": 1.0, "train": 3.0, "step": 7.0}.items():
        timer.record(phase, seconds)
    ledger = CostLedger()
    account_step(ledger, timer, StepRollouts(0, 0, drawn))
    account_step(ledger, timer, StepRollouts(1, 1, drawn))
    assert {name: phase.seconds for name, phase in ledger.phases.items()} == {
        "rollout": 4.0,
        "scoring": 1.0,
        "old_log_prob": 2.0,
        "train": 6.0,
    }
    assert ledger.phases["rollout"].tokens == Tokens(prompt=2 * 5, response=2 * 5)

    beside = CostLedger()
    timer.record("engine", 6.0)
    account_step(beside, timer, StepRollouts(2, 1, drawn, engine_seconds=6.0))
    assert beside.phases["engine"].tokens == Tokens(5, 5) and beside.phases["engine"].seconds == 6.0
    assert beside.phases["rollout"].kind is None  # the trainer's wait generated nothing itself

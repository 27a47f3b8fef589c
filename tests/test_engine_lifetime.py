"""An engine left behind by an earlier run must not break the next one, nor the process group of the ranks it
serves (each test here makes its own engines, so none shares the process-wide vLLM state with a module fixture's
engine)."""

import datetime
import gc
import weakref

import pytest
import torch

from reasonrl.config import EngineConfig
from reasonrl.rollouts.engine import RolloutEngine

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True)
TIMEOUT = datetime.timedelta(minutes=42)


@pytest.fixture
def ranks_group(tmp_path):
    """A default process group made before any engine, as ``reasonrl.distributed.init_ranks`` makes the ranks' under
    torchrun (one gloo rank here), with a timeout of its own; afterwards vLLM's groups, then it, are destroyed."""
    assert not torch.distributed.is_initialized(), "a process group from an earlier test is still there"
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=TIMEOUT)
    group = torch.distributed.group.WORLD
    yield group
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()  # the engines' groups, made from this one; this one stays
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_an_engine_dropped_in_a_reference_cycle_does_not_break_the_next_nor_the_ranks_group(
    tiny_model_dir, ranks_group
):
    """As when a finished run's engine is still reachable only through a reference cycle (a test's traceback, a
    closure): its collection tears down vLLM's parallel state, which must happen before the next engine starts, not
    inside its start-up. CI saw the latter as "pipeline model parallel group is not initialized" at the next
    engine's first generate. vLLM's teardown ends by destroying the default process group: under torchrun the ranks'
    group, which the run still needs, so it must stay."""
    # The first engine a process starts is kept alive by vLLM's import (a stored ImportError's traceback holds the
    # frames that imported it): make that one here, so the engine dropped below is one that can be collected.
    RolloutEngine(tiny_model_dir, CONFIG)
    finished = RolloutEngine(tiny_model_dir, CONFIG)
    collected = weakref.ref(finished)
    cycle = [finished]
    cycle.append(cycle)
    gc.collect()  # the cycle reaches the oldest generation, as a finished run's leftovers do
    del finished, cycle
    engine = RolloutEngine(tiny_model_dir, CONFIG)
    assert collected() is None, "the dropped engine was not collected: this test shows nothing"
    assert torch.distributed.group.WORLD is ranks_group, "the dropped engine destroyed the ranks' process group"
    total = torch.ones(1)
    torch.distributed.all_reduce(total)  # the ranks' group still works
    (group,) = engine.generate(["1+1="], n=1, temperature=0.0, min_tokens=4, max_tokens=4, stop=[])
    assert len(group) == 1 and group[0].length == 4
    # vLLM's own groups, made from the ranks' group, wait as long as it does for a slow rank.
    parallel = engine._llm.llm_engine.vllm_config.parallel_config
    assert parallel.distributed_timeout_seconds == parallel.cpu_distributed_timeout_seconds == TIMEOUT.seconds

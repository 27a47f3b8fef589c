"""An engine left behind by an earlier run must not break the next one (each test here makes its own engines, so
none shares the process-wide vLLM state with a module fixture's engine)."""

import gc

import pytest

from reasonrl.config import EngineConfig
from reasonrl.rollouts.engine import RolloutEngine

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(cpu_kv_cache_gib=1, max_model_len=512, enforce_eager=True)


def test_an_engine_dropped_in_a_reference_cycle_does_not_break_the_next(tiny_model_dir):
    """As when a finished run's engine is still reachable only through a reference cycle (a test's traceback, a
    closure): its collection tears down vLLM's parallel state, which must happen before the next engine starts, not
    inside its start-up. CI saw the latter as "pipeline model parallel group is not initialized" at the next
    engine's first generate."""
    # The first engine a process starts is kept alive by vLLM's import (a stored ImportError's traceback holds the
    # frames that imported it): make that one here, so the engine dropped below is one that can be collected.
    RolloutEngine(tiny_model_dir, CONFIG)
    finished = RolloutEngine(tiny_model_dir, CONFIG)
    cycle = [finished]
    cycle.append(cycle)
    gc.collect()  # the cycle reaches the oldest generation, as a finished run's leftovers do
    del finished, cycle
    engine = RolloutEngine(tiny_model_dir, CONFIG)
    (group,) = engine.generate(["1+1="], n=1, temperature=0.0, min_tokens=4, max_tokens=4, stop=[])
    assert len(group) == 1 and group[0].length == 4

"""Resource guards: the per-op memory constant bounds what a run really allocates; over-budget runs are
refused with advice before they start."""
import tracemalloc

import pytest

from simulator.costs import SimpleCostModel
from simulator.engine import run
from simulator.errors import ConfigError, ResourceLimitError
from clustersim.guards import ENGINE_BYTES_PER_OP, available_memory_bytes, check_budget
from simulator.metrics import compute_metrics
from tests.simulator.toy import toy_dp_pipeline


def test_engine_bytes_per_op_bounds_a_real_run():
    tracemalloc.start()
    try:
        progs = toy_dp_pipeline(4, 16, 24)
        res = run(progs, SimpleCostModel())
        compute_metrics(res)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert progs.op_count > 5000
    assert peak / progs.op_count < ENGINE_BYTES_PER_OP


def test_within_budget_returns_the_estimate():
    progs = toy_dp_pipeline(2, 2, 4)
    est = check_budget(progs, "full", max_ops=10_000, max_memory_bytes=1e9)
    assert est.ops == progs.op_count and est.memory_bytes == pytest.approx(progs.op_count * ENGINE_BYTES_PER_OP)


def test_too_many_ops_in_full_mode_suggests_symmetric_mode():
    with pytest.raises(ResourceLimitError, match=r"exceed the event budget.*symmetric mode \(--mode symmetric\) would simulate 1,234 ops"):
        check_budget(10**9, "full", max_memory_bytes=1e15, symmetric_ops=1234)
    with pytest.raises(ResourceLimitError, match=r"--mode symmetric.*smaller --global-batch"):
        check_budget(10**9, "full", max_memory_bytes=1e15)


def test_too_much_memory_in_symmetric_mode_suggests_a_smaller_horizon():
    with pytest.raises(ResourceLimitError, match=r"of memory exceeds.*with the timeline.*smaller --global-batch.*no --out") as e:
        check_budget(10**6, "symmetric", max_ops=10**9, max_memory_bytes=1e8, timeline=True)
    assert "--mode symmetric" not in str(e.value)


def test_default_budget_uses_available_memory():
    assert available_memory_bytes() > 1e8
    check_budget(1000, "full")
    with pytest.raises(ResourceLimitError):
        check_budget(10**13, "full")


@pytest.mark.parametrize("bad", [-1, 1.5, float("nan"), "many", None, True])
def test_bad_estimates_are_config_errors(bad):
    with pytest.raises(ConfigError):
        check_budget(bad, "full")
    with pytest.raises(ConfigError):
        check_budget(10, "sometimes")

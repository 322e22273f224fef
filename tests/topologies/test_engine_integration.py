"""The cost model driven by the real engine: symmetric mode (representative + images) equals full mode."""
import pytest

from simulator.engine import run
from simulator.program import Programs, collective, compute
from topologies import load_cluster
from topologies.cost import ClusterCostModel


def _programs(symmetric: bool) -> Programs:
    n = 64
    p = Programs(world_size=n, ops={})
    dp = {r: p.add_group(tuple(range(r % 8, n, 8)), "dp") for r in range(n)}
    tp = {r: p.add_group(tuple(range(r // 8 * 8, r // 8 * 8 + 8)), "tp") for r in range(n)}
    ranks = [0] if symmetric else range(n)
    for r in ranks:
        p.ops[r] = [
            compute("fwd", flops=2e12),
            collective("tp_ar", "all_reduce", tp[r], 2**26, deps=(0,)),
            compute("bwd", flops=4e12, deps=(1,)),
            collective("dp_ar", "all_reduce", dp[r], 2**29, stream="dp", deps=(2,)),
            compute("more", flops=1e12, deps=(2,)),
            collective("tp_ar2", "all_reduce", tp[r], 2**26, deps=(4,)),
        ]
    if symmetric:
        p.classes = {0: tuple(range(n))}
    return p


@pytest.mark.parametrize("rail", [True, False])
def test_symmetric_equals_full_in_flow_mode(rail):
    c = load_cluster("dgx-h100", 64, tiers=2, leaf_down=16, oversubscription=4, rail_optimised=rail)
    flow = ClusterCostModel(c, network="flow")
    full = run(_programs(False), flow).step_time_s
    sym = run(_programs(True), flow).step_time_s
    assert sym == pytest.approx(full, rel=1e-9)
    analytical = run(_programs(False), ClusterCostModel(c)).step_time_s
    if rail:
        assert full == pytest.approx(analytical, rel=1e-9)     # rails never share a link here
    else:
        assert full > analytical * 1.05                        # 8 DP rings squeeze through 4 uplinks

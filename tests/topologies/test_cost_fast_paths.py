"""The cost model's remembered answers equal pricing afresh: comm_sm_fraction once per (kind, NCCL group
shape, size), compute_time_s once per kernel list object."""
import random

import pytest

from simulator.calibration import Calibration
from schedules import build_programs
from schedules.models import get_model
from schedules.plan import ParallelPlan
from simulator.calibration import ComputeFit, LayerFit
from simulator.costs import CommRequest
from tests.topologies.test_calibration_scope import H100_JSON
from topologies import load_cluster
from topologies.cost import ClusterCostModel

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier", "all_to_all", "p2p")


def _requests(world: int, seed: int):
    rng = random.Random(seed)
    out = []
    for _ in range(400):
        kind = rng.choice(KINDS)
        k = 2 if kind == "p2p" else rng.choice((2, 3, 4, 8, 16, 24))
        start = rng.randrange(0, world - 8 * k)
        ranks = rng.choice((tuple(rng.sample(range(world), k)), tuple(range(start, start + k)),
                            tuple(range(start, start + 8 * k, 8))))
        out.append(CommRequest(kind, ranks, rng.choice((1.0, 4e3, 1e6, 3e7, 5e8))))
    return out


@pytest.mark.parametrize("preset,gpus,over,calibrated", [
    ("dgx-a100", 2520, {}, False),
    ("dgx-h100", 512, dict(rail_optimised=False, leaf_down=12, tiers=3, oversubscription=2), False),
    ("dgx-h100", 1024, dict(leaf_down=8, tiers=3), False),
    ("dgx-h100", 256, {}, True),
])
def test_sm_share_per_shape_equals_each_group_priced_afresh(preset, gpus, over, calibrated):
    c = load_cluster(preset, gpus, **over)
    cal = Calibration.load(H100_JSON) if calibrated else None
    shared = ClusterCostModel(c, network="flow", calibration=cal)
    for req in _requests(gpus, 7):
        fresh = ClusterCostModel(c, network="flow", calibration=cal)
        sms = c.accelerator.sm_count
        want = fresh._sm_fraction(req.kind, fresh._gpus(req), req.size_bytes, sms)
        assert shared.comm_sm_fraction(req) == want
        assert fresh.comm_sm_fraction(req) == want
    assert len(shared._sm_shape_cache) < len(shared._sm_cache)      # groups of one shape were priced once


@pytest.mark.parametrize("cal", [None, Calibration(compute=[ComputeFit("NVIDIA H100 80GB HBM3", 5e14, 1e9)]),
                                 Calibration(layers=[LayerFit("H100-SXM", "forward", 4e14, 0.0)])])
def test_compute_time_per_kernel_list_equals_each_op_priced_afresh(cal):
    """One model answers every op of full programs (ops sharing kernel lists) as a fresh model per op
    does, to the bit; a layer fit still prices by layer (no per-list answer then)."""
    progs = build_programs(get_model("llama3-8b"), ParallelPlan(dp=2, tp=2, pp=2, seq=2048, global_batch=4), 8,
                           symmetric=False)
    c = load_cluster("dgx-h100", 8)
    shared = ClusterCostModel(c, calibration=cal)
    ops = [(r, op) for r, prog in progs.ops.items() for op in prog if op.kind == "compute"]
    assert any(op.kernels is not None for _, op in ops)
    for r, op in ops:
        want = ClusterCostModel(c, calibration=cal).compute_time_s(r, op)
        assert shared.compute_time_s(r, op) == want and shared.compute_time_s(r, op) == want
    assert bool(shared._kl_times) == (cal is None or not cal.layers)

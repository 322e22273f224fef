"""refine_classes (vectorised over whole classes, transfers priced in batches) finds exactly the classes of
a plain per-rank colour refinement written from the module docstring, on even and uneven placements; and the
cost model's batch pricing equals pricing each transfer on its own."""
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedules import build_programs
from simulator.costs import CommRequest
from simulator.errors import TopologyError
from simulator.program import COLLECTIVE, RECV, SEND
from simulator.symmetry import _round, refine_classes
from tests.simulator.test_symmetry import uneven_plans
from topologies import load_cluster
from topologies.cost import ClusterCostModel
from topologies.faults import FaultSpec, faulted_cluster


def reference_classes(programs, cost) -> set:
    """Colour refinement, one rank at a time: signature = (colour, device, per collective op: its time and
    the colours its group reaches, per transfer: its time and the peer's colour), to a fixed point."""
    n = programs.world_size
    rep_of = {m: r for r, ms in programs.classes.items() for m in ms}
    colour = [(rep_of[m], cost.device_key(m)) for m in range(n)]
    while True:
        sig = []
        for m in range(n):
            parts = [colour[m]]
            for op in programs.ops[rep_of[m]]:
                if op.kind == COLLECTIVE:
                    g = programs.group_of(m, programs.groups[op.group].family)
                    ranks = programs.groups[g].ranks
                    t = cost.comm_time_s(CommRequest(op.collective, ranks, op.size_bytes))
                    parts.append((_round(t), frozenset(colour[x] for x in ranks)))
                elif op.kind in (SEND, RECV):
                    fam = programs.groups[op.group].family
                    pos = programs.groups[op.group].ranks
                    g = programs.groups[programs.group_of(m, fam)].ranks
                    peer = g[pos.index(op.peer)]
                    pair = (m, peer) if op.kind == SEND else (peer, m)
                    parts.append((_round(cost.comm_time_s(CommRequest("p2p", pair, op.size_bytes))),
                                  colour[peer]))
            sig.append(tuple(parts))
        ids = {s: i for i, s in enumerate(dict.fromkeys(sig))}
        new = [ids[s] for s in sig]
        if len(ids) == len(set(colour)):
            break
        colour = new
    out: dict = {}
    for m in range(n):
        out.setdefault(colour[m], []).append(m)
    return {tuple(ms) for ms in out.values()}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uneven_plans(), st.sampled_from(["analytical", "flow"]))
def test_classes_equal_a_per_rank_reference(case, network):
    model, plan, over = case
    try:
        cluster = load_cluster("dgx-h100", plan.world_size, **over)
    except TopologyError:
        assume(False)
    cost = ClusterCostModel(cluster, network=network)
    programs = build_programs(model, plan, plan.world_size, symmetric=True)
    got = {tuple(ms) for ms in refine_classes(programs, cost).programs.classes.values()}
    assert got == reference_classes(programs, cost)


#: fabrics of the batch-pricing tests: the 530B plan's A100 SuperPOD, a non-rail 3-tier tapered tree, a 3-tier tree
FABRICS = [
    ("dgx-a100", 2520, {}),
    ("dgx-h100", 512, dict(rail_optimised=False, leaf_down=12, tiers=3, oversubscription=2)),
    ("dgx-h100", 1024, dict(leaf_down=8, tiers=3)),
]


@pytest.mark.parametrize("preset,gpus,over", FABRICS)
def test_batch_transfer_times_equal_one_at_a_time(preset, gpus, over):
    c = load_cluster(preset, gpus, **over)
    rng = random.Random(2)
    pairs = [(rng.randrange(gpus), rng.randrange(gpus)) for _ in range(2000)] + [(5, 5)]
    for size in (1e3, 3e7):
        batch = ClusterCostModel(c, network="flow").comm_times_s("p2p", np.array(pairs), size)
        alone = ClusterCostModel(c, network="flow")
        assert batch == [alone.comm_time_s(CommRequest("p2p", p, size)) for p in pairs]
    # shuffled placement, faults (no shapes) and collectives: the one-at-a-time answers
    shuffled = load_cluster(preset, gpus, **over)
    perm = list(range(gpus))
    rng.shuffle(perm)
    shuffled.set_placement(perm)
    broken = faulted_cluster(load_cluster(preset, gpus, **over), FaultSpec(link_degradation={(0, ("leaf", 0)): 0.5}))
    for cl in (shuffled, broken):
        m = ClusterCostModel(cl, network="flow")
        assert m.comm_times_s("p2p", pairs[:300], 1e6) == [
            ClusterCostModel(cl, network="flow").comm_time_s(CommRequest("p2p", p, 1e6)) for p in pairs[:300]]
    groups = [(0, 8, 16, 24), (1, 9, 17, 25)]
    assert ClusterCostModel(c).comm_times_s("all_reduce", groups, 1e6) == [
        ClusterCostModel(c).comm_time_s(CommRequest("all_reduce", g, 1e6)) for g in groups]


@pytest.mark.parametrize("preset,gpus,over", FABRICS)
def test_batch_collective_times_equal_one_at_a_time(preset, gpus, over):
    """comm_times_s of collectives (group shapes found for all groups at once) = comm_time_s per group."""
    c = load_cluster(preset, gpus, **over)
    rng = random.Random(3)
    for k in (2, 3, 8, 16):
        groups = [tuple(rng.sample(range(gpus), k)) for _ in range(200)] + \
                 [tuple(range(i * 8, i * 8 + k)) for i in range(20)] + [tuple(range(i, i + 8 * k, 8)) for i in range(8)]
        for kind in ("all_reduce", "all_gather", "all_to_all"):
            batch = ClusterCostModel(c, network="flow").comm_times_s(kind, np.array(groups), 3e7)
            alone = ClusterCostModel(c, network="flow")
            assert batch == [alone.comm_time_s(CommRequest(kind, g, 3e7)) for g in groups]


def test_batch_times_of_one_table_at_many_kinds_and_sizes():
    """One cost model keeps a table's group shapes (comm_times_s); asked again at other kinds and sizes, and
    for two-member groups both as transfers and as collectives, it answers as comm_time_s one at a time."""
    c = load_cluster("dgx-h100", 1024, leaf_down=8, tiers=3)
    rng = random.Random(4)
    groups = np.array([rng.sample(range(1024), 8) for _ in range(100)])
    pairs = groups[:, :2].copy()
    m = ClusterCostModel(c, network="flow")
    for kind, table in [("all_reduce", groups), ("all_gather", groups), ("p2p", pairs), ("all_reduce", pairs),
                        ("reduce_scatter", groups), ("p2p", pairs)]:
        for size in (1e3, 3e7):
            alone = ClusterCostModel(c, network="flow")
            assert m.comm_times_s(kind, table, size) == [
                alone.comm_time_s(CommRequest(kind, tuple(g), size)) for g in table.tolist()], (kind, size)
    assert len(m._shape_rows) == 3            # groups; pairs as transfers; pairs as collectives

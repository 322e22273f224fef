"""Cluster.comm_shape: groups with equal shape keys cost the same (brute force over random groups, priced
without the shape cache), keys do collide (the cache is used), and the faulted cluster has none."""
import random

import pytest

from simulator.costs import CommRequest
from topologies import load_cluster
from topologies.cost import ClusterCostModel

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _groups(c, rng, count):
    gpn, nodes = c.gpus_per_node, c.n_gpus // c.gpus_per_node
    out = []
    for _ in range(count):
        k = rng.choice((2, 2, 3, 4, 8))
        span = rng.choice((2, 4, 16, nodes))
        first = rng.randrange(0, nodes - span + 1)
        ns = sorted(rng.sample(range(first, first + span), min(k, span)))
        locs = rng.choice((["same"], ["spread"], ["random"]))[0]
        loc0 = rng.randrange(gpn)
        g = [n * gpn + (loc0 if locs == "same" else (loc0 + i) % gpn if locs == "spread" else rng.randrange(gpn))
             for i, n in enumerate(ns)]
        if rng.random() < 0.3:
            g = g[::-1]
        out.append(tuple(g))
    return out


@pytest.mark.parametrize("preset,gpus,over", [
    ("dgx-a100", 2520, {}),                                             # 3 tiers, a pod per rail
    ("dgx-h100", 1024, {"leaf_down": 8, "tiers": 3}),                   # 2 pods per rail
    ("dgx-h100", 512, {"rail_optimised": False, "leaf_down": 12, "tiers": 3, "oversubscription": 2}),
])
def test_equal_shapes_cost_the_same(preset, gpus, over):
    c = load_cluster(preset, gpus, **over)
    cost = ClusterCostModel(c, network="analytical")
    rng = random.Random(7)
    by_key: dict = {}
    priced = 0
    for g in _groups(c, rng, 400):
        kinds = ("p2p",) if len(g) == 2 and rng.random() < 0.5 else KINDS
        for kind in kinds:
            for size in (4e3, 3e7):
                req = CommRequest(kind, g, size)
                t = cost._time(req, g)[0]              # priced directly, no shape cache
                priced += 1
                by_key.setdefault((kind, c.comm_shape(g), size), set()).add(t)
    assert all(len(ts) == 1 for ts in by_key.values()), [k for k, ts in by_key.items() if len(ts) > 1][:3]
    assert len(by_key) < 0.9 * priced            # keys are shared by many groups: the cache is used


def test_shape_keys_tell_placements_apart_and_faults_disable_them():
    c = load_cluster("dgx-a100", 2520)
    same_unit, across_units = c.comm_shape((0, 8)), c.comm_shape((8 * 19, 8 * 20))
    assert same_unit != across_units
    assert c.comm_shape((0, 8)) == c.comm_shape((8 * 20 + 6, 8 * 21 + 6))      # another unit, another rail
    cost = ClusterCostModel(c, network="analytical")
    t = [cost.comm_time_s(CommRequest("p2p", p, 1e6)) for p in ((0, 8), (8 * 19, 8 * 20))]
    assert t[0] < t[1]
    from topologies.faults import FaultSpec, faulted_cluster
    f = faulted_cluster(c, FaultSpec(link_degradation={"0:leaf.0": 0.5}))
    assert f.comm_shape((0, 8)) is None

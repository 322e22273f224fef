"""Symmetric images priced by automorphism (``Cluster.translate_links``) and vectorised routes
(``Cluster.route_many``) equal the explicit per-image routes and algorithm loads, link for link; and the flow
bundles and simulated step times built from them equal those built image by image."""
import random

import numpy as np
import pytest

from schedules import build_programs
from schedules.models import custom_model
from schedules.plan import ParallelPlan
from simulator.costs import CommRequest
from simulator.engine import run
from simulator.symmetry import refine_classes
from topologies import load_cluster
from topologies.collectives import ALGORITHMS
from topologies.cost import ClusterCostModel
from topologies.faults import FaultSpec, faulted_cluster

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
CLUSTERS = [
    ("dgx-h100", 1024, dict(leaf_down=8, tiers=3)),                     # 2 pods per rail
    ("dgx-a100", 2520, {}),                                             # a pod per rail, no SHARP
    ("dgx-h100", 128, dict(rail_optimised=False, leaf_down=4, tiers=3, oversubscription=2)),
    ("dgx-h100", 64, dict(pxn=False, leaf_down=16, tiers=2)),
    ("gb200-nvl72", 288, {}),                                           # 72-GPU domains of 4-GPU nodes
]


def _load(links, coef) -> dict:
    out: dict = {}
    for l, c in zip(np.asarray(links).tolist(), np.asarray(coef).tolist()):
        out[l] = out.get(l, 0.0) + c
    return out


def _groups(c, rng):
    """(group, images) pairs: groups inside one domain moved to other domains, single-rail groups moved to
    other rails on the same nodes, and groups no automorphism here maps (mixed)."""
    ds, gpn, nd = c.domain_size, c.gpus_per_node, c.n_domains
    out = []
    for _ in range(6):
        k = rng.choice((2, 3, 4, min(8, ds)))
        local = sorted(rng.sample(range(ds), k))
        if rng.random() < 0.3:
            local = local[::-1]
        doms = rng.sample(range(nd), min(nd, 4))
        out.append([tuple(d * ds + x for x in local) for d in doms])
    nodes = c.n_gpus // gpn
    for _ in range(6):
        ns = sorted(rng.sample(range(nodes), rng.choice((2, 3, 5, min(16, nodes)))))
        if rng.random() < 0.3:
            ns = ns[::-1]
        rails = rng.sample(range(gpn), min(gpn, 4))
        out.append([tuple(n * gpn + r for n in ns) for r in rails])
    out.append([(0, gpn + 1), (2, gpn + 3)])                          # two rails each: no map known
    return out


@pytest.mark.parametrize("preset,gpus,over", CLUSTERS)
def test_translated_links_equal_each_images_own_algorithm(preset, gpus, over):
    c = load_cluster(preset, gpus, **over)
    m = ClusterCostModel(c, network="flow")
    rng = random.Random(3)
    mapped = 0
    for groups in _groups(c, rng):
        rep, images = groups[0], groups[1:]
        for kind in KINDS:
            for name in ALGORITHMS:
                ev = m._evaluate(kind, rep, name)
                if ev is None or not len(ev[2]):
                    continue
                moved = c.translate_links(ev[2], rep, images)
                if moved is None:
                    continue
                mapped += 1
                for img, row in zip(images, moved):
                    own = m._evaluate(kind, img, name)
                    assert own is not None, (kind, name, rep, img)
                    assert _load(row, ev[3]) == _load(own[2], own[3]), (kind, name, rep, img)
                    assert own[:2] == ev[:2]
    assert mapped > 20
    assert c.translate_links(np.array([0]), (0, c.gpus_per_node + 1), [(2, c.gpus_per_node + 3)]) is None


@pytest.mark.parametrize("preset,gpus,over", CLUSTERS + [("dgx-h100", 8, {}), ("pcie-ethernet-lab", None, {})])
def test_route_many_equals_route(preset, gpus, over):
    c = load_cluster(preset, gpus, **over)
    rng = random.Random(5)
    pairs = [(rng.randrange(c.n_gpus), rng.randrange(c.n_gpus)) for _ in range(3000)]
    flat = c.route_many([a for a, _ in pairs], [b for _, b in pairs])
    if flat is None:            # no vectorised router for this cluster (shared NICs ...): route() is used
        assert preset == "pcie-ethernet-lab"
        return
    want = sorted(l for a, b in pairs for l in c.route(a, b))
    assert sorted(flat.tolist()) == want


def test_faulted_clusters_map_nothing():
    c = faulted_cluster(load_cluster("dgx-h100", 64), FaultSpec(link_failures=[(0, ("leaf", 0))]))
    assert c.route_many([0, 1], [9, 17]) is None
    assert c.translate_links(np.array([0, 1]), (0, 1), [(8, 9)]) is None


def _explicit(m):
    """The same cost model pricing every image on its own (no automorphism, no vectorised routes)."""
    m.cluster.translate_links = lambda *a: None
    m.cluster.route_many = lambda *a: None
    return m


@pytest.mark.parametrize("preset,gpus,over", CLUSTERS[:2] + CLUSTERS[3:4])
def test_bundles_with_mapped_images_equal_explicit_ones(preset, gpus, over):
    fast = ClusterCostModel(load_cluster(preset, gpus, **over), network="flow")
    slow = _explicit(ClusterCostModel(load_cluster(preset, gpus, **over), network="flow"))
    rng = random.Random(11)
    for groups in _groups(fast.cluster, rng):
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            req = CommRequest(kind, groups[0], 3e7, images=tuple(groups[1:]))
            a, b = fast.bundle(req), slow.bundle(req)
            assert a.T == b.T and a.ref_bytes == b.ref_bytes
            assert a.links.tolist() == b.links.tolist() and a.nbytes.tolist() == b.nbytes.tolist()
        pairs = [(g[0], g[-1]) for g in groups]
        req = CommRequest("p2p", pairs[0], 1e6, images=tuple(pairs[1:]))
        a, b = fast.bundle(req), slow.bundle(req)
        assert a.links.tolist() == b.links.tolist() and a.nbytes.tolist() == b.nbytes.tolist()


@pytest.mark.parametrize("plan,over", [
    (ParallelPlan(tp=8, pp=4, dp=4, global_batch=8, seq=256, schedule="interleaved", virtual_stages=2), {}),
    (ParallelPlan(tp=8, pp=3, dp=5, global_batch=10, seq=256, schedule="1f1b", zero=1), dict(leaf_down=4)),
])
def test_step_time_with_mapped_images_equals_explicit_images(plan, over):
    """Symmetric (even) and class-split (uneven: stages across leaves) plans: the same step, to the bit."""
    model = custom_model(layers=8, hidden=512, heads=8, vocab=8000)
    times = []
    for explicit in (False, True):
        cost = ClusterCostModel(load_cluster("dgx-h100", plan.world_size, **over), network="flow")
        if explicit:
            _explicit(cost)
        programs = refine_classes(build_programs(model, plan, plan.world_size, symmetric=True), cost).programs
        times.append(run(programs, cost).step_time_s)
    assert times[0] == times[1]


@pytest.mark.parametrize("preset,gpus,over", CLUSTERS + [
    ("dgx-h100", 8, {}), ("dgx-h100", 16384, {}), ("dgx-b200", 64, dict(tiers=2, oversubscription=2)),
    ("pcie-ethernet-lab", None, {}), ("tpu-v5p", None, {}), ("cloudmatrix-384", None, {}),
    ("dgx-h100", 64, dict(fabric=dict(latency=2e-6), domain=dict(latency=1e-7))),
])
def test_lazy_graph_cluster_equals_the_graph_built_one(preset, gpus, over, monkeypatch):
    """Link table, fat tree and (built on demand) graph of the lazy cluster equal the eager build's."""
    from topologies.cluster import Cluster
    lazy = load_cluster(preset, gpus, **over)
    monkeypatch.setattr(Cluster, "LAZY_GRAPH", False)
    eager = load_cluster(preset, gpus, **over)
    for attr in ("link_name", "link_capacity", "link_latency", "link_type", "link_id", "_endpoint_of_gpu",
                 "_torus"):
        assert getattr(lazy, attr) == getattr(eager, attr), attr
    assert (lazy.fat_tree is None) == (eager.fat_tree is None)
    if lazy.fat_tree is not None:
        assert vars(lazy.fat_tree) == vars(eager.fat_tree)
    assert [lazy.has_sharp(d) for d in range(lazy.n_domains)] == [eager.has_sharp(d) for d in range(eager.n_domains)]
    g, h = lazy.graph, eager.graph
    assert list(g.nodes(data=True)) == list(h.nodes(data=True))
    assert list(g.edges(data=True)) == list(h.edges(data=True))
    assert g.graph.keys() == h.graph.keys() and lazy.describe() == eager.describe()
    a, b = lazy._link_codes(), eager._link_codes()             # the table's codes, vs the loop over names
    assert (a is None) == (b is None)
    if a is not None:
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    uniform = ClusterCostModel(lazy)._uniform_domains
    eager._link_codes = lambda: None                          # the loop over link names
    assert ClusterCostModel(eager)._uniform_domains == uniform


def test_bad_images_give_the_one_group_errors():
    from simulator.errors import ClusterSimError
    m = ClusterCostModel(load_cluster("dgx-h100", 64), network="flow")
    for images in (((8, 8, 9, 10),), ((8, 9, 10, 640),)):
        with pytest.raises(ClusterSimError, match="twice|not placed"):
            m.bundle(CommRequest("all_reduce", (0, 1, 2, 3), 1e6, images=images))
    with pytest.raises(ClusterSimError, match="not placed"):
        m.bundle(CommRequest("p2p", (0, 8), 1e6, images=((1, 999),)))


@pytest.mark.parametrize("preset,gpus,over", CLUSTERS + [("dgx-h100", 8, {}), ("dgx-h100", 16384, {}),
                                                         ("pcie-ethernet-lab", None, {})])
def test_table_cluster_finds_links_without_the_name_dict(preset, gpus, over):
    """A cluster whose link table comes from the specs builds no name -> id dict for its routes; the ids
    its codes give (``_table_link``) are ``link_id``'s for every link, and None where no such link is."""
    c = load_cluster(preset, gpus, **over)
    if c._link_id is not None:          # built from the graph: nothing lazy
        return
    routed = [c.route(0, g) for g in range(0, c.n_gpus, max(1, c.n_gpus // 64))]
    assert c._link_id is None and c._link_name is None and all(routed[1:])
    for i, (a, b) in enumerate(c.link_name):
        assert c._table_link(a, b) == i
    ids = c.link_id
    assert routed == [tuple(c._route(0, g)) for g in range(0, c.n_gpus, max(1, c.n_gpus // 64))]
    sw = c.link_name[0][0]              # (switch of domain 0, GPU 0)
    last = c.n_gpus - 1
    for a, b in [(0, (sw[0], 1)), (last, (sw[0], 0)), (c.n_gpus, sw), (-1, sw), (sw, c.n_gpus), ("up", -1),
                 ("up", 10 ** 6), ("down", "x"), ("sideways", 0), (0, 1), (sw, sw), (0, ("leaf", -1)),
                 (0, ("leaf", 10 ** 6)), ((sw[0],), 0), (("leaf", 0, 1), 0)]:
        assert c._table_link(a, b) == ids.get((a, b)), (a, b)
    c._link_id = None
    with pytest.raises(Exception, match="no link"):
        c._l(0, (sw[0], 1))


def _alike(c, rng, count=40):
    """(group, other) GPU tuples: random groups (one or several per node, across leaves and pods, in any
    order) and copies moved by node shifts, rail permutations or both; pairs of equal and unequal shape."""
    gpn, nodes = c.gpus_per_node, c.n_gpus // c.gpus_per_node
    out = []
    for _ in range(count):
        ns = rng.sample(range(nodes), rng.choice((2, 3, 5, min(12, nodes))))
        rails = sorted(rng.sample(range(gpn), rng.choice((1, 1, 2, min(4, gpn)))))
        group = [n * gpn + r for n in ns for r in rails]
        if rng.random() < 0.5:
            group.sort()
        shift = rng.randrange(nodes)
        perm = sorted(rng.sample(range(gpn), len(rails)))
        to = dict(zip(rails, perm))
        other = [((g // gpn + shift) % nodes) * gpn + to[g % gpn] for g in group]
        out.append((tuple(group), tuple(other)))
    return out


@pytest.mark.parametrize("preset,gpus,over", CLUSTERS + [("dgx-h100", 16384, {})])
def test_moved_links_equal_the_groups_own_algorithm(preset, gpus, over):
    """A group of the same shape as one already priced takes that one's links through the cluster's map
    (``Cluster.map_links``, ``ClusterCostModel._moved_links``): A, K, the links in order and their bytes are
    what pricing the group itself gives, bit for bit; where the map is not known the group is priced."""
    c = load_cluster(preset, gpus, **over)
    rng = random.Random(5)
    checked = 0
    for group, other in _alike(c, rng):
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"):
            a, b = (group[:2], other[:2]) if kind == "p2p" else (group, other)
            if len(set(a)) < 2:
                continue
            fresh = ClusterCostModel(c, network="flow")
            warm = ClusterCostModel(c, network="flow")
            for name in (("p2p",) if kind == "p2p" else tuple(ALGORITHMS)):
                own = fresh._algo_cost(kind, b, name)
                warm._algo_cost(kind, a, name)                      # prices the shape on group a
                got = warm._algo_cost(kind, b, name)
                assert (own is None) == (got is None), (kind, name, a, b)
                if own is None:
                    continue
                assert (got.A, got.K) == (own.A, own.K), (kind, name, a, b)
                assert got.links.tolist() == own.links.tolist() and got.coef.tolist() == own.coef.tolist(), \
                    (kind, name, a, b)
                ref = warm._algo_cost(kind, a, name)
                moved = None if ref is None else c.map_links(ref.links, a, b)
                if moved is not None:
                    assert moved.tolist() == own.links.tolist()
                    checked += 1
    if c.comm_shape((0, 1)) is not None:
        assert checked > 20


def test_map_links_refuses_groups_of_other_shapes():
    c = load_cluster("dgx-h100", 1024, leaf_down=8, tiers=3)
    m = ClusterCostModel(c, network="flow")
    links = m._evaluate("all_reduce", (0, 8, 16), "ring")[2]
    assert c.map_links(links, (0, 8, 16), (0, 8, 16 + 8 * 8 * 4)) is None       # a node in another pod
    assert c.map_links(links, (0, 8, 16), (0, 8)) is None
    assert c.map_links(links, (0, 8, 16), (8, 16, 24)).tolist() == m._evaluate("all_reduce", (8, 16, 24), "ring")[2].tolist()

import networkx as nx
import pytest

from simulator.errors import TopologyError
from topologies import builders, load_cluster


def test_nvswitch_node():
    g = builders.nvswitch_node()
    assert sorted(n for n in g if isinstance(n, int)) == list(range(8))
    assert all(d["bandwidth"] == 450e9 and d["type"] == "nvlink" for *_, d in g.edges(data=True))
    assert g.nodes[("nvswitch", 0)]["sharp"]


def test_torus_wrap_and_no_wrap():
    g = builders.torus((4, 4, 4), 100e9)
    assert g.number_of_edges() == 64 * 3 and all(d == 6 for _, d in g.degree())
    g2 = builders.torus((4, 4), 100e9, wrap=False)
    assert g2.number_of_edges() == 2 * 4 * 3
    with pytest.raises(TopologyError):
        builders.torus((4,), 1e9)


def test_optical_mesh_direct_and_switched():
    g = builders.optical_mesh(6, 60e9, direct=True)
    assert g.number_of_edges() == 15 and all(d["bandwidth"] == 12e9 for *_, d in g.edges(data=True))
    g = builders.optical_mesh(8, 60e9, slice_size=4)
    assert nx.number_connected_components(g) == 2


def test_fat_tree_oversubscription_and_rails():
    g = builders.fat_tree(64, 50e9, tiers=2, leaf_down=16, oversubscription=2)
    ft = g.graph["fat_tree"]
    assert ft.n_leaves == 4 and ft.uplinks == 8
    with pytest.raises(TopologyError, match="whole number"):
        builders.fat_tree(64, 50e9, leaf_down=16, oversubscription=3)
    with pytest.raises(TopologyError, match="tiers: 3"):
        builders.fat_tree(4096, 50e9, tiers=2, leaf_down=16)
    eps = [((n, r), r) for n in range(4) for r in range(4)]
    ft = builders.fat_tree(eps, 50e9, leaf_down=8, rail_optimised=True).graph["fat_tree"]
    assert all(ft.leaf_of[(n, r)] == ft.leaf_of[(0, r)] for n, r in [e[0] for e in eps])


def _max_flow_between_halves(g, left, right):
    h = nx.DiGraph()
    for u, v, d in g.edges(data=True):
        h.add_edge(u, v, capacity=d["bandwidth"])
        h.add_edge(v, u, capacity=d["bandwidth"])
    for x in left:
        h.add_edge("S", x, capacity=float("inf"))
    for x in right:
        h.add_edge(x, "T", capacity=float("inf"))
    return nx.maximum_flow_value(h, "S", "T")


@pytest.mark.parametrize("tiers,leaf_down,hosts", [(2, 4, 16), (3, 2, 16)])
def test_oversubscription_halves_bisection(tiers, leaf_down, hosts):
    """2:1 oversubscription halves the cross-spine bisection: max-flow between the two halves of the hosts
    (an independent computation) and Cluster.describe() agree."""
    flows = []
    for o in (1, 2):
        g = builders.fat_tree(hosts, 50e9, tiers=tiers, leaf_down=leaf_down, oversubscription=o)
        hs = [("host", i) for i in range(hosts)]
        flows.append(_max_flow_between_halves(g, hs[: hosts // 2], hs[hosts // 2:]))
    assert flows[0] == pytest.approx(2 * flows[1])
    for o in (1, 2):
        c = load_cluster("dgx-h100", 128, oversubscription=o, rail_optimised=False, tiers=2, leaf_down=16)
        gpus = range(c.n_gpus)
        mf = _max_flow_between_halves(c.graph, list(gpus)[:64], list(gpus)[64:])
        assert c.bisection_bytes_per_s() == pytest.approx(mf)
        assert mf == pytest.approx(64 * 50e9 / o)


def test_validate_graph_errors():
    g = nx.Graph()
    g.add_edge(0, 1, bandwidth=1e9, latency=0)
    g.add_edge(2, 3, bandwidth=1e9, latency=0)
    with pytest.raises(TopologyError, match="disconnected"):
        builders.validate_graph(g)
    g.add_edge(1, 2, bandwidth=0, latency=0)
    with pytest.raises(TopologyError, match="non-positive"):
        builders.validate_graph(g)


@pytest.mark.parametrize("preset,gpus", [("dgx-h100", 64), ("dgx-h100", 2048), ("dgx-a100", 1600), ("tpu-v5p", 128),
                                         ("gb200-nvl72", 144), ("pcie-ethernet-lab", 8), ("cloudmatrix-384", 32)])
def test_routes_are_shortest_paths(preset, gpus):
    """Structural routes have as many hops as networkx's shortest path in the real graph (trunks stand for
    one of the equal-cost spine/core links), and consecutive links chain."""
    if preset.startswith("dgx") or preset.startswith("gb200"):
        clusters = (load_cluster(preset, gpus, pxn=False), load_cluster(preset, gpus, rail_optimised=False))
    else:
        clusters = (load_cluster(preset, gpus),)
    for c in clusters:
        _check_shortest(c, gpus)


def test_pxn_keeps_traffic_on_the_destination_rail():
    c = load_cluster("dgx-h100", 2048)
    names = [c.link_name[l] for l in c.route_ranks(0, 2047)]      # rail 0 -> rail 7, far pod
    assert names[:2] == [(0, ("nvswitch", 0)), (("nvswitch", 0), 7)]        # NVLink to the rail-7 GPU
    assert names[2] == (7, ("leaf", c.fat_tree.leaf_of[7]))
    assert c.fat_tree.leaf_of[7] != c.fat_tree.leaf_of[0]
    direct = load_cluster("dgx-h100", 2048, pxn=False)
    assert [direct.link_name[l] for l in direct.route_ranks(0, 2047)][0] == (0, ("leaf", 0))
    # same-rail routes are unchanged
    same = [c.link_name[l] for l in c.route_ranks(0, 2040)]
    assert same == [direct.link_name[l] for l in direct.route_ranks(0, 2040)]
    assert c.describe()["fabric"]["pxn"] and not direct.describe()["fabric"]["pxn"]


def _check_shortest(c, gpus):
    pairs = [(0, gpus - 1), (1, gpus // 2), (3, 5), (0, gpus // 3), (gpus - 2, 7)]
    for a, b in pairs:
        links = c.route_ranks(a, b)
        assert len(links) == nx.shortest_path_length(c.graph, a, b)
        names = [c.link_name[l] for l in links]
        if names and isinstance(names[0], tuple) and len(names[0]) == 2 and names[0][0] == a:
            assert names[-1][1] == b


def test_torus_dimension_ordered_route():
    c = load_cluster("tpu-v5p", 64)
    links = c.route_ranks(0, 63)    # (0,0,0) -> (3,3,3): one wrap-around hop per dimension
    assert [c.link_name[l] for l in links] == [(0, 48), (48, 60), (60, 63)]


def test_rail_optimised_fewer_hops():
    rail = load_cluster("dgx-h100", 256)
    flat = load_cluster("dgx-h100", 256, rail_optimised=False)
    # GPU 0 of node 0 and GPU 0 of node 31: same rail leaf when rail-optimised, different leaves otherwise
    assert rail.hops(0, 248) == 1
    assert flat.hops(0, 248) == 3


def test_rail_optimised_superpod_layout_every_rail_alike():
    """DGX SuperPOD rail-optimised fabric (the 530B plan's 315 DGX A100 nodes, scalable units of 20): NIC r of
    the 20 nodes of a scalable unit share one leaf, a pod (spine group) holds leaves of one rail only, and
    so every rail has the same structure: the issue-15 DP groups on rails 0 and 6 cost the same."""
    from simulator.costs import CommRequest
    from topologies.cost import ClusterCostModel
    c = load_cluster("dgx-a100", 2520)
    ft = c.fat_tree
    nodes = 2520 // 8
    for n in range(nodes):
        for r in range(8):
            leaf = ft.leaf_of[8 * n + r]
            assert leaf == ft.leaf_of[8 * (n // 20 * 20) + r]             # one leaf per (unit, rail)
            assert ft.pod_of_leaf[leaf] == ft.pod_of_leaf[ft.leaf_of[r]]   # 16 leaves of a rail: one pod
    pods_of_rail = [{ft.pod_of_leaf[ft.leaf_of[8 * n + r]] for n in range(nodes)} for r in range(8)]
    assert all(len(p) == 1 for p in pods_of_rail) and len(set().union(*pods_of_rail)) == 8
    for a in range(0, nodes, 7):                 # hops between nodes depend on the nodes, not the rail
        for b in range(0, nodes, 11):
            assert len({c.hops(8 * a + r, 8 * b + r) for r in range(8)}) == 1
    cost = ClusterCostModel(c, network="flow")
    t = [cost.comm_time_s(CommRequest("all_reduce", tuple(first + 8 * k for k in range(9)), 1e8))
         for first in (576, 582)]
    assert t[0] == t[1]


def test_rail_optimised_pods_split_within_a_rail():
    """More leaves per rail than a pod holds: pods are chunks of one rail's leaves, never mixing rails."""
    eps = [((n, r), r) for n in range(40) for r in range(2)]
    ft = builders.fat_tree(eps, 50e9, tiers=3, leaf_down=4, rail_optimised=True).graph["fat_tree"]
    assert ft.n_leaves == 20 and ft.n_pods == 6                 # 10 leaves per rail -> pods of 4, 4, 2
    for r in range(2):
        pods = [ft.pod_of_leaf[ft.leaf_of[(n, r)]] for n in range(40)]
        assert pods == [pods[0] + n // 16 for n in range(40)]
    assert not {ft.pod_of_leaf[ft.leaf_of[(n, 0)]] for n in range(40)} & {ft.pod_of_leaf[ft.leaf_of[(n, 1)]]
                                                                         for n in range(40)}

"""The multi-dimensional ASTRA-sim analytical model: closed forms and scheduling invariants."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import ConfigError
from topologies.astra import GIB, AstraNetwork, AstraSystem, Dimension, load_network, load_system
from topologies.multidim import MultiDimCostModel, _schedule, chunk_phases, collective_ns, message_ns


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 10**6), st.integers(1, 10**6))
def test_two_stage_pipeline_makespan(a, b):
    """Two chunks through two dimensions, one active chunk each: a + max(a, b) + b (hand-derived)."""
    assert _schedule([a, b], [0, 1], 2, AstraSystem()) == a + max(a, b) + b


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 10**5), st.integers(1, 16), st.integers(1, 16))
def test_single_dimension_batches(t, chunks, active):
    """One dimension: chunks run in batches of ``active``."""
    sysc = AstraSystem(active_chunks_per_dimension=active)
    assert _schedule([t], [0], chunks, sysc) == -(-chunks // active) * t


def test_ring_all_reduce_closed_form():
    """Ring all-reduce on one ring dimension, one chunk: ed + 2(n-1)(msg + ed) + (n-1)·3·reduce."""
    n, size = 8, 8 * 2**20
    dim = Dimension("Ring", n, 100 * GIB, 1e-6)
    sysc = AstraSystem(preferred_dataset_splits=1, local_mem_bw_Bps=1e12, endpoint_delay_ns=10)
    msg = size // n
    step = int(1000 + msg / 107.3741824) + 10
    expected = 10 + 2 * (n - 1) * step + (n - 1) * 3 * int(msg / 1e12 * 1e9)
    assert collective_ns("all_reduce", size, (0,), AstraNetwork((dim,)), sysc) == expected


def test_hierarchical_all_reduce_phases():
    net = AstraNetwork((Dimension("Ring", 4, GIB, 0), Dimension("Switch", 2, GIB, 0), Dimension("Switch", 4, GIB, 0)))
    lbw = AstraSystem(collective_optimization="localBWAware")
    assert chunk_phases("all_reduce", [0, 1, 2], net, lbw) == [
        (0, "reduce_scatter"), (1, "reduce_scatter"), (2, "all_reduce"), (1, "all_gather"), (0, "all_gather")]
    assert chunk_phases("all_reduce", [0, 2], net, AstraSystem()) == [(0, "all_reduce"), (2, "all_reduce")]
    assert chunk_phases("all_gather", [0, 1], net, AstraSystem()) == [(1, "all_gather"), (0, "all_gather")]


def test_every_algorithm_prices_and_grows_with_size():
    net = AstraNetwork((Dimension("Switch", 8, 50 * GIB, 5e-7), Dimension("Ring", 4, 25 * GIB, 5e-7)))
    for algo in ("ring", "direct", "halvingDoubling", "doubleBinaryTree"):
        sysc = AstraSystem(implementations={"all_reduce": (algo, algo)}, preferred_dataset_splits=4)
        small = collective_ns("all_reduce", 2**20, (0, 1), net, sysc)
        big = collective_ns("all_reduce", 2**26, (0, 1), net, sysc)
        assert 0 < small < big, algo
    with pytest.raises(ConfigError):
        collective_ns("all_to_all", 2**20, (0,), net, AstraSystem(implementations={"all_to_all": ("halvingDoubling",)}))


def test_cost_model_groups_and_p2p():
    net = AstraNetwork((Dimension("Ring", 4, 50 * GIB, 5e-7), Dimension("Switch", 4, 25 * GIB, 1e-6)))
    cm = MultiDimCostModel(net, AstraSystem())
    assert cm.dims_of((0, 1, 2, 3)) == (0,)
    assert cm.dims_of((1, 5, 9, 13)) == (1,)
    assert cm.dims_of((0, 5)) is None
    from simulator.costs import CommRequest
    # p2p to the opposite ring position: 2 hops on dimension 0
    assert cm.comm_time_s(CommRequest("p2p", (0, 2), 1e6)) == message_ns(net.dims[0], 2, 10**6) * 1e-9
    assert cm.comm_time_s(CommRequest("p2p", (0, 4), 1e6)) == message_ns(net.dims[1], 2, 10**6) * 1e-9


@pytest.mark.parametrize("text,match", [
    ("topology: [ Torus ]\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1]\n", "Torus"),
    ("topology: [ Ring ]\nnpus_count: [1]\nbandwidth: [1]\nlatency: [1]\n", "npus_count"),
    ("topology: [ Ring, Ring ]\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1]\n", "one entry per dimension"),
    ("topology: [ Ring ]\nnpus_count: [4]\nbandwidth: [-1]\nlatency: [1]\n", "bandwidth"),
    ("topology: [ Ring ]\nnpus_count: [4]\nbandwidth: [1e-320]\nlatency: [1]\n", "bandwidth"),
    ("topology: [ Ring ]\nnpus_count: [4]\nbandwidth: [1]\nlatency: [1e308]\n", "latency"),
])
def test_bad_network_files(tmp_path, text, match):
    p = tmp_path / "n.yml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_network(p)


@pytest.mark.parametrize("text,match", [
    ('{"all-reduce-implementation": ["bogus"]}', "bogus"),
    ('{"preferred-dataset-splits": 1000000000}', "preferred-dataset-splits"),     # a split loop that never ends
    ('{"endpoint-delay": 1e308}', "endpoint-delay"),                              # an int() overflow
    ('{"peak-perf": 1e-320, "local-mem-bw": 1e-320, "roofline-enabled": 1}', "local-mem-bw"),
    ('{"roofline-enabled": "yes"}', "roofline-enabled must be 0 or 1"),                # was read as true
])
def test_bad_system_file(tmp_path, text, match):
    """Values out of their physical range are the file's error, not a hang or an overflow deep inside."""
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_system(p)


def test_flow_mode_alone_equals_analytical_and_shares_links():
    """Flow mode: one communication alone takes its analytical time; two concurrent all-reduces on the
    same ring share its links (max-min fair) and finish later than either alone, no later than serially."""
    from simulator.engine import run
    from simulator.program import Programs, collective
    net = AstraNetwork((Dimension("Ring", 4, 50 * GIB, 5e-7), Dimension("Switch", 2, 25 * GIB, 1e-6)))
    sysc = AstraSystem(preferred_dataset_splits=1)

    def programs(streams):
        p = Programs(world_size=8, ops={})
        g = [p.add_group(tuple(range(0, 4)), "d0"), p.add_group(tuple(range(4, 8)), "d0")]
        for r in range(8):
            p.ops[r] = [collective(f"ar{s}", "all_reduce", g[r // 4], 64e6, stream=f"c{s}") for s in range(streams)]
        return p

    one_a = run(programs(1), MultiDimCostModel(net, sysc)).step_time_s
    one_f = run(programs(1), MultiDimCostModel(net, sysc, "flow")).step_time_s
    assert one_f == pytest.approx(one_a, rel=1e-9)
    two_a = run(programs(2), MultiDimCostModel(net, sysc)).step_time_s
    two_f = run(programs(2), MultiDimCostModel(net, sysc, "flow")).step_time_s
    assert two_a == pytest.approx(one_a)                  # congestion-unaware: side by side for free
    assert one_a * 1.5 < two_f <= 2 * one_a * (1 + 1e-9)  # sharing the ring's links


def test_link_routes():
    from topologies.multidim import _LinkTable
    net = AstraNetwork((Dimension("Ring", 4, GIB, 0), Dimension("Switch", 4, GIB, 0), Dimension("FullyConnected", 2, GIB, 0)))
    t = _LinkTable(net)
    assert len(t.capacity) == 32 // 4 * 8 + 32 // 4 * 8 + 32 // 2 * 4
    assert len(t.route(0, 1)) == 1 and len(t.route(0, 2)) == 2 and len(t.route(0, 3)) == 1   # shorter way round
    assert t.route(0, 1) != t.route(1, 0)                                                     # directed
    assert len(t.route(0, 4)) == 2 and len(t.route(0, 16)) == 1
    assert t.route(1, 5)[0] != t.route(0, 4)[0]                                               # other line


def _ring_ns(kind, n, data, bw_Bps, lat_s, hops, ed=10, mem_Bps=0.0):
    """Hand-written ring phase (Ring.cc step structure), independent of topologies.multidim."""
    msg = data if kind == "all_gather" else data // n
    steps = {"all_reduce": 2 * (n - 1)}.get(kind, n - 1)
    red = {"all_reduce": n - 1, "reduce_scatter": n - 1}.get(kind, 0)
    send = int(hops * lat_s * 1e9 + msg / (bw_Bps / 1e9))
    proc = 3 * int(msg / mem_Bps * 1e9) if mem_Bps else 0
    return ed + steps * (send + ed) + red * proc


def test_two_level_all_reduce_is_rs_ar_ag():
    """localBWAware all-reduce over 2 dims, one chunk: RS on dim 0, AR of the shard on dim 1, AG on dim 0."""
    d0, d1 = Dimension("Switch", 8, 400 * GIB, 5e-7), Dimension("Ring", 4, 50 * GIB, 1e-6)
    net = AstraNetwork((d0, d1))
    sysc = AstraSystem(preferred_dataset_splits=1, collective_optimization="localBWAware", local_mem_bw_Bps=2e12)
    D = 64 * 2**20
    expected = (_ring_ns("reduce_scatter", 8, D, d0.bandwidth_Bps, 5e-7, 2, mem_Bps=2e12)
                + _ring_ns("all_reduce", 4, D // 8, d1.bandwidth_Bps, 1e-6, 1, mem_Bps=2e12)
                + _ring_ns("all_gather", 8, D // 8, d0.bandwidth_Bps, 5e-7, 2))
    assert collective_ns("all_reduce", D, (0, 1), net, sysc) == expected
    base = AstraSystem(preferred_dataset_splits=1, local_mem_bw_Bps=2e12)      # baseline: AR on each dimension
    assert collective_ns("all_reduce", D, (0, 1), net, base) == (
        _ring_ns("all_reduce", 8, D, d0.bandwidth_Bps, 5e-7, 2, mem_Bps=2e12)
        + _ring_ns("all_reduce", 4, D, d1.bandwidth_Bps, 1e-6, 1, mem_Bps=2e12))


def test_every_cluster_gets_per_dimension_algorithms(tmp_path):
    """--network astra: a cluster becomes a multi-dimensional network (domain dims + fabric) and its
    collectives follow the system's per-dimension algorithms."""
    import json
    import topologies
    from topologies.multidim import network_of_cluster
    net = network_of_cluster(topologies.load_cluster("dgx-h100", 16))
    assert [(d.topology, d.npus) for d in net.dims] == [("Switch", 8), ("Switch", 2)]
    net = network_of_cluster(topologies.load_cluster("tpu-v5p", 64))
    assert [(d.topology, d.npus) for d in net.dims] == [("Ring", 4)] * 3
    from click.testing import CliRunner
    from clustersim.cli import cli
    flags = ["simulate", "--model", "tiny", "--cluster", "dgx-h100", "--gpus", "16", "--network", "astra", "--json"]
    ring = json.loads(CliRunner().invoke(cli, flags).output)
    sysf = tmp_path / "s.json"
    sysf.write_text(json.dumps({"all-reduce-implementation": ["direct", "halvingDoubling"],
                                "preferred-dataset-splits": 4, "active-chunks-per-dimension": 2}))
    other = json.loads(CliRunner().invoke(cli, flags + ["--astra-system", str(sysf)]).output)
    assert ring["network"] == "astra" and ring["step_time_s"] > 0
    assert other["step_time_s"] != ring["step_time_s"]


def test_vectorised_hops_match_route():
    from topologies.multidim import _LinkTable
    import numpy as np
    net = AstraNetwork((Dimension("Ring", 5, GIB, 0), Dimension("Switch", 3, GIB, 0), Dimension("FullyConnected", 2, GIB, 0)))
    t = _LinkTable(net)
    src = np.arange(30)
    for d, stride in enumerate((1, 5, 15)):
        n = net.dims[d].npus
        for off in range(1, n):
            hops = t.hops_along(d, src, off)
            for i, r in enumerate(src.tolist()):
                a = (r // stride) % n
                peer = r + (((a + off) % n) - a) * stride
                assert [int(h[i]) for h in hops] == t.route(r, peer)

import pytest

from simulator.calibration import Calibration, CollectiveFit, ComputeFit
from simulator.costs import CommRequest
from simulator.errors import ConfigError, TopologyError
from simulator.program import compute
from topologies import load_cluster
from topologies.cost import DEFAULT_COMPUTE_EFFICIENCY, DEFAULT_MEMORY_EFFICIENCY, STEP_LATENCY_S, ClusterCostModel

EXACT = {"nvlink": 1.0, "ib": 1.0, "ici": 1.0, "ethernet": 1.0, "pcie": 1.0, "ub": 1.0}


def _model(c, **kw):
    kw.setdefault("efficiency", EXACT)
    kw.setdefault("call_overhead_s", 0.0)
    kw.setdefault("comm_model", "links")      # the route-level closed forms (NCCL's model: test_nccl.py)
    return ClusterCostModel(c, **kw)


def _nvlink_alpha(c):
    lat = c.graph.edges[0, ("nvswitch", 0)]["latency"]
    return 2 * lat + STEP_LATENCY_S["nvlink"]


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1024, 2**20, 2**32])
def test_ring_closed_forms(n, size):
    c = load_cluster("dgx-h100", 8)
    m = _model(c, algorithm="ring")
    a, B = _nvlink_alpha(c), 450e9
    ranks = tuple(range(n))
    ar = m.comm_time_s(CommRequest("all_reduce", ranks, size))
    assert ar == pytest.approx(2 * (n - 1) / n * size / B + 2 * (n - 1) * a, rel=1e-12)
    for kind in ("all_gather", "reduce_scatter"):
        t = m.comm_time_s(CommRequest(kind, ranks, size))
        assert t == pytest.approx((n - 1) / n * size / B + (n - 1) * a, rel=1e-12)
    assert m.algorithm_for(CommRequest("all_reduce", ranks, size)) == "ring"


def test_efficiency_and_overhead_defaults_apply():
    c = load_cluster("dgx-h100", 8)
    m = ClusterCostModel(c, algorithm="ring", comm_model="links")
    S = 2**30
    t = m.comm_time_s(CommRequest("all_reduce", tuple(range(8)), S))
    expected = 6.6e-6 + 14 * _nvlink_alpha(c) + 2 * 7 / 8 * S / (450e9 * 0.8)
    assert t == pytest.approx(expected, rel=1e-12)


def test_hierarchical_closed_form_and_beats_flat_ring():
    c = load_cluster("dgx-h100", 32)
    m = _model(c)
    ranks = tuple(range(32))                # 4 nodes x 8 GPUs
    S = 2**30
    k, mm = 8, 4
    a_in = _nvlink_alpha(c)
    nic_lat = c.graph.edges[0, ("leaf", c.fat_tree.leaf_of[0])]["latency"]
    a_out = 2 * nic_lat + STEP_LATENCY_S["ib"]      # same-rail leaf: GPU -> leaf -> GPU
    expected = (2 * (k - 1) * a_in + 2 * (k - 1) / k * S / 450e9
                + 2 * (mm - 1) * a_out + 2 * (mm - 1) / mm * (S / k) / 50e9)
    req = CommRequest("all_reduce", ranks, S)
    h = _model(c, algorithm="hierarchical").comm_time_s(req)
    assert h == pytest.approx(expected, rel=1e-12)
    flat = _model(c, algorithm="ring").comm_time_s(req)
    assert h < flat / 3
    assert m.algorithm_for(req) in ("hierarchical", "rings") and m.comm_time_s(req) <= h
    for size in (2**20, 2**26):             # also for medium sizes, and with default efficiencies
        r = CommRequest("all_reduce", ranks, size)
        assert (ClusterCostModel(c, algorithm="hierarchical", comm_model="links").comm_time_s(r)
                < ClusterCostModel(c, algorithm="ring", comm_model="links").comm_time_s(r))


def test_torus_4x4x4_dimension_ordered_closed_form():
    c = load_cluster("tpu-v5p", 64)
    m = _model(c)
    S = 2**30
    B = c.graph.edges[0, 1]["bandwidth"]
    a = c.graph.edges[0, 1]["latency"] + STEP_LATENCY_S["ici"]
    L = 4
    expected = sum(2 * ((L - 1) * a + (L - 1) / L * (S / L**d) / (2 * B)) for d in range(3))
    req = CommRequest("all_reduce", tuple(range(64)), S)
    assert m.algorithm_for(req) == "torus"
    assert m.comm_time_s(req) == pytest.approx(expected, rel=1e-12)
    # all-gather / reduce-scatter: half of it each
    for kind in ("all_gather", "reduce_scatter"):
        assert m.comm_time_s(CommRequest(kind, tuple(range(64)), S)) == pytest.approx(expected / 2, rel=1e-12)
    # one ring of the torus (a line of 4 chips along the last dimension)
    line = CommRequest("all_reduce", (0, 1, 2, 3), S)
    assert m.comm_time_s(line) == pytest.approx(2 * (3 * a + 3 / 4 * S / (2 * B)), rel=1e-12)
    # the torus algorithm beats a single ring over the whole slice
    assert m.comm_time_s(req) < _model(c, algorithm="ring").comm_time_s(req)


def test_p2p_bottleneck_and_latency():
    c = load_cluster("dgx-h100", 64)
    m = _model(c)
    S = 2**30
    t = m.comm_time_s(CommRequest("p2p", (0, 8), S))
    nic_lat = c.graph.edges[0, ("leaf", c.fat_tree.leaf_of[0])]["latency"]
    assert t == pytest.approx(2 * nic_lat + STEP_LATENCY_S["ib"] + S / 50e9, rel=1e-12)
    assert c.bottleneck_bytes_per_s(0, 8) == 50e9
    assert m.comm_time_s(CommRequest("p2p", (3, 3), S)) == 0
    assert m.comm_time_s(CommRequest("all_reduce", (3,), S)) == 0


def test_nvls_used_inside_sharp_domain_only():
    h100 = load_cluster("dgx-h100", 8)
    a100 = load_cluster("dgx-a100", 8)
    req = CommRequest("all_reduce", tuple(range(8)), 2**30)
    assert ClusterCostModel(h100).algorithm_for(req) == "nvls"
    assert ClusterCostModel(a100).algorithm_for(req) in ("ring", "tree")
    assert ClusterCostModel(a100, algorithm="nvls").algorithm_for(req) in ("ring", "tree")   # not applicable


def test_small_messages_prefer_tree_across_nodes():
    c = load_cluster("dgx-h100", 512)
    m = ClusterCostModel(c)
    ranks = tuple(range(0, 512, 8))          # one GPU per node, 64 nodes
    assert m.algorithm_for(CommRequest("all_reduce", ranks, 1024)) == "tree"
    assert m.algorithm_for(CommRequest("all_reduce", ranks, 2**30)) == "ring"


def test_all_to_all_direct_and_cloudmatrix():
    c = load_cluster("cloudmatrix-384", 64)
    m = _model(c)
    S = 2**28
    t = m.comm_time_s(CommRequest("all_to_all", tuple(range(64)), S))
    a = 2 * c.graph.edges[0, ("ub", 0)]["latency"] + STEP_LATENCY_S["ub"]
    assert t == pytest.approx(63 * a + 63 / 64 * S / 392e9, rel=1e-12)


def test_ideal_and_bad_requests():
    c = load_cluster("dgx-h100", 16)
    m = ClusterCostModel(c, network="ideal")
    assert m.comm_time_s(CommRequest("all_reduce", tuple(range(16)), 2**30)) == 0
    assert not m.contention_aware and ClusterCostModel(c, network="flow").contention_aware
    with pytest.raises(ConfigError, match="network mode"):
        ClusterCostModel(c, network="magic")
    with pytest.raises(ConfigError, match="algorithm"):
        ClusterCostModel(c, algorithm="butterfly")
    with pytest.raises(TopologyError, match="not placed"):
        ClusterCostModel(c).comm_time_s(CommRequest("all_reduce", (0, 99), 10))
    with pytest.raises(ConfigError, match="kind"):
        ClusterCostModel(c).comm_time_s(CommRequest("gossip", (0, 1), 10))
    with pytest.raises(ConfigError, match="twice"):
        ClusterCostModel(c).comm_time_s(CommRequest("all_reduce", (0, 1, 1), 10))
    with pytest.raises(ConfigError, match=">= 0 bytes"):
        ClusterCostModel(c).comm_time_s(CommRequest("all_reduce", (0, 1), -5))


def test_compute_roofline_default_and_calibrated():
    c = load_cluster("dgx-h100", 8)
    m = ClusterCostModel(c, gpu_variation=0)
    op = compute("gemm", flops=1e15, mem_bytes=1e9)
    assert m.compute_time_s(0, op) == pytest.approx(1e15 / (989.4e12 * DEFAULT_COMPUTE_EFFICIENCY))
    mem = compute("norm", flops=1e6, mem_bytes=1e10)
    # memory-bound: H100-SXM's BabelStream mean (Azure: Copy 2.90, Mul 2.90, Add 2.97, Triad 2.97 TB/s)
    assert m.compute_time_s(0, mem) == pytest.approx(1e10 / 2.935e12)
    flat = ClusterCostModel(c, compute_efficiency=0.5)
    assert flat.compute_time_s(0, mem) == pytest.approx(1e10 / (3.35e12 * DEFAULT_MEMORY_EFFICIENCY))
    assert ClusterCostModel(c, compute_efficiency=0.5).compute_time_s(0, op) == pytest.approx(1e15 / (989.4e12 * 0.5))
    cal = Calibration(compute=[ComputeFit("H100", 8e14, 1e9)],
                      collectives=[CollectiveFit("all_reduce", 8, "intra", 2e-5, 3e11)])
    mc = ClusterCostModel(c, calibration=cal, gpu_variation=0)
    assert mc.compute_time_s(0, op) == pytest.approx(1e15 / (8e14 * 1e15 / (1e15 + 1e9)))
    S = 2**30
    assert mc.comm_time_s(CommRequest("all_reduce", tuple(range(8)), S)) == pytest.approx(2e-5 + S * 1.75 / 3e11)
    assert mc.algorithm_for(CommRequest("all_reduce", tuple(range(8)), S)).endswith("(calibrated time)")
    assert m.peak_flops(3) == 989.4e12 and m.memory_capacity_bytes(3) == 81559 * 2**20 and m.device_key(0) == "H100-SXM"


def test_direct_optical_mesh_prefers_direct_exchange():
    c = load_cluster("cloudmatrix-384", 16, direct=True)
    m = _model(c)
    assert len(c.route_ranks(0, 9)) == 1
    S = 2**30
    per_circuit = 392e9 / 15
    ring = _model(c, algorithm="ring").comm_time_s(CommRequest("all_gather", tuple(range(16)), S))
    assert ring > 15 / 16 * S / per_circuit
    req = CommRequest("all_gather", tuple(range(16)), S)
    assert m.algorithm_for(req) == "direct"
    assert m.comm_time_s(req) == pytest.approx(S / 16 / per_circuit + c.graph.edges[0, 1]["latency"]
                                               + STEP_LATENCY_S["ub"], rel=1e-12)


@pytest.mark.parametrize("preset,gpus,ranks", [("dgx-h100", 64, tuple(range(0, 64, 8))),
                                               ("gb200-nvl72", 144, tuple(range(0, 144, 9))),
                                               ("tpu-v5p", 64, tuple(range(16))),
                                               ("pcie-ethernet-lab", 16, tuple(range(16)))])
def test_cost_is_affine_in_size_and_bounded_by_injection(preset, gpus, ranks):
    c = load_cluster(preset, gpus)
    m = ClusterCostModel(c, algorithm="ring", comm_model="links")
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        t = [m.comm_time_s(CommRequest(kind, ranks, s)) for s in (0.0, 2**28, 2**29)]
        assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
        # a ring's busbw can never exceed its slowest hop's per-path bottleneck
        hops = zip(ranks, ranks[1:] + ranks[:1])
        bottleneck = min(c.bottleneck_bytes_per_s(a, b) for a, b in hops)
        from simulator.calibration import bus_factor
        busbw = 2**29 / t[2] * bus_factor(kind, len(ranks))
        assert busbw <= bottleneck * 0.9


def test_nccl_multi_rail_rings_closed_form():
    """k rings (one per local GPU / NIC rail) each carry S/k: the NICs add up (k x 50 GB/s < 450 GB/s)."""
    c = load_cluster("dgx-h100", 16)
    m = _model(c, algorithm="rings")
    S, n, k = 2**32, 16, 8
    nic_lat = c.graph.edges[0, ("leaf", c.fat_tree.leaf_of[0])]["latency"]
    a = 2 * nic_lat + STEP_LATENCY_S["ib"]
    req = CommRequest("all_reduce", tuple(range(n)), S)
    assert m.comm_time_s(req) == pytest.approx(2 * (n - 1) * a + 2 * (n - 1) / n * S / (k * 50e9), rel=1e-12)
    ag = m.comm_time_s(CommRequest("all_gather", tuple(range(n)), S))
    assert ag == pytest.approx((n - 1) * a + (n - 1) / n * S / (k * 50e9), rel=1e-12)
    # NCCL-like choice: rings for big buffers across nodes, a latency-friendly algorithm for small ones
    auto = ClusterCostModel(c, comm_model="links")
    assert auto.algorithm_for(req) == "rings"
    assert auto.algorithm_for(CommRequest("all_reduce", tuple(range(n)), 4096)) != "rings"
    # with a single GPU per node it does not apply
    assert _model(c, algorithm="rings").algorithm_for(CommRequest("all_reduce", (0, 8), S)) != "rings"


def test_identical_domains_share_costs_unless_a_link_differs():
    c = load_cluster("dgx-h100", 32)
    m = ClusterCostModel(c)
    reqs = [CommRequest("all_reduce", tuple(range(8 * k, 8 * k + 8)), 2**28) for k in range(4)]
    assert len({m.comm_time_s(r) for r in reqs}) == 1
    c.link_capacity[c.link_id[(11, ("nvswitch", 1))]] /= 2          # a degraded NVLink in node 1
    m2 = ClusterCostModel(c)
    t = [m2.comm_time_s(r) for r in reqs]
    assert t[1] > t[0] == t[2] == t[3]
    lab = ClusterCostModel(load_cluster("pcie-ethernet-lab", 16))
    assert lab._uniform_domains


def test_device_keys_are_every_ranks_device_key_and_wrappers_keep_their_own():
    """Symmetry refinement takes all ranks' device keys at once from the cost model's own class; a model
    that wraps another (attribute delegation) is asked rank by rank, so its own device_key still splits."""
    from schedules import build_programs
    from schedules.models import custom_model
    from schedules.plan import ParallelPlan
    from simulator.symmetry import refine_classes
    from topologies import load_cluster
    c = load_cluster("dgx-h100", 32)
    m = ClusterCostModel(c, network="flow")
    assert m.device_keys(32) == [m.device_key(r) for r in range(32)]

    class Wrapped:                      # like topologies.faults.FaultyCostModel: its own device_key
        def __init__(self, base):
            self.base = base

        def device_key(self, rank):
            return "slow" if rank == 9 else self.base.device_key(rank)

        def __getattr__(self, name):
            return getattr(self.base, name)

    model = custom_model(layers=2, hidden=256, heads=4, vocab=1000)
    plan = ParallelPlan(tp=2, pp=2, dp=8, micro_batch=1, global_batch=16, seq=128)
    progs = build_programs(model, plan, 32)
    assert refine_classes(progs, m).classes == len(progs.classes)
    assert refine_classes(progs, Wrapped(m)).classes > len(progs.classes)

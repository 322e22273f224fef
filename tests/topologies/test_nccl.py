"""NCCL's cost model (topologies.nccl) against closed forms written from NCCL's tuning.cc / search.cc."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.calibration import Calibration, CollectiveFit
from simulator.costs import CommRequest
from topologies import load_cluster, nccl
from topologies import nccl_constants as C
from topologies.cost import ClusterCostModel

GIB, MIB = 2**30, 2**20


def _comm(preset, gpus, ranks=None, **over):
    c = load_cluster(preset, gpus, **over)
    return nccl.comm_of(c, tuple(range(gpus)) if ranks is None else tuple(ranks))


def test_graph_search_matches_nccl_on_dgx_nodes():
    # H100: 18 NVLinks x 20.6 GB/s = 370.8; 6 rings at 60 GB/s fit, split in two (dup) -> 12 x 30
    g = nccl.graphs(_comm("dgx-h100", 8))
    assert (g["ring"].channels, g["ring"].bw_intra) == (12, 30.0)
    # NVLS: a head moves 2x, the other 7 GPUs 1x per channel: 9 s <= 370.8 -> s = 40, one channel per GPU
    assert (g["nvls"].channels, g["nvls"].bw_intra) == (8, 40.0)
    # A100: 12 x 20 GB/s = 240 = 6 x 40 -> dup -> 12 x 20; no NVLS on Ampere
    g = nccl.graphs(_comm("dgx-a100", 8))
    assert (g["ring"].channels, g["ring"].bw_intra) == (12, 20.0) and "nvls" not in g


def test_ring_simple_closed_form_from_tuning_cc():
    comm = _comm("dgx-h100", 8)
    S = 4 * GIB
    c = nccl.choose(comm, "all_reduce", S, "ring", "simple")
    # baseLat 8.4 + 2(n-1) x hwLat NVLink ring Simple 3.4 us; busBw = 12 x 30 -> algbw x n / (2(n-1))
    lat = (8.4 + 14 * 3.4) * 1e-6
    assert c.time_s == pytest.approx(lat + S / (360e9 * 8 / 14), rel=1e-9)
    # LL: half the line rate capped at llMaxBw (Hopper, one node: 141 GB/s), 0.6 us per step
    ll = nccl.choose(comm, "all_reduce", S, "ring", "ll")
    assert ll.bandwidth_Bps == pytest.approx(141e9 * 8 / 14) and ll.latency_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6)


def test_large_all_reduce_busbw_in_published_range():
    for preset, lo, hi in (("dgx-h100", 430, 500), ("dgx-h200", 430, 500), ("dgx-a100", 210, 250)):
        m = ClusterCostModel(load_cluster(preset, 8))
        for S in (GIB, 4 * GIB, 16 * GIB):
            t = m.comm_time_s(CommRequest("all_reduce", tuple(range(8)), S))
            busbw = S / t * 2 * 7 / 8 / 1e9
            assert lo <= busbw <= hi, (preset, S, busbw)


def test_tuner_choice_by_size_and_hardware():
    h100 = _comm("dgx-h100", 8)
    assert nccl.choose(h100, "all_reduce", 4096).name == "ring/ll"
    assert nccl.choose(h100, "all_reduce", GIB).name == "nvls/simple"
    assert nccl.choose(h100, "all_gather", GIB).name == "ring/simple"      # NVLS all-gather is slower here
    a100 = _comm("dgx-a100", 8)
    assert {nccl.choose(a100, "all_reduce", s).algorithm for s in (1024, MIB, GIB)} == {"ring"}
    # across many nodes the tree wins small and mid sizes, the ring the largest (NCCL's own model)
    many = _comm("dgx-a100", 256)
    assert nccl.choose(many, "all_reduce", MIB).algorithm == "tree"
    assert nccl.choose(many, "all_reduce", 4 * GIB).algorithm == "ring"
    # PAT only with one GPU per node
    rail = _comm("dgx-h100", 64, ranks=range(0, 64, 8))
    assert nccl.choose(rail, "all_gather", MIB).algorithm in ("pat", "ring")
    assert "pat" in {c.algorithm for c in nccl.table(rail, "all_gather", MIB)}
    assert "pat" not in {c.algorithm for c in nccl.table(_comm("dgx-h100", 16), "all_gather", MIB)}


def test_fewer_channels_for_small_sizes():
    comm = _comm("dgx-h100", 8)
    small = nccl.choose(comm, "all_reduce", 64 * 1024, "ring", "simple")
    big = nccl.choose(comm, "all_reduce", 64 * MIB, "ring", "simple")
    # Simple: 512 threads x 64 B per channel -> 64 KiB keeps 2 of the 12 channels
    assert (small.channels, big.channels) == (2, 12)
    assert small.time_s > small.estimate_s and big.time_s == pytest.approx(big.estimate_s)


def test_forced_algorithm_and_protocol_in_the_cost_model():
    c = load_cluster("dgx-h100", 8)
    req = CommRequest("all_reduce", tuple(range(8)), 64 * MIB)
    m = ClusterCostModel(c, algorithm="ring", protocol="LL128")
    assert (m.algorithm_for(req), m.protocol_for(req)) == ("ring", "ll128")
    auto = ClusterCostModel(c)
    assert (auto.algorithm_for(req), auto.protocol_for(req)) == ("nvls", "simple")
    # NVLS where the switch cannot reduce (A100): NCCL's default instead
    a = ClusterCostModel(load_cluster("dgx-a100", 8), algorithm="nvls")
    assert a.algorithm_for(req) == "ring"
    # route-level algorithms keep working (links model)
    h = ClusterCostModel(load_cluster("dgx-h100", 16), algorithm="hierarchical")
    assert h.algorithm_for(CommRequest("all_reduce", tuple(range(16)), GIB)) == "hierarchical"


def test_calibration_overrides_the_nccl_model():
    c = load_cluster("dgx-h100", 8)
    fit = CollectiveFit(kind="all_reduce", group_size=8, scope="intra", alpha_s=1e-3, busbw_bytes_per_s=1e9)
    cal = Calibration(collectives=[fit])
    S = 8 * MIB
    t = ClusterCostModel(c, calibration=cal).comm_time_s(CommRequest("all_reduce", tuple(range(8)), S))
    assert t == pytest.approx(fit.time_s(S, 8))


def test_p2p_and_all_to_all_closed_forms():
    c = load_cluster("dgx-h100", 16)
    comm = nccl.comm_of(c, (0, 8))
    S = 256 * MIB
    # Simple above 16 KiB: ring base 8.4 + NET hwLat 14 us, NIC at 50 GB/s (NCCL units = line rate)
    assert nccl.p2p_time_s(comm, S, inter_node=True) == pytest.approx(22.4e-6 + S / 50e9)
    assert nccl.p2p_time_s(comm, 1024, inter_node=False) == pytest.approx((6.6 + 0.6) * 1e-6 + 1024 / (370.8e9 * 0.5))
    a2a = nccl.comm_of(c, tuple(range(16)))
    # 16 ranks, 2 nodes: 7/16 of S over NVLink, 8/16 over the node's 8 NICs shared by its 8 GPUs
    t = nccl.all_to_all_time_s(a2a, S)
    assert t == pytest.approx((6.6 + 2.7) * 1e-6 + max(7 / 16 * S / 370.8e9, 8 / 16 * S / 50e9))


def test_every_gpu_of_an_nvl72_rack_has_its_own_nic():
    """GB200 NVL72: the NVLink domain (72 GPUs) spans 18 trays of 4 GPUs with 4 NICs; a group's ranks on one
    rack use their own NICs (the model once saw 4 NICs per rack, an 8-16x too slow cross-rack all-to-all)."""
    c = load_cluster("gb200-nvl72", 144)
    group = tuple(range(0, 144, 2))                 # 36 ranks on each of two racks
    comm = nccl.comm_of(c, group)
    assert (comm.n_nodes, comm.ppn, comm.nics) == (2, 36, 36)
    S = 256 * MIB
    t = nccl.all_to_all_time_s(comm, S)
    # 36/72 of S leaves the rack, each GPU over its own 400 Gb/s NIC; 35/72 over NVLink
    assert t == pytest.approx(nccl.p2p_time_s(comm, 0.0, True) + max(36 / 72 * S / 50e9, 35 / 72 * S / (comm.intra_bw * 1e9)))
    # priced through the cluster cost model too (the route bound does not raise it)
    m = ClusterCostModel(c)
    assert m.comm_time_s(CommRequest("all_to_all", group, S)) == pytest.approx(t, rel=0.02)
    # DGX H100: unchanged (one NIC per GPU, node = domain)
    assert nccl.comm_of(load_cluster("dgx-h100", 16), tuple(range(16))).nics == 8


@pytest.mark.parametrize("preset,gpus,group,sparse", [
    ("dgx-h100", 24, tuple(range(20)), 4),                # 8 + 8 + 4 GPUs of three nodes
    ("dgx-h100", 32, tuple(range(4, 20)), 4),             # 4 + 8 + 4
    ("gb200-nvl72", 144, tuple(range(64, 128)), 8),       # 8 GPUs of rack 0, 56 of rack 1
])
def test_uneven_groups_run_as_many_rings_as_the_sparsest_node_holds(preset, gpus, group, sparse):
    """A group with fewer ranks on some node: every ring crosses every node and NCCL keeps the fewest
    channels any node found, so the sparsest node's NICs (one per GPU on these rails) bound the rings. The
    closed form: all-gather moves (n-1)/n of S through that node's NICs. The model once priced such groups
    as one ring through one NIC (the route stand-in needed equal domains): 4-17x too slow."""
    c = load_cluster(preset, gpus)
    n, nodes, fullest, sparsest = nccl.group_shape(c, group)
    assert sparsest == sparse < fullest
    comm = nccl.comm_of(c, group)
    assert (comm.ppn_min, comm.channel_nics, comm.nics) == (sparse, sparse, fullest)
    nic = c.fabric_spec.bandwidth
    m = ClusterCostModel(c)
    S = GIB
    bound = (n - 1) / n * S / (sparse * nic)
    t = m.comm_time_s(CommRequest("all_gather", group, S))
    assert bound <= t <= 1.2 * bound
    # all-reduce moves twice the bytes (ring) or as much through the heads' NICs (trees): never more than
    # twice the all-gather, never under the one-way closed form
    ar = m.comm_time_s(CommRequest("all_reduce", group, S))
    assert bound <= ar <= 2.1 * t
    # the route-level model (NCCL's per-rail rings over the links) agrees
    links = ClusterCostModel(c, comm_model="links").comm_time_s(CommRequest("all_gather", group, S))
    assert bound <= links <= 1.25 * bound
    # all-to-all: the sparsest node's GPUs send the most across nodes, each over its own NIC
    a2a = nccl.all_to_all_time_s(comm, S)
    assert a2a == pytest.approx(nccl.p2p_time_s(comm, 0.0, True)
                                + max((n - sparse) / n * S / nic, (fullest - 1) / n * S / (comm.intra_bw * 1e9)))
    # even groups keep the fullest node's count (unchanged model)
    even = tuple(range(16))
    assert nccl.comm_of(c, even).ring_nics == 0 and nccl.group_shape(c, even)[2] == nccl.group_shape(c, even)[3]


def test_moe_dispatch_destinations():
    comm = _comm("dgx-h100", 8)
    # one expert per GPU, top-1: a token goes to one GPU, 7/8 of the time a remote one
    t, nbytes = nccl.moe_time_s(comm, 1000, 100.0, 1, 8, inter_node=False)
    assert nbytes == pytest.approx(1000 * 100.0 * 7 / 8)
    # top-8 of 8 experts: every GPU
    _, nbytes = nccl.moe_time_s(comm, 1000, 100.0, 8, 8, inter_node=False)
    assert nbytes == pytest.approx(1000 * 100.0 * 7)


def test_not_nccl_hardware_keeps_the_route_model():
    c = load_cluster("tpu-v5p", 64)
    assert nccl.comm_of(c, tuple(range(16))) is None
    m = ClusterCostModel(c)
    assert m.protocol_for(CommRequest("all_reduce", tuple(range(16)), MIB)) == "-"


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["dgx-h100", "dgx-a100", "pcie-ethernet-lab", "dgx-b200"]),
       st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast"]),
       st.integers(2, 16), st.integers(0, 34))
def test_time_positive_estimate_monotone_and_never_beats_line_rate(preset, kind, n, log_size):
    from topologies.collectives import ALGORITHMS
    c = load_cluster(preset, 16)
    m = ClusterCostModel(c)
    ranks = tuple(range(n))
    S = float(2**log_size)
    t = m.comm_time_s(CommRequest(kind, ranks, S))
    assert t > 0
    # no route-level schedule moves the bytes faster than its busiest link at line rate allows
    raw = ClusterCostModel(c, comm_model="links", efficiency={k: 1.0 for k in m.efficiency})
    gpus = tuple(c.gpu_of(r) for r in ranks)
    bounds = [S * float((a.coef / raw.capacity[a.links]).max())
              for a in (raw._algo_cost(kind, gpus, name) for name in ALGORITHMS if name != "p2p")
              if a is not None and len(a.coef)]
    assert t >= min(bounds) * (1 - 1e-9)
    # NCCL's estimate grows with the size (the tuner's minimum of increasing lines)
    comm = nccl.comm_of(c, ranks)
    a, b = nccl.choose(comm, kind, S), nccl.choose(comm, kind, 2 * S)
    assert b.estimate_s >= a.estimate_s


def test_unknown_devices_price_exactly_as_before():
    """The CPU closed loop's one-box cluster (a device NCCL's model does not know) keeps the route model."""
    from topologies.cluster import Cluster, DomainSpec
    from topologies.specs import AcceleratorSpec
    acc = AcceleratorSpec(name="cpu-x", peak_bf16_flops=1e12, peak_fp8_flops=None, hbm_bytes=64e9,
                          hbm_bytes_per_s=1e10, scale_up_bytes_per_s=2e9, nic_bytes_per_s=2e9, scale_up_link="pcie",
                          vendor="cpu")
    c = Cluster("2x-cpu", acc, gpus=2, gpus_per_node=2, domain=DomainSpec("pcie", 2, 2e9))
    for kind in ("all_reduce", "all_gather", "p2p"):
        req = CommRequest(kind, (0, 1), 3e6)
        assert ClusterCostModel(c).comm_time_s(req) == ClusterCostModel(c, comm_model="links").comm_time_s(req)


def test_collnet_only_where_the_fabric_reduces():
    plain = _comm("dgx-h100", 64)
    sharp = _comm("dgx-h100", 64, fabric_sharp=True)
    algos = lambda comm: {c.algorithm for c in nccl.table(comm, "all_reduce", 64 * MIB)}     # noqa: E731
    assert not {"collnet_direct", "collnet_chain"} & algos(plain) and "nvls" not in algos(plain)
    # SHARP: CollNet direct / chain and NVLS across nodes (NVLink SHARP + IB SHARP) become candidates
    assert {"collnet_direct", "collnet_chain", "nvls"} <= algos(sharp)
    g = nccl.graphs(sharp)["collnet"]
    assert g.channels == 8 and g.bw_inter == 48.0        # one head per NIC, 400 Gb/s -> 48 GB/s channels
    # CollNet direct latency: NET hwLat 31 + 2 x (1 x NVLink 3.7 + 7 x 0.4 arity) us
    cd = nccl.choose(sharp, "all_reduce", 64 * MIB, "collnet_direct")
    assert cd.latency_s == pytest.approx((31 + 2 * (3.7 + 7 * 0.4)) * 1e-6)
    assert nccl.choose(_comm("dgx-h100", 8, fabric_sharp=True), "all_reduce", MIB, "collnet_direct") is None


def test_older_releases_tune_as_their_tuning_cc():
    """Closed forms from tuning.cc at tags v2.18.5-1 / v2.20.5-1 / v2.27.7-1 (the releases of published rows)."""
    import dataclasses
    h100 = _comm("dgx-h100", 8)
    assert nccl.parse_version("2.18.5") == 21805 and nccl.parse_version("2.27.7 (stated elsewhere)") == 22707
    assert nccl.parse_version("") == 0 and nccl.parse_version("unknown") == 0
    v2185, v2277 = (dataclasses.replace(h100, version=v) for v in (21805, 22707))
    rows = {(c.algorithm, c.protocol): c for c in nccl.table(v2185, "all_reduce", GIB)}
    # 2.18: NVLS 23 us; ring LL at 1/4 of 12 x 30 GB/s, capped by the Ampere-row LL cap 87.7 -> x 8/14
    assert rows[("nvls", "simple")].latency_s == pytest.approx(23e-6)
    assert rows[("ring", "ll")].bandwidth_Bps == pytest.approx(87.7e9 * 8 / 14)
    # 2.21-2.27: NVLS 25 us, 8 channels x min(bwIntra, bwInter) = 40 GB/s, x 5/6 (no nvlsEfficiency, no 2x)
    nv = nccl.choose(dataclasses.replace(h100, version=22707), "all_reduce", GIB, "nvls")
    old = {(c.algorithm, c.protocol): c for c in nccl.table(v2277, "all_reduce", GIB)}[("nvls", "simple")]
    assert old.latency_s == pytest.approx(25e-6) and old.bandwidth_Bps == pytest.approx(8 * 40e9 * 5 / 6)
    # the release picks, the newest model prices: a forced NVLS costs what the newest model says
    assert nv.time_s == pytest.approx(nccl.choose(h100, "all_reduce", GIB, "nvls").time_s)
    # 2.18 has no NVLS all-gather (ring only for all-gather / reduce-scatter)
    assert "nvls" not in {c.algorithm for c in nccl.table(v2185, "all_gather", GIB)}
    assert "nvls" in {c.algorithm for c in nccl.table(h100, "all_gather", GIB)}


def test_release_changes_the_pick_where_the_tuners_differ():
    """6 of 8 B200: 2.27's NVLS model (x 5/6, no nvlsEfficiency) rates NVLS above its ring; the newest model
    (nvlsEfficiency 0.74 on Blackwell) rates it below. The version is carried by the cost model."""
    c = load_cluster("dgx-b200", 8)
    req = CommRequest("all_reduce", tuple(range(6)), 8 * GIB)
    assert ClusterCostModel(c).algorithm_for(req) == "ring"
    assert ClusterCostModel(c, nccl_version="2.27.7").algorithm_for(req) == "nvls"
    assert ClusterCostModel(c, nccl_version="2.27.7").with_cluster(c).nccl_version == "2.27.7"


def test_nvls_tree_correction_on_blackwell_x86_only():
    """tuning.cc (>= 2.28): NVLS-tree bandwidth x treeCorrectionFactor[Simple][log2(size/64)] on Blackwell with
    x86 hosts; 1 MiB -> index 14 -> 0.5. Not on Hopper, not in 2.27."""
    import dataclasses
    b200 = _comm("dgx-b200", 32)
    S = 2**20
    est = {(c.algorithm, c.protocol): c for c in nccl.table(b200, "all_reduce", S)}[("nvls_tree", "simple")]
    old = {(c.algorithm, c.protocol): c
           for c in nccl.table(dataclasses.replace(b200, version=22707), "all_reduce", S)}[("nvls_tree", "simple")]
    raw = nccl._bandwidth(b200, "all_reduce", "nvls_tree", "simple", nccl.graphs(b200)) * 1e9
    assert est.bandwidth_Bps == pytest.approx(raw * 0.5)
    assert old.bandwidth_Bps == pytest.approx(nccl._bandwidth(dataclasses.replace(b200, version=22707), "all_reduce",
                                                              "nvls_tree", "simple", nccl.graphs(b200)) * 1e9)
    h100 = _comm("dgx-h100", 32)
    c = {(c.algorithm, c.protocol): c for c in nccl.table(h100, "all_reduce", S)}[("nvls_tree", "simple")]
    assert c.bandwidth_Bps == pytest.approx(nccl._bandwidth(h100, "all_reduce", "nvls_tree", "simple",
                                                            nccl.graphs(h100)) * 1e9)


def test_harness_closed_form():
    """nccl-tests -g N: the period is the slower of the GPUs and N launches by one thread (issue #123: 33.7 us
    for 8 GPUs); blocking benchmarks add the launches to the collective."""
    per = 33.7e-6 / 8
    assert nccl.harness_time_s(10e-6, 8) == pytest.approx(33.7e-6)
    assert nccl.harness_time_s(50e-6, 8) == pytest.approx(50e-6)
    assert nccl.harness_time_s(10e-6, 1) == pytest.approx(10e-6)
    assert nccl.harness_time_s(10e-6, 1, blocking=True) == pytest.approx(10e-6 + per)
    assert nccl.harness_time_s(1e-3, 8, blocking=True) == pytest.approx(1e-3 + 33.7e-6)


def test_tree_simple_latency_is_the_stated_releases():
    """tuning.cc tree Simple (baseLat; hwLat NVLink, NET) by release: v2.19-v2.22 (0; 28, 28), v2.18.3-v2.18.6
    (0; 4, 14), v2.23.4 on (8.4; 4.0, 14); tree latency = base + 2 ((ppn - 1) intra + log2(nodes) inter)."""
    import dataclasses
    comm = _comm("dgx-h100", 16)                                     # 2 nodes x 8
    for version, us in ((22105, 2 * (7 * 28 + 28)), (21805, 2 * (7 * 4 + 14)), (22707, 8.4 + 2 * (7 * 4 + 14)),
                        (0, 8.4 + 2 * (7 * 4 + 14))):
        c = dataclasses.replace(comm, version=version)
        assert nccl._latency_us(c, "all_reduce", "tree", "simple") == pytest.approx(us)
        assert nccl._latency_us(c, "all_reduce", "tree", "ll") == pytest.approx(6.8 + 2 * (7 * 0.6 + 5.0))


def test_blackwell_caps_are_the_stated_releases():
    """tuning.cc per-channel caps on Blackwell: twice Hopper's in v2.25-v2.27 (ring LL128 73.4, tree 2 x 36.0
    beyond 2 nodes), the newest tables from v2.28 (40.0, 24.0); bus = min(channels x bw x factor, channels x cap)."""
    import dataclasses
    comm = _comm("dgx-b200", 32)                                     # 4 nodes x 8
    g = nccl.graphs(comm)
    for version, tree_cap in ((22707, 72.0), (0, 24.0)):
        c = dataclasses.replace(comm, version=version)
        tree = g["tree"]
        want = min(tree.channels * tree.bw_inter * 0.92, tree.channels * tree_cap) * 0.5
        assert nccl._bandwidth(c, "all_reduce", "tree", "simple", g) == pytest.approx(want)
    assert nccl._cap(dataclasses.replace(comm, version=22707), "ring_ll128", 0) == pytest.approx(73.4)
    assert nccl._cap(comm, "ring_ll128", 0) == 40.0
    h100 = dataclasses.replace(_comm("dgx-h100", 32), version=22707)
    assert nccl._cap(h100, "tree", 2) == 36.0                        # Hopper: the same in every release


def test_one_rank_per_node_ring_takes_the_tree_net_latency_from_2_23():
    """interLat = ppn == 1 ? hwLat[NET][Tree] : hwLat[NET][algo] from v2.23.4; 2 ranks on 2 nodes, ring LL:
    6.6 + 2 x NET latency (tree 5.0 now, ring 2.7 before)."""
    import dataclasses
    comm = nccl.comm_of(load_cluster("dgx-h100", 16), (0, 8))
    assert comm.ppn == 1 and comm.n_nodes == 2
    assert nccl._latency_us(comm, "all_reduce", "ring", "ll") == pytest.approx(6.6 + 2 * 5.0)
    old = dataclasses.replace(comm, version=22105)
    assert nccl._latency_us(old, "all_reduce", "ring", "ll") == pytest.approx(6.6 + 2 * 2.7)


def test_torch_call_overhead_is_the_published_difference_of_the_two_timings():
    """PyTorch's per-call host time: median over 8 B..1 MiB of (--with-host-overhead - default) median latency on
    8x H200 (ml-engineering network/benchmarks/README.md); a blocking call pays it before the collective, a
    queued one overlaps it."""
    import statistics
    with_host = (36.6, 38.0, 39.1, 41.7, 43.5, 50.9)
    default = (15.2, 17.9, 18.8, 20.9, 21.4, 27.7)
    diff = statistics.median(a - b for a, b in zip(with_host, default))
    assert C.TORCH_CALL_OVERHEAD_S == pytest.approx(diff * 1e-6, abs=1e-9)
    h = C.TORCH_CALL_OVERHEAD_S
    assert nccl.harness_time_s(10e-6, 1, blocking=True, host_s=h) == pytest.approx(10e-6 + h)
    assert nccl.harness_time_s(10e-6, 8, blocking=False, host_s=h) == pytest.approx(max(10e-6, h))
    assert nccl.harness_time_s(1e-3, 1, blocking=False, host_s=h) == pytest.approx(1e-3)


@pytest.mark.parametrize("size", [8, 4096, 2**20, 2**26, 2**33])
def test_algorithm_and_protocol_sets_pick_the_lowest_estimate_among_them(size):
    """NCCL_ALGO=Ring,Tree NCCL_PROTO=Simple: the pick is the brute-force minimum estimate over that subset."""
    comm = _comm("dgx-h100", 16, nic_bandwidth=25e9, fabric_link="ethernet")
    rows = [r for r in nccl.table(comm, "all_reduce", size) if r.algorithm in ("ring", "tree")
            and r.protocol == "simple"]
    best = min(rows, key=lambda r: r.estimate_s)
    got = nccl.choose(comm, "all_reduce", size, ("ring", "tree"), ("simple",))
    assert (got.algorithm, got.protocol) == (best.algorithm, best.protocol)
    assert nccl.choose(comm, "all_reduce", size, ("ring",), ("ll",)) == nccl.choose(comm, "all_reduce", size,
                                                                                     "ring", "ll")


def test_plugin_latency_enters_every_inter_node_step():
    """tuning.cc: interLat += latencyInter (the plugin's reported latency), twice for Simple. 4 nodes of 8:
    tree 2 log2(4) = 4 inter steps, ring all-reduce 2 (4 - 1) = 6, NVLS-tree 2 log2(4) = 4; one node: none."""
    from dataclasses import replace
    base = _comm("dgx-b200", 32, fabric_link="ethernet")
    efa = replace(base, net_latency_us=35.0)
    lat = lambda c, a, p: {(r.algorithm, r.protocol): r.latency_s for r in nccl.table(c, "all_reduce", 8)}[(a, p)]
    for algo, proto, steps, factor in (("tree", "ll", 4, 1), ("tree", "simple", 4, 2), ("ring", "ll128", 6, 1),
                                       ("ring", "simple", 6, 2), ("nvls_tree", "simple", 4, 2)):
        assert lat(efa, algo, proto) - lat(base, algo, proto) == pytest.approx(steps * factor * 35e-6, rel=1e-9)
    one = _comm("dgx-b200", 8)
    assert nccl.table(replace(one, net_latency_us=35.0), "all_reduce", 8) == nccl.table(one, "all_reduce", 8)


def test_nvls_chunk_is_enqueue_cc_s_by_hand():
    """8x H100: 16 NVLS channels x 8 heads = 128 concurrent ops; 128 KiB, 64 KiB below 64 x 128 x 128 KiB = 1 GiB,
    32 KiB below 8 x 128 x 64 KiB = 64 MiB, 16 KiB below 2 x 128 x 32 KiB = 8 MiB."""
    h100 = _comm("dgx-h100", 8)
    want = {MIB: 16384, 8 * MIB - 1: 16384, 8 * MIB: 32768, 64 * MIB - 1: 32768, 64 * MIB: 65536,
            GIB - 1: 65536, GIB: 131072, 8 * GIB: 131072}
    assert {s: nccl.nvls_chunk_bytes(h100, s, 8) for s in want} == want
    # 8x B200: 24 channels x 8 heads = 192: 16 KiB below 2 x 192 x 32 KiB = 12 MiB
    assert nccl.nvls_chunk_bytes(_comm("dgx-b200", 8), 12 * MIB - 1, 8) == 16384


def test_nvls_all_reduce_pays_the_three_stage_pipeline_fill():
    """One-node NVLS all-reduce: latency + S / bw + 2 x min(iteration, S) / bw, iteration = 128 x chunk bytes;
    the tuner's estimate (what picks the algorithm) keeps NCCL's latency + S / bw."""
    h100 = _comm("dgx-h100", 8)
    for S, iteration in ((MIB, 128 * 16384), (8 * MIB, 128 * 32768), (100 * MIB, 128 * 65536),
                         (4 * GIB, 128 * 131072)):
        c = nccl.choose(h100, "all_reduce", S, "nvls")
        bw = c.bandwidth_Bps
        assert c.time_s == pytest.approx(c.latency_s + S / bw + 2 * min(iteration, S) / bw, rel=1e-12)
        assert c.estimate_s == pytest.approx(c.latency_s + S / bw, rel=1e-12)
    # 8 MiB by hand: bus 8 x 40 x 0.85 x 7/8 x 2 = 476 GB/s -> algbw 476 x 8/14 = 272 GB/s; 25 us; 4 MiB iteration
    c = nccl.choose(h100, "all_reduce", 8 * MIB, "nvls")
    assert c.time_s == pytest.approx(25e-6 + 8 * MIB / 272e9 + 2 * 4 * MIB / 272e9, rel=1e-9)


def test_no_pipeline_fill_outside_one_node_nvls_all_reduce():
    """Ring and tree ranks all start on their own data (no fill); multi-node NVLS-tree and NVLS all-gather keep
    NCCL's latency + size / bandwidth."""
    for comm, kind in ((_comm("dgx-h100", 8), "all_gather"), (_comm("dgx-h100", 8), "all_reduce"),
                       (_comm("dgx-h100", 16), "all_reduce"), (_comm("dgx-a100", 8), "all_reduce")):
        for c in nccl.table(comm, kind, 64 * MIB):
            if (c.algorithm, kind, comm.n_nodes) == ("nvls", "all_reduce", 1):
                continue
            share = 1.0 if c.algorithm in ("nvls", "nvls_tree", "pat", "collnet_direct") else \
                c.channels / nccl.comm_channels(comm, nccl.graphs(comm))
            assert c.time_s == pytest.approx(c.latency_s + 64 * MIB / (c.bandwidth_Bps * share), rel=1e-12)

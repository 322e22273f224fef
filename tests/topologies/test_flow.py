import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costs import CommRequest
from simulator.errors import TopologyError
from topologies import load_cluster
from topologies.cost import ClusterCostModel
from topologies.flow import drive, max_min_rates

EXACT = {"nvlink": 1.0, "ib": 1.0, "ici": 1.0, "ethernet": 1.0, "pcie": 1.0, "ub": 1.0}


def run_all(net, starts):
    """Drive a FlowNetwork like the engine: starts = [(time, key, request)]; returns key -> finish time."""
    return drive(net, starts)


def test_two_flows_over_one_link_get_half_each():
    c = load_cluster("dgx-h100", 64)
    m = ClusterCostModel(c, network="flow", efficiency=EXACT)
    S = 2**32
    # both leave GPU 0 through its NIC link: 0->8 and 0->16
    a, b = CommRequest("p2p", (0, 8), S), CommRequest("p2p", (0, 16), S)
    done = run_all(m.network(), [(0.0, "a", a), (0.0, "b", b)])
    assert done["a"] == pytest.approx(2 * S / 50e9, rel=1e-9)
    assert done["b"] == pytest.approx(2 * S / 50e9, rel=1e-9)
    # a half-size flow: both at half rate until it ends at S/B, then the other alone: 1.5 S/B
    # (up to the few-microsecond latency terms, which the fluid model smears over each bundle's life)
    done = run_all(m.network(), [(0.0, "a", a), (0.0, "b", CommRequest("p2p", (0, 16), S / 2))])
    assert done["b"] == pytest.approx(S / 50e9, rel=1e-4)
    assert done["a"] == pytest.approx(1.5 * S / 50e9, rel=1e-4)
    # disjoint flows do not interact: each takes its analytical time
    c2 = CommRequest("p2p", (1, 9), S)
    done = run_all(m.network(), [(0.0, "a", a), (0.0, "c", c2)])
    assert done["a"] == pytest.approx(m.comm_time_s(a), rel=1e-12)
    assert done["c"] == pytest.approx(m.comm_time_s(c2), rel=1e-12)


def test_late_start_shares_remaining():
    c = load_cluster("dgx-h100", 16)
    m = ClusterCostModel(c, network="flow", efficiency=EXACT, comm_model="links")
    S, B = 2**32, 50e9
    a = CommRequest("p2p", (0, 8), S)
    done = run_all(m.network(), [(0.0, "a", a), (0.5 * S / B, "b", CommRequest("p2p", (0, 8), S / 4))])
    # b (S/4) shares with a from S/(2B): half rate each until b ends after S/(2B) more; a then has S/4 left
    assert done["b"] == pytest.approx(S / B, rel=1e-4)         # latency terms are smeared (module doc)
    assert done["a"] == pytest.approx(1.25 * S / B, rel=1e-4)


GROUPS = [tuple(range(8)), (0, 1, 2, 3), tuple(range(16)), tuple(range(0, 64, 8)), tuple(range(64)), (5, 13, 21),
          (0, 9, 18, 27, 36, 45)]
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(GROUPS), st.sampled_from(KINDS), st.floats(0, 2**33))
def test_flow_alone_equals_analytical(group, kind, size):
    c = _CLUSTER
    req = CommRequest(kind, group, size)
    an = ClusterCostModel(c).comm_time_s(req)
    fl = ClusterCostModel(c, network="flow")
    done = run_all(fl.network(), [(1.0, "x", req)])
    assert done["x"] - 1.0 == pytest.approx(an, rel=1e-9, abs=1e-15)


_CLUSTER = load_cluster("dgx-h100", 64)


def _dp_groups():
    return [tuple(range(j, 64, 8)) for j in range(8)]


@pytest.mark.parametrize("rail", [True, False])
def test_symmetric_images_equal_full_launch(rail):
    c = load_cluster("dgx-h100", 64, tiers=2, leaf_down=16, oversubscription=4, rail_optimised=rail)
    m = ClusterCostModel(c, network="flow")
    groups = _dp_groups()
    S = 2**28
    full = run_all(m.network(), [(0.0, i, CommRequest("all_reduce", g, S)) for i, g in enumerate(groups)])
    sym = run_all(m.network(), [(0.0, "rep", CommRequest("all_reduce", groups[0], S, images=tuple(groups[1:])))])
    assert sym["rep"] == pytest.approx(full[0], rel=1e-9)
    assert max(full.values()) == pytest.approx(full[0], rel=1e-9)


def test_rail_optimised_vs_not_for_cross_node_groups():
    """8 concurrent DP all-reduces (one per local GPU index) over 8 nodes on a 4:1 oversubscribed fabric:
    rail-optimised, each rail's traffic stays on its leaf (full NIC rate); otherwise the leaves' 4
    uplinks carry 8 crossing flows -> at most half the NIC rate. Alone, only the latency differs."""
    S = 2**30
    times = {}
    for rail in (True, False):
        c = load_cluster("dgx-h100", 64, tiers=2, leaf_down=16, oversubscription=4, rail_optimised=rail)
        m = ClusterCostModel(c, network="flow")
        g = _dp_groups()
        req = CommRequest("all_reduce", g[0], S, images=tuple(g[1:]))
        times[rail] = run_all(m.network(), [(0.0, "dp", req)])["dp"]
        alone = ClusterCostModel(c).comm_time_s(CommRequest("all_reduce", g[0], S))
        times[rail, "alone"] = alone
        times[rail, "alone links"] = ClusterCostModel(c, comm_model="links").comm_time_s(
            CommRequest("all_reduce", g[0], S))
    assert times[True] == pytest.approx(times[True, "alone"], rel=1e-9)
    assert times[False] > 1.8 * times[True]
    assert times[False, "alone links"] > times[True, "alone links"]        # more hops, more latency
    assert times[False, "alone"] == pytest.approx(times[True, "alone"], rel=0.01)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_max_min_fairness_characterisation(data):
    """Feasible, and every bundle below rate 1 crosses a saturated link on which no bundle has a larger
    per-flow rate x = y · ref (the bottleneck characterisation of max-min fairness)."""
    nl = data.draw(st.integers(1, 6))
    cap = np.array(data.draw(st.lists(st.floats(0.5, 10), min_size=nl, max_size=nl)))
    nb = data.draw(st.integers(1, 6))
    links, dem = [], []
    for _ in range(nb):
        ls = sorted(data.draw(st.sets(st.integers(0, nl - 1), min_size=1, max_size=nl)))
        links.append(np.array(ls))
        dem.append(np.array(data.draw(st.lists(st.floats(0.1, 10), min_size=len(ls), max_size=len(ls)))))
    y = max_min_rates(links, dem, cap)
    ref = np.array([d.max() for d in dem])
    x = y * ref
    load = np.zeros(nl)
    for b in range(nb):
        np.add.at(load, links[b], y[b] * dem[b])
    assert np.all(load <= cap * (1 + 1e-9))
    assert np.all((y >= 0) & (y <= 1 + 1e-12))
    for b in range(nb):
        if y[b] >= 1 - 1e-9:
            continue
        ok = False
        for l in links[b]:
            if load[l] >= cap[l] * (1 - 1e-7):
                on = [bb for bb in range(nb) if l in links[bb]]
                if all(x[bb] <= x[b] * (1 + 1e-7) + 1e-12 for bb in on):
                    ok = True
        assert ok, (b, y, load, cap)


def test_flow_below_its_fair_share_is_not_slowed():
    """A wants a whole link; B crosses it at a quarter of the link's rate because its own bottleneck is
    elsewhere. Max-min: B keeps its rate, A gets the rest (proportional sharing would slow B too)."""
    cap = np.array([4.0, 1.0])
    y = max_min_rates([np.array([0]), np.array([0, 1])], [np.array([4.0]), np.array([1.0, 1.0])], cap)
    assert y[1] == pytest.approx(1.0) and y[0] == pytest.approx(0.75)


def test_flow_network_errors_and_ideal():
    c = load_cluster("dgx-h100", 16)
    net = ClusterCostModel(c, network="flow").network()
    req = CommRequest("p2p", (0, 8), 1e6)
    net.start(0.0, "k", req)
    with pytest.raises(TopologyError, match="twice"):
        net.start(0.0, "k", req)
    with pytest.raises(TopologyError, match="unknown"):
        net.finish(0.0, "nope")
    with pytest.raises(TopologyError, match="backwards"):
        net.start(-1.0, "j", req)
    ideal = ClusterCostModel(c, network="ideal")
    done = run_all(ideal.network(), [(2.0, "z", req)])
    assert done["z"] == 2.0
    an = ClusterCostModel(c)
    done = run_all(an.network(), [(0.0, "a", req), (0.0, "b", CommRequest("p2p", (0, 8), 1e6))])
    assert done["a"] == done["b"] == pytest.approx(an.comm_time_s(req))


def test_calibrated_flow_alone_equals_calibrated_analytical():
    from simulator.calibration import Calibration, CollectiveFit
    c = load_cluster("dgx-h100", 16)
    # a fit faster than the links (busbw 2x NVLink) and one slower
    for busbw in (9e11, 1e11):
        cal = Calibration(collectives=[CollectiveFit("all_reduce", 8, "intra", 1e-5, busbw)])
        req = CommRequest("all_reduce", tuple(range(8)), 2**30)
        an = ClusterCostModel(c, calibration=cal).comm_time_s(req)
        assert an == pytest.approx(1e-5 + 2**30 * 1.75 / busbw)
        done = run_all(ClusterCostModel(c, network="flow", calibration=cal).network(), [(0.0, "x", req)])
        assert done["x"] == pytest.approx(an, rel=1e-9)


@pytest.mark.parametrize("lazy", [True, False])
def test_lazy_and_eager_agree_and_second_ask_is_exact(lazy):
    from topologies.flow import FlowNetwork
    c = load_cluster("dgx-h100", 64, tiers=2, leaf_down=16, oversubscription=4, rail_optimised=False)
    m = ClusterCostModel(c, network="flow")
    starts = [(0.0, i, CommRequest("all_reduce", g, 2**26 * (i + 1))) for i, g in enumerate(_dp_groups())]
    starts += [(1e-3 * i, ("p", i), CommRequest("p2p", (i, i + 8), 2**24)) for i in range(8)]
    eager = drive(FlowNetwork(m.capacity, m.bundle, lazy=False), starts)
    net = FlowNetwork(m.capacity, m.bundle, lazy=lazy)
    assert drive(net, starts) == pytest.approx(eager, rel=1e-12)
    net = FlowNetwork(m.capacity, m.bundle, lazy=lazy)
    for t, k, r in starts[:8]:
        net.start(t, k, r)
    first, second = net.next_completion(), net.next_completion()
    assert first[0] > 0 and second[0] >= first[0]
    assert second == net.next_completion()          # exact answers are stable
    assert second[0] == pytest.approx(min(eager[k] for k in range(8)), rel=1e-12)


_OVER = load_cluster("dgx-h100", 64, tiers=2, leaf_down=16, oversubscription=4, rail_optimised=False)
_REQ = st.one_of(
    st.builds(lambda a, b, s: CommRequest("p2p", (a, b), s), st.integers(0, 63), st.integers(0, 63),
              st.floats(0, 2**30)),
    st.builds(lambda g, k, s: CommRequest(k, tuple(sorted(g)), s), st.sets(st.integers(0, 63), min_size=2, max_size=12),
              st.sampled_from(KINDS), st.floats(0, 2**30)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.05), _REQ), min_size=1, max_size=12))
def test_contention_only_slows_and_lazy_equals_eager(items):
    from topologies.flow import FlowNetwork
    m = ClusterCostModel(_OVER, network="flow")
    starts = [(t, i, r) for i, (t, r) in enumerate(items)]
    lazy = drive(FlowNetwork(m.capacity, m.bundle), starts)
    eager = drive(FlowNetwork(m.capacity, m.bundle, lazy=False), starts)
    assert set(lazy) == set(range(len(items)))
    for t, i, r in starts:
        assert lazy[i] >= t + m.comm_time_s(r) * (1 - 1e-9) - 1e-12
        assert lazy[i] == pytest.approx(eager[i], rel=1e-9, abs=2e-9)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_spec_index_equals_whole_network_reference(data):
    """The link-sharing index (reused specs, and specs built from tuples and forgotten when idle) gives the
    finish times of a reference that recomputes every active bundle together at each event (max-min
    allocations decompose over components, so only rounding may differ); narrow specs (looked up on their
    links among the active ones), wide ones (keeping their neighbours and a count of the active ones) and any
    mix of the two give the same times to the last bit."""
    from topologies.flow import BundleSpec, FlowNetwork
    n_links = data.draw(st.integers(2, 6))
    cap = np.array(data.draw(st.lists(st.floats(1.0, 10.0), min_size=n_links, max_size=n_links)))
    shapes = data.draw(st.lists(st.tuples(st.floats(0.1, 5.0), st.lists(st.integers(0, n_links - 1), min_size=1,
                                                                              max_size=3, unique=True)),
                                min_size=1, max_size=4))
    specs = [BundleSpec(T, links, [1.0] * len(links)) for T, links in shapes]
    starts = [(data.draw(st.floats(0.0, 3.0)), k, data.draw(st.integers(0, len(shapes) - 1)))
              for k in range(data.draw(st.integers(1, 12)))]

    class WholeNetwork(FlowNetwork):
        solo_shortcut = False

        def _component(self, seeds):
            return list(self.active)

    cached = drive(FlowNetwork(cap, lambda i: specs[i]), starts)
    owned = drive(FlowNetwork(cap, lambda i: tuple(specs[i])), starts)
    whole = drive(WholeNetwork(cap, lambda i: specs[i]), starts)
    assert cached == owned
    for wide in (0, 1, 2):              # every spec wide; those of 2-3 links; those of 3
        class Mixed(FlowNetwork):
            wide_links = wide

        assert drive(Mixed(cap, lambda i: specs[i]), starts) == cached
        assert drive(Mixed(cap, lambda i: tuple(specs[i])), starts) == cached
    for k, t in whole.items():
        assert cached[k] == pytest.approx(t, rel=1e-9, abs=1e-12)


def test_engine_ends_communications_on_time_when_others_start_just_before():
    """A transfer that ends 0.5 ns after two others start (sharing a link: their rates need solving) ends at
    its own time, not one rate update later (the engine settles the network once every event of an instant
    has run, with no provisional wake-up)."""
    from simulator.costs import SimpleCostModel
    from simulator.engine import run
    from simulator.program import Programs, collective, compute
    from topologies.flow import BundleSpec, FlowNetwork

    class TwoLinks(SimpleCostModel):
        contention_aware = True

        def comm_time_s(self, request):
            return 1.0

        def network(self):
            specs = {(0, 1): BundleSpec(1.0, [0], [1.0]), (2, 3): BundleSpec(1.0, [1], [1.0]),
                     (4, 5): BundleSpec(1.0, [1], [1.0])}
            return FlowNetwork(np.array([1.0, 1.0]), lambda req: specs[req.ranks])

    for lead_s in (0.5e-9, 0.0, 2e-9):
        progs = Programs(world_size=6, ops={})
        groups = [progs.add_group([2 * g, 2 * g + 1], f"g{g}") for g in range(3)]
        for r in range(6):
            late = [compute("wait", (1.0 - lead_s) * 1e12)] if r >= 2 else []
            progs.ops[r] = late + [collective("c", "all_reduce", groups[r // 2], 1.0, deps=(0,) if late else ())]
        res = run(progs, TwoLinks(flops_per_s=1e12))
        assert res.end_s[0][0] == 1.0
        for r in (2, 4):        # two bundles sharing a link: 2 s each
            assert res.end_s[r][1] == pytest.approx(3.0 - lead_s, rel=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_small_solver_equals_numpy_solver_to_the_last_bit(data):
    """The plain-Python max-min solver used for small components gives exactly the numpy solver's rates
    (same progressive filling, same operations in the same order), ties and saturated links included."""
    from topologies.flow import _max_min_small
    nl = data.draw(st.integers(1, 8))
    vals = st.sampled_from([0.5, 1.0, 2.0, 3.0]) if data.draw(st.booleans()) else st.floats(1e-3, 1e3)
    cap = np.array(data.draw(st.lists(vals, min_size=nl, max_size=nl)))
    nb = data.draw(st.integers(1, 8))
    links, dem, ref = [], [], []
    for _ in range(nb):
        ls = sorted(data.draw(st.sets(st.integers(0, nl - 1), min_size=0 if nb > 1 else 1, max_size=nl)))
        links.append(np.array(ls, dtype=np.int64))
        d = data.draw(st.lists(vals, min_size=len(ls), max_size=len(ls)))
        dem.append(np.array(d, dtype=float))
        ref.append(data.draw(st.one_of(st.just(max(d, default=1.0)), vals)))
    want = max_min_rates(links, dem, cap, ref).tolist()
    got = _max_min_small([l.tolist() for l in links], [d.tolist() for d in dem], cap.tolist(), ref)
    assert got == want


def test_closed_form_end_is_taken_back_when_a_neighbour_starts():
    """A communication that starts alone gets its closed-form end (off the network's heap); when another starts
    on its link before then, the re-solve takes it back from that instant: its closed-form end no longer
    finishes it (``finish_closed`` answers False) and ``next_completion`` gives its shared end."""
    from topologies.flow import BundleSpec, FlowNetwork
    spec = BundleSpec(1.0, [0], [1.0])
    net = FlowNetwork(np.array([1.0]), lambda req: spec)
    assert net.start(0.0, "a", None, True) == 1.0
    assert net.next_completion() is None             # off the heap: nothing for the engine to wake up for
    assert net.start(0.5, "b", None, True) is None   # a neighbour: both share the link from t = 0.5
    net.settle()
    assert net.next_completion() == (1.5, "a")       # a's last half at half rate
    assert net.finish_closed(1.0, "a") is False      # the stale closed-form end does nothing
    assert net.next_completion() == (1.5, "a")
    net.finish(1.5, "a")
    net.settle()
    assert net.next_completion() == (2.0, "b")
    assert drive(FlowNetwork(np.array([1.0]), lambda req: spec), [(0.0, "a", None), (0.5, "b", None)],
                 closed=True) == {"a": 1.5, "b": 2.0}
    # alone from start to end: finish_closed ends it
    net = FlowNetwork(np.array([1.0]), lambda req: spec)
    t = net.start(0.0, "a", None, True)
    assert net.finish_closed(t, "a") is True and not net.active
    assert net.finish_closed(t, "a") is False        # taken back and finished already: nothing to do


def _small_network(data, capacities, durations):
    """A random network of 1-5 links (capacities drawn from ``capacities``), 1-4 communication shapes of 0-3 links
    moving 1 B on each link in one of ``durations`` seconds, and 1-12 starts at times from a small set (many at one instant):
    (capacity array, specs, starts for ``drive``)."""
    from topologies.flow import BundleSpec
    n_links = data.draw(st.integers(1, 5))
    cap = np.array(data.draw(st.lists(st.sampled_from(capacities), min_size=n_links, max_size=n_links)))
    shapes = data.draw(st.lists(st.tuples(st.sampled_from(durations),
                                          st.lists(st.integers(0, n_links - 1), min_size=0, max_size=3, unique=True)),
                                min_size=1, max_size=4))
    specs = [BundleSpec(T, links, [1.0] * len(links)) for T, links in shapes]
    starts = [(data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.75])), k, data.draw(st.integers(0, len(shapes) - 1)))
              for k in range(data.draw(st.integers(1, 12)))]
    return cap, specs, starts


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_closed_form_ends_equal_the_network_s_own(data):
    """Driving with closed-form ends for communications that start alone (taken back when a neighbour starts),
    and solving components in the order of their spec ids, give every communication the finish time of the
    general path to 1e-12 relative."""
    from topologies.flow import FlowNetwork
    cap, specs, starts = _small_network(data, [1.0, 2.0, 3.0], [0.25, 0.5, 1.0, 1.5])

    class FoundOrder(FlowNetwork):
        canonical_order = False         # components solved in the order their bundles were found

    general = drive(FoundOrder(cap, lambda i: specs[i]), starts)
    closed = drive(FlowNetwork(cap, lambda i: specs[i]), starts, closed=True)
    canonical = drive(FlowNetwork(cap, lambda i: specs[i]), starts)
    for other in (closed, canonical):
        assert other.keys() == general.keys()
        for k, t in general.items():
            assert other[k] == pytest.approx(t, rel=1e-12, abs=1e-15)


def test_room_on_every_link_starts_at_full_speed_without_a_re_solve():
    """A communication starting beside others with room for it at full speed on every link takes rate 1 and a
    closed-form end without re-solving anything; one without room re-solves the component; an end whose
    neighbours all run at full speed re-solves nothing (none can speed up); a re-solve that changes nobody's
    rate leaves closed-form ends standing."""
    from topologies.flow import BundleSpec, FlowNetwork
    spec = BundleSpec(1.0, [0], [1.0])          # 1 B/s on link 0 at full speed
    net = FlowNetwork(np.array([3.0]), lambda req: spec)
    assert net.start(0.0, "a", None, True) == 1.0           # alone
    assert net.start(0.25, "b", None, True) == 1.25         # room: 1 + 1 <= 3
    assert net.recomputes == 0 and net.settled
    assert net.start(0.5, "c", None, True) is None          # 1 + 1 + 1 leaves no margin: re-solved
    net.settle()
    assert net.recomputes == 1 and [b.rate for b in net.active.values()] == [1.0, 1.0, 1.0]
    assert net.finish_closed(1.0, "a") is True              # its rate did not change: its closed end stands
    assert net.settled                                      # b and c run at full speed: nothing to re-solve
    assert net.finish_closed(1.25, "b") is True
    assert net.next_completion() == (1.5, "c")
    # no room: both share the link from 0.5 on, and a's closed-form end is taken back
    net = FlowNetwork(np.array([1.5]), lambda req: spec)
    assert net.start(0.0, "a", None, True) == 1.0
    assert net.start(0.5, "b", None, True) is None
    net.settle()
    assert net.finish_closed(1.0, "a") is False
    assert [b.rate for b in net.active.values()] == [0.75, 0.75]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_network_shortcuts_equal_re_solving_every_component(data):
    """Starting with room at full speed, ends skipping neighbours at full speed and re-solves leaving unchanged
    bundles alone give every communication the finish time of a network that re-solves and reschedules the
    whole component at every start and end, to 1e-12 relative (the same max-min allocations: they are
    unique), with closed-form ends or without."""
    from topologies.flow import FlowNetwork
    cap, specs, starts = _small_network(data, [1.0, 2.0, 3.0, 4.5], [0.5, 1.0, 2.0, 4.0])

    class Resolving(FlowNetwork):
        keep_unchanged = skip_full = room_shortcut = False

    for closed in (False, True):
        want = drive(Resolving(cap, lambda i: specs[i]), starts, closed=closed)
        got = drive(FlowNetwork(cap, lambda i: specs[i]), starts, closed=closed)
        assert got.keys() == want.keys()
        for k, t in want.items():
            assert got[k] == pytest.approx(t, rel=1e-12, abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_link_load_follows_the_active_bundles_and_shortcuts_keep_the_times(data):
    """The per-link load the room shortcut reads equals, after every start and end, the demand of the active
    bundles at their counted rates (a scheduled bundle counted at its rate); it returns to zero when nothing
    runs; and the finish times equal a network that re-solves every component (1e-9), for narrow and wide
    specs, specs shared or built from tuples (forgotten when idle), varied demands, closed-form ends or not."""
    from topologies.flow import BundleSpec, FlowNetwork
    n_links = data.draw(st.integers(2, 8))
    cap = np.array(data.draw(st.lists(st.floats(0.5, 5.0), min_size=n_links, max_size=n_links)))
    shapes = []
    for _ in range(data.draw(st.integers(2, 6))):
        T = data.draw(st.floats(0.1, 4.0))
        links = data.draw(st.lists(st.integers(0, n_links - 1), max_size=min(5, n_links), unique=True))
        shapes.append((T, links, [data.draw(st.floats(0.01, 3.0)) * T for _ in links]))
    specs = [BundleSpec(*s) for s in shapes]
    starts = [(data.draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.5, 4.0])), k, data.draw(st.integers(0, len(shapes) - 1)))
              for k in range(data.draw(st.integers(1, 20)))]
    wide = data.draw(st.sampled_from([64, 2]))
    owned = data.draw(st.booleans())
    bundle_of = (lambda i: tuple(shapes[i])) if owned else (lambda i: specs[i])

    class Resolving(FlowNetwork):
        keep_unchanged = skip_full = room_shortcut = False
        wide_links = wide

    class Checked(FlowNetwork):
        wide_links = wide

        def _check(self):
            want = [0.0] * len(self._cap_list)
            for b in self.active.values():
                for l, d in zip(b.link_list, b.demand_list):
                    want[l] += b.counted * d
                if b.version != 0 and b.spec is not None:       # scheduled (or closed-form): counted at its rate
                    assert b.counted == b.rate
            assert self._load == pytest.approx(want, rel=1e-9, abs=1e-9)

        def start(self, *a, **k):
            out = super().start(*a, **k)
            self._check()
            return out

        def finish(self, *a, **k):
            super().finish(*a, **k)
            self._check()

    for closed in (False, True):
        want = drive(Resolving(cap, bundle_of), starts, closed=closed)
        net = Checked(cap, bundle_of)
        got = drive(net, starts, closed=closed)
        assert got.keys() == want.keys()
        for key, t in want.items():
            assert got[key] == pytest.approx(t, rel=1e-9, abs=1e-12)
        assert not net.active and net._load == pytest.approx([0.0] * n_links, abs=1e-9)

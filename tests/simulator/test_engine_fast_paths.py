"""The engine's and the flow network's fast paths against their general paths, to the last bit.

Fast paths (issue 15, third round): the engine's own event loop on a calendar queue (a list per instant,
a heap of instants) instead of SimPy's ``Environment.run`` / ``schedule`` on its heap of events; a network
wake-up reusing the settled network's last answer and running the communications that end then at once
when nothing is queued before them; the flow network's rates
remembered per component (by its bundles' specs, in order) instead of solved again, and scans of a wide
spec's neighbours (a component's search, a finish waking the others) stopping once every active one is met. The
general paths are what ``ReferenceEngine`` and ``SolvingNetwork`` run. Random programs on two nodes of a
flow-network cluster (NVLink alone or shared, NICs shared by cross-node groups and transfers, SMs held by
communication), with durations and sizes from small sets so that many events share an instant, must give
every op the same ready, start and end times, bit for bit."""
from array import array

import pytest
from hypothesis import given, settings, strategies as st

from simulator.engine import Engine
from simulator.errors import DeadlockError
from simulator.program import Programs, collective, compute, recv, send
from topologies import load_cluster
from topologies.cost import ClusterCostModel
from topologies.flow import FlowNetwork

CLUSTER = load_cluster("dgx-h100", 16, tiers=2, leaf_down=4, oversubscription=2, rail_optimised=False)


class ReferenceEngine(Engine):
    """The general paths: SimPy's own run loop, the network asked again after every wake-up, and every ended
    communication queued as an event."""

    calendar = False        # SimPy's heap and its own Environment.run (Engine._loop)
    inline_ends = False
    closed_ends = False
    chain_comms = False     # every collective waits for its own end event

    def _network_changed(self, nxt=False) -> None:
        super()._network_changed(False)


class SolvingNetwork(FlowNetwork):
    """Every component solved again; every neighbour of a wide spec scanned."""

    memo_rates = False
    stop_early = False


class ResolvingNetwork(SolvingNetwork):
    """Besides: every start (unless alone on its links) and every end re-solve the component, and every bundle
    of it is rescheduled, its rate changed or not."""

    keep_unchanged = False
    skip_full = False
    room_shortcut = False


class Costs(ClusterCostModel):
    solving = False
    net_class = None        # the network's class, when not the cost model's own

    def network(self):
        if self.solving:
            return SolvingNetwork(self.capacity, self.bundle)
        if self.net_class is not None:
            return self.net_class(self.capacity, self.bundle)
        return super().network()


@st.composite
def programs(draw):
    ranks = sorted(draw(st.sets(st.integers(0, 15), min_size=2, max_size=8)))
    progs = Programs(world_size=16, ops={r: [] for r in range(16)})
    groups = []
    for i in range(draw(st.integers(1, 4))):
        members = sorted(draw(st.sets(st.sampled_from(ranks), min_size=1, max_size=len(ranks))))
        groups.append(progs.add_group(members, f"g{i}"))
    flops = st.sampled_from([1e11, 2e11, 5e11])
    sizes = st.sampled_from([2.0**20, 2.0**24, 2.0**27])
    streams = st.sampled_from(["compute", "comm", "dp"])

    # a body of events repeated (as a schedule repeats micro-batches): components of bundles recur
    body = []
    for e in range(draw(st.integers(1, 15))):
        kind = draw(st.sampled_from(["compute", "compute", "collective", "collective", "p2p"]))
        back = st.sets(st.integers(1, 3), max_size=2)       # deps: ops this many places back on the rank
        if kind == "compute":
            body.append((kind, draw(st.sampled_from(ranks)), draw(flops), draw(streams), draw(back)))
        elif kind == "collective":
            g = draw(st.sampled_from(groups))
            ck = draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]))
            body.append((kind, g, ck, draw(sizes), [(draw(streams), draw(back)) for _ in progs.groups[g].ranks]))
        else:
            a, b = draw(st.lists(st.sampled_from(ranks), min_size=2, max_size=2, unique=True))
            body.append((kind, a, b, draw(sizes), draw(streams), draw(streams), draw(back), draw(back)))

    def deps(r, back):
        n = len(progs.ops[r])
        return tuple(sorted(n - k for k in back if k <= n))

    for rep in range(draw(st.integers(1, 3))):
        for e, ev in enumerate(body):
            name = f"{rep}.{e}"
            if ev[0] == "compute":
                _, r, fl, stream, back = ev
                progs.ops[r].append(compute("c" + name, fl, stream=stream, deps=deps(r, back)))
            elif ev[0] == "collective":
                _, g, ck, size, per_rank = ev
                for r, (stream, back) in zip(progs.groups[g].ranks, per_rank):
                    progs.ops[r].append(collective("x" + name, ck, g, size, stream=stream, deps=deps(r, back)))
            else:
                _, a, b, size, sa, sb, ba, bb = ev
                progs.ops[a].append(send("s" + name, b, size, stream=sa, deps=deps(a, ba)))
                progs.ops[b].append(recv("r" + name, a, size, stream=sb, deps=deps(b, bb)))
    return progs


def _times(res):
    return {r: (array("d", res.ready_s[r]).tobytes(), array("d", res.start_s[r]).tobytes(),
                array("d", res.end_s[r]).tobytes()) for r in res.end_s}


class OpenEngine(Engine):
    """The fast paths but closed-form ends: every communication ends through the network's wake-up."""

    closed_ends = False


def _compare(progs, engine, rel):
    general_cost = Costs(CLUSTER, network="flow")
    general_cost.solving = True
    try:
        general = ReferenceEngine(progs, general_cost).run()
    except DeadlockError as e:
        with pytest.raises(DeadlockError) as fast_e:
            engine(progs, Costs(CLUSTER, network="flow")).run()
        assert str(fast_e.value) == str(e)
        return None, None
    fast = engine(progs, Costs(CLUSTER, network="flow")).run()
    if rel == 0:
        assert _times(fast) == _times(general)
        assert fast.step_time_s == general.step_time_s
    else:
        for r in general.end_s:
            for times in ("ready_s", "start_s", "end_s"):
                assert getattr(fast, times)[r] == pytest.approx(getattr(general, times)[r], rel=rel, nan_ok=True)
        assert fast.step_time_s == pytest.approx(general.step_time_s, rel=rel)
    return fast, general


@settings(max_examples=120, deadline=None)
@given(programs())
def test_fast_paths_equal_general_paths_to_the_last_bit(progs):
    _compare(progs, OpenEngine, 0)


@settings(max_examples=60, deadline=None)
@given(programs(), st.integers(0, 1000))
def test_the_calendar_stops_at_until_as_simpy_does(progs, pick):
    """A run cut at ``until_s`` (an instant where ops end, so events fall exactly on it, or between two): the
    calendar leaves the events at and after it unprocessed, as SimPy's ``run(until)`` does on its heap."""
    try:
        whole = ReferenceEngine(progs, Costs(CLUSTER, network="flow")).run()
    except DeadlockError:
        return
    ends = sorted({t for r in whole.end_s for t in whole.end_s[r] if t > 0})
    if not ends:
        return
    t = ends[pick % len(ends)]
    for until in (t, (t + ends[pick % len(ends) - 1]) / 2 if pick % len(ends) else t / 2):
        general = ReferenceEngine(progs, Costs(CLUSTER, network="flow"), until_s=until).run()
        fast = OpenEngine(progs, Costs(CLUSTER, network="flow"), until_s=until).run()
        assert _times(fast) == _times(general)


@settings(max_examples=120, deadline=None)
@given(programs())
def test_closed_form_ends_equal_general_paths(progs):
    """Communications that start alone on their links end by their own event, at their closed-form end (taken
    back by the network when a neighbour starts first): every op's times to 1e-12 relative (events of one
    instant may run in another order)."""
    _compare(progs, Engine, 1e-12)


@settings(max_examples=150, deadline=None)
@given(programs())
def test_network_shortcuts_equal_resolving_every_component(progs):
    """The flow network's shortcuts (a start with room on every link at full speed without a re-solve, an end
    re-solving none of its neighbours at full speed, a re-solve leaving the bundles whose rate it does not
    change as they were) give every op the times of a network that re-solves and reschedules every component
    at every start and end, to 1e-12 relative: the allocations are the same (max-min fair allocations are
    unique); only a bundle's progress, integrated in fewer steps, may round differently."""
    resolving = Costs(CLUSTER, network="flow")
    resolving.net_class = ResolvingNetwork
    try:
        want = Engine(progs, resolving).run()
    except DeadlockError:
        return
    got = Engine(progs, Costs(CLUSTER, network="flow")).run()
    for r in want.end_s:
        for times in ("ready_s", "start_s", "end_s"):
            assert getattr(got, times)[r] == pytest.approx(getattr(want, times)[r], rel=1e-12, nan_ok=True)


def _overlapping(x_s: float) -> Programs:
    """Ranks 0 and 1 all-reduce "a" (1 GiB) on one stream; on another, after ``x_s`` of compute, "b" (128 MiB) on
    the same group (the same NVLink links): "b" starts while "a" runs when ``x_s`` is short."""
    progs = Programs(world_size=16, ops={r: [] for r in range(16)})
    g = progs.add_group([0, 1], "tp")
    for r in (0, 1):
        progs.ops[r] = [collective("a", "all_reduce", g, 2.0**30, stream="s1"),
                        compute("x", stream="s2", duration_s=x_s),
                        collective("b", "all_reduce", g, 2.0**27, stream="s2", deps=(1,)),
                        compute("y", stream="s2", deps=(0, 2), duration_s=1e-4)]
    return progs


def test_a_closed_form_end_is_handed_back_when_a_neighbour_starts():
    """"a" starts alone (closed-form end); "b" starts on its links before that end: the network re-solves both
    from then, "a" ends later than alone, by the network's wake-up, and the stale closed-form end does nothing.
    The times equal the general path's; a "b" starting after "a" ends leaves "a" its closed-form end."""
    alone = Engine(_overlapping(1.0), Costs(CLUSTER, network="flow")).run()
    t_a = alone.end_s[0][0]
    assert alone.start_s[0][2] > t_a              # "b" after "a": nothing shared
    fast, general = _compare(_overlapping(t_a / 3), Engine, 1e-12)
    assert fast.start_s[0][2] == fast.start_s[1][2] < t_a / 2     # ("x" is slowed by "a" holding SMs)
    assert fast.end_s[0][0] == fast.end_s[1][0] > t_a * (1 + 1e-6)     # slowed by "b" from t_a / 3
    assert fast.end_s[0][0] == general.end_s[0][0]
    for r in (0, 1):
        assert fast.start_s[r][3] == max(fast.end_s[r][0], fast.end_s[r][2])


def _meeting(compute_s: float, compute_first: bool = False) -> Programs:
    """Ranks 0 and 1 all-reduce "a" over NVLink, then "b". Rank 1 computes "c" for ``compute_s`` from t = 0 on
    another stream, then "d" (after a short "e" on a third stream): "d" starts when "c" ends, "b" when "a" ends.
    "a" and "c" start at t = 0; ``compute_first`` lists "c" first in rank 1's program, so its stream reaches
    it before rank 1 reaches "a" (else after)."""
    progs = Programs(world_size=16, ops={r: [] for r in range(16)})
    g = progs.add_group([0, 1], "tp")
    progs.ops[0] = [collective("a", "all_reduce", g, 2.0**27), collective("b", "all_reduce", g, 2.0**27)]
    a, b = collective("a", "all_reduce", g, 2.0**27), collective("b", "all_reduce", g, 2.0**27)
    c, e = compute("c", stream="compute", duration_s=compute_s), compute("e", stream="aux", duration_s=1e-5)
    head = [c, a] if compute_first else [a, c]
    progs.ops[1] = head + [e, b, compute("d", stream="compute", deps=(2,), duration_s=1e-3)]
    return progs


@pytest.mark.parametrize("compute_first", [False, True])
def test_communication_and_compute_starting_at_one_instant_do_not_depend_on_queue_order(compute_first):
    """All-reduce "a" and compute op "c" start together at t = 0 and end together; "b" and "d" then start
    together. Whichever the queue reaches first, a communication that starts at the instant a compute op starts
    counts as starting after it: "c" is not lengthened, its overlap with "a" is owed by rank 1's next compute op
    on its stream ("d", f·T), and "b" does not slow "d" at its start; the general paths agree to the last bit."""
    from simulator.costs import CommRequest
    cost = Costs(CLUSTER, network="flow")
    t_end = Engine(_meeting(1.0), cost).run().end_s[0][0]
    f = cost.comm_sm_fraction(CommRequest("all_reduce", (0, 1), 2.0**27))
    assert f > 0
    progs = _meeting(t_end, compute_first)
    ci, ai = (0, 1) if compute_first else (1, 0)
    fast = Engine(progs, Costs(CLUSTER, network="flow")).run()
    assert fast.start_s[1][ci] == fast.start_s[1][ai] == 0.0
    assert fast.end_s[1][ci] == fast.end_s[0][0] == t_end           # "c" not lengthened by "a"
    assert fast.start_s[1][4] == fast.start_s[1][3] == t_end
    assert fast.end_s[1][4] == t_end + 1e-3 + f * t_end           # "a"'s overlap with "c", owed by "d"
    general = ReferenceEngine(_meeting(t_end, compute_first), Costs(CLUSTER, network="flow")).run()
    assert _times(fast) == _times(general)
    other = Engine(_meeting(t_end, not compute_first), Costs(CLUSTER, network="flow")).run()
    assert other.end_s[1][4] == fast.end_s[1][4] and other.step_time_s == fast.step_time_s


class NetworkedEngine(Engine):
    """Every communication goes through the flow network (no fixed channels, see Engine._find_fixed)."""

    fixed_channels = False


@settings(max_examples=120, deadline=None)
@given(programs())
def test_fixed_channels_equal_the_networks_closed_form_ends_to_the_last_bit(progs):
    """Communications that no other channel (group or pair, with the stream issuing it) ever meets on a link
    are timed without the network: the same end times as the network's closed-form ends, and the same events
    in the same order, so every op's times agree bit for bit."""
    try:
        networked = NetworkedEngine(progs, Costs(CLUSTER, network="flow")).run()
    except DeadlockError as e:
        with pytest.raises(DeadlockError) as fixed_e:
            Engine(progs, Costs(CLUSTER, network="flow")).run()
        assert str(fixed_e.value) == str(e)
        return
    fixed = Engine(progs, Costs(CLUSTER, network="flow")).run()
    assert _times(fixed) == _times(networked)


def test_only_communications_alone_on_their_links_are_fixed():
    """A TP pair on its node's NVLink issuing every all-reduce from one stream is fixed; the same group issuing
    from two streams (its all-reduces may overlap) is not, nor is a transfer whose NIC a cross-node group
    also loads."""
    progs = Programs(world_size=16, ops={r: [] for r in range(16)})
    tp = progs.add_group([0, 1], "tp")
    tp2 = progs.add_group([2, 3], "tp")
    dp = progs.add_group([0, 8], "dp")
    for r in (0, 1):
        progs.ops[r] = [collective("a", "all_reduce", tp, 2.0**24), collective("b", "all_reduce", tp, 2.0**20)]
    for r in (2, 3):
        progs.ops[r] = [collective("a", "all_reduce", tp2, 2.0**24, stream="s1"),
                        collective("b", "all_reduce", tp2, 2.0**20, stream="s2")]
    progs.ops[0] += [collective("d", "all_reduce", dp, 2.0**24, stream="dp")]
    progs.ops[8] = [collective("d", "all_reduce", dp, 2.0**24, stream="dp"), send("s", 1, 2.0**20)]
    progs.ops[1] += [recv("r", 8, 2.0**20, stream="pp")]
    engine = Engine(progs, Costs(CLUSTER, network="flow"))
    fixed_groups = {key[0] for key in engine.fixed}
    assert tp in fixed_groups and tp2 not in fixed_groups
    assert engine._fixed_req                          # tp's requests (met at a rendezvous of two ranks)
    reqs = {id(r): k for k, r in engine._requests.items()}
    fixed = {reqs[i] for i in engine._fixed_req}
    assert (tp, "all_reduce", 2.0**24) in fixed and (tp2, "all_reduce", 2.0**24) not in fixed
    assert not any(k[0] == (8, 1) for k in fixed) and any(k[0] == (8, 1) for k in engine._requests)
    assert engine.run().step_time_s == NetworkedEngine(progs, Costs(CLUSTER, network="flow")).run().step_time_s


def test_a_request_s_start_record_is_kept_per_stream():
    """The same all-reduce (group, kind, size) holds no SMs on a stream whose overlapped compute is priced
    without them (``tp_overlap``) and holds them on another: what a start needs is kept per (request,
    stream), so the second never takes the first's record. Slowest with both on ``comm``, fastest with both on
    ``tp_overlap``, in between mixed."""
    progs_of = {}
    for first, second in (("tp_overlap", "tp_overlap"), ("tp_overlap", "comm"), ("comm", "comm")):
        p = Programs(world_size=16, ops={r: [] for r in range(16)})
        g = p.add_group([0, 8], "x")          # two nodes: the NICs carry it
        for r in (0, 8):
            p.ops[r] = [collective("a", "all_reduce", g, 2.0**27, stream=first),
                        compute("c", 5e14, stream="compute"),
                        collective("b", "all_reduce", g, 2.0**27, stream=second, deps=(0,)),
                        compute("d", 5e14, stream="compute", deps=(1,))]
        progs_of[(first, second)] = Engine(p, Costs(CLUSTER, network="flow")).run().step_time_s
    none, mixed, both = progs_of.values()
    assert none < mixed < both


def test_a_transfer_s_request_is_its_real_pair():
    """In class mode one simulated pair (0 -> the representative 8) stands for transfers to several real peers
    (8 and 16, both represented by 8): each start asks the network for its own real pair."""
    p = Programs(world_size=32, ops={r: [] for r in range(32)},
                 classes={0: (0,), 8: (8, 16)} | {r: (r,) for r in range(32) if r not in (0, 8, 16)})
    p.ops[0] = [send("s1", 8, 2.0**28, stream="a"), send("s2", 16, 2.0**28, stream="a")]
    p.ops[8] = [recv("r1", 0, 2.0**28, stream="a"), recv("r2", 0, 2.0**28, stream="a")]
    del p.ops[16]
    cluster = load_cluster("dgx-h100", 32, tiers=2, leaf_down=4, oversubscription=2, rail_optimised=False)
    e = Engine(p, ClusterCostModel(cluster, network="flow"))
    started = []
    communicate = e._communicate
    e._communicate = lambda rv, req: (started.append(req.ranks), communicate(rv, req))[1]
    e.run()
    assert started == [(0, 8), (0, 16)]

"""Engine tests on hand-built programs whose answers are known in closed form."""
import math

import pytest

from simulator.costs import IdealCostModel, SimpleCostModel
from simulator.engine import run
from simulator.errors import DeadlockError, ProgramError
from simulator.metrics import compute_metrics
from simulator.program import Programs, collective, compute, recv, send
from tests.simulator.toy import toy_dp_pipeline, toy_gpipe

GFLOP = 1e9


def test_compute_overlaps_allreduce_on_another_stream():
    # 2 ranks: 1 s of compute, then a 4 GB all-reduce on the comm stream overlapping a second 1 s compute.
    bw = 1e9
    size = 2e9
    progs = Programs(world_size=2, ops={})
    g = progs.add_group([0, 1], "dp")
    for r in range(2):
        progs.ops[r] = [
            compute("c0", 1e12),
            collective("ar", "all_reduce", g, size, stream="comm", deps=(0,)),
            compute("c1", 1e12, deps=(0,)),
            compute("step", 0.5e12, deps=(1, 2)),
        ]
    cm = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=bw)
    res = run(progs, cm)
    ar = 2 * (2 - 1) / 2 * size / bw              # ring closed form: 2 s
    assert res.start_s[0][1] == pytest.approx(1.0)
    assert res.end_s[0][1] == pytest.approx(1.0 + ar)
    assert res.step_time_s == pytest.approx(1.0 + ar + 0.5)
    m = compute_metrics(res)
    # communication 2 s, of which 1 s hidden behind c1: overlap 50%, exposed 1 s of a 3.5 s step
    assert m.overlap_fraction == pytest.approx(0.5)
    assert m.exposed_comm_fraction == pytest.approx(1.0 / 3.5)


def test_send_recv_chain_latency_adds_up():
    # rank 0 -> 1 -> 2 -> 3, each hop 1e9 bytes at 1e9 B/s plus 1 ms alpha, 0.1 s compute between hops.
    n, size = 4, 1e9
    progs = Programs(world_size=n, ops={})
    for r in range(n):
        ops = []
        if r > 0:
            ops.append(recv("rx", r - 1, size))
        ops.append(compute("work", 1e11, deps=(len(ops) - 1,) if ops else ()))
        if r < n - 1:
            ops.append(send("tx", r + 1, size, deps=(len(ops) - 1,)))
        progs.ops[r] = ops
    res = run(progs, SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9, alpha_s=1e-3))
    hop = 1e-3 + 1.0
    assert res.step_time_s == pytest.approx(n * 0.1 + (n - 1) * hop)
    # a send and its recv start and end together
    assert res.start_s[0][1] == res.start_s[1][0]
    assert res.end_s[0][1] == res.end_s[1][0]


@pytest.mark.parametrize("p,m", [(4, 1), (4, 4), (4, 8), (4, 16), (2, 3), (8, 8)])
def test_toy_pipeline_bubble_closed_form(p, m):
    res = run(toy_gpipe(p, m), IdealCostModel(flops_per_s=1e12))
    met = compute_metrics(res)
    assert met.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    assert res.step_time_s == pytest.approx((m + p - 1) * 3.0)


def test_missing_collective_is_reported_statically_and_by_the_engine():
    progs = Programs(world_size=3, ops={})
    g = progs.add_group([0, 1, 2], "dp")
    for r in range(3):
        ops = [compute("c", 1e9), collective("ar1", "all_reduce", g, 1e6, deps=(0,))]
        if r != 2:
            ops.append(collective("ar2", "all_reduce", g, 1e6))
        progs.ops[r] = ops
    with pytest.raises(ProgramError, match=r"rank 2 misses collective #1"):
        run(progs, SimpleCostModel())
    with pytest.raises(DeadlockError) as e:
        run(progs, SimpleCostModel(), check=False)
    msg = str(e.value)
    assert "rank 0" in msg and "rank 1" in msg and "[2]" in msg and "ar2" in msg
    assert {b["rank"] for b in e.value.blocked} == {0, 1}
    assert all(b["waits_for"] == [2] for b in e.value.blocked)


def test_unmatched_recv_is_reported():
    progs = Programs(world_size=2, ops={0: [compute("c", 1e9)], 1: [recv("rx", 0, 1e6)]})
    with pytest.raises(ProgramError, match="rank 1 op 0"):
        run(progs, SimpleCostModel())
    with pytest.raises(DeadlockError, match=r"rank 1 stream 'comm' op 0 .*waiting for rank 0 to post the matching send"):
        run(progs, SimpleCostModel(), check=False)


def test_cyclic_wait_between_two_groups_is_a_deadlock():
    # rank 0 enters A then B, rank 1 enters B then A (both on one stream): classic cyclic wait.
    progs = Programs(world_size=2, ops={})
    a = progs.add_group([0, 1], "a")
    b = progs.add_group([0, 1], "b")
    progs.ops[0] = [collective("A", "all_reduce", a, 1e6), collective("B", "all_reduce", b, 1e6)]
    progs.ops[1] = [collective("B", "all_reduce", b, 1e6), collective("A", "all_reduce", a, 1e6)]
    with pytest.raises(DeadlockError) as e:
        run(progs, SimpleCostModel())
    assert sorted(x["rank"] for x in e.value.blocked) == [0, 1]
    assert "waiting for rank(s) [1]" in str(e.value) and "waiting for rank(s) [0]" in str(e.value)


def test_send_send_deadlock_on_one_stream():
    progs = Programs(world_size=2, ops={
        0: [send("tx", 1, 1e6), recv("rx", 1, 1e6)],
        1: [send("tx", 0, 1e6), recv("rx", 0, 1e6)],
    })
    with pytest.raises(DeadlockError, match="matching recv"):
        run(progs, SimpleCostModel())


def test_cyclic_dependencies_are_rejected():
    progs = Programs(world_size=1, ops={0: [compute("a", 1, deps=(1,)), compute("b", 1, stream="x", deps=(0,))]})
    with pytest.raises(ProgramError, match="cyclic"):
        run(progs, SimpleCostModel())
    progs = Programs(world_size=1, ops={0: [compute("a", 1, deps=(5,))]})
    with pytest.raises(ProgramError, match="dependency 5"):
        run(progs, SimpleCostModel())


def test_collective_size_disagreement_names_ranks_and_ops():
    progs = Programs(world_size=2, ops={})
    g = progs.add_group([0, 1], "tp")
    progs.ops[0] = [collective("ag", "all_gather", g, 1e6)]
    progs.ops[1] = [collective("ag", "all_gather", g, 2e6)]
    with pytest.raises(ProgramError, match=r"rank 0 op 0 .* vs rank 1 op 0"):
        run(progs, SimpleCostModel())
    progs.ops[1] = [collective("ag", "all_reduce", g, 1e6)]
    with pytest.raises(ProgramError, match="disagrees"):
        run(progs, SimpleCostModel())


def test_fixed_duration_overrides_cost_model():
    progs = Programs(world_size=2, ops={})
    g = progs.add_group([0, 1], "dp")
    progs.ops[0] = [compute("c", 1e15, duration_s=0.25), collective("ar", "all_reduce", g, 1e9, duration_s=0.5,
                                                                    deps=(0,))]
    progs.ops[1] = [collective("ar", "all_reduce", g, 1e9, duration_s=0.7)]
    res = run(progs, SimpleCostModel(link_bytes_per_s=1.0))
    assert res.start_s[1][0] == pytest.approx(0.25)      # waits for rank 0
    assert res.step_time_s == pytest.approx(0.25 + 0.7)  # the longest measured duration


@pytest.mark.parametrize("p,d,m", [(2, 4, 3), (4, 8, 4), (8, 64, 8), (4, 128, 2)])
def test_symmetric_equals_full(p, d, m):
    cm = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e10, alpha_s=2e-5)
    full = run(toy_dp_pipeline(p, d, m), cm)
    sym = run(toy_dp_pipeline(p, d, m, symmetric=True), cm)
    assert sym.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    mf, ms = compute_metrics(full), compute_metrics(sym)
    for k in ("bubble_fraction", "exposed_comm_fraction", "overlap_fraction", "mfu", "tokens_per_s"):
        assert getattr(ms, k) == pytest.approx(getattr(mf, k), rel=1e-9)
    assert sym.events_simulated * d == full.events_simulated
    assert sym.rank_end_s == pytest.approx(full.rank_end_s, rel=1e-9)


def test_memory_peak_from_alloc_free():
    progs = Programs(world_size=1, ops={0: [
        compute("f0", 1e9, alloc=(("activations", 10.0),)),
        compute("f1", 1e9, alloc=(("activations", 10.0),)),
        compute("b1", 1e9, free=(("activations", 10.0),)),
        compute("b0", 1e9, free=(("activations", 10.0),)),
    ]}, static_memory={0: {"parameters": 100.0, "optimizer": 50.0}})
    res = run(progs, SimpleCostModel(memory_bytes=165.0))
    m = compute_metrics(res)
    assert m.peak_memory_bytes == 170.0
    assert not m.fits_in_memory


def test_until_stops_early_without_deadlock_error():
    res = run(toy_gpipe(4, 4), IdealCostModel(flops_per_s=1e12), until_s=5.0)
    assert any(math.isnan(e) for e in res.end_s[3])


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("until", [None, 4.0, 0.5])
def test_precomputed_durations_leave_no_trace(shared, until):
    """Compute ops without deps of ranks that own their op objects are priced before the run (their duration
    sits in their end slot until they end); ranks sharing another rank's ops are priced as they run. Start and
    end times equal an engine that prices every op as it runs, also when until_s stops the run (an op that
    never ended has no end time)."""
    from simulator.engine import Engine

    class PricedAsTheyRun(Engine):
        def _durations(self):
            pass

    cost = IdealCostModel(flops_per_s=1e12)
    progs = Programs(world_size=2, ops={0: [], 1: []})
    progs.ops[0] = [compute("a", 1e12), compute("b", 2e12), compute("c", 3e12, deps=(1,)), compute("d", 4e12)]
    progs.ops[1] = list(progs.ops[0]) if shared else [op.copy() for op in progs.ops[0]]
    got = Engine(progs, cost, until_s=until).run()
    ref = PricedAsTheyRun(progs, cost, until_s=until).run()
    same = lambda a, b: all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))
    for r in (0, 1):
        assert same(got.start_s[r], ref.start_s[r]) and same(got.end_s[r], ref.end_s[r])
    if until is None:
        assert list(got.end_s[1]) == [1.0, 3.0, 6.0, 10.0]
    else:
        assert math.isnan(got.end_s[1][3])


def test_device_failure_reports_hung_ranks_like_a_watchdog():
    from simulator.errors import DeviceFailureError
    progs = toy_dp_pipeline(2, 4, 2)
    with pytest.raises(DeviceFailureError) as e:
        run(progs, SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e10), failures={5: 1.5})
    msg = str(e.value)
    assert "rank(s) [5] failed" in msg
    hung = {b["rank"] for b in e.value.blocked if b["state"] != "failed"}
    assert hung and 5 not in hung
    assert any(5 in b["waits_for"] for b in e.value.blocked)
    # a failure after the step ends changes nothing
    ok = run(progs, SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e10), failures={5: 1e6})
    assert ok.step_time_s < 1e6


def test_rendezvous_keys_are_small_integers_whatever_the_group_size():
    """Full mode keys rendezvous by integer sync ids packed with the count in one int64 per op: nothing per op
    hashes a group's rank tuple."""
    from simulator.engine import Engine
    n = 64
    p = Programs(world_size=n, ops={})
    world = p.add_group(range(n), "world")
    for r in range(n):
        p.ops[r] = [compute("c", flops=1e9), collective("ar", "all_reduce", world, 1e6, deps=(0,)),
                    send("s", (r + 1) % n, 1e3, stream="tx", deps=(1,)), recv("r", (r - 1) % n, 1e3, stream="rx")]
    e = Engine(p, SimpleCostModel())
    assert all(ks.typecode == "q" for ks in e.rv_keys.values())
    keys = [e.rendezvous_key(r, i) for r in range(n) for i in range(4)]
    assert keys.count(None) == n and all(type(a) is int and type(b) is int for a, b in filter(None, keys))
    keys = [k for k in keys if k is not None]
    assert len({k for k in keys if k[0] >= 0}) == 1 and e.needed[0] == n      # one world rendezvous of 64
    assert len(e.p2p_pairs) == n
    assert e.run().step_time_s > 0


def test_progress_counts_ended_ops_while_running_and_ends_at_the_total(monkeypatch):
    """``progress(done, total)`` is called while the engine runs (here at every 1024th instant: no wall-time
    gap asked for), with the ops ended so far, never decreasing, and once more at the end with the total."""
    from simulator.engine import Engine
    monkeypatch.setattr(Engine, "progress_every_s", 0.0)
    progs = Programs(world_size=2, ops={})
    # each op waited for by the next: one instant each (none coalesced)
    progs.ops[0] = [compute(f"c{i}", 1e9 * (1 + i % 3), deps=(i - 1,) if i else ()) for i in range(3000)]
    progs.ops[1] = [compute(f"d{i}", 1e9) for i in range(10)]
    calls = []
    res = run(progs, SimpleCostModel(flops_per_s=1e12), progress=lambda d, t: calls.append((d, t)))
    assert res.events_simulated == 3010
    assert len(calls) >= 3 and calls[-1] == (3010, 3010)
    done = [d for d, _ in calls]
    assert done == sorted(done) and 0 < done[0] < 3010
    assert all(t == 3010 for _, t in calls)

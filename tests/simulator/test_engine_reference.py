"""The engine's callback core against a brute-force reference: one plain SimPy process per (rank, stream),
written from the program contract alone (ops of a stream in order after their deps; the k-th collective of a
rank on a group, in program order, meets the other members' k-th; the k-th send s->d meets the k-th recv at
d from s; a communication starts when its last participant arrives and lasts the cost model's time).

With an analytical cost model nothing depends on the order of events within one instant, so the two must
agree on every op's ready, start and end time (to rounding: the engine sums a chain of compute ops before
it waits, the reference waits for each op)."""
import math
from collections import defaultdict

import simpy
from hypothesis import given, settings, strategies as st

from simulator.costs import CommRequest, SimpleCostModel
from simulator.engine import run
from simulator.errors import ClusterSimError
from simulator.program import COLLECTIVE, COMPUTE, SEND, Programs, collective, compute
from tests.simulator.test_properties import random_programs

COST = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9, alpha_s=1e-5)


def reference(progs: Programs, cost) -> dict:
    """rank -> [(ready, start, end)] per op, from one SimPy process per (rank, stream)."""
    env = simpy.Environment()
    done = {r: [env.event() for _ in prog] for r, prog in progs.ops.items()}
    times = {r: [None] * len(prog) for r, prog in progs.ops.items()}
    meetings = {}                                   # rendezvous key -> [arrived, needed, event, ops]
    keys = {}
    for r, prog in progs.ops.items():              # rendezvous keys in program order
        count = defaultdict(int)
        for i, op in enumerate(prog):
            if op.kind == COLLECTIVE:
                k = ("c", op.group)
            elif op.kind != COMPUTE:
                k = ("p", r, op.peer) if op.kind == SEND else ("p", op.peer, r)
            else:
                continue
            keys[(r, i)] = (k, count[(k, op.kind)])
            count[(k, op.kind)] += 1

    def comm_time(op, src):
        if op.kind == COLLECTIVE:
            return cost.comm_time_s(CommRequest(op.collective, progs.groups[op.group].ranks, op.size_bytes))
        pair = (src, op.peer) if op.kind == SEND else (op.peer, src)
        return cost.comm_time_s(CommRequest("p2p", pair, op.size_bytes))

    def stream(r, idxs):
        prog = progs.ops[r]
        for i in idxs:
            op = prog[i]
            for d in op.deps:
                yield done[r][d]
            ready = env.now
            if op.kind == COMPUTE:
                dur = op.duration_s if op.duration_s is not None else cost.compute_time_s(r, op)
                yield env.timeout(dur)
                start = ready
            else:
                key = keys[(r, i)]
                m = meetings.get(key)
                if m is None:
                    needed = len(progs.groups[op.group].ranks) if op.kind == COLLECTIVE else 2
                    m = meetings[key] = [0, needed, env.event(), (op, r)]
                m[0] += 1
                if op.kind == SEND:
                    m[3] = (op, r)
                if m[0] == m[1]:
                    m[2].succeed(env.now)
                start = yield m[2]
                if len(m) == 4:                     # the first participant to resume starts the clock
                    m.append(env.timeout(comm_time(*m[3])))
                yield m[4]
            times[r][i] = (ready, start, env.now)
            done[r][i].succeed()

    for r, prog in progs.ops.items():
        streams = defaultdict(list)
        for i, op in enumerate(prog):
            streams[op.stream].append(i)
        for idxs in streams.values():
            env.process(stream(r, idxs))
    env.run()
    return times


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


@settings(max_examples=200, deadline=None)
@given(random_programs())
def test_engine_matches_a_simpy_process_per_stream_reference(progs):
    res = run(progs, COST)
    ref = reference(progs, COST)
    for r, prog in progs.ops.items():
        for i in range(len(prog)):
            ready, start, end = ref[r][i]
            assert _close(res.ready_s[r][i], ready), (r, i, res.ready_s[r][i], ready)
            assert _close(res.start_s[r][i], start), (r, i, res.start_s[r][i], start)
            assert _close(res.end_s[r][i], end), (r, i, res.end_s[r][i], end)


def test_reference_sees_a_late_member():
    """Sanity of the reference itself: a collective starts when its slowest member arrives."""
    p = Programs(world_size=2, ops={})
    g = p.add_group([0, 1], "dp")
    p.ops[0] = [compute("c", 0, duration_s=2.0), collective("ar", "all_reduce", g, 0.0, deps=(0,))]
    p.ops[1] = [collective("ar", "all_reduce", g, 0.0)]
    ref = reference(p, COST)
    res = run(p, COST)
    assert ref[1][0][1] == 2.0 == res.start_s[1][0]
    assert _close(res.end_s[0][1], 2.0 + COST.comm_time_s(CommRequest("all_reduce", (0, 1), 0.0)))


def test_negative_failure_time_is_a_clear_error():
    p = Programs(world_size=1, ops={0: [compute("c", 0, duration_s=1.0)]})
    try:
        run(p, COST, failures={0: -1.0})
    except ClusterSimError as e:
        assert "failure time of rank 0" in str(e)
    else:
        raise AssertionError("a negative failure time was accepted")

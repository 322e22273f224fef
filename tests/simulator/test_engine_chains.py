"""Collectives a stream meets alone at a known time run right after the op before them, without an event each
(``Engine.chain_comms``): the same ready, start and end time for every op, bit for bit, as when each waits for
its own end event, and far fewer events where they are many (a class-mode run's TP all-reduces)."""
from array import array

import pytest
from hypothesis import event, given, settings, strategies as st

from schedules import build_programs
from schedules.models import custom_model
from schedules.plan import ParallelPlan
from simulator.engine import Engine
from simulator.errors import DeadlockError
from simulator.program import Programs, collective, compute, recv, send, validate
from simulator.symmetry import refine_classes
from topologies import load_cluster
from topologies.cost import ClusterCostModel


class Unchained(Engine):
    """Every collective waits for its own end event."""

    chain_comms = False


class Counting(Engine):
    """Counts the events queued."""

    def _setup(self, *a) -> None:
        super()._setup(*a)
        self.queued = 0
        push = self._push

        def counted(t, event):
            self.queued += 1
            push(t, event)
        self._push = counted


def _times(res):
    return {r: (array("d", res.ready_s[r]).tobytes(), array("d", res.start_s[r]).tobytes(),
                array("d", res.end_s[r]).tobytes()) for r in res.end_s}


def _same(progs, cost_of) -> bool:
    """Whether the chained run queued fewer events (it chained); its times must equal the unchained run's."""
    try:
        reference = Unchained(progs, cost_of()).run()
    except DeadlockError as e:
        try:
            Engine(progs, cost_of()).run()
        except DeadlockError as chained_e:
            assert str(chained_e) == str(e)
            return False
        raise AssertionError("the chained engine finished where the unchained one deadlocked")
    engine = Counting(progs, cost_of())
    chained = engine.run()
    assert _times(chained) == _times(reference)
    assert chained.step_time_s == reference.step_time_s
    return engine.queued < _queued(progs, cost_of)


def _queued(progs, cost_of) -> int:
    engine = type("U", (Counting, Unchained), {})(progs, cost_of())
    engine.run()
    return engine.queued


@st.composite
def tp_like_programs(draw):
    """Ranks with a one-member group each (a TP group all in one class) and shared groups, compute ops on one
    stream followed by that group's collectives on the same stream, transfers and shared collectives on others:
    the chains, the ops others wait for that cut them, and the SMs that other streams' communications hold."""
    n = draw(st.integers(2, 4))
    progs = Programs(world_size=16, ops={r: [] for r in range(16)})
    own = {r: progs.add_group([r], "tp") for r in range(n)}
    shared = progs.add_group(list(range(n)), "dp")
    sizes = st.sampled_from([0.0, 2.0**20, 2.0**24, 2.0**27])
    durations = st.sampled_from([None, 1e-4, 3e-4])
    for e in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["layer", "layer", "layer", "shared", "p2p"]))
        if kind == "layer":
            r = draw(st.integers(0, n - 1))
            prog = progs.ops[r]
            dep = draw(st.sampled_from([(), (len(prog) - 1,)])) if prog else ()
            prog.append(compute(f"c{e}", draw(st.sampled_from([1e11, 5e11])), duration_s=draw(durations), deps=dep))
            for k in range(draw(st.integers(0, 3))):
                prog.append(collective(f"tp{e}.{k}", draw(st.sampled_from(["all_reduce", "all_gather"])), own[r],
                                       draw(sizes), stream="compute",
                                       duration_s=draw(st.sampled_from([None, None, 2e-5]))))
        elif kind == "shared":          # the members agree on its size (validate's rule)
            size = draw(sizes)
            for r in range(n):
                progs.ops[r].append(collective(f"dp{e}", "all_reduce", shared, size, stream="dp",
                                               deps=(len(progs.ops[r]) - 1,) if progs.ops[r] else ()))
        else:
            a, b = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
            size = draw(sizes)
            progs.ops[a].append(send(f"s{e}", b, size, stream="pp",
                                     deps=(len(progs.ops[a]) - 1,) if progs.ops[a] else ()))
            progs.ops[b].append(recv(f"r{e}", a, size, stream="pp"))
    return progs


CLUSTER = load_cluster("dgx-h100", 16)


@settings(max_examples=150, deadline=None)
@given(tp_like_programs(), st.sampled_from(["analytical", "flow"]))
def test_chained_collectives_equal_unchained_to_the_last_bit(progs, network):
    validate(progs)                 # valid programs: their members agree on every collective
    chained = _same(progs, lambda: ClusterCostModel(CLUSTER, network=network))
    event(f"{network}: chained {chained}")


@pytest.mark.parametrize("network", ["analytical", "flow"])
def test_a_class_mode_pipeline_chains_its_tp_all_reduces_with_the_same_times(network):
    """TP 8 x PP 3 x DP 3 with stages across leaf switches (class mode): each stage's TP group is in one class,
    its all-reduces follow the layer's compute op on the compute stream; chained, the run queues far fewer
    events and every op's times are the unchained run's, bit for bit."""
    plan = ParallelPlan(tp=8, pp=3, dp=3, global_batch=12, seq=256, schedule="1f1b", zero=1)
    cluster = load_cluster("dgx-a100", plan.world_size, leaf_down=4)
    model = custom_model(layers=6, hidden=512, heads=8, vocab=8000)
    cost = ClusterCostModel(cluster, network=network)
    progs = refine_classes(build_programs(model, plan, plan.world_size, symmetric=True), cost).programs
    chained, unchained = Counting(progs, cost), type("U", (Counting, Unchained), {})(progs, cost)
    assert network == "analytical" or chained.fixed     # flow: the TP all-reduces are met alone, in closed form
    a, b = chained.run(), unchained.run()
    assert _times(a) == _times(b)
    assert chained.queued < 0.7 * unchained.queued

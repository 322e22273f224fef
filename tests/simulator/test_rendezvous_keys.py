"""The engine's rendezvous keys (``Engine._rendezvous_keys``) against the rules they implement, written here as
one plain loop over every rank's ops in program order, apart from the engine's set-up: the same
keys (the k-th op of a rank on a group, or on a (source, destination) pair, sends and receives counted apart),
sync ids and p2p pair ids assigned in the same order, and the same distinct communications recorded for the
fixed-channel scan (stream, first rank, op; None as stream once two streams issue one, with the last op)."""
from collections import defaultdict

import pytest
from hypothesis import given, settings

from schedules import build_programs
from simulator.engine import Engine
from simulator.program import COLLECTIVE, RECV, SEND, Programs, SyncTable, compute, recv, send
from tests.simulator.test_engine_fast_paths import CLUSTER, Costs, programs


def reference(engine):
    """The rules stated declaratively, with a SyncTable of its own (ids are assigned in the order first asked):
    every communication op in (rank, index) order names an id; a rank's k-th op on a counter (a group's sync
    id; a pair's sends; the same pair's receives) gets (id, k); a distinct communication (receives ask
    nothing) keeps its first (stream, rank, op) unless two streams issue it, then (None, rank, op) of its last."""
    sync = SyncTable(engine.p, engine.rep)
    comm = [(rank, i, op) for rank, prog in engine.p.ops.items() for i, op in enumerate(prog)
            if op.kind in (COLLECTIVE, SEND, RECV)]
    gids = [op.group for _, _, op in comm if op.kind == COLLECTIVE]
    sid = {g: sync.id_of(g) for g in dict.fromkeys(gids)}
    pair_of = {(r, i): (r, engine.rep[op.peer]) if op.kind == SEND else (engine.rep[op.peer], r)
               for r, i, op in comm if op.kind != COLLECTIVE}
    pairs = list(dict.fromkeys(pair_of.values()))
    pid = {pr: -1 - j for j, pr in enumerate(pairs)}
    keys = {rank: [None] * len(prog) for rank, prog in engine.p.ops.items()}
    counts = defaultdict(int)
    for r, i, op in comm:
        ident = sid[op.group] if op.kind == COLLECTIVE else pid[pair_of[(r, i)]]
        counter = (r, op.kind if op.kind != COLLECTIVE else "c", ident)
        keys[r][i] = (ident, counts[counter])
        counts[counter] += 1
    uses = defaultdict(list)
    for r, i, op in comm:
        if op.kind == COLLECTIVE:
            uses[(op.group, op.collective, op.size_bytes)].append((op.stream, r, op))
        elif op.kind == SEND:
            uses[((r, op.peer), op.group, op.size_bytes)].append((op.stream, r, op))
    channels = {}
    for ch, us in uses.items():
        one = all(u[0] == us[0][0] for u in us)
        channels[ch] = us[0] if one else (None, us[-1][1], us[-1][2])
    return keys, pairs, channels, sync


class Scanning(Engine):
    """Keeps what the fixed-channel scan gathered (``_find_fixed`` consumes it)."""

    def _find_fixed(self):
        self.gathered = dict(self._channels)
        super()._find_fixed()


def _keys(engine) -> dict:
    """The engine's keys as (id, k) per op, None at compute ops."""
    return {rank: [engine.rendezvous_key(rank, i) for i in range(len(prog))] for rank, prog in engine.p.ops.items()}


def _check(engine):
    keys, pairs, channels, sync = reference(engine)
    assert _keys(engine) == keys
    assert engine.p2p_pairs == pairs
    assert engine.sync.members == sync.members and engine.sync.group == sync.group
    assert engine.needed == [len(m) for m in sync.members]
    if engine._scan:
        got = {ch: (s, r, id(op)) for ch, (s, r, op) in engine.gathered.items()}
        assert list(got) == list(channels)
        assert got == {ch: (s, r, id(op)) for ch, (s, r, op) in channels.items()}
    # keys are packed integers (id << 32) + k, one int64 per op
    for rank, ks in engine.rv_keys.items():
        assert ks.typecode == "q" and len(ks) == len(engine.p.ops[rank])
        for i, k in enumerate(keys[rank]):
            if k is not None:
                assert ks[i] == k[0] * 2**32 + k[1]


@settings(max_examples=60, deadline=None)
@given(programs())
def test_keys_channels_and_ids_match_the_per_op_rules(progs):
    _check(Scanning(progs, Costs(CLUSTER, network="flow")))
    _check(Scanning(progs, Costs(CLUSTER, network="analytical")))


def test_class_mode_programs_of_an_uneven_placement():
    """Symmetric programs (representatives, sync ids shared by groups of the same representatives), with
    pipeline transfers, on the flow network."""
    from clustersim.experiment import _setup, experiment_from_dict

    exp = experiment_from_dict(dict(cluster="dgx-a100", gpus=168, model="llama3-8b", tp=8, pp=7, dp=3, seq=2048,
                                    global_batch=21, micro_batch=1, network="flow", schedule="1f1b"))
    _, _, _, cost, _, progs, _, _, _ = _setup(exp, False, False, None)
    assert progs.classes is not None and len(progs.ops) > 7      # 7 stages split by placement (14 classes)
    _check(Scanning(progs, cost))


def _without_templates(progs):
    from dataclasses import replace
    return replace(progs, templates=None)


def _same_set_up(progs, cost):
    """The set-up shared per template equals the op-by-op one: keys, ids, channels (order included) and the
    targeted ops, streams and compute streams of every rank; and both follow the per-op rules."""
    fast, slow = Scanning(progs, cost), Scanning(_without_templates(progs), cost)
    _check(fast)
    assert _keys(fast) == _keys(slow) and fast.p2p_pairs == slow.p2p_pairs and fast.needed == slow.needed
    assert fast.targeted == slow.targeted and fast._compute_streams == slow._compute_streams
    assert {r: {k: list(v) for k, v in s.items()} for r, s in fast._streams.items()} == \
        {r: {k: list(v) for k, v in s.items()} for r, s in slow._streams.items()}
    if fast._scan:
        assert [(ch, s, r, id(op)) for ch, (s, r, op) in fast.gathered.items()] == \
            [(ch, s, r, id(op)) for ch, (s, r, op) in slow.gathered.items()]
    assert not slow.templated
    assert fast.run().step_time_s == slow.run().step_time_s
    return fast


@pytest.mark.parametrize("plan, network", [
    (dict(tp=2, pp=4, dp=2, schedule="interleaved", virtual_stages=2, zero=1), "flow"),
    (dict(tp=2, pp=2, dp=4, schedule="1f1b", fsdp=True), "flow"),            # next and prev stage are one rank
    (dict(tp=2, pp=2, dp=2, cp=2, schedule="zb", sp=True), "analytical"),
    (dict(tp=1, pp=2, dp=8, ep=4, schedule="1f1b", moe=True), "flow"),
])
def test_ranks_of_one_template_share_their_set_up(plan, network):
    from schedules.models import custom_model
    from schedules.plan import ParallelPlan
    from topologies import load_cluster
    from topologies.cost import ClusterCostModel
    moe = plan.pop("moe", False)
    model = custom_model(layers=8, hidden=256, heads=8, vocab=4000, **(dict(experts=8, top_k=2) if moe else {}))
    p = ParallelPlan(global_batch=8 * plan["dp"], seq=256, **plan)
    progs = build_programs(model, p, p.world_size, symmetric=False)
    assert progs.templates and len(set(progs.templates.values())) < len(progs.ops)
    cluster = load_cluster("dgx-h100", p.world_size, gpus_per_node=4, leaf_down=3, rail_optimised=False)
    fast = _same_set_up(progs, ClusterCostModel(cluster, network=network))
    assert len(fast.templated) == len(progs.ops) - len(set(progs.templates.values()))


def test_a_rank_unlike_its_template_takes_the_op_by_op_path():
    """A broken promise is caught where it shows: rank 2 claims rank 0's template, but its two sends go to one
    peer (rank 0's went to two), so its two slots would share one pair; rank 3's program is longer."""
    progs = Programs(world_size=16, ops={})
    a, b = send("a", 1, 1e6), send("b", 3, 1e6)
    progs.ops[0] = [a, b]
    progs.ops[1] = [recv("a", 0, 1e6)]
    progs.ops[2] = [send("a", 1, 1e6), send("b", 1, 1e6)]
    progs.ops[1] += [recv("a", 2, 1e6), recv("b", 2, 1e6)]
    progs.ops[3] = [recv("b", 0, 1e6), send("x", 4, 1e6), compute("c")]
    progs.ops[4] = [recv("x", 3, 1e6)]
    progs.templates = {0: "t", 2: "t", 3: "t"}
    assert not _same_set_up(progs, Costs(CLUSTER, network="flow")).templated


@pytest.mark.parametrize("faults", [dict(stragglers={3: 1.3, 9: 1.1}), dict(jitter=0.05)])
def test_durations_shared_per_template_follow_each_ranks_device(faults):
    """Compute durations are worked out once per template and kind of device (``cost.device_key``): a
    straggler's (its factor in its key) and every rank's under jitter (the rank in its key) stay its own;
    every op's times equal the run without templates."""
    from array import array

    from schedules.models import custom_model
    from schedules.plan import ParallelPlan
    from topologies import load_cluster
    from topologies.cost import ClusterCostModel
    from topologies.faults import FaultSpec, apply_faults
    p = ParallelPlan(tp=2, pp=2, dp=4, global_batch=8, seq=256, schedule="1f1b", zero=1)
    cluster = load_cluster("dgx-h100", p.world_size)
    progs = build_programs(custom_model(layers=4, hidden=256, heads=8, vocab=4000), p, p.world_size, symmetric=False)
    cost, _ = apply_faults(ClusterCostModel(cluster, network="flow"), cluster, FaultSpec(**faults), p.world_size)
    if hasattr(cost, "bind"):
        cost = cost.bind(progs)
    a, b = Engine(progs, cost).run(), Engine(_without_templates(progs), cost).run()
    assert {r: array("d", e).tobytes() for r, e in a.end_s.items()} == \
        {r: array("d", e).tobytes() for r, e in b.end_s.items()}
    assert a.end_s[3][-1] != a.end_s[2][-1] or faults.get("jitter")

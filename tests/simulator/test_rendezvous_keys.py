"""The engine's rendezvous keys (``Engine._rendezvous_keys``) against the rules they implement, written here as
one plain loop over every rank's ops in program order, apart from the engine's set-up: the same
keys (the k-th op of a rank on a group, or on a (source, destination) pair, sends and receives counted apart),
sync ids and p2p pair ids assigned in the same order, and the same distinct communications recorded for the
fixed-channel scan (stream, first rank, op; None as stream once two streams issue one, with the last op)."""
from collections import defaultdict

from hypothesis import given, settings

from simulator.engine import Engine
from simulator.program import COLLECTIVE, RECV, SEND, SyncTable
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


def _check(engine):
    keys, pairs, channels, sync = reference(engine)
    assert engine.rv_keys == keys
    assert engine.p2p_pairs == pairs
    assert engine.sync.members == sync.members and engine.sync.group == sync.group
    assert engine.needed == [len(m) for m in sync.members]
    if engine._scan:
        got = {ch: (s, r, id(op)) for ch, (s, r, op) in engine.gathered.items()}
        assert list(got) == list(channels)
        assert got == {ch: (s, r, id(op)) for ch, (s, r, op) in channels.items()}
    # keys are shared tuples: one object per (id, k)
    objs = {}
    for ks in engine.rv_keys.values():
        for k in ks:
            if k is not None:
                assert objs.setdefault(k, k) is k


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

"""The engine's rendezvous keys (``Engine._rendezvous_keys``) against the rules they implement, written here as
one plain loop over every rank's ops in program order, apart from the engine's set-up: the same
keys (the k-th op of a rank on a group, or on a (source, destination) pair, sends and receives counted apart),
sync ids and p2p pair ids assigned in the same order, and the same distinct communications recorded for the
fixed-channel scan (stream, first rank, op; None as stream once two streams issue one, with the last op)."""
from hypothesis import given, settings

from simulator.engine import Engine
from simulator.program import COLLECTIVE, COMPUTE, RECV, SEND, SyncTable
from tests.simulator.test_engine_fast_paths import CLUSTER, Costs, programs


def reference(engine):
    """The rules, one op at a time, with a SyncTable of its own (ids are assigned in the order first asked)."""
    sync = SyncTable(engine.p, engine.rep)
    made_of, pair_id, sid_of, pairs, channels, out = {}, {}, {}, [], {}, {}
    for rank, prog in engine.p.ops.items():
        keys = [None] * len(prog)
        counters = {}
        for i, op in enumerate(prog):
            kind = op.kind
            if kind == COMPUTE:
                continue
            if kind == COLLECTIVE:
                g = op.group
                ck = sid = sid_of.get(g)
                if sid is None:
                    ck = sid = sid_of[g] = sync.id_of(g)
            elif kind in (SEND, RECV):
                pair = (rank, engine.rep[op.peer]) if kind == SEND else (engine.rep[op.peer], rank)
                sid = pair_id.get(pair)
                if sid is None:
                    sid = pair_id[pair] = -1 - len(pairs)
                    pairs.append(pair)
                ck = sid if kind == SEND else (sid,)
            else:
                continue
            k = counters.get(ck, 0)
            counters[ck] = k + 1
            made = made_of.setdefault(sid, [])
            if k < len(made):
                keys[i] = made[k]
            else:
                keys[i] = key = (sid, k)
                made.append(key)
            if kind != RECV:
                ch = (op.group, op.collective, op.size_bytes) if kind == COLLECTIVE else \
                    ((rank, op.peer), op.group, op.size_bytes)
                seen = channels.get(ch)
                if seen is None:
                    channels[ch] = (op.stream, rank, op)
                elif seen[0] != op.stream:
                    channels[ch] = (None, rank, op)
        out[rank] = keys
    return out, pairs, channels, sync


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

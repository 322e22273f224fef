"""Programs -> Chakra execution traces (one ``<prefix>.<rank>.et`` per rank), plus ASTRA-sim's
communicator-group JSON, so ASTRA-sim (or our reader) runs our generated workloads.

Each op becomes a node: compute -> COMP_NODE (``num_ops``, ``tensor_size``; ``duration_micros`` only for
measured ops), collectives -> COMM_COLL_NODE (``comm_type``, ``comm_size`` in ASTRA-sim's convention,
``pg_name`` naming the communicator), send/recv -> COMM_SEND/RECV_NODE (``comm_src``, ``comm_dst``,
``comm_tag``). ``deps`` become ``data_deps``; the previous op of the same stream becomes a ``ctrl_deps``
entry (Chakra has no streams). Exact float values and labels ride along in ``cs_*`` attributes, which our
reader prefers, so export then import reproduces the simulation exactly. Memory alloc/free records are
not exported (Chakra has no equivalent).
"""
from __future__ import annotations

import json
from pathlib import Path

from simulator import atomic
from simulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Programs
from traces.chakra import schema as S
from traces.chakra.wire import delimited, encode, write_varint

SCHEMA_VERSION = "0.0.4"          # the version ASTRA-sim's microbenchmark ETs carry
_COMM_TYPES = {"all_reduce": S.ALL_REDUCE, "all_gather": S.ALL_GATHER, "reduce_scatter": S.REDUCE_SCATTER,
               "all_to_all": S.ALL_TO_ALL, "broadcast": S.BROADCAST, "reduce": S.REDUCE, "barrier": S.BARRIER}


def pg_name(gid: int) -> str:
    """Communicator name of group ``gid`` (ASTRA-sim parses names as integers > 0)."""
    return str(gid + 1)


def node_common(programs: Programs, i: int, op: Op, prev_in_stream: int | None) -> dict:
    """The part of op ``i``'s node that every rank running it shares (all but the communicator name and
    the point-to-point endpoints, see ``rank_attrs``)."""
    attrs = [S.make_attr("is_cpu_op", False), S.make_attr("stream", op.stream)]
    for key, val in (("cs_phase", op.phase), ("cs_microbatch", op.microbatch), ("cs_layer", op.layer),
                     ("cs_strategy", op.strategy)):
        if val is not None:
            attrs.append(S.make_attr(key, val))
    node = {"id": i, "name": op.name, "data_deps": sorted(set(op.deps))}
    if prev_in_stream is not None and prev_in_stream not in op.deps:
        node["ctrl_deps"] = [prev_in_stream]
    if op.duration_s is not None:
        node["duration_micros"] = int(round(op.duration_s * 1e6))
        attrs.append(S.make_attr("cs_duration_s", float(op.duration_s)))
    if op.kind == COMPUTE:
        node["type"] = S.COMP_NODE
        attrs += [S.make_attr("num_ops", int(round(op.flops))), S.make_attr("tensor_size", int(round(op.mem_bytes))),
                  S.make_attr("cs_flops", float(op.flops)), S.make_attr("cs_mem_bytes", float(op.mem_bytes))]
    elif op.kind == COLLECTIVE:
        n = programs.groups[op.group].size
        astra_size = op.size_bytes / n if op.collective == "all_gather" else op.size_bytes
        node["type"] = S.COMM_COLL_NODE
        attrs += [S.make_attr("comm_type", _COMM_TYPES[op.collective]),
                  S.make_attr("comm_size", int(round(astra_size))), S.make_attr("cs_size_bytes", float(op.size_bytes))]
    else:
        node["type"] = S.COMM_SEND_NODE if op.kind == SEND else S.COMM_RECV_NODE
        attrs += [S.make_attr("comm_size", int(round(op.size_bytes))), S.make_attr("cs_size_bytes", float(op.size_bytes))]
    node["attr"] = attrs
    return node


def _attr_field(name: str, value) -> bytes:
    """One encoded ``attr`` entry of a Node (field 10): appending it to a node's bytes adds the attribute."""
    body = encode(S.make_attr(name, value), S.SCHEMA, "AttributeProto")
    return write_varint(10 << 3 | 2) + write_varint(len(body)) + body


class _Encoder:
    """Encodes the ETs of every rank of one Programs, sharing what ranks have in common: the common part
    of each representative op's node is encoded once; a member adds its communicator name or endpoints."""

    def __init__(self, programs: Programs):
        self.programs = programs
        self.rep_of = programs.representative_of()
        self.common: dict[tuple[int, int], bytes] = {}
        self.pg: dict[int, bytes] = {}
        self.used_groups: set[int] = set()

    def _common(self, rep: int, i: int, op: Op, prev: int | None) -> bytes:
        key = (rep, i)
        blob = self.common.get(key)
        if blob is None:
            blob = self.common[key] = encode(node_common(self.programs, i, op, prev), S.SCHEMA, "Node")
        return blob

    def et_bytes(self, rank: int) -> bytes:
        p = self.programs
        rep = self.rep_of[rank]
        out = [delimited(encode({"version": SCHEMA_VERSION}, S.SCHEMA, "GlobalMetadata"))]
        last: dict[str, int] = {}
        tags: dict[tuple, int] = {}
        mine: dict[str, int | None] = {}
        for i, op in enumerate(p.ops[rep]):
            blob = self._common(rep, i, op, last.get(op.stream))
            last[op.stream] = i
            if op.kind == COLLECTIVE:
                gid = op.group
                if rank != rep:
                    fam = p.groups[gid].family
                    if fam not in mine:
                        mine[fam] = p.group_of(rank, fam)
                    gid = mine[fam]
                self.used_groups.add(gid)
                extra = self.pg.get(gid)
                if extra is None:
                    extra = self.pg[gid] = _attr_field("pg_name", pg_name(gid))
                blob += extra
            elif op.kind in (SEND, RECV):
                peer = op.peer
                if rank != rep and op.group is not None:
                    g = p.groups[op.group]
                    own = p.group_of(rank, g.family)
                    peer = p.groups[own].ranks[g.ranks.index(op.peer)]
                send = op.kind == SEND
                pair = (rank, peer) if send else (peer, rank)
                tag = tags[pair] = tags.get(pair, -1) + 1
                blob += (_attr_field("comm_src", rank if send else peer) + _attr_field("comm_dst", peer if send else rank)
                         + _attr_field("comm_tag", tag))
            out.append(write_varint(len(blob)) + blob)
        return b"".join(out)


def et_bytes(programs: Programs, rank: int) -> bytes:
    """One rank's ET file content."""
    return _Encoder(programs).et_bytes(rank)


def write_workload(programs: Programs, out_dir: str | Path, prefix: str = "workload") -> list[Path]:
    """Write ``<prefix>.<rank>.et`` for every rank and ``comm_groups.json``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    enc = _Encoder(programs)
    paths = []
    for r in range(programs.world_size):
        p = out / f"{prefix}.{r}.et"
        p.write_bytes(enc.et_bytes(r))
        paths.append(p)
    groups = {pg_name(g): list(programs.groups[g].ranks) for g in sorted(enc.used_groups)}
    gp = out / "comm_groups.json"
    atomic.write_text(gp, json.dumps(groups, indent=1) + "\n")
    return paths + [gp]


def load_comm_groups(path: str | Path) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's communicator-group JSON ({name: [ranks]}) -> {name: ranks}."""
    from simulator.errors import ConfigError
    from simulator.inputs import load_json
    data = load_json(path, "communicator-group file")       # bounded read, deep nesting, huge numbers
    if not isinstance(data, dict) or not all(isinstance(v, list) and v and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v) for v in data.values()):
        raise ConfigError(f"communicator-group file {path}: expected {{name: [rank, ...]}}")
    return {str(k): tuple(v) for k, v in data.items()}

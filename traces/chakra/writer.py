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

from simulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Programs
from traces.chakra import schema as S
from traces.chakra.wire import delimited, encode

SCHEMA_VERSION = "0.0.4"          # the version ASTRA-sim's microbenchmark ETs carry
_COMM_TYPES = {"all_reduce": S.ALL_REDUCE, "all_gather": S.ALL_GATHER, "reduce_scatter": S.REDUCE_SCATTER,
               "all_to_all": S.ALL_TO_ALL, "broadcast": S.BROADCAST, "reduce": S.REDUCE, "barrier": S.BARRIER}


def pg_name(gid: int) -> str:
    """Communicator name of group ``gid`` (ASTRA-sim parses names as integers > 0)."""
    return str(gid + 1)


def rank_program(programs: Programs, rank: int) -> list[Op]:
    """The program ``rank`` runs: its own, or (symmetric mode) its representative's mapped onto its groups."""
    if rank in programs.ops:
        return programs.ops[rank]
    rep = programs.representative_of()[rank]
    out = []
    for op in programs.ops[rep]:
        new = Op.__new__(Op)
        for slot in Op.__slots__:
            setattr(new, slot, getattr(op, slot))
        if op.group is not None:
            g = programs.groups[op.group]
            mine = programs.group_of(rank, g.family)
            new.group = mine
            if op.peer is not None and mine is not None:
                new.peer = programs.groups[mine].ranks[g.ranks.index(op.peer)]
        out.append(new)
    return out


def node_of(programs: Programs, rank: int, i: int, op: Op, prev_in_stream: int | None, tag: int) -> dict:
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
                  S.make_attr("comm_size", int(round(astra_size))), S.make_attr("pg_name", pg_name(op.group)),
                  S.make_attr("cs_size_bytes", float(op.size_bytes))]
    else:
        send = op.kind == SEND
        node["type"] = S.COMM_SEND_NODE if send else S.COMM_RECV_NODE
        attrs += [S.make_attr("comm_src", rank if send else op.peer), S.make_attr("comm_dst", op.peer if send else rank),
                  S.make_attr("comm_size", int(round(op.size_bytes))), S.make_attr("comm_tag", tag),
                  S.make_attr("cs_size_bytes", float(op.size_bytes))]
    node["attr"] = attrs
    return node


def et_bytes(programs: Programs, rank: int) -> bytes:
    """One rank's ET file content."""
    out = [delimited(encode({"version": SCHEMA_VERSION}, S.SCHEMA, "GlobalMetadata"))]
    last: dict[str, int] = {}
    tags: dict[tuple, int] = {}
    for i, op in enumerate(rank_program(programs, rank)):
        tag = 0
        if op.kind in (SEND, RECV):
            pair = (rank, op.peer) if op.kind == SEND else (op.peer, rank)
            tag = tags[pair] = tags.get(pair, -1) + 1
        node = node_of(programs, rank, i, op, last.get(op.stream), tag)
        last[op.stream] = i
        out.append(delimited(encode(node, S.SCHEMA, "Node")))
    return b"".join(out)


def write_workload(programs: Programs, out_dir: str | Path, prefix: str = "workload") -> list[Path]:
    """Write ``<prefix>.<rank>.et`` for every rank and ``comm_groups.json``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(programs.world_size):
        p = out / f"{prefix}.{r}.et"
        p.write_bytes(et_bytes(programs, r))
        paths.append(p)
    used = set()
    for r in range(programs.world_size):
        used.update(op.group for op in rank_program(programs, r) if op.kind == COLLECTIVE)
    groups = {pg_name(g): list(programs.groups[g].ranks) for g in sorted(used)}
    gp = out / "comm_groups.json"
    gp.write_text(json.dumps(groups, indent=1) + "\n")
    return paths + [gp]


def load_comm_groups(path: str | Path) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's communicator-group JSON ({name: [ranks]}) -> {name: ranks}."""
    from simulator.errors import ConfigError
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"communicator-group file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"communicator-group file {path}: cannot parse JSON: {e}") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) and v and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v) for v in data.values()):
        raise ConfigError(f"communicator-group file {path}: expected {{name: [rank, ...]}}")
    return {str(k): tuple(v) for k, v in data.items()}

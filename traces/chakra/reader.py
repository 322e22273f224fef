"""Chakra execution traces -> ``Programs``.

A workload is one file per rank, ``<prefix>.<rank>.et``: a varint-length-delimited stream of one
``GlobalMetadata`` then ``Node`` messages (schema in ``traces.chakra.schema``). Node mapping:

- COMP_NODE: ``duration_micros`` when set (and, with ``roofline=True``, only for CPU ops or ops without
  ``num_ops``, as ASTRA-sim does); otherwise ``num_ops`` FLOPs and ``tensor_size`` bytes priced by the cost
  model. CPU ops run on stream ``cpu``, GPU ops on ``gpu`` (one op at a time each, as ASTRA-sim's
  HardwareResource), unless a ``stream`` attribute names one.
- MEM_LOAD/MEM_STORE_NODE: ``tensor_size`` bytes on stream ``memory``.
- COMM_COLL_NODE: ``comm_type``, ``comm_size`` (ASTRA-sim convention: all-gather counts one rank's input;
  converted to ours, the gathered output), over the communicator named by ``pg_name`` (``comm_groups``) or
  over the network dimensions flagged in ``involved_dim`` (default: all). Collective nodes without
  ``comm_type`` (the CPU-side launch records of PyTorch traces) replay their measured duration.
- COMM_SEND/RECV_NODE: ``comm_dst``/``comm_src``, ``comm_size``, ``comm_tag``.
- METADATA/INVALID_NODE: complete at once (ASTRA-sim skips them); STORAGE/BATCH/CHECKPOINT nodes replay
  their duration and are reported.
Data and control dependencies become ``deps``; dependencies on ids absent from the file are counted and
reported. Ranks whose files are byte-identical form one symmetric class (one is simulated).
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import TraceError
from simulator.inputs import MAX_BYTES, read_bytes
from simulator.program import COLLECTIVE, COMPUTE, RECV, SEND, Op, Programs
from traces.chakra import schema as S
from traces.chakra.wire import WireError, decode, iter_delimited

COMM_KINDS = {S.ALL_REDUCE: "all_reduce", S.ALL_GATHER: "all_gather", S.REDUCE_SCATTER: "reduce_scatter",
              S.REDUCE_SCATTER_BLOCK: "reduce_scatter", S.ALL_TO_ALL: "all_to_all", S.BROADCAST: "broadcast",
              S.REDUCE: "reduce", S.BARRIER: "barrier"}
# attributes that change timing
TIMING_ATTRS = {"is_cpu_op", "comm_type", "comm_size", "involved_dim", "pg_name", "comm_src", "comm_dst",
                "comm_tag", "num_ops", "tensor_size", "stream", "op_type",
                # clustersim's own (written by the exporter): exact sizes and labels
                "cs_flops", "cs_mem_bytes", "cs_size_bytes", "cs_duration_s", "cs_phase", "cs_microbatch", "cs_layer",
                "cs_strategy"}
# provenance attributes of PyTorch-converted traces (et_converter): read, no effect on timing
PROVENANCE_ATTRS = {"tid", "fw_parent", "fw_tid", "op_schema", "seq_id", "rf_id", "scope", "pid", "ts",
                    "cat", "kernel_name", "inter_thread_dep", "is_grad"}


# tensor metadata strings of PyTorch-converted traces: framed and checked, not decoded (no effect on timing)
_UNUSED_NODE_FIELDS = frozenset({"inputs", "outputs"})
# One rank's ET file: a node holds at least a type, an id, a name and a duration (tens of bytes), so 1 GiB is
# tens of millions of nodes, the order of the engine's whole op budget (clustersim/guards.py DEFAULT_MAX_OPS);
# a bigger file is refused before it is read, a device (/dev/zero) after 1 GiB.
ET_LIMIT_BYTES = 1 << 30


@dataclass
class ChakraReport:
    """What the reader found and how it treated it (printed by ``clustersim chakra run``)."""

    files: int = 0
    classes: int = 0
    version: str = ""
    node_types: Counter = field(default_factory=Counter)     # over all distinct files, per file kind
    unknown_attributes: Counter = field(default_factory=Counter)
    unknown_fields: Counter = field(default_factory=Counter)
    missing_deps: int = 0
    cycle_deps: int = 0
    notes: list = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.files} rank file(s), {self.classes} distinct (symmetric classes), Chakra schema "
               f"{self.version or '?'}",
               "nodes by type (per distinct file): " + ", ".join(f"{k} {v}" for k, v in sorted(self.node_types.items()))]
        if self.unknown_attributes:
            out.append("unknown attributes, ignored: " + ", ".join(f"{k} ({v} nodes)"
                                                              for k, v in sorted(self.unknown_attributes.items())))
        if self.unknown_fields:
            out.append("unknown message fields, ignored: " + ", ".join(f"{k} ({v})"
                                                                  for k, v in sorted(self.unknown_fields.items())))
        if self.missing_deps:
            out.append(f"{self.missing_deps} dependencies on node ids absent from the file were ignored")
        if self.cycle_deps:
            out.append(f"{self.cycle_deps} dependencies closing cycles in the trace were dropped")
        return out + self.notes


def rank_files(prefix: str | Path) -> list[str]:
    """Paths of ``<prefix>.<rank>.et`` for ranks 0..N-1 (TraceError if none or a rank is missing)."""
    if not str(prefix).strip():
        raise TraceError("the Chakra ET prefix is empty: give the path before .<rank>.et, e.g. out/workload")
    prefix = Path(prefix)
    if prefix.is_dir():             # a folder: say which prefixes it holds
        names = sorted({m.group(1) for n in os.listdir(prefix) if (m := re.match(r"(.+)\.\d+\.et$", n))})
        raise TraceError(f"{prefix} is a folder; give the path before .<rank>.et"
                         + (f", e.g. {prefix / names[0]}" if names else " (it holds no <prefix>.<rank>.et file)"))
    folder = prefix.parent if str(prefix.parent) else Path(".")
    if not folder.is_dir():
        raise TraceError(f"no Chakra ET files {prefix}.<rank>.et: folder {folder} does not exist")
    pat = re.compile(re.escape(prefix.name) + r"\.(\d+)\.et$")
    found = {}
    for name in sorted(os.listdir(folder)):
        m = pat.match(name)
        if m:
            rank = int(m.group(1))
            if rank in found:         # workload.7.et and workload.07.et: one rank, two files
                raise TraceError(f"Chakra ET files {os.path.basename(found[rank])} and {name} both name rank "
                                 f"{rank}; keep one")
            found[rank] = os.path.join(folder, name)
    if not found:
        raise TraceError(f"no Chakra ET files {prefix}.<rank>.et found")
    missing = [r for r in range(len(found)) if r not in found]
    if missing:
        raise TraceError(f"Chakra ET files {prefix}.<rank>.et: rank {missing[0]} is missing "
                         f"({len(found)} files, ranks must be 0..N-1)")
    return [found[r] for r in range(len(found))]


def parse_et(data: bytes, where: str) -> tuple[dict, list[dict], Counter]:
    """(GlobalMetadata dict, Node dicts, unknown field counts) of one ET file's bytes."""
    try:
        spans = list(iter_delimited(data))
    except WireError as e:
        raise TraceError(f"{where}: not a Chakra ET (corrupt or truncated): {e}") from None
    if not spans:
        raise TraceError(f"{where}: empty file, expected a GlobalMetadata message then nodes")
    unknown: Counter = Counter()
    try:
        meta = decode(data, S.SCHEMA, "GlobalMetadata", *spans[0])
    except WireError as e:
        raise TraceError(f"{where}: GlobalMetadata (first message) is corrupt: {e}") from None
    for f in meta.pop("_unknown", []):
        unknown[f"GlobalMetadata.{f}"] += 1
    nodes = []
    for i, (s, e) in enumerate(spans[1:]):
        if s == e:
            # a node has at least a type; zero bytes (a file of zeros) would make one empty node per byte
            raise TraceError(f"{where}: node #{i} (message at byte {s}) is empty; not a Chakra ET")
        try:
            node = decode(data, S.SCHEMA, "Node", s, e, skip=_UNUSED_NODE_FIELDS)
        except (WireError, RecursionError) as err:
            raise TraceError(f"{where}: node #{i} (message at byte {s}) is corrupt: {err}") from None
        for f in node.pop("_unknown", []):
            unknown[f"Node.{f}"] += 1
        nodes.append(node)
    return meta, nodes, unknown


@dataclass
class _Groups:
    """How collective nodes name their communicators, resolved per rank."""

    world_size: int
    dims: tuple[int, ...] | None = None            # npus per network dimension (None: one flat dimension)
    comm_groups: dict[str, tuple[int, ...]] | None = None
    family_attrs: dict = field(default_factory=dict)      # dimension family -> attributes that made it

    def members(self, rank: int, attrs: dict, where: str) -> tuple[tuple[int, ...], str]:
        pg = attrs.get("pg_name")
        if pg:
            if self.comm_groups is None or str(pg) not in self.comm_groups:
                raise TraceError(f"{where}: pg_name {pg!r} is not in the communicator-group file"
                                 + ("" if self.comm_groups is not None else " (give --comm-group FILE)"))
            ranks = self.comm_groups[str(pg)]
            if rank not in ranks:
                raise TraceError(f"{where}: rank {rank} runs a collective on group {pg!r}, which does not hold it")
            bad = [r for r in ranks if not 0 <= r < self.world_size]
            if bad or len(set(ranks)) != len(ranks):
                what = f"rank(s) {bad[:8]} outside 0..{self.world_size - 1}" if bad else "a rank twice"
                raise TraceError(f"{where}: communicator group {pg!r} {list(ranks)[:16]} names {what} "
                                 f"(the workload has {self.world_size} ranks)")
            return ranks, f"pg:{pg}"
        if self.dims is None:
            return tuple(range(self.world_size)), "world"
        inv = attrs.get("involved_dim")
        ndim = len(self.dims)
        flags = [True] * ndim if inv is None else [bool(v) for v in inv][:ndim] + [False] * max(0, ndim - len(inv))
        coords, r = [], rank
        for n in self.dims:
            coords.append(r % n)
            r //= n
        ranks = [0]
        stride = 1
        for d, n in enumerate(self.dims):
            if flags[d]:
                ranks = [x + i * stride for i in range(n) for x in ranks]
            else:
                ranks = [x + coords[d] * stride for x in ranks]
            stride *= n
        family = "dims" + "".join(str(d) for d in range(ndim) if flags[d])
        self.family_attrs.setdefault(family, {"involved_dim": flags})
        return tuple(sorted(ranks)), family


def _attrs(node: dict, report: ChakraReport) -> dict:
    out = {}
    for a in node.get("attr", []):
        name = a.get("name", "")
        out[name] = S.attr_value(a)
        if name not in TIMING_ATTRS and name not in PROVENANCE_ATTRS:
            report.unknown_attributes[name] += 1
    return out


#: physical bounds on one node's figures: beyond them a value is corrupt, and the step it gives overflows (a
#: 1e300 s duration printed inf and crashed writing the trace): a node's FLOPs, bytes and duration
MAX_NODE_FLOPS = 1e21
MAX_NODE_SECONDS = 1e5
_LIMITS = {"num_ops": MAX_NODE_FLOPS, "cs_flops": MAX_NODE_FLOPS, "cs_duration_s": MAX_NODE_SECONDS,
           "duration_micros": MAX_NODE_SECONDS * 1e6}


def _num(attrs: dict, key: str, where: str, default=0):
    v = attrs.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v == float("inf"):
        raise TraceError(f"{where}: attribute {key} must be a non-negative number, got {v!r}")
    limit = _LIMITS.get(key, MAX_BYTES)
    if v > limit:
        raise TraceError(f"{where}: attribute {key} is {v:g}, beyond any real node (at most {limit:g}"
                         f"{' s' if key == 'cs_duration_s' else ' us' if key == 'duration_micros' else ''})")
    return v


def build_program(rank: int, nodes: list[dict], programs: Programs, groups: _Groups, report: ChakraReport,
                  where: str, roofline: bool = False) -> list[Op]:
    """One rank's program from its nodes (topological order; ties keep file order)."""
    index: dict[int, int] = {}
    for i, n in enumerate(nodes):
        nid = n.get("id", 0)
        if nid in index:
            raise TraceError(f"{where}: node #{i} repeats id {nid} (node #{index[nid]})")
        index[nid] = i
    deps: list[list[int]] = []
    for n in nodes:
        ds = {}
        for d in (*n.get("data_deps", ()), *n.get("ctrl_deps", ())):
            j = index.get(d)
            if j is None:
                report.missing_deps += 1
            else:
                ds[j] = None
        deps.append(list(ds))
    order = _topological(deps, nodes, where, report)
    position = {i: k for k, i in enumerate(order)}
    prog = []
    for i in order:
        node = nodes[i]
        nw = f"{where}: node #{i} (id {node.get('id', 0)}, {node.get('name', '')!r})"
        try:
            op = _op(rank, node, nw, programs, groups, report, roofline)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as e:
            raise TraceError(f"{nw}: malformed node: {type(e).__name__}: {e}") from None
        op.deps = tuple(sorted(position[j] for j in deps[i] if position[j] < position[i]))
        prog.append(op)
    return prog


def _topological(deps: list[list[int]], nodes, where: str, report: "ChakraReport") -> list[int]:
    """Kahn's order, ties by file position. Traces converted from PyTorch can hold dependency cycles
    (a CPU op and its kernel depending on each other): when no node is ready, the earliest waiting node
    is released and the dependencies it still waits on are dropped (counted in the report)."""
    import heapq
    n = len(deps)
    indeg = [len(d) for d in deps]
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for j in ds:
            succ[j].append(i)
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    done = [False] * n
    waiting = 0
    while len(order) < n:
        if not ready:
            while done[waiting] or indeg[waiting] <= 0:
                waiting += 1
            report.cycle_deps += indeg[waiting]
            indeg[waiting] = 0
            heapq.heappush(ready, waiting)
        i = heapq.heappop(ready)
        if done[i]:
            continue
        done[i] = True
        order.append(i)
        for k in succ[i]:
            indeg[k] -= 1
            if indeg[k] == 0 and not done[k]:
                heapq.heappush(ready, k)
    return order


def _op(rank, node, where, programs, groups, report, roofline) -> Op:
    ntype = node.get("type", S.INVALID_NODE)
    tname = S.NODE_TYPE_NAMES.get(ntype, f"unknown node type {ntype} (replayed as measured)")
    report.node_types[tname] += 1
    attrs = _attrs(node, report)
    name = node.get("name", "") or f"node{node.get('id', 0)}"
    cpu = bool(attrs.get("is_cpu_op", False))
    stream = attrs.get("stream")
    stream = (f"gpu{stream}" if isinstance(stream, int) else str(stream)) if stream is not None else None
    dur_us = _num(node, "duration_micros", where)
    exact_s = _num(attrs, "cs_duration_s", where, None)
    labels = dict(phase=attrs.get("cs_phase") or None, microbatch=attrs.get("cs_microbatch"),
                  layer=attrs.get("cs_layer"), strategy=attrs.get("cs_strategy"))
    if ntype == S.COMP_NODE:
        flops = _num(attrs, "cs_flops", where, _num(attrs, "num_ops", where))
        mem = _num(attrs, "cs_mem_bytes", where, _num(attrs, "tensor_size", where))
        use_duration = dur_us > 0 and (not roofline or cpu or not flops)
        duration = (exact_s if exact_s is not None else dur_us * 1e-6) if use_duration or exact_s is not None else None
        return Op(COMPUTE, name, stream or ("cpu" if cpu else "gpu"), flops=float(flops), mem_bytes=float(mem),
                  duration_s=duration, **labels)
    if ntype in (S.MEM_LOAD_NODE, S.MEM_STORE_NODE):
        mem = _num(attrs, "cs_mem_bytes", where, _num(attrs, "tensor_size", where))
        return Op(COMPUTE, name, stream or "memory", mem_bytes=float(mem),
                  duration_s=dur_us * 1e-6 if dur_us > 0 else None, **labels)
    if ntype == S.COMM_COLL_NODE:
        if "comm_type" not in attrs:
            report.node_types["COMM_COLL_NODE without comm_type (replayed as measured)"] += 1
            return Op(COMPUTE, name, stream or ("cpu" if cpu else "gpu"), duration_s=dur_us * 1e-6, **labels)
        ctype = attrs["comm_type"]
        kind = COMM_KINDS.get(ctype)
        if kind is None:
            raise TraceError(f"{where}: collective type {S.COMM_TYPE_NAMES.get(ctype, ctype)} is not supported "
                             f"(supported: {', '.join(S.COMM_TYPE_NAMES[k] for k in sorted(COMM_KINDS))})")
        size = _num(attrs, "cs_size_bytes", where, None)
        ranks, family = groups.members(rank, attrs, where)
        if size is None:
            size = float(_num(attrs, "comm_size", where))
            if kind == "all_gather":
                size *= len(ranks)
        gid = programs.add_group(ranks, family)
        return Op(COLLECTIVE, name, stream or "comm", collective=kind, group=gid, size_bytes=float(size), **labels)
    if ntype in (S.COMM_SEND_NODE, S.COMM_RECV_NODE):
        key = "comm_dst" if ntype == S.COMM_SEND_NODE else "comm_src"
        peer = attrs.get(key)
        if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < programs.world_size or peer == rank:
            raise TraceError(f"{where}: {key} must be another rank in 0..{programs.world_size - 1}, got {peer!r}")
        size = _num(attrs, "cs_size_bytes", where, _num(attrs, "comm_size", where))
        kind = SEND if ntype == S.COMM_SEND_NODE else RECV
        return Op(kind, name, stream or "p2p", peer=peer, size_bytes=float(size), **labels)
    if ntype in (S.METADATA_NODE, S.INVALID_NODE):
        return Op(COMPUTE, name, "skipped", duration_s=0.0)
    return Op(COMPUTE, name, stream or "other", duration_s=dur_us * 1e-6)


def load_programs(prefix: str | Path, dims: tuple[int, ...] | None = None,
                  comm_groups: dict[str, tuple[int, ...]] | None = None, roofline: bool = False,
                  symmetric: bool = True) -> tuple[Programs, ChakraReport]:
    """Read ``<prefix>.<rank>.et`` for every rank into Programs (+ a report of what was found).

    dims         NPUs per network dimension (resolves ``involved_dim``); their product must be the number of
                 files. None: every collective without ``pg_name`` spans all ranks.
    comm_groups  communicator name -> ranks (ASTRA-sim's --comm-group-configuration), for ``pg_name``.
    symmetric    byte-identical files form one class (False: every rank simulated).
    """
    files = rank_files(prefix)
    world = len(files)
    if dims is not None:
        prod = 1
        for n in dims:
            prod *= n
        if prod != world:
            raise TraceError(f"{prefix}: {world} rank files but the network has {prod} NPUs "
                             f"({' x '.join(map(str, dims))})")
    report = ChakraReport(files=world)
    by_digest: dict = {}
    blobs: dict = {}
    last: bytes | None = None
    for r, p in enumerate(files):
        data = read_bytes(p, "Chakra ET", ET_LIMIT_BYTES, TraceError)     # not /dev/zero behind a link
        if not symmetric:
            key = r
        elif data == last:                       # the common case: a memcmp, no hashing
            key = last
        else:
            key = last = data                    # identical contents share one dict key
        ranks = by_digest.get(key)
        if ranks is None:
            by_digest[key] = [r]
            blobs[key] = (p, data)
        else:
            ranks.append(r)
    programs = Programs(world_size=world, ops={}, classes={})
    groups = _Groups(world, dims, comm_groups)
    parsed: dict = {}
    for key, (p, data) in blobs.items():
        meta, nodes, unknown = parse_et(data, str(p))
        report.unknown_fields.update(unknown)
        report.version = report.version or meta.get("version", "") or \
            next((S.attr_value(a) for a in meta.get("attr", []) if a.get("name") == "schema"), "")
        parsed[key] = (meta, nodes)
    if not any(nodes for _, nodes in parsed.values()):
        raise TraceError(f"{prefix}: no rank file holds a node (only the GlobalMetadata header): nothing to "
                         f"simulate")
    classes: dict[int, tuple[int, ...]] = {}
    for key, ranks in by_digest.items():
        p, _ = blobs[key]
        _, nodes = parsed[key]
        rep = ranks[0]
        prog = build_program(rep, nodes, programs, groups, report, str(p), roofline)
        if len(ranks) > 1 and any(op.kind in (SEND, RECV) for op in prog):
            # point-to-point names absolute peers: identical files are not images of each other
            for r in ranks:
                programs.ops[r] = prog if r == rep else build_program(r, nodes, programs, groups, ChakraReport(),
                                                                      str(files[r]), roofline)
                classes[r] = (r,)
            continue
        programs.ops[rep] = prog
        classes[rep] = tuple(ranks)
        if len(ranks) > 1:
            _register_images(ranks, prog, programs, groups)
    programs.classes = classes if any(len(m) > 1 for m in classes.values()) else None
    report.classes = len(classes)
    programs.meta["chakra"] = report
    return programs, report


def _register_images(ranks: list[int], prog: list[Op], programs: Programs, groups: "_Groups") -> None:
    """Register the groups the other members of a class use (same family, their own members), so that
    symmetric mode finds every image of a representative's collective. O(world) per family."""
    fams = {programs.groups[op.group].family for op in prog if op.kind == COLLECTIVE}
    for fam in fams:
        attrs = groups.family_attrs.get(fam)
        if attrs is None:
            continue            # world and named communicators: the same group for every member
        covered: set[int] = set()
        for r in ranks:
            if r in covered:
                continue
            g, _ = groups.members(r, attrs, "")
            programs.add_group(g, fam)
            covered.update(g)


def replicate_programs(prefix: str | Path, dims: tuple[int, ...], comm_groups=None, roofline: bool = False):
    """One rank file standing for every NPU of a ``dims`` network (one symmetric class)."""
    files = rank_files(prefix)
    world = 1
    for n in dims:
        world *= n
    report = ChakraReport(files=1)
    data = read_bytes(files[0], "Chakra ET", ET_LIMIT_BYTES, TraceError)     # bounded, as every rank file
    meta, nodes, unknown = parse_et(data, str(files[0]))
    report.unknown_fields.update(unknown)
    report.version = meta.get("version", "") or next(
        (S.attr_value(a) for a in meta.get("attr", []) if a.get("name") == "schema"), "")
    programs = Programs(world_size=world, ops={})
    groups = _Groups(world, dims, comm_groups)
    prog = build_program(0, nodes, programs, groups, report, str(files[0]), roofline)
    if any(op.kind in (SEND, RECV) for op in prog):
        raise TraceError(f"{files[0]}: --replicate cannot copy a trace with point-to-point nodes (absolute peers)")
    for op in prog:
        g = programs.groups[op.group] if op.kind == COLLECTIVE else None
        if g is not None and g.family.startswith("pg:") and len(g.ranks) != world:
            raise TraceError(f"{files[0]}: --replicate: {op.name!r} runs on communicator {g.family[3:]!r} "
                             f"{list(g.ranks)[:16]}, which does not hold all {world} NPUs; every copy of the file "
                             f"would name it (absolute ranks): give one rank file per NPU (chakra export writes them)")
    programs.ops[0] = prog
    programs.classes = {0: tuple(range(world))}
    _register_images(list(range(world)), prog, programs, groups)
    report.classes = 1
    report.notes.append(f"one rank file replicated over {world} NPUs")
    programs.meta["chakra"] = report
    return programs, report

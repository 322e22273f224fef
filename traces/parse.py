"""Kineto (PyTorch profiler) traces -> pandas DataFrames.

``load_trace(path)`` reads one file (``.json`` or ``.json.gz``) or a folder of per-rank files (the layout
Holistic Trace Analysis expects: one file per rank, the rank in ``distributedInfo``) and returns a
``Trace`` with per-rank metadata and five DataFrames, all ranks concatenated, times in **seconds** from
the earliest event of any rank (``Trace.origin_us`` is that instant in the trace's own microseconds):

steps        rank, step (N of ``ProfilerStep#N``), name, ts, dur, end, pid, tid, gpu_end (last GPU op
             launched in the step; NaN without GPU ops)
cpu_ops      rank, ts, dur, end, name, cat (cpu_op | user_annotation | cuda_runtime | cuda_driver), pid, tid,
             external_id, correlation, seq_nr (autograd "Sequence number"), flops (GEMMs, from Input Dims),
             parent / depth (nesting on the thread; parent is a row label of this frame, -1 none),
             fwd_op (backward autograd node -> its forward op, -1), step (-1 outside steps)
kernels      rank, ts, dur, end, name, cat (kernel | gpu_memcpy | gpu_memset), pid, tid, device, stream,
             correlation, launch (cuda_runtime row), op (launching CPU op row: innermost op enclosing the
             launch), op_name, step, is_comm (NCCL kernel)
collectives  rank, kind (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, barrier,
             send, recv, gather, scatter), impl (what the backend ran: gloo runs FSDP's reduce_scatter
             as an all_reduce), backend, name, size_bytes (nccl-tests convention, see simulator.program),
             in_nelems, out_nelems, dtype, group_size, group_ranks (tuple), pg (process-group name),
             peer (p2p), ts, dur, end (execution: NCCL kernel or gloo work; includes waiting for peers),
             issue_ts, issue_end (the CPU op that enqueued it), stream ("cuda:N", "gloo:TID", "cpu:TID"),
             kernel / op (rows of kernels / cpu_ops, -1), seq (k-th collective of this rank on its group),
             step, timing ("gpu" | "worker" | "cpu")
memory       rank, ts, bytes (signed), total_allocated, total_reserved, device_type (0 CPU, 1 CUDA),
             device_id, addr, tid

Row labels of every frame are 0..n-1 and link columns hold those labels. Unknown or missing optional
fields become NaN / -1 / None; a corrupt file raises ``TraceError`` naming it.
"""
from __future__ import annotations

import ast
import math
import re
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import TraceError
from traces.kineto import Scan

# --------------------------------------------------------------------------------------------- constants
CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TRACE_SUFFIXES = (".json", ".json.gz")

# bytes per element: Kineto "dtype" (record_param_comms, c10 ScalarType names) and "Input type" spellings
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4,
    "short": 2, "int16": 2, "char": 1, "signed char": 1, "int8": 1, "byte": 1, "unsigned char": 1,
    "uint8": 1, "bool": 1, "complexfloat": 8, "c10::complex<float>": 8, "complexdouble": 16,
    "c10::complex<double>": 16, "float8_e4m3fn": 1, "c10::float8_e4m3fn": 1, "float8_e5m2": 1,
    "c10::float8_e5m2": 1,
}

_KINDS = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
    "barrier": "barrier", "monitoredbarrier": "barrier", "send": "send", "recv": "recv", "gather": "gather",
    "scatter": "scatter", "sendrecv": "sendrecv",
}
_KIND_SUFFIXES = ("intotensorcoalesced", "tensorcoalesced", "intotensor", "coalesced", "anysource", "tensor",
                  "base", "sparse")

_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
#: the longest profiled step taken as real (us): a day
MAX_STEP_US = 86400e6
_RANK_RE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_BACKWARD_RE = re.compile(r"Backward\d*$")

COMM_ARG_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
                 "Process Group Ranks", "Process Group Name", "In split size", "Out split size")


def normalize_kind(name: str | None) -> str | None:
    """'c10d::_allgather_base_', 'nccl:all_reduce', 'allreduce', 'ncclKernel_AllReduce_RING_LL_Sum_float'
    -> canonical collective kind, or None when the name is not a collective."""
    if not name or not isinstance(name, str):
        return None
    s = name.strip()
    low = s.lower()
    if low.startswith("nccldevkernel_") or low.startswith("ncclkernel_"):
        s = s.split("_", 2)[1] if s.count("_") >= 1 else s
        low = s.lower()
    for prefix in ("c10d::", "nccl:", "gloo:", "record_param_comms"):
        if low.startswith(prefix):
            low = low[len(prefix):]
    key = low.replace("_", "").replace(" ", "")
    for suf in _KIND_SUFFIXES:
        if key.endswith(suf) and key[: -len(suf)] in _KINDS:
            key = key[: -len(suf)]
            break
    return _KINDS.get(key)


def dtype_bytes(dtype: str | None) -> float:
    if not dtype:
        return math.nan
    return float(DTYPE_BYTES.get(str(dtype).strip().lower(), math.nan))


def _numel(dims) -> int | None:
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return None
    n = 1
    for d in dims:
        n *= d
    return n


def _tensor_numels(arg) -> list[int]:
    """Numels of one 'Input Dims' entry: a tensor ([d...]) or a tensor list ([[d...], ...])."""
    if not isinstance(arg, list):
        return []
    if all(isinstance(d, int) for d in arg):
        return [_numel(arg)] if arg else []
    out = []
    for a in arg:
        out.extend(_tensor_numels(a))
    return out


def gemm_flops(name: str, dims) -> float:
    """FLOPs of a GEMM op from its 'Input Dims' (2·M·N·K per product); NaN for other ops."""
    if not isinstance(dims, list):
        return math.nan
    try:
        if name in ("aten::mm", "aten::_scaled_mm") and len(dims) >= 2:
            (m, k), (k2, n) = dims[0][-2:], dims[1][-2:]
            return 2.0 * m * k * n if k == k2 else math.nan
        if name == "aten::addmm" and len(dims) >= 3:
            (m, k), (k2, n) = dims[1], dims[2]
            return 2.0 * m * k * n if k == k2 else math.nan
        if name == "aten::bmm" and len(dims) >= 2:
            (b, m, k), (b2, k2, n) = dims[0], dims[1]
            return 2.0 * b * m * k * n if (k, b) == (k2, b2) else math.nan
        if name == "aten::baddbmm" and len(dims) >= 3:
            (b, m, k), (b2, k2, n) = dims[1], dims[2]
            return 2.0 * b * m * k * n if (k, b) == (k2, b2) else math.nan
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return math.nan


GEMM_OPS = ("aten::mm", "aten::_scaled_mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _is_comm_name(name: str) -> bool:
    return name == "record_param_comms" or name.startswith("c10d::") or name.startswith("nccl:") or \
        name.startswith("gloo:")


def _parse_ranks(v) -> tuple[int, ...] | None:
    if isinstance(v, list):
        try:
            return tuple(int(x) for x in v)
        except (TypeError, ValueError):
            return None
    if isinstance(v, str) and v.strip().startswith("["):
        try:
            lst = ast.literal_eval(v.strip())
            return tuple(int(x) for x in lst)
        except (ValueError, SyntaxError, TypeError):
            return None
    return None


def _num(v) -> float:
    if isinstance(v, bool):
        return math.nan
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return math.nan
    return math.nan


def _hid(v):
    """A process / thread id as written (int or str); anything else (lists, dicts) as its string."""
    if v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() else str(v)
    return str(v)


_TS_LIMIT_US = 1e18     # microseconds: ~31,700 years; beyond this a time is garbage


def _finite(v) -> float | None:
    """A time in microseconds as a float, or None unless it is a real, finite, plausible number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int) and not -_TS_LIMIT_US < v < _TS_LIMIT_US:
        return None
    v = float(v)
    return v if -_TS_LIMIT_US < v < _TS_LIMIT_US else None


_I64 = 1 << 63


def _int(v, default=-1) -> int:
    """An id or count as an int64 (``default`` when missing, not a whole number, or out of int64 range)."""
    if isinstance(v, bool) or v is None:
        return default
    if isinstance(v, int):
        return v if -_I64 <= v < _I64 else default
    if isinstance(v, float) and math.isfinite(v) and abs(v) < 9.2e18:
        return int(v)
    if isinstance(v, str) and len(v) < 32:
        try:
            v = int(v)
        except ValueError:
            return default
        return v if -_I64 <= v < _I64 else default
    return default


# --------------------------------------------------------------------------------------------- data model
@dataclass
class RankInfo:
    """What one rank's file says about itself."""

    rank: int
    path: Path
    world_size: int | None = None
    backend: str | None = None
    devices: list = field(default_factory=list)         # deviceProperties names
    distributed_info: dict = field(default_factory=dict)
    process_groups: list = field(default_factory=list)  # {"name", "desc", "ranks", "backend", "size"}
    host: str | None = None
    pid: object = None
    main_tid: object = None
    base_time_ns: int | None = None
    start_abs_us: float = 0.0       # first event, on the common clock (baseTimeNanoseconds applied)
    thread_names: dict = field(default_factory=dict)
    negative_durations: int = 0     # complete events whose negative "dur" was read as 0 (repaired, see replay)

    @property
    def device(self) -> str:
        """The name of this rank's accelerator, or 'cpu' for CPU-only traces."""
        return self.devices[0] if self.devices else "cpu"


@dataclass
class Trace:
    """A parsed trace: per-rank metadata and DataFrames (times in seconds from ``origin_us``)."""

    path: Path
    ranks: dict[int, RankInfo]
    steps: pd.DataFrame
    cpu_ops: pd.DataFrame
    kernels: pd.DataFrame
    collectives: pd.DataFrame
    memory: pd.DataFrame
    origin_us: float = 0.0
    shared_clock: bool = True

    @property
    def world_size(self) -> int:
        ws = [i.world_size for i in self.ranks.values() if i.world_size]
        return max(ws) if ws else (max(self.ranks) + 1 if self.ranks else 0)

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def has_gpu(self) -> bool:
        return len(self.kernels) > 0

    @property
    def backend(self) -> str:
        b = {i.backend for i in self.ranks.values() if i.backend}
        return b.pop() if len(b) == 1 else ("nccl" if self.has_gpu else "gloo")

    def device(self, rank: int) -> str:
        return self.ranks[rank].device


# --------------------------------------------------------------------------------------------- one file
def _columns(floats: tuple, ints: tuple, objects: tuple) -> dict:
    """Column buffers: typed arrays for numbers (8 bytes a row instead of a Python object and a pointer),
    lists for strings and ids."""
    return {**{k: array("d") for k in floats}, **{k: array("q") for k in ints}, **{k: [] for k in objects}}


def _frame(cols: dict) -> pd.DataFrame:
    """The columns as a frame of one block per column: numbers stay in their buffers (no copy into a
    consolidated 2-D block, which held the trace's numbers twice at once)."""
    return pd.DataFrame({k: np.frombuffer(v, dtype=np.float64 if v.typecode == "d" else np.int64)
                         if isinstance(v, array) else v for k, v in cols.items()}, copy=False)


class _RankParser:
    """Accumulates the rows of one file in column buffers (cheap) while the file streams by."""

    def __init__(self, path: Path):
        self.path = path
        self.cpu = _columns(("ts", "dur", "flops"), ("external_id", "correlation", "seq_nr", "fwd_tid"),
                            ("name", "cat", "pid", "tid"))
        self.cpu_extra: dict[int, dict] = {}        # row -> args of comm ops (Input Dims, comm args)
        self.gpu = _columns(("ts", "dur"), ("device", "stream", "correlation", "external_id"),
                            ("name", "cat", "pid", "tid"))
        self.gpu_extra: dict[int, dict] = {}
        self.mem = _columns(("ts", "bytes", "total_allocated", "total_reserved"),
                            ("device_type", "device_id", "addr"), ("tid",))
        self.thread_names: dict = {}
        self.min_ts = math.inf
        self.intern: dict[str, str] = {}
        self.ids: dict = {}
        self.negative_durations = 0         # CPU / GPU events whose negative or unreadable duration was read as 0

    def _id(self, v):
        """``_hid(v)``, one shared object per distinct id (millions of rows hold a few distinct ids)."""
        v = _hid(v)
        return self.ids.setdefault((type(v), v), v)

    def _name(self, s) -> str:
        s = s if isinstance(s, str) else str(s)
        return self.intern.setdefault(s, s)

    def add(self, e: dict) -> None:
        ph = e.get("ph")
        if ph == "X":
            cat = e.get("cat")
            ts, dur = _finite(e.get("ts")), _finite(e.get("dur", 0.0))
            if ts is None:
                return
            if dur is None or dur < 0:
                if (dur is not None or e.get("dur") is not None) and (cat in CPU_CATS or cat in GPU_CATS):
                    self.negative_durations += 1         # negative, or not a plausible number
                dur = 0.0
            args = e.get("args") or {}
            if not isinstance(args, dict):
                args = {}
            name = self._name(e.get("name", ""))
            if cat in CPU_CATS:
                c = self.cpu
                row = len(c["ts"])
                c["ts"].append(float(ts)); c["dur"].append(float(dur)); c["name"].append(name)
                c["cat"].append(cat); c["pid"].append(self._id(e.get("pid"))); c["tid"].append(self._id(e.get("tid")))
                c["external_id"].append(_int(args.get("External id")))
                c["correlation"].append(_int(args.get("correlation")))
                c["seq_nr"].append(_int(args.get("Sequence number")))
                c["fwd_tid"].append(_int(args.get("Fwd thread id")))
                flops = math.nan
                if name in GEMM_OPS:
                    flops = gemm_flops(name, args.get("Input Dims"))
                c["flops"].append(flops)
                if _is_comm_name(name):
                    self.cpu_extra[row] = {k: args[k] for k in COMM_ARG_KEYS + ("Input Dims", "Input type",
                                                                              "Concrete Inputs") if k in args}
                self.min_ts = min(self.min_ts, ts)
            elif cat in GPU_CATS:
                g = self.gpu
                row = len(g["ts"])
                g["ts"].append(float(ts)); g["dur"].append(float(dur)); g["name"].append(name)
                g["cat"].append(cat); g["pid"].append(self._id(e.get("pid"))); g["tid"].append(self._id(e.get("tid")))
                g["device"].append(_int(args.get("device"), _int(e.get("pid"))))
                g["stream"].append(_int(args.get("stream"), _int(e.get("tid"))))
                g["correlation"].append(_int(args.get("correlation")))
                g["external_id"].append(_int(args.get("External id")))
                if cat == "kernel" and "nccl" in name.lower():
                    self.gpu_extra[row] = {k: args[k] for k in COMM_ARG_KEYS if k in args}
                self.min_ts = min(self.min_ts, ts)
        elif ph == "i" or ph == "I":
            if e.get("name") == "[memory]":
                args = e.get("args") or {}
                ts = _finite(e.get("ts"))
                if ts is None or not isinstance(args, dict):
                    return
                m = self.mem
                m["ts"].append(float(ts)); m["bytes"].append(_num(args.get("Bytes")))
                m["total_allocated"].append(_num(args.get("Total Allocated")))
                m["total_reserved"].append(_num(args.get("Total Reserved")))
                m["device_type"].append(_int(args.get("Device Type")))
                m["device_id"].append(_int(args.get("Device Id")))
                m["addr"].append(_int(args.get("Addr"), 0))
                m["tid"].append(self._id(e.get("tid")))
        elif ph == "M" and e.get("name") == "thread_name":
            args = e.get("args") or {}
            if isinstance(args, dict):
                self.thread_names[(_hid(e.get("pid")), _hid(e.get("tid")))] = args.get("name")


# Event cap: real Kineto events take 200-500 characters of JSON each (measured: 363 and 465 per complete
# event in /work/shared/traces/real-gpu); a file whose kept rows average fewer than MIN_CHARS_PER_ROW
# characters is not a profiler trace, and refusing it keeps memory linear in the file's decompressed size.
MIN_CHARS_PER_ROW = 64
ROWS_FREE = 200_000            # rows always accepted (small synthetic test traces)


def _parse_file(path: Path) -> tuple[_RankParser, dict]:
    rp = _RankParser(path)
    scan = Scan(path)
    for i, ev in enumerate(scan.events()):
        rp.add(ev)
        if not i & 0xFFFF:
            rows = len(rp.cpu["ts"]) + len(rp.gpu["ts"]) + len(rp.mem["ts"])
            if rows > ROWS_FREE + scan.chars_read / MIN_CHARS_PER_ROW:
                raise TraceError(f"{path}: {rows:,} events in {scan.chars_read:,} characters: fewer than "
                                 f"{MIN_CHARS_PER_ROW} characters per event, not a profiler trace")
    return rp, scan.meta


def _rank_info(path: Path, meta: dict, rp: _RankParser, fallback_rank: int) -> RankInfo:
    di = meta.get("distributedInfo")
    di = di if isinstance(di, dict) else {}
    rank = _int(di.get("rank"), -1)
    if rank < 0:
        m = _RANK_RE.search(path.name)
        rank = int(m.group(1)) if m else fallback_rank
    ws = _int(di.get("world_size"), -1)
    ws = ws if 0 < ws <= (1 << 22) else -1          # nonsense values: unknown
    devs = meta.get("deviceProperties")
    devices = [d.get("name") for d in devs if isinstance(d, dict) and d.get("name")] if isinstance(devs, list) else []
    pgs = []
    for pg in di.get("pg_config") or []:
        if not isinstance(pg, dict):
            continue
        ranks = _parse_ranks(pg.get("ranks"))
        pgs.append({"name": str(pg.get("pg_name", len(pgs))), "desc": pg.get("pg_desc"),
                    "ranks": ranks, "backend": pg.get("backend_config"),
                    "size": _int(pg.get("pg_size"), len(ranks) if ranks else -1)})
    base = meta.get("baseTimeNanoseconds")
    base = int(base) if isinstance(base, (int, float)) and not isinstance(base, bool) and math.isfinite(base) \
        and 0 < base < 1e20 else None
    host = meta.get("host_name")
    # the GPU device used by this rank: the device of its kernels, else deviceProperties[rank % n]
    if len(rp.gpu["device"]) and devices:
        dev_ids = pd.Series(np.frombuffer(rp.gpu["device"], dtype=np.int64)).value_counts()
        did = int(dev_ids.index[0])
        names = {d.get("id"): d.get("name") for d in devs if isinstance(d, dict)}
        if did in names and names[did]:
            devices = [names[did]] + [d for d in devices if d != names[did]]
    elif not len(rp.gpu["ts"]):
        devices = []            # CPU-only trace: deviceProperties lists GPUs it did not use
    return RankInfo(rank=rank, path=path, world_size=ws if ws > 0 else None, backend=di.get("backend"),
                    devices=devices, distributed_info=di, process_groups=pgs,
                    host=host if isinstance(host, (str, int, float)) else None,
                    base_time_ns=base, thread_names={t: n for (p, t), n in rp.thread_names.items()},
                    negative_durations=rp.negative_durations)


# --------------------------------------------------------------------------------------------- nesting
_NEST_BLOCK = 1 << 16       # rows per block of _nest


def _nest(ts: np.ndarray, end: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """parent (row, -1) and depth of every interval, nesting within equal ``keys`` (thread)."""
    n = len(ts)
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return parent, depth
    order = np.lexsort((-(end - ts), ts, keys))
    eps = 1e-3  # us: rounding in exported timestamps
    stack: list[tuple] = []         # (row, start, end) of the enclosing intervals
    prev_key = None
    # rows in sorted order, converted to Python numbers a block at a time (whole-column lists of millions
    # of floats were the largest transient of parsing)
    for lo in range(0, n, _NEST_BLOCK):
        rows = order[lo:lo + _NEST_BLOCK]
        for i, t0, t1, key in zip(rows.tolist(), ts[rows].tolist(), end[rows].tolist(), keys[rows].tolist()):
            if key != prev_key:
                stack.clear()
                prev_key = key
            while stack and not (t0 >= stack[-1][1] - eps and t1 <= stack[-1][2] + eps
                                 and t0 < stack[-1][2] + (eps if t1 > t0 else 0.0)):
                stack.pop()
            if stack:
                parent[i] = stack[-1][0]
                depth[i] = len(stack)
            stack.append((i, t0, t1))
    return parent, depth


# --------------------------------------------------------------------------------------------- frames of one rank
def _frames(rp: _RankParser, info: RankInfo) -> dict:
    cpu, gpu, mem = _frame(rp.cpu), _frame(rp.gpu), _frame(rp.mem)
    for k in ("cpu", "gpu", "mem"):
        setattr(rp, k, None)            # the buffers are in the frames now: free them
    # microseconds from this rank's first event: small numbers keep sub-ns precision
    first = rp.min_ts if math.isfinite(rp.min_ts) else 0.0
    for df in (cpu, gpu, mem):
        if len(df):
            df["ts"] = df["ts"] - first
    cpu["end"] = cpu["ts"] + cpu["dur"]
    gpu["end"] = gpu["ts"] + gpu["dur"]
    # nesting per thread
    # gloo:<op> annotations are asynchronous spans (post -> completion) that overlap the thread's other
    # work (isend/irecv on the main thread): nest them apart so they do not adopt unrelated ops
    gloo = _name_test(cpu["name"], lambda n: n.startswith("gloo:"))
    pid_c, n_pid = _str_codes(cpu["pid"])
    tid_c, n_tid = _str_codes(cpu["tid"])
    tid_codes = (tid_c * n_pid + pid_c) * 2 + gloo       # one key per (pid, tid, lane) as strings
    parent, depth = _nest(cpu["ts"].to_numpy(float), cpu["end"].to_numpy(float), tid_codes)
    cpu["parent"], cpu["depth"] = parent, depth
    # steps
    is_step = _name_test(cpu["name"], lambda n: n.startswith("ProfilerStep")) & \
        cpu["cat"].isin(["user_annotation", "cpu_op"]).to_numpy()
    steps = cpu.loc[is_step, ["ts", "dur", "end", "name", "pid", "tid"]].copy()
    digits = steps["name"].str.extract(_STEP_RE, expand=False).fillna("-1")
    huge = digits.str.len() > 15
    if huge.any():
        raise TraceError(f"{info.path}: step number of {steps['name'][huge].iloc[0][:40]!r}... is too large "
                         f"(ProfilerStep#N with N of more than 15 digits)")
    unnumbered = digits == "-1"
    if unnumbered.any():        # (they had all become one step -1, the others dropped without a word)
        name = str(steps["name"][unnumbered].iloc[0])[:40]
        raise TraceError(f"{info.path}: step event {name!r} has no step number (ProfilerStep#N with N a whole "
                         f"number >= 0, as torch.profiler names its steps)")
    steps["step"] = digits.astype(np.int64)
    dur = steps["dur"].to_numpy(float)
    bad = ~(np.isfinite(dur) & (dur > 0) & (dur < MAX_STEP_US))
    if bad.any():       # (a negative or unreadable "dur" was read as 0)
        i = int(np.argmax(bad))
        raise TraceError(f"{info.path}: step event {str(steps['name'].iloc[i])[:40]!r} has no usable duration "
                         f"(read as {dur[i]:g} us): a profiled step lasts a positive time under "
                         f"{MAX_STEP_US / 1e6:g} s")
    twice = steps["step"].duplicated()
    if twice.any():
        n = int(steps["step"][twice].iloc[0])
        raise TraceError(f"{info.path}: two ProfilerStep#{n} events on one rank; a trace profiles each step once")
    steps = steps.sort_values("ts")
    steps["cpu_row"] = steps.index
    steps = steps.reset_index(drop=True)
    info.main_tid = steps["tid"].iloc[0] if len(steps) else _most_common(cpu["tid"])
    info.pid = steps["pid"].iloc[0] if len(steps) else _most_common(cpu["pid"])
    st0, st1 = steps["ts"].to_numpy(float), steps["end"].to_numpy(float)
    stepno = steps["step"].to_numpy(int)

    def step_of(ts: np.ndarray) -> np.ndarray:
        if len(st0) == 0:
            return np.full(len(ts), -1, dtype=np.int64)
        i = np.searchsorted(st0, ts, side="right") - 1
        ok = (i >= 0) & (ts < st1[np.clip(i, 0, None)])
        return np.where(ok, stepno[np.clip(i, 0, None)], -1)

    cpu["step"] = step_of(cpu["ts"].to_numpy(float))
    # kernels -> launching runtime (correlation) -> enclosing op
    gpu["launch"] = -1
    if len(gpu):
        rt = cpu.index[cpu["cat"].isin(["cuda_runtime", "cuda_driver"]) & (cpu["correlation"] >= 0)]
        corr_to_row = pd.Series(rt, index=cpu.loc[rt, "correlation"].to_numpy())
        corr_to_row = corr_to_row[~corr_to_row.index.duplicated()]
        gpu["launch"] = gpu["correlation"].map(corr_to_row).fillna(-1).astype(np.int64)
    launch = gpu["launch"].to_numpy()
    has = launch >= 0
    op = np.full(len(gpu), -1, dtype=np.int64)
    op[has] = cpu["parent"].to_numpy()[launch[has]]
    gpu["op"] = op
    op_name = np.full(len(op), None, dtype=object)
    op_name[op >= 0] = take(cpu["name"], op[op >= 0])
    gpu["op_name"] = op_name.tolist()
    gstep = np.full(len(gpu), -1, dtype=np.int64)
    gstep[has] = cpu["step"].to_numpy()[launch[has]]
    gpu["step"] = gstep
    gpu["is_comm"] = gpu.index.isin(list(rp.gpu_extra))
    if len(steps):
        gend = gpu[gpu["step"] >= 0].groupby("step")["end"].max()
        steps["gpu_end"] = steps["step"].map(gend)
    else:
        steps["gpu_end"] = pd.Series(dtype=float)
    # backward node -> forward op by sequence number
    cpu["fwd_op"] = _link_fwd(cpu)
    colls = _collectives(cpu, gpu, rp, info)
    return {"steps": steps, "cpu_ops": cpu, "kernels": gpu, "collectives": colls, "memory": mem}


def _str_codes(col: pd.Series) -> tuple[np.ndarray, int]:
    """Codes of ``str(value)`` for an object column (equal codes for equal strings) and their count,
    without making one string per row (millions of rows hold a few distinct pids / tids)."""
    codes, uniq = pd.factorize(col)                      # None -> -1
    strs = ["None"] + [str(u) for u in uniq]
    same, inv = np.unique(strs, return_inverse=True)
    return inv[codes + 1].astype(np.int64), len(same)


def _name_test(col: pd.Series, test) -> np.ndarray:
    """``test(name)`` for every row of a name column, evaluated once per distinct name."""
    codes, uniq = pd.factorize(col)                      # per distinct value (no string per row)
    hit = np.array([isinstance(u, str) and bool(test(u)) for u in uniq] + [False], dtype=bool)
    return hit[codes]                                    # code -1 (missing name) -> the last entry, False


def _most_common(col: pd.Series):
    """The most frequent value of ``col`` (None counts too), None for an empty column."""
    counts = col.value_counts(dropna=False)
    return counts.index[0] if len(counts) else None


def _link_fwd(cpu: pd.DataFrame) -> np.ndarray:
    out = np.full(len(cpu), -1, dtype=np.int64)
    seq = cpu["seq_nr"].to_numpy()
    if not (seq >= 0).any():
        return out
    is_bwd = _name_test(cpu["name"], lambda n: _BACKWARD_RE.search(n) or
                        n.startswith("autograd::engine::evaluate_function"))
    fwd = np.flatnonzero((seq >= 0) & ~is_bwd)
    # prefer the GEMM (it carries FLOPs), else the outermost op with that number (stable: then the first row)
    gemm = ~np.isnan(cpu["flops"].to_numpy(float)[fwd])
    fwd = fwd[np.lexsort((cpu["depth"].to_numpy()[fwd], ~gemm))]
    fseq, first = np.unique(seq[fwd], return_index=True)       # first occurrence of each sequence number
    label = cpu.index.to_numpy()[fwd[first]]
    bwd_rows = np.flatnonzero(is_bwd & (seq >= 0))
    at = np.searchsorted(fseq, seq[bwd_rows]).clip(0, max(len(fseq) - 1, 0))
    found = (fseq[at] == seq[bwd_rows]) if len(fseq) else np.zeros(len(bwd_rows), dtype=bool)
    out[bwd_rows] = np.where(found, label[at] if len(fseq) else -1, -1)
    return out


# --------------------------------------------------------------------------------------------- collectives
def _size_from_dims(kind: str, name: str, dims, elem: float, group_size: int) -> tuple[float, float, float]:
    """(size_bytes, in_nelems, out_nelems) from a c10d op's / gloo annotation's Input Dims."""
    if not isinstance(dims, list) or not dims or not math.isfinite(elem):
        return math.nan, math.nan, math.nan
    a0 = sum(_tensor_numels(dims[0]))
    a1 = sum(_tensor_numels(dims[1])) if len(dims) > 1 else 0
    base = name.split("::")[-1]
    if name.startswith("gloo:") or name.startswith("nccl:"):
        n = a0
        return n * elem, n, n
    if kind == "all_gather":
        if base in ("_allgather_base_", "allgather_into_tensor_coalesced_"):
            return a0 * elem, a1, a0                          # (output, input)
        return a1 * max(group_size, 1) * elem, a1, a1 * max(group_size, 1)   # (outputs list, input)
    if kind == "reduce_scatter":
        if base in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
            return a1 * elem, a1, a0                          # (output, input)
        return a0 * max(group_size, 1) * elem, a0 * max(group_size, 1), a0
    if kind == "all_to_all":
        if base == "alltoall_base_":
            return a1 * elem, a1, a0                          # (output, input, splits...)
        return a1 * elem, a1, a0
    if kind == "barrier":
        return 0.0, 0.0, 0.0
    return a0 * elem, a0, a0


def _size_from_nelems(kind: str, in_n: float, out_n: float, elem: float) -> float:
    if not math.isfinite(elem):
        return math.nan
    if kind == "all_gather":
        return out_n * elem
    if kind in ("reduce_scatter", "all_to_all"):
        return in_n * elem
    if kind == "barrier":
        return 0.0
    return (in_n if math.isfinite(in_n) else out_n) * elem


def _input_type(extra: dict) -> str | None:
    t = extra.get("Input type")
    if isinstance(t, list):
        for x in t:
            if isinstance(x, str) and x and x not in ("Scalar", "TensorList", "ScalarList", "GenericList"):
                return x
    return None


def _peer(extra: dict) -> int:
    ci = extra.get("Concrete Inputs")
    if isinstance(ci, list) and len(ci) >= 2:
        # c10d::send(tensors, dstRank, tag) / recv_(tensors, srcRank, tag); newer torch prepends the PG
        for v in ci[1:]:
            p = _int(v, -1)
            if p >= 0:
                return p
    return -1


class _CommInfo:
    """Everything known about one collective, merged from the events that describe it."""

    __slots__ = ("kind", "impl", "name", "in_n", "out_n", "dtype", "elem", "group_size", "group_ranks", "pg",
                 "dims", "dims_name", "peer", "issue_row", "issue_ts", "issue_end", "issue_tid")

    def __init__(self):
        self.kind = self.impl = self.name = self.dtype = self.pg = None
        self.in_n = self.out_n = self.elem = math.nan
        self.group_size = -1
        self.group_ranks = None
        self.dims = self.dims_name = None
        self.peer = -1
        self.issue_row = -1
        self.issue_ts = self.issue_end = math.nan
        self.issue_tid = None

    def absorb(self, name: str, extra: dict) -> None:
        k = normalize_kind(extra.get("Collective name")) or normalize_kind(name)
        if k and (self.kind is None or (self.kind == "sendrecv" and k != "sendrecv")):
            self.kind = k
        if self.name is None or name.startswith("c10d::"):
            self.name = name
        if "In msg nelems" in extra and not math.isfinite(self.in_n):
            self.in_n = _num(extra["In msg nelems"])
            self.out_n = _num(extra.get("Out msg nelems"))
        if extra.get("dtype") and self.dtype is None:
            self.dtype = str(extra["dtype"])
        gs = _int(extra.get("Group size"), -1)
        if gs > 0 and self.group_size < 0:
            self.group_size = gs
        r = _parse_ranks(extra.get("Process Group Ranks"))
        if r and self.group_ranks is None:
            self.group_ranks = r
        if extra.get("Process Group Name") is not None and self.pg is None:
            self.pg = str(extra["Process Group Name"])
        dims = extra.get("Input Dims")
        if isinstance(dims, list) and sum(_tensor_numels(dims[:2])) > 0 and (
                self.dims is None or name.startswith("c10d::")):
            self.dims, self.dims_name = dims, name
        t = _input_type(extra)
        if t and self.dtype is None:
            self.dtype = t
        if self.peer < 0:
            self.peer = _peer(extra) if name.startswith("c10d::") else -1


def take(col: pd.Series, rows: np.ndarray) -> np.ndarray:
    """``col``'s values at positions ``rows`` as an object array, converting only those (a string column
    held by Arrow would otherwise make a Python string for every row)."""
    return np.asarray(col.array[np.asarray(rows, dtype=np.int64)], dtype=object)


def _names_at(cpu: pd.DataFrame, rows) -> dict:
    """Row -> name for a few rows (not a Python string for each of millions of rows)."""
    rows = np.fromiter(rows, dtype=np.int64)
    return dict(zip(rows.tolist(), take(cpu["name"], rows).tolist()))


def _comm_roots(cpu: pd.DataFrame, extra: dict) -> dict[int, list[int]]:
    """Comm-ish CPU events grouped by their outermost comm-ish ancestor on the same thread."""
    parent = cpu["parent"].to_numpy()
    names = _names_at(cpu, extra)
    is_comm = {r for r in extra if not names[r].startswith("gloo:")}
    roots: dict[int, list[int]] = {r: [r] for r in extra if names[r].startswith("gloo:")}
    for r in sorted(is_comm):
        root, p = r, parent[r]
        while p >= 0:
            if p in is_comm:
                root = p
            p = parent[p]
        roots.setdefault(root, []).append(r)
    return roots


def _resolve_group(ci: _CommInfo, info: RankInfo, world: int | None) -> None:
    pgs = info.process_groups
    if ci.group_ranks is None and ci.pg is not None:
        for pg in pgs:
            if pg["name"] == ci.pg and pg["ranks"]:
                ci.group_ranks = pg["ranks"]
    if ci.group_ranks is None:
        member = [pg for pg in pgs if pg["ranks"] and info.rank in pg["ranks"]]
        if ci.group_size > 0:
            member = [pg for pg in member if len(pg["ranks"]) == ci.group_size]
        if len({pg["ranks"] for pg in member}) == 1:
            ci.group_ranks = member[0]["ranks"]
            ci.pg = ci.pg or member[0]["name"]
        elif ci.group_size > 0 and world and ci.group_size == world:
            ci.group_ranks = tuple(range(world))
        elif ci.group_size < 0 and world and not member:
            ci.group_ranks = tuple(range(world))
    if ci.group_ranks is not None and ci.group_size < 0:
        ci.group_size = len(ci.group_ranks)
    if ci.kind in ("send", "recv") and ci.peer < 0 and ci.group_ranks and len(ci.group_ranks) == 2:
        ci.peer = [r for r in ci.group_ranks if r != info.rank][0]


def _finish_size(ci: _CommInfo) -> float:
    kind = ci.impl if ci.kind == "sendrecv" else ci.kind
    elem = dtype_bytes(ci.dtype)
    ci.elem = elem
    if math.isfinite(ci.in_n) or math.isfinite(ci.out_n):
        return _size_from_nelems(kind or "", ci.in_n, ci.out_n, elem)
    if ci.dims is not None:
        size, i, o = _size_from_dims(kind or "", ci.dims_name or "", ci.dims, elem, ci.group_size)
        ci.in_n, ci.out_n = i, o
        return size
    return math.nan


def _gloo_thread_groups(tids: set, info: RankInfo) -> dict:
    """Worker thread -> process-group name for gloo: every gloo process group starts its worker threads
    (two by default) together, so thread ids cluster; clusters in id order map to this rank's gloo process
    groups in creation order (``distributedInfo.pg_config``). Empty when the counts disagree."""
    try:
        ids = sorted(int(t) for t in tids)
    except (TypeError, ValueError):
        return {}
    clusters: list[list[int]] = []
    for t in ids:
        if clusters and t - clusters[-1][-1] <= 2:
            clusters[-1].append(t)
        else:
            clusters.append([t])
    pgs = [pg for pg in info.process_groups if pg["ranks"] and info.rank in pg["ranks"]
           and "gloo" in str(pg.get("backend") or "gloo")]
    if not clusters or len(clusters) != len(pgs):
        return {}
    return {t: pg["name"] for c, pg in zip(clusters, pgs) for t in c}


def _collectives(cpu: pd.DataFrame, gpu: pd.DataFrame, rp: _RankParser, info: RankInfo) -> pd.DataFrame:
    extra = rp.cpu_extra
    roots = _comm_roots(cpu, extra)
    names = _names_at(cpu, extra)
    ts, end, tid = cpu["ts"].to_numpy(float), cpu["end"].to_numpy(float), cpu["tid"].to_numpy(object)
    parent = cpu["parent"].to_numpy()
    world = info.world_size
    rows = []

    def info_of(root: int) -> _CommInfo:
        ci = _CommInfo()
        for r in roots.get(root, [root]):
            ci.absorb(names[r], extra.get(r, {}))
        ci.issue_row, ci.issue_ts, ci.issue_end, ci.issue_tid = root, ts[root], end[root], tid[root]
        return ci

    def root_of(row: int) -> int:
        root, p = -1, row
        while p >= 0:
            if p in extra:
                root = p
            p = parent[p]
        return root

    nccl_rows = sorted(rp.gpu_extra)
    if nccl_rows:
        gop = gpu["op"].to_numpy()
        for k in nccl_rows:
            root = root_of(gop[k]) if gop[k] >= 0 else -1
            ci = info_of(root) if root >= 0 else _CommInfo()
            kx = rp.gpu_extra[k]
            # the kernel's own args describe exactly this kernel: they win
            if kx:
                ci2 = _CommInfo()
                ci2.absorb(gpu.at[k, "name"], kx)
                for a in ("kind", "dtype", "group_ranks", "pg"):
                    if getattr(ci2, a) is not None:
                        setattr(ci, a, getattr(ci2, a))
                if math.isfinite(ci2.in_n):
                    ci.in_n, ci.out_n = ci2.in_n, ci2.out_n
                if ci2.group_size > 0:
                    ci.group_size = ci2.group_size
            if ci.kind is None or ci.kind == "sendrecv":
                ci.impl = normalize_kind(gpu.at[k, "name"])
                ci.kind = ci.kind if ci.kind and ci.kind != "sendrecv" else ci.impl
            ci.impl = normalize_kind(gpu.at[k, "name"]) or ci.kind
            if ci.name is None:
                ci.name = gpu.at[k, "name"]
            rows.append((ci, gpu.at[k, "ts"], gpu.at[k, "dur"], f"cuda:{gpu.at[k, 'stream']}", k, "gpu"))
    else:
        enq = [r for r in roots if not names[r].startswith("gloo:")]
        work = [r for r in roots if names[r].startswith("gloo:")]
        enq_info = [(r, info_of(r)) for r in sorted(enq, key=lambda r: ts[r])]
        enq_info = [(r, ci) for r, ci in enq_info if ci.kind and ci.kind != "sendrecv"]
        work = sorted(work, key=lambda r: ts[r])
        used = [False] * len(work)
        lane_pg = _gloo_thread_groups({tid[w] for w in work} - {tid[r] for r in enq}, info)
        for r, ci in enq_info:
            # gloo's queue is FIFO per process group: the first unused compatible work that starts after the
            # enqueue; among the process groups' queues, the earliest such work
            best = None
            heads_seen = set()
            for j, w in enumerate(work):
                if used[j] or ts[w] < ts[r] - 1.0:
                    continue
                lane = tid[w] if tid[w] != tid[r] else "same"
                if lane in heads_seen:
                    continue
                wk = normalize_kind(names[w])
                compatible = wk == ci.kind or (ci.kind == "reduce_scatter" and wk == "all_reduce") or \
                    (ci.kind == "all_gather" and wk == "all_gather") or ci.kind == "barrier"
                if lane == "same" and ts[w] < end[r] - 1.0 and ts[w] < ts[r]:
                    continue
                if compatible:
                    best = j
                    break
                heads_seen.add(lane)
            if best is not None:
                used[best] = True
                w = work[best]
                ci.impl = normalize_kind(names[w]) or ci.kind
                ci.absorb(names[w], extra.get(w, {}))
                if ci.pg is None and tid[w] in lane_pg:
                    ci.pg = lane_pg[tid[w]]
                stream = f"gloo:{tid[w]}" if tid[w] != tid[r] else f"cpu:{tid[w]}"
                rows.append((ci, ts[w], end[w] - ts[w], stream, -1, "worker"))
            else:
                ci.impl = ci.kind
                rows.append((ci, ts[r], end[r] - ts[r], f"cpu:{tid[r]}", -1, "cpu"))
    out = []
    for ci, t0, dur, stream, krow, timing in rows:
        if not ci.kind or ci.kind == "sendrecv" and not ci.impl:
            continue
        _resolve_group(ci, info, world)
        size = _finish_size(ci)
        out.append({
            "kind": ci.kind, "impl": ci.impl or ci.kind, "backend": info.backend or ("nccl" if krow >= 0 else None),
            "name": ci.name, "size_bytes": size, "in_nelems": ci.in_n, "out_nelems": ci.out_n, "dtype": ci.dtype,
            "group_size": ci.group_size, "group_ranks": ci.group_ranks, "pg": ci.pg, "peer": ci.peer,
            "ts": t0, "dur": dur, "end": t0 + dur, "issue_ts": ci.issue_ts, "issue_end": ci.issue_end,
            "stream": stream, "kernel": krow, "op": ci.issue_row, "timing": timing,
        })
    cols = ["kind", "impl", "backend", "name", "size_bytes", "in_nelems", "out_nelems", "dtype", "group_size",
            "group_ranks", "pg", "peer", "ts", "dur", "end", "issue_ts", "issue_end", "stream", "kernel", "op",
            "timing"]
    df = pd.DataFrame(out, columns=cols)
    if len(df):
        df = df.sort_values("ts" if nccl_rows else "issue_ts", kind="stable").reset_index(drop=True)
        gkey = df["pg"].fillna("").astype(str) + "|" + \
            df["group_ranks"].map(lambda r: r if r is not None else ()).astype(str) + "|" + \
            df["kind"].where(df["kind"].isin(["send", "recv"]), "coll") + "|" + df["peer"].astype(str).where(
                df["kind"].isin(["send", "recv"]), "")
        df["seq"] = df.groupby(gkey).cumcount()
        st = cpu["step"].to_numpy()
        kst = gpu["step"].to_numpy() if len(gpu) else np.array([], dtype=np.int64)
        df["step"] = [int(st[int(o)]) if o >= 0 else (int(kst[k]) if k >= 0 else -1)
                      for o, k in zip(df["op"], df["kernel"])]
    else:
        df["seq"] = pd.Series(dtype=np.int64)
        df["step"] = pd.Series(dtype=np.int64)
    return df


# --------------------------------------------------------------------------------------------- public
def trace_files(path: str | Path) -> list[Path]:
    """The trace files of ``path``: the file itself, or the .json / .json.gz files of a folder (searched
    recursively when the folder has none at its top), without manifests and calibration files."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"trace path {p} does not exist")
    if p.is_file():
        return [p]

    def ok(f: Path) -> bool:
        n = f.name.lower()
        return f.is_file() and n.endswith(TRACE_SUFFIXES) and not n.startswith(("manifest", "calib", ".")) and \
            "calibration" not in n
    files = sorted(f for f in p.iterdir() if ok(f))
    if not files:
        files = sorted(f for f in p.rglob("*") if ok(f))
    if not files:
        raise TraceError(f"no trace files (*.json, *.json.gz) in {p}")
    return files


MANIFEST_FORMAT = "clustersim-trace-manifest"


def load_manifest(path: str | Path) -> dict:
    """The collector's ``manifest.json`` (bounded read, validated to be a mapping); TraceError otherwise."""
    from simulator.inputs import JSON_LIMIT_BYTES, brief, load_json
    data = load_json(path, "manifest", JSON_LIMIT_BYTES, err=TraceError)
    if not isinstance(data, dict):
        raise TraceError(f"manifest {path}: expected a JSON object, got {brief(data)}")
    for key in ("devices", "hostnames"):
        v = data.get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise TraceError(f"manifest {path}: {key} must be a list of strings, got {brief(v)}")
    ws = data.get("world_size")
    if ws is not None and (isinstance(ws, bool) or not isinstance(ws, int) or not 0 < ws <= 1 << 24):
        raise TraceError(f"manifest {path}: world_size must be an integer from 1 to {1 << 24:,}, got {brief(ws)}")
    return data


def folder_manifest(folder: Path) -> dict | None:
    """``folder/manifest.json`` of a collector run, or None when there is none."""
    m = Path(folder) / "manifest.json"
    return load_manifest(m) if m.is_file() else None


def one_run_problems(trace: Trace, manifest: dict | None) -> list[str]:
    """Why the files of ``trace`` do not look like one run (empty when they do): ranks outside the
    manifest's world or missing from its ``trace_files``, steps its ``profiler.profiled_steps`` does not name,
    ranks that disagree on the world size, or that share no ProfilerStep number."""
    problems = []
    names = {r: i.path.name for r, i in trace.ranks.items()}
    sizes = {i.world_size for i in trace.ranks.values() if i.world_size}
    if len(sizes) > 1:
        problems.append(f"the files disagree on the world size ({', '.join(map(str, sorted(sizes)))})")
    if manifest is not None and manifest.get("format") == MANIFEST_FORMAT and manifest.get("mode") != "bench":
        ws = manifest.get("world_size")
        if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0:
            if sizes and ws not in sizes:
                problems.append(f"manifest.json says world_size {ws} but the traces' distributedInfo says "
                                f"{', '.join(map(str, sorted(sizes)))}")
            extra = sorted(r for r in trace.ranks if r >= ws)
            if extra:
                problems.append(f"manifest.json says world_size {ws} but {', '.join(names[r] for r in extra)} "
                                f"hold{'s' if len(extra) == 1 else ''} rank{'s' if len(extra) > 1 else ''} "
                                f"{', '.join(map(str, extra))}")
        prof = manifest.get("profiler")
        said = prof.get("profiled_steps") if isinstance(prof, dict) else None
        if isinstance(said, list) and said and all(isinstance(x, int) and not isinstance(x, bool) for x in said) \
                and len(trace.steps):
            held = sorted(set(trace.steps["step"].tolist()) - set(said))
            if held:
                problems.append(f"manifest.json says steps {_span(tuple(sorted(said)))} were profiled but the traces "
                                f"hold step{'s' if len(held) > 1 else ''} {_span(tuple(held))}")
        listed = manifest.get("trace_files")
        if isinstance(listed, dict):
            known = {str(v) for v in listed.values()}
            stray = sorted(n for n in names.values() if n not in known)
            if stray:
                problems.append(f"{', '.join(stray)} not listed in manifest.json's trace_files")
    if len(trace.steps):
        # a rank may miss a step the others profiled (replay handles that); ranks of one run share steps
        per_rank = trace.steps[trace.steps["step"] >= 0].groupby("rank")["step"].apply(lambda s: tuple(sorted(s)))
        if len(per_rank) > 1 and not set.intersection(*(set(v) for v in per_rank)):
            shown = "; ".join(f"{names.get(r, r)}: steps {_span(v)}" for r, v in per_rank.items())
            problems.append(f"the ranks share no profiled step ({shown[:300]})")
    return problems


def _span(steps: tuple) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if list(steps) == list(range(steps[0], steps[-1] + 1)) else \
        ",".join(map(str, steps[:8])) + ("..." if len(steps) > 8 else "")


def check_one_run(trace: Trace, allow_mixed: bool = False) -> Trace:
    """Raise TraceError naming the disagreement when a folder mixes runs (unless ``allow_mixed``)."""
    if allow_mixed or not Path(trace.path).is_dir():
        return trace
    problems = one_run_problems(trace, folder_manifest(Path(trace.path)))
    if problems:
        raise TraceError(f"{trace.path} mixes files of different runs: {'; '.join(problems)}. Collect into an "
                         f"empty folder, or pass --allow-mixed to use them anyway")
    return trace


def load_trace(path: str | Path, *, progress=None) -> Trace:
    """Parse a Kineto trace file or a folder of per-rank files into a ``Trace``."""
    files = trace_files(path)
    parsed = []
    for i, f in enumerate(files):
        rp, meta = _parse_file(f)
        if not len(rp.cpu["ts"]) and not len(rp.gpu["ts"]):
            raise TraceError(f"{f}: the trace holds no CPU or GPU events (was the profiler active?)")
        info = _rank_info(f, meta, rp, i)
        parsed.append((info, rp, meta))
        if progress:
            progress(i + 1, len(files))
    by_rank: dict[int, tuple] = {}
    for info, rp, meta in parsed:
        if info.rank in by_rank:
            raise TraceError(f"{by_rank[info.rank][0].path} and {info.path} both hold rank {info.rank}; pass the "
                             f"folder of one run (one file per rank)")
        by_rank[info.rank] = (info, rp, meta)
    # common clock: baseTimeNanoseconds + ts (us); a base on some ranks only would offset those by decades
    lacking = sorted(r for r, (info, _, _) in by_rank.items() if info.base_time_ns is None)
    if lacking and len(lacking) != len(by_rank):
        raise TraceError(f"{by_rank[lacking[0]][0].path}: no valid baseTimeNanoseconds (a positive number of ns), "
                         f"which the other ranks' traces have: the ranks cannot be put on one clock")
    for info, rp, _ in by_rank.values():
        info.start_abs_us = (info.base_time_ns or 0) / 1e3 + rp.min_ts
    origin = min(info.start_abs_us for info, _, _ in by_rank.values())
    hosts = {info.host for info, _, _ in by_rank.values()}
    shared = len(hosts) == 1
    frames = {k: [] for k in ("steps", "cpu_ops", "kernels", "collectives", "memory")}
    offsets = {"cpu_ops": 0, "kernels": 0}
    for rank in sorted(by_rank):
        info, rp, _ = by_rank[rank]
        fr = _frames(rp, info)
        # times relative to this rank's first event stay precise; then the rank's offset on the common clock
        offset_us = info.start_abs_us - origin if math.isfinite(rp.min_ts) else 0.0
        for name, df in fr.items():
            for col in ("ts", "end", "gpu_end", "issue_ts", "issue_end"):
                if col in df:
                    df[col] = (df[col] + offset_us) * 1e-6
            if "dur" in df:
                df["dur"] = df["dur"] * 1e-6
            df.insert(0, "rank", rank)
        # relabel link columns to global row labels
        co, ko = offsets["cpu_ops"], offsets["kernels"]
        c = fr["cpu_ops"]
        for col in ("parent", "fwd_op"):
            c[col] = np.where(c[col] >= 0, c[col] + co, -1)
        k = fr["kernels"]
        for col in ("launch", "op"):
            k[col] = np.where(k[col] >= 0, k[col] + co, -1)
        cl = fr["collectives"]
        cl["op"] = np.where(cl["op"] >= 0, cl["op"] + co, -1)
        cl["kernel"] = np.where(cl["kernel"] >= 0, cl["kernel"] + ko, -1)
        fr["steps"]["cpu_row"] = fr["steps"]["cpu_row"] + co
        offsets["cpu_ops"] += len(c)
        offsets["kernels"] += len(k)
        for name in frames:
            frames[name].append(fr[name])
    out = {}
    for name, lst in frames.items():
        lst = [d for d in lst if len(d)] or lst[:1]
        out[name] = lst[0] if len(lst) == 1 else pd.concat(lst, ignore_index=True) if lst else pd.DataFrame()
        lst.clear()
    return Trace(path=Path(path), ranks={r: v[0] for r, v in by_rank.items()}, origin_us=origin,
                 shared_clock=shared, **out)


def main(argv=None) -> int:   # pragma: no cover - debugging aid
    t = load_trace((argv or sys.argv[1:])[0])
    print({r: (i.device, i.world_size, i.backend) for r, i in t.ranks.items()})
    for name in ("steps", "cpu_ops", "kernels", "collectives", "memory"):
        print(name, len(getattr(t, name)))
    print(t.steps)
    print(t.collectives.head(20).to_string())
    return 0


if __name__ == "__main__":   # pragma: no cover
    sys.exit(main())

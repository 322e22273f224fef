"""Hand-made Kineto traces with known contents (times in microseconds, as Kineto writes them).

``nccl_rank(rank)`` builds one rank of a 2-rank NCCL data-parallel job, two ProfilerSteps of 1000 us, each
with a forward GEMM (launching one kernel), a backward GEMM, and one all_reduce of 1 Mi floats on group
[0, 1] issued by c10d::allreduce_ > record_param_comms > nccl:all_reduce and run as an NCCL kernel.
``skew_us`` shifts a rank's clock; its NCCL kernels then end with the other rank's (they wait for nobody).
``gloo_rank(rank)`` builds a CPU/gloo rank with the same structure (gloo worker-thread annotations).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

STEP_US = 1000.0
ALLREDUCE_NELEMS = 1 << 20      # floats -> 4 MiB
NCCL_KERNEL_US = 120.0


def _x(name, cat, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def nccl_rank(rank: int, *, world: int = 2, base_ts: float = 5_000_000.0, with_args: bool = True,
              skew_us: float = 0.0) -> dict:
    pid, tid = 100 + rank, 100 + rank
    ev = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "main"}}]
    corr = 1
    for s in range(2):
        t0 = base_ts + skew_us + s * STEP_US
        ev.append(_x(f"ProfilerStep#{s + 3}", "user_annotation", t0, STEP_US - 1, pid, tid))
        # forward GEMM: aten::linear > aten::addmm > cudaLaunchKernel -> kernel
        dims = {"Input Dims": [[64], [32, 128], [128, 64]], "Input type": ["float", "float", "float"]}
        ev.append(_x("aten::linear", "cpu_op", t0 + 10, 40, pid, tid, **{"Sequence number": 10 + s * 10}))
        ev.append(_x("aten::addmm", "cpu_op", t0 + 12, 30, pid, tid,
                     **({"Sequence number": 11 + s * 10, **dims} if with_args else {})))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", t0 + 20, 5, pid, tid, correlation=corr))
        ev.append(_x("ampere_sgemm_64x64_nn", "kernel", t0 + 30, 50, 0, 7,
                     device=0, stream=7, correlation=corr))
        corr += 1
        # backward node matched to the forward addmm by sequence number
        ev.append(_x("AddmmBackward0", "cpu_op", t0 + 300, 60, pid, tid,
                     **({"Sequence number": 11 + s * 10} if with_args else {})))
        ev.append(_x("aten::mm", "cpu_op", t0 + 305, 40, pid, tid,
                     **({"Input Dims": [[32, 64], [64, 128]]} if with_args else {})))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", t0 + 310, 5, pid, tid, correlation=corr))
        ev.append(_x("ampere_sgemm_32x32_tn", "kernel", t0 + 320, 40, 0, 7, device=0, stream=7,
                     correlation=corr))
        corr += 1
        # all_reduce: c10d op > record_param_comms > nccl:all_reduce > launch -> NCCL kernel
        comm = {"Collective name": "allreduce", "In msg nelems": ALLREDUCE_NELEMS,
                "Out msg nelems": ALLREDUCE_NELEMS, "Group size": world, "dtype": "Float",
                "Process Group Name": "0", "Process Group Ranks": str(list(range(world)))} if with_args else {}
        ev.append(_x("c10d::allreduce_", "cpu_op", t0 + 400, 50, pid, tid))
        ev.append(_x("record_param_comms", "cpu_op", t0 + 402, 45, pid, tid, **comm))
        ev.append(_x("nccl:all_reduce", "user_annotation", t0 + 405, 40, pid, tid))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", t0 + 410, 6, pid, tid, correlation=corr))
        ev.append(_x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                     "kernel", t0 + 450, NCCL_KERNEL_US - skew_us, 0, 20, device=0, stream=20, correlation=corr,
                     **comm))
        corr += 1
        ev.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid, "tid": tid,
                   "ts": t0 + 15, "args": {"Bytes": 4096, "Total Allocated": 8192, "Total Reserved": 65536,
                                           "Device Type": 1, "Device Id": 0, "Addr": 1234}})
    trace = {"schemaVersion": 1,
             "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9}],
             "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                                 "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                                "backend_config": "cuda:nccl", "pg_size": world,
                                                "ranks": list(range(world))}]},
             "traceEvents": ev, "traceName": f"rank{rank}", "displayTimeUnit": "ms",
             "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    return trace


def gloo_rank(rank: int, *, world: int = 2, base_ts: float = 9_000_000.0) -> dict:
    """CPU-only gloo rank: one step with a c10d::allreduce_ enqueue and its gloo:all_reduce worker
    annotation, and a c10d::_reduce_scatter_base_ run by gloo as an all_reduce of the full tensor."""
    pid, tid, w1, w2 = 200 + rank, 200 + rank, 300 + rank * 10, 301 + rank * 10
    t0 = base_ts
    ev = [
        _x("ProfilerStep#1", "user_annotation", t0, 2000, pid, tid),
        _x("aten::mm", "cpu_op", t0 + 10, 300, pid, tid, **{"Input Dims": [[64, 64], [64, 64]]}),
        _x("c10d::allreduce_", "cpu_op", t0 + 400, 20, pid, tid,
           **{"Input Dims": [[[1000]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar",
                                                                             "Scalar"]}),
        _x("gloo:all_reduce", "user_annotation", t0 + 430, 200, pid, w1,
           **{"Input Dims": [[1000]], "Input type": ["float"]}),
        _x("c10d::_reduce_scatter_base_", "cpu_op", t0 + 700, 20, pid, tid,
           **{"Input Dims": [[500], [1000], [], [], [], []], "Input type": ["float", "float"]}),
        _x("gloo:all_reduce", "user_annotation", t0 + 730, 300, pid, w2,
           **{"Input Dims": [[1000]], "Input type": ["float"]}),
        _x("aten::copy_", "cpu_op", t0 + 1100, 100, pid, tid),
    ]
    return {"schemaVersion": 1, "distributedInfo": {
        "backend": "gloo", "rank": rank, "world_size": world,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo",
                       "pg_size": world, "ranks": list(range(world))}]},
        "traceEvents": ev, "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def write(trace: dict, path: Path, *, gz: bool = False, indent=None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(trace, indent=indent)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path

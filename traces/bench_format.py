"""nccl-tests-style text for the collective benchmark (``collect --bench collectives``); torch-free.

Layout after nccl-tests' (NVIDIA/nccl-tests, src/common.cu): a header naming the columns and units, one row
per size (size in bytes, count in elements, type, reduction op, root, time, algbw, busbw), and a closing
``# Avg bus bandwidth    : X`` line (GB/s, the mean busbw over the sizes). Time is printed as min / avg / max
over the timed repetitions; algbw and busbw come from the average time, as nccl-tests computes them.
"""
from __future__ import annotations

from simulator.calibration import bus_factor

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2}
NCCL_TYPE = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
#: the kinds the collective benchmark times (traces.bench_collectives), the rows a calibration reads
BENCH_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p")


def header(kind: str, world: int, backend: str) -> list[str]:
    return [f"# {kind} on {world} ranks ({backend}), out-of-place",
            "#",
            f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>7} {'root':>6} {'time min':>10} {'time avg':>10} "
            f"{'time max':>10} {'algbw':>8} {'busbw':>8}",
            f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>7} {'':>6} {'(us)':>10} {'(us)':>10} {'(us)':>10} "
            f"{'(GB/s)':>8} {'(GB/s)':>8}"]


def bandwidths(row: dict, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of a results row from its average time (time_s where no average was kept)."""
    t = row.get("time_avg_s") or row["time_s"]
    algbw = row["size_bytes"] / t / 1e9
    return algbw, algbw * bus_factor(row["kind"], world)


def row_line(row: dict, world: int) -> str:
    t = row["time_s"]
    tmin, tavg, tmax = row.get("time_min_s", t), row.get("time_avg_s", t), row.get("time_max_s", t)
    dtype = row.get("dtype", "float32")
    count = int(row["size_bytes"]) // DTYPE_BYTES.get(dtype, 4)
    redop = "sum" if row["kind"] in REDUCING else "none"
    root = 0 if row["kind"] in ("broadcast", "reduce") else -1
    algbw, busbw = bandwidths(row, world)
    return (f" {int(row['size_bytes']):>11d} {count:>12d} {NCCL_TYPE.get(dtype, dtype):>8} {redop:>7} {root:>6d} "
            f"{tmin * 1e6:>10.1f} {tavg * 1e6:>10.1f} {tmax * 1e6:>10.1f} {algbw:>8.3f} {busbw:>8.3f}")


def avg_bus_bandwidth(rows: list[dict], world: int) -> str:
    bws = [bandwidths(r, world)[1] for r in rows]
    return f"# Avg bus bandwidth    : {sum(bws) / len(bws) if bws else 0.0:g}"


def table(rows: list[dict], world: int, backend: str) -> list[str]:
    """Every line of the benchmark's report: one nccl-tests block per collective kind, in row order."""
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    out = []
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        out += header(kind, world, backend) + [row_line(r, world) for r in mine] + [avg_bus_bandwidth(mine, world), "#"]
    return out

"""Sustained GEMM rate: one matmul shape run back to back for minutes, its achieved FLOP/s per time window.

Why: the simulator's GEMM curves come from short (burst) microbenchmarks (ml-engineering's MAMF search; the
XLA perf table, single timings). A GPU held at full tensor-core load for minutes reaches its power limit and
its power management lowers the clocks; the simulator slows the burst curves by ml-engineering's published
sustained / burst ratio (MSMF / MAMF, topologies/microbench/gemm_sustained.csv) where one exists for the
device. This measures that ratio on one device, for one shape, to compare with it: no model constant is
taken from it automatically.

    python -m traces.bench_sustained [--seconds 120] [--window 1] [--shape 8192,8192,8192] [--dtype bf16]
                                     [--out sustained.json]

Per window: GEMMs launched back to back until the window's time is up, the device synchronised, achieved
FLOP/s = 2·M·N·K·count / elapsed; on NVIDIA GPUs also the SM clock (MHz), board power (W) and temperature
(°C) that ``nvidia-smi`` reports at the window's end (absent where it is not installed). The summary gives
the first window's rate, the steady rate (median of the second half's windows) and their ratio. Units: s,
FLOP/s, MHz, W, °C. Imports torch (the collector's extra).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from simulator import atomic

DTYPES = ("bf16", "fp16", "fp32")


def nvidia_smi_sample(index: int = 0) -> dict:
    """SM clock (MHz), power draw (W) and temperature (°C) of GPU ``index`` now; {} without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    try:
        clock, power, temp = (float(x) for x in out.stdout.strip().splitlines()[0].split(","))
    except ValueError:
        return {}
    return {"sm_clock_mhz": clock, "power_w": power, "temperature_c": temp}


def summarize(windows: list[dict]) -> dict:
    """First-window rate, steady rate (median of the second half's windows) and steady / first."""
    if not windows:
        raise ValueError("no windows measured")
    first = windows[0]["flops_per_s"]
    half = windows[len(windows) // 2:]
    steady = statistics.median(w["flops_per_s"] for w in half)
    return {"first_window_flops_per_s": first, "steady_flops_per_s": steady,
            "steady_over_first": steady / first if first > 0 else None,
            "min_window_flops_per_s": min(w["flops_per_s"] for w in windows)}


def run(seconds: float, window_s: float, shape: tuple[int, int, int], dtype: str, device: str | None = None,
        warmup: int = 10) -> dict:
    """Run the benchmark; return {device, shape, dtype, windows: [...], summary: {...}}."""
    import torch

    from traces.rank_io import device_name, synchronize

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not (seconds > 0 and window_s > 0 and window_s <= seconds):
        raise ValueError(f"need 0 < window ({window_s}) <= seconds ({seconds})")
    if min(shape) < 1:
        raise ValueError(f"shape must be three positive sizes M,N,K, got {shape}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    m, n, k = shape
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(device=dev, dtype=tdt)     # normal data, as MAMF's torch.randn
    b = torch.randn(k, n, generator=gen).to(device=dev, dtype=tdt)
    c = torch.empty(m, n, device=dev, dtype=tdt)
    for _ in range(warmup):
        torch.matmul(a, b, out=c)
    synchronize(dev)
    flops = 2.0 * m * n * k
    windows = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if t0 - t_start >= seconds:
            break
        count = 0
        while time.perf_counter() - t0 < window_s:
            for _ in range(8):                  # a few launches per clock read: the queue stays full
                torch.matmul(a, b, out=c)
            count += 8
        synchronize(dev)
        elapsed = time.perf_counter() - t0
        w = {"t_s": time.perf_counter() - t_start, "gemms": count, "elapsed_s": elapsed,
             "flops_per_s": flops * count / elapsed}
        if dev.type == "cuda":
            w.update(nvidia_smi_sample(dev.index or 0))
        windows.append(w)
    return {"device": device_name(dev), "shape": list(shape), "dtype": dtype, "torch": torch.__version__,
            "seconds": seconds, "window_s": window_s, "windows": windows, "summary": summarize(windows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="total run (s)")
    ap.add_argument("--window", type=float, default=1.0, help="window of each rate sample (s)")
    ap.add_argument("--shape", default="8192,8192,8192", help="M,N,K of the GEMM")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--out", default=None, help="write the JSON result here (default: print it)")
    args = ap.parse_args(argv)
    try:
        shape = tuple(int(x) for x in args.shape.split(","))
        if len(shape) != 3:
            raise ValueError
    except ValueError:
        print(f"error: --shape takes M,N,K (three integers), got {args.shape!r}", file=sys.stderr)
        return 2
    try:
        res = run(args.seconds, args.window, shape, args.dtype, args.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=1)
    if args.out:
        atomic.write_text(args.out, text + "\n")
    else:
        print(text)
    s = res["summary"]
    print(f"{res['device']}: {shape} {args.dtype}: first window {s['first_window_flops_per_s'] / 1e12:.2f} TFLOP/s, "
          f"steady {s['steady_flops_per_s'] / 1e12:.2f} TFLOP/s (x{s['steady_over_first']:.3f})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

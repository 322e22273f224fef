"""One prepared capture of a machine's calibration data (issue 5, part 6): run it whenever GPUs are available.

    python -m traces.capture --out traces/data/capture-h100 [--nproc N] [--quick]

Runs, through ``clustersim collect`` (torchrun on a free local port; NCCL with GPUs, gloo on CPUs):

1. layer benchmarks (``--bench layers``, one process): a tiny and a mid-size decoder block, forward and
   backward at their TP shards and micro-batch sizes;
2. single-process training traces of the tiny and the mid-size model (DDP on one rank): GEMMs of every shape
   a layer has, for the GEMM efficiency curve;
3. with ``N >= 2`` ranks (default: every GPU, at most 8; 2 on a CPU): the collective benchmark and a training
   trace of each strategy (ddp, fsdp, tp, pp) on N ranks;
4. ``calibrate`` over all of it: ``OUT/calibration.json`` and ``OUT/calibration.png``; ``OUT/summary.json``
   lists every run with its median step and the calibration's fits. The per-rank traces stay in the run
   folders; commit the calibration, the summary, the manifests and one trimmed trace (rank 0 of the tiny run);
5. with ``--sustained SECONDS``: ``traces.bench_sustained`` on the first device for that long
   (``OUT/sustained.json``; its first-window and steady GEMM rates go into the summary).

``--quick`` shrinks every shape and step count (the test suite runs it on CPU). Imports torch only to count
GPUs; each run is a subprocess.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from simulator.errors import ClusterSimError
from traces.calibrate import calibrate, plot
from traces.launch import launch

# (hidden, heads, seq, batch, layers): shapes that fit a 16 GB GPU in fp32 / bf16 alike
TINY = {"hidden": 256, "heads": 4, "seq": 128, "batch": 8, "layers": 2}
MID = {"hidden": 2048, "heads": 16, "seq": 2048, "batch": 4, "layers": 4}
QUICK_TINY = {"hidden": 64, "heads": 2, "seq": 32, "batch": 2, "layers": 2}
QUICK_MID = {"hidden": 128, "heads": 4, "seq": 64, "batch": 2, "layers": 2}
STRATEGIES = ("ddp", "fsdp", "tp", "pp")


def gpu_count() -> int:
    try:
        import torch
    except ImportError as e:
        raise ClusterSimError(f"traces.capture needs PyTorch ({e})") from None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def shape_args(shape: dict, keys=("hidden", "heads", "seq", "batch", "layers")) -> list[str]:
    return [x for k in keys if k in shape for x in (f"--{k}", str(shape[k]))]


def multi_rank_shape(tiny: dict, n: int) -> tuple[dict, bool]:
    """The tiny model for the n-rank runs, with a layer per pipeline stage and a head per tensor-parallel rank
    where the collector's model allows it; and whether n-way TP divides its heads and SwiGLU width."""
    from traces.models import ModelConfig     # torch is importable: gpu_count() needed it
    try:
        cfg = ModelConfig(hidden=tiny["hidden"], heads=max(tiny["heads"], n))
    except ValueError:                        # hidden does not split into n even heads
        cfg = ModelConfig(hidden=tiny["hidden"], heads=tiny["heads"])
    shape = dict(tiny, layers=max(tiny["layers"], n), heads=cfg.heads)
    return shape, cfg.heads % n == 0 and cfg.ffn % n == 0


def _median_step(run: Path) -> float | None:
    m = json.loads((run / "manifest.json").read_text())
    return (m.get("step_time_s") or {}).get("median_profiled_s")


def capture(out: Path, nproc: int | None = None, quick: bool = False, log=print,
            sustained_s: float | None = None) -> dict:
    """Run every capture of the module doc under ``out``; return the summary (also written to summary.json).
    ``sustained_s``: also run the sustained-GEMM check that long (seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    n = nproc or (min(gpus, 8) if gpus else 2)
    tiny, mid = (QUICK_TINY, QUICK_MID) if quick else (TINY, MID)
    steps = ["--steps", "4", "--active", "2"] if quick else ["--steps", "8", "--active", "4"]
    runs: list[dict] = []

    def run(name: str, nranks: int, args: list[str]) -> Path:
        d = out / name
        t0 = time.perf_counter()
        log(f"capture: {name} ({nranks} rank{'s' if nranks > 1 else ''}) ...")
        launch(nranks, [*args, "--out", str(d)], timeout_s=1800, quiet=True)
        runs.append({"name": name, "ranks": nranks, "args": args, "wall_s": round(time.perf_counter() - t0, 1)})
        return d

    dirs = [run("layers-tiny", 1, ["--bench", "layers", *shape_args(tiny, ("hidden", "heads", "seq", "batch"))]),
            run("layers-mid", 1, ["--bench", "layers", *shape_args(mid, ("hidden", "heads", "seq", "batch"))]),
            run("train-tiny", 1, ["--strategy", "ddp", *steps, *shape_args(tiny)]),
            run("train-mid", 1, ["--strategy", "ddp", *steps, *shape_args(mid)])]
    if n >= 2:
        dirs.append(run("bench-collectives", n, ["--bench", "collectives"] + (["--max-bytes", "65536"] if quick else [])))
        multi, tp_fits = multi_rank_shape(tiny, n)
        for s in STRATEGIES:
            if s == "tp" and not tp_fits:
                continue
            dirs.append(run(f"{s}-{n}", n, ["--strategy", s, *steps, *shape_args(multi),
                                            *(["--microbatches", "2"] if s == "pp" else [])]))
    cal = calibrate(dirs)
    cal.save(out / "calibration.json")
    plot(cal, out / "calibration.png")
    for r, d in zip(runs, dirs):
        if (d / "manifest.json").exists():
            r["median_profiled_step_s"] = _median_step(d)
    summary = {
        "gpus": gpus, "ranks": n, "quick": quick, "runs": runs,
        # every fit without its measured points (those are in calibration.json)
        **{kind: [{k: v for k, v in vars(f).items() if k != "points"} for f in fits]
           for kind, fits in (("compute", cal.compute), ("layers", cal.layers), ("collectives", cal.collectives))},
    }
    if sustained_s:
        summary["sustained"] = _sustained(out / "sustained.json", sustained_s, quick, log)
    from simulator.atomic import write_text
    write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    log(f"capture: wrote {out / 'calibration.json'}, {out / 'calibration.png'}, {out / 'summary.json'}")
    return summary


def _sustained(path: Path, seconds: float, quick: bool, log) -> dict:
    """Run traces.bench_sustained in its own process (one device); its device, shape and summary."""
    import subprocess
    window = min(1.0, seconds / 4)
    cmd = [sys.executable, "-m", "traces.bench_sustained", "--seconds", str(seconds), "--window", str(window),
           "--out", str(path)] + (["--shape", "128,128,128", "--dtype", "fp32"] if quick else [])
    log(f"capture: sustained GEMM rate for {seconds:g} s ...")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 600)
    if done.returncode != 0:
        raise ClusterSimError(f"traces.bench_sustained failed: {done.stderr.strip()[-500:]}")
    res = json.loads(path.read_text())
    return {"device": res["device"], "shape": res["shape"], "dtype": res["dtype"], **res["summary"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traces.capture", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (one sub-folder per run)")
    ap.add_argument("--nproc", type=int, default=None, help="ranks of the multi-rank runs (default: GPUs, <= 8)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and few steps (a smoke test)")
    ap.add_argument("--sustained", type=float, default=None, metavar="SECONDS",
                    help="also run the sustained-GEMM check (traces.bench_sustained) for SECONDS")
    a = ap.parse_args(argv)
    if a.sustained is not None and not a.sustained > 0:
        print(f"error: --sustained takes a positive number of seconds, got {a.sustained}", file=sys.stderr)
        return 2
    try:
        capture(Path(a.out), a.nproc, a.quick, sustained_s=a.sustained)
    except (ClusterSimError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

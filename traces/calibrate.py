"""Fit the cost-model parameters of ``simulator.calibration`` from traces and collective benchmarks.

``calibrate(sources)`` takes trace files / folders (``traces.parse.load_trace``) and collective-benchmark
results (the collector's ``manifest.json`` of a ``--bench collectives`` run, or its folder) and returns a
``Calibration``:

compute      per device, from GEMM ops (aten::mm / addmm / bmm / baddbmm, FLOPs from Input Dims): the time of
             an op (its GPU kernels' total on GPU traces, the op's own CPU time on CPU traces) against its
             FLOPs. The model time = F / peak + F_half / peak (achieved = peak · F / (F + F_half)) is linear in
             F, fitted by least squares on relative error over the median time of each distinct size.
layers       per device and phase (forward / backward), from the collector's layer benchmark (``--bench
             layers``): the time of one whole decoder block's forward or backward against its model FLOPs
             (``schedules.models``, divided by the TP degree as the programs do), the same linear fit.
collectives  per (kind, backend, group size, scope), time = alpha + size · bus_factor / busbw, fitted the
             same way over the mean transfer time of each distinct size (the expected cost a step pays;
             nccl-tests reports means too; collectives whose peers are absent from the trace count as one
             median per size, as their durations include waiting). In a trace the transfer time of
             one collective is min(end) - max(start) over its members when all members are in the trace and
             share a clock (a member's duration includes waiting for the others), else the shortest member
             duration; gloo runs FSDP's reduce_scatter as an all_reduce of the whole buffer, so gloo points
             are filed under what gloo ran (``impl``). Points measured on different devices are not fitted
             together (an A100 and a V100 node have different interconnects): a TraceError says so, unless
             ``allow_mixed``.

``plot(calibration, path)`` draws every fit against its measured points. Units: seconds, bytes, FLOPs.
"""
from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration import (LAYER_PHASES, MAX_BUSBW_BYTES_PER_S, Calibration, CollectiveFit, ComputeFit,
                                  LayerFit, bus_factor)
from simulator.errors import ClusterSimError, TraceError
from simulator.inputs import MAX_BYTES, integer, number, text
from traces.bench_format import BENCH_KINDS
from traces.parse import Trace, check_one_run, folder_manifest, load_manifest, load_trace, trace_files

BENCH_FORMAT = "clustersim-trace-manifest"


# --------------------------------------------------------------------------------------------- fitting
def fit_linear_relative(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) >= 0 of t = slope·x + intercept minimising the squared *relative* error.

    With one distinct x the intercept is 0 (a line through the origin)."""
    x, t = np.asarray(x, float), np.asarray(t, float)
    ok = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
    x, t = x[ok], t[ok]
    if len(x) == 0:
        raise ValueError("no valid points to fit")
    w = 1.0 / t
    if len(np.unique(x)) >= 2:
        A = np.stack([x * w, w], axis=1)
        (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        if a > 0 and b >= 0:
            return float(a), float(b)
        if a <= 0:   # time does not grow with size: a constant
            return 0.0, float(np.median(t))
    # through the origin: minimise sum((a x / t - 1)^2)
    xw = x * w
    a = float(np.sum(xw) / np.sum(xw * xw)) if np.any(xw > 0) else 0.0
    return a, 0.0


def fit_compute(device: str, flops: np.ndarray, seconds: np.ndarray) -> ComputeFit:
    """ComputeFit from (FLOPs, seconds) samples: medians per distinct size, then the linear fit."""
    df = pd.DataFrame({"f": flops, "t": seconds}).dropna()
    df = df[(df["f"] > 0) & (df["t"] > 0)]
    if df.empty:
        raise ValueError(f"no GEMM samples for {device}")
    med = df.groupby("f")["t"].median().reset_index()
    a, b = fit_linear_relative(med["f"].to_numpy(), med["t"].to_numpy())
    if a <= 0:
        raise ValueError(f"{device}: GEMM time does not grow with FLOPs; cannot fit a peak")
    peak = 1.0 / a
    points = [[float(f), float(f / t)] for f, t in zip(med["f"], med["t"])]
    return ComputeFit(device=device, peak_flops_per_s=peak, half_saturation_flops=b * peak, points=points)


def fit_layer(device: str, phase: str, flops: np.ndarray, seconds: np.ndarray) -> LayerFit:
    """LayerFit from (layer FLOPs, seconds) samples, fitted as ``fit_compute``."""
    c = fit_compute(device, flops, seconds)
    return LayerFit(device=device, phase=phase, peak_flops_per_s=c.peak_flops_per_s,
                    half_saturation_flops=c.half_saturation_flops, points=c.points)


def fit_collective(kind: str, group_size: int, scope: str, backend: str, sizes, seconds) -> CollectiveFit:
    df = pd.DataFrame({"s": sizes, "t": seconds}).dropna()
    df = df[(df["s"] > 0) & (df["t"] > 0)]
    if df.empty:
        raise ValueError(f"no {kind} samples")
    # the mean per size, not the median: a step pays every collective's time, slow ones included (gloo on
    # shared cores is bimodal: ~0.5 ms or ~3.5 ms for the same 512 KiB all_reduce); nccl-tests reports means
    med = df.groupby("s")["t"].mean().reset_index()
    slope, alpha = fit_linear_relative(med["s"].to_numpy(), med["t"].to_numpy())
    bf = bus_factor(kind, group_size)
    if slope <= 0 or bf / slope > MAX_BUSBW_BYTES_PER_S:
        # latency-bound at every measured size (times flat, whatever the sign of their noise): bandwidth from
        # the largest one
        s_max = med["s"].max()
        slope, alpha = med["t"].max() / s_max, 0.0
    if bf / slope > MAX_BUSBW_BYTES_PER_S:     # (med is sorted by size)
        (s0, t0), (s1, t1) = med.iloc[0].tolist(), med.iloc[-1].tolist()
        raise TraceError(f"{kind} ({backend}, {int(group_size)} ranks, {scope}-node): its times ({t0:.3g} s at "
                         f"{s0:.3g} B ... {t1:.3g} s at {s1:.3g} B) give a bus bandwidth of {bf / slope:.3g} B/s, "
                         f"beyond any network ({MAX_BUSBW_BYTES_PER_S:.0e} B/s): they hardly grow with the size, "
                         f"and are no measurements of it")
    return CollectiveFit(kind=kind, group_size=int(group_size), scope=scope, alpha_s=alpha,
                         busbw_bytes_per_s=bf / slope, backend=backend,
                         points=[[float(s), float(t)] for s, t in zip(med["s"], med["t"])])


FIT_WARN_ERROR = 0.20     # calibrate warns when a fit misses one of its own points by more than this


def fit_errors(fit) -> tuple[float, float]:
    """(median, max) relative error of a fit against its own points: achieved FLOP/s for compute and layer
    fits (points [flops, FLOP/s]), time for collective fits (points [bytes, seconds]); (0, 0) without points."""
    errs = []
    for x, y in fit.points:
        if not y:
            continue
        pred = fit.time_s(x) if isinstance(fit, CollectiveFit) else fit.achieved_flops_per_s(x)
        errs.append(abs(pred - y) / abs(y))
    if not errs:
        return 0.0, 0.0
    return float(np.median(errs)), float(np.max(errs))


# --------------------------------------------------------------------------------------------- samples
def gemm_samples(trace: Trace) -> pd.DataFrame:
    """device, flops, seconds of every GEMM op of the trace."""
    ops = trace.cpu_ops
    g = ops[ops["flops"].notna() & (ops["flops"] > 0)]
    if g.empty:
        return pd.DataFrame(columns=["device", "flops", "seconds"])
    dev = {r: trace.device(r) for r in trace.ranks}
    if trace.has_gpu:
        # kernels launched by the GEMM op or anything under it
        k = trace.kernels
        k = k[(k["op"] >= 0) & (k["cat"] == "kernel")]
        parent = ops["parent"].to_numpy()
        gemm = set(g.index)
        owner = []
        for o in k["op"].to_numpy():
            p = o
            while p >= 0 and p not in gemm:
                p = parent[p]
            owner.append(p)
        k = k.assign(owner=owner)
        k = k[k["owner"] >= 0]
        t = k.groupby("owner")["dur"].sum()
        g = g.loc[g.index.intersection(t.index)]
        secs = t.loc[g.index].to_numpy()
    else:
        secs = g["dur"].to_numpy()
    return pd.DataFrame({"device": g["rank"].map(dev).to_numpy(), "flops": g["flops"].to_numpy(),
                         "seconds": secs})


def transfer_times(trace: Trace) -> pd.DataFrame:
    """One row per collective instance (matched across the ranks present): kind, impl, backend, group_size,
    size_bytes, ranks present, transfer_s (see module doc), step."""
    c = trace.collectives
    if c.empty:
        return pd.DataFrame(columns=["kind", "impl", "backend", "group_size", "group_ranks", "size_bytes",
                                     "transfer_s", "complete", "step"])
    c = c.assign(gkey=c["pg"].fillna("").astype(str) + "|" + c["group_ranks"].astype(str) + "|"
                 + c["kind"].where(c["kind"].isin(["send", "recv"]), "coll"))
    rows = []
    present = set(trace.ranks)
    for (gkey, seq), g in c.groupby(["gkey", "seq"], sort=False):
        first = g.iloc[0]
        members = set(first["group_ranks"]) if first["group_ranks"] is not None else set(g["rank"])
        complete = members <= set(g["rank"]) and members <= present
        if complete and trace.shared_clock and len(g) > 1:
            tr = g["end"].min() - g["ts"].max()
            if not tr > 0:
                tr = g["dur"].min()
        else:
            tr = g["dur"].min()
        rows.append({"kind": first["kind"], "impl": first["impl"], "backend": first["backend"],
                     "group_size": int(first["group_size"]) if first["group_size"] > 0 else len(members),
                     "group_ranks": first["group_ranks"], "size_bytes": g["size_bytes"].max(),
                     "transfer_s": float(tr), "complete": complete, "step": first["step"], "gkey": gkey,
                     "seq": seq})
    return pd.DataFrame(rows)


def _p2p_pairs(trace: Trace) -> pd.DataFrame:
    """Transfer time of each send matched with its recv (k-th send src->dst with k-th recv at dst from src)."""
    c = trace.collectives
    s = c[c["kind"] == "send"].assign(src=lambda d: d["rank"], dst=lambda d: d["peer"])
    r = c[c["kind"] == "recv"].assign(src=lambda d: d["peer"], dst=lambda d: d["rank"])
    if s.empty or r.empty:
        return pd.DataFrame(columns=["size_bytes", "transfer_s"])
    s = s.assign(k=s.groupby(["src", "dst"]).cumcount())
    r = r.assign(k=r.groupby(["src", "dst"]).cumcount())
    m = s.merge(r, on=["src", "dst", "k"], suffixes=("_s", "_r"))
    tr = np.minimum(m["end_s"], m["end_r"]) - np.maximum(m["ts_s"], m["ts_r"])
    tr = tr.where(tr > 0, np.minimum(m["dur_s"], m["dur_r"]))
    return pd.DataFrame({"size_bytes": m["size_bytes_s"], "transfer_s": tr, "backend": m["backend_s"]})


def _scope(trace: Trace) -> str:
    hosts = {i.host for i in trace.ranks.values()}
    return "intra" if len(hosts) <= 1 else "inter"


def _manifest(folder: Path) -> dict | None:
    return folder_manifest(folder)


def bench_samples(manifest: dict, where: str) -> pd.DataFrame:
    """Rows of a collector benchmark manifest: kind, backend, group_size, scope, size_bytes, transfer_s."""
    res = manifest.get("results")
    if not isinstance(res, list) or not res:
        raise TraceError(f"{where}: benchmark manifest has no 'results' table")
    rows = []
    for i, r in enumerate(res):
        w = f"{where}: results row {i}"
        if not isinstance(r, dict):
            raise TraceError(f"{w}: expected a mapping")
        group = r.get("group_size") if "group_size" in r else manifest.get("world_size")
        rows.append({"kind": text(r.get("kind"), f"{w}: kind", choices=BENCH_KINDS, err=TraceError),
                     "size_bytes": number(r.get("size_bytes"), f"{w}: size_bytes", lo=0, lo_open=True,
                                          hi=MAX_BYTES, err=TraceError),
                     "transfer_s": number(r.get("time_s"), f"{w}: time_s", lo=0, lo_open=True, hi=1e6,
                                          err=TraceError),
                     "group_size": integer(group, f"{w}: group_size (or the manifest's world_size)", lo=1,
                                           hi=1 << 24, err=TraceError)})
    df = pd.DataFrame(rows)
    df["backend"] = text(manifest.get("backend") or "nccl", f"{where}: backend", err=TraceError)
    hosts = manifest.get("hostnames") or [1]
    df["scope"] = text(manifest.get("scope") or ("intra" if len(set(map(str, hosts if isinstance(hosts, list)
                                                                            else [hosts]))) <= 1 else "inter"),
                       f"{where}: scope", choices=("intra", "inter"), err=TraceError)
    return df


def layer_samples(manifest: dict, where: str) -> pd.DataFrame:
    """Rows of a layer-benchmark manifest: device, phase, flops (model FLOPs per rank), seconds."""
    from schedules.models import custom_model      # the FLOP model the simulator's programs use

    res = manifest.get("results")
    if not isinstance(res, list) or not res:
        raise TraceError(f"{where}: layer benchmark manifest has no 'results' table")
    device = (manifest.get("devices") or ["unknown"])[0]
    rows = []
    for i, r in enumerate(res):
        try:
            m = custom_model(layers=1, hidden=int(r["hidden"]), heads=int(r["heads"]), ffn=int(r["ffn"]),
                             vocab=1, gated_mlp=True)
            lf = m.layer_flops(0, int(r["seq"]), int(r["batch"]))
            tp = int(r.get("tp") or 1)
            rows.append({"device": device, "phase": "forward", "flops": lf.forward / tp,
                         "seconds": float(r["forward_s"])})
            rows.append({"device": device, "phase": "backward",
                         "flops": (lf.backward_input + lf.backward_weight) / tp, "seconds": float(r["backward_s"])})
        except (KeyError, TypeError, ValueError, ZeroDivisionError, ClusterSimError) as e:
            raise TraceError(f"{where}: layer benchmark results row {i} lacks a valid hidden / heads / ffn / seq "
                             f"/ batch / tp / forward_s / backward_s ({e})") from None
    return pd.DataFrame(rows)


def _device_set(names) -> str:
    """The devices a source ran on, as one label (sorted, distinct): collective samples of different labels
    are not fitted together (``calibrate``)."""
    found = sorted({str(n) for n in names if n})
    return ", ".join(found) if found else "unknown"


# --------------------------------------------------------------------------------------------- calibrate
def calibrate(sources, *, min_points: int = 1, allow_mixed: bool = False) -> Calibration:
    """Fit a Calibration from trace files/folders and collective-benchmark manifests (or their folders)."""
    if isinstance(sources, (str, Path)):
        sources = [sources]
    sources = [Path(s) for s in sources]
    if not sources:
        raise TraceError("calibrate needs at least one trace folder, trace file or benchmark manifest")
    gemms, colls, used, layer_rows = [], [], [], []
    for src in sources:
        if not src.exists():
            raise TraceError(f"{src} does not exist")
        manifest = None
        if src.is_file() and src.name == "manifest.json":
            manifest = load_manifest(src)
        elif src.is_dir():
            manifest = _manifest(src)
        if manifest is not None and manifest.get("mode") == "bench" and manifest.get("bench") == "layers":
            layer_rows.append(layer_samples(manifest, str(src)))
            used.append({"path": str(src), "kind": "layer benchmark", "backend": manifest.get("backend"),
                         "devices": sorted(set(manifest.get("devices") or []))})
            continue
        if manifest is not None and manifest.get("mode") == "bench":
            b = bench_samples(manifest, str(src))
            b["source"] = str(src)
            b["devices"] = _device_set(manifest.get("devices") or [])
            colls.append(b)
            used.append({"path": str(src), "kind": "collective benchmark", "backend": manifest.get("backend"),
                         "devices": sorted(set(manifest.get("devices") or []))})
            continue
        trace = check_one_run(load_trace(src), allow_mixed)
        devnames = {}
        if manifest is not None and not trace.has_gpu and manifest.get("devices"):
            devnames = {r: manifest["devices"][r] for r in trace.ranks if r < len(manifest["devices"])}
        g = gemm_samples(trace)
        if devnames:
            g["device"] = g["device"].where(g["device"] != "cpu", g["device"].map(lambda _: None))
            ranks = trace.cpu_ops.loc[trace.cpu_ops["flops"] > 0, "rank"].to_numpy()
            if len(ranks) == len(g):
                g["device"] = [devnames.get(r, "cpu") for r in ranks]
        gemms.append(g)
        t = transfer_times(trace)
        scope = (manifest or {}).get("scope") or _scope(trace)
        devices = _device_set(devnames.values() if devnames else [trace.device(r) for r in trace.ranks])
        if not t.empty:
            t = t[t["kind"].isin(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                  "reduce"])]
            t = t.assign(kind=np.where(t["backend"].eq("gloo"), t["impl"], t["kind"]), scope=scope)
            cols = ["kind", "backend", "group_size", "scope", "size_bytes"]
            # a member's own duration (peers absent from the trace) includes waiting for them: one median per
            # size, so that the mean the fit takes is not a mean of waits
            partial = t[~t["complete"].astype(bool)]
            partial = partial.groupby(cols, dropna=False, as_index=False)["transfer_s"].median()
            colls.append(pd.concat([t.loc[t["complete"].astype(bool), cols + ["transfer_s"]], partial],
                                   ignore_index=True).assign(devices=devices))
        p = _p2p_pairs(trace)
        if not p.empty:
            colls.append(p.assign(kind="p2p", group_size=2, scope=scope, devices=devices)[
                ["kind", "backend", "group_size", "scope", "size_bytes", "transfer_s", "devices"]])
        used.append({"path": str(src), "kind": "trace", "ranks": trace.rank_ids, "world_size": trace.world_size,
                     "backend": trace.backend, "devices": sorted({trace.device(r) for r in trace.ranks}),
                     "files": [f.name for f in trace_files(src)][:16],
                     "torch": (manifest or {}).get("torch_version")})
    cal = Calibration(source={
        "method": "clustersim calibrate: " + __doc__.split("\n\n")[1].split("\n")[0].strip(),
        "inputs": used, "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": "compute and layers: achieved = peak * F / (F + F_half); collectives: time = alpha + size * "
                 "bus_factor / busbw (nccl-tests sizes)",
    })
    g = pd.concat(gemms, ignore_index=True) if gemms else pd.DataFrame(columns=["device", "flops", "seconds"])
    for dev, d in g.groupby("device"):
        if d["flops"].nunique() >= min_points:
            try:
                cal.compute.append(fit_compute(str(dev), d["flops"].to_numpy(), d["seconds"].to_numpy()))
            except ValueError:
                pass
    if layer_rows:
        lr = pd.concat(layer_rows, ignore_index=True)
        for phase in LAYER_PHASES:
            for dev, d in lr[lr["phase"] == phase].groupby("device"):
                try:
                    cal.layers.append(fit_layer(str(dev), phase, d["flops"].to_numpy(), d["seconds"].to_numpy()))
                except ValueError:
                    pass
    c = pd.concat(colls, ignore_index=True) if colls else pd.DataFrame()
    if not c.empty:
        c = c.dropna(subset=["size_bytes", "transfer_s"])
        c = c.assign(backend=c["backend"].fillna("unknown"))
        for (kind, backend, n, scope), d in c.groupby(["kind", "backend", "group_size", "scope"]):
            labels = sorted(d["devices"].unique())
            if len(labels) > 1 and not allow_mixed:
                raise TraceError(
                    f"{kind} ({backend}, {int(n)} ranks, {scope}-node) was measured on different devices "
                    f"({'; '.join(labels)}): one fit would mix their interconnects. Calibrate each "
                    f"device's traces and benchmarks separately, or pass --allow-mixed to fit them together")
            if d["size_bytes"].nunique() >= min_points and n >= 2:
                try:
                    cal.collectives.append(fit_collective(kind, int(n), scope, backend, d["size_bytes"].to_numpy(),
                                                          d["transfer_s"].to_numpy()))
                except ValueError:
                    pass
    if not cal.compute and not cal.collectives and not cal.layers:
        raise TraceError(f"nothing to calibrate in {', '.join(map(str, sources))}: no GEMM op with shapes "
                         f"(record with record_shapes=True) and no collective with a known size")
    return cal


# --------------------------------------------------------------------------------------------- plot
def plot(cal: Calibration, path: str | Path) -> Path:
    """One panel per fit: measured points and the fitted curve (log-log)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatterSciNotation, NullFormatter

    fits = ([("compute", f) for f in cal.compute] + [("layer", f) for f in cal.layers]
            + [("coll", f) for f in cal.collectives])
    if not fits:
        raise TraceError("the calibration has no fit to plot")
    cols = min(3, len(fits))
    rows = math.ceil(len(fits) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (what, f) in zip(axes.flat, fits):
        pts = np.array(f.points, float) if f.points else np.zeros((0, 2))
        if what in ("compute", "layer"):
            xs = np.logspace(math.log10(max(pts[:, 0].min() / 2, 1.0)) if len(pts) else 6,
                             math.log10(pts[:, 0].max() * 2) if len(pts) else 13, 100)
            ax.plot(xs, [f.achieved_flops_per_s(x) / 1e12 for x in xs], "-", label="fit")
            if len(pts):
                ax.plot(pts[:, 0], pts[:, 1] / 1e12, "o", ms=4, label="measured (median)")
            ax.set_xlabel("GEMM FLOPs" if what == "compute" else f"layer {f.phase} FLOPs (per rank)")
            ax.set_ylabel("achieved TFLOP/s")
            ax.set_title(f"{f.device}{'' if what == 'compute' else ' (whole layer)'}\npeak {f.peak_flops_per_s / 1e12:.3g} TFLOP/s, "
                         f"F_half {f.half_saturation_flops:.3g}", fontsize=9)
        else:
            xs = np.logspace(math.log10(max(pts[:, 0].min() / 2, 1.0)) if len(pts) else 3,
                             math.log10(pts[:, 0].max() * 2) if len(pts) else 9, 100)
            ax.plot(xs, [f.time_s(x) * 1e6 for x in xs], "-", label="fit")
            if len(pts):
                ax.plot(pts[:, 0], pts[:, 1] * 1e6, "o", ms=4, label="measured (mean)")
            ax.set_xlabel("size (bytes)"); ax.set_ylabel("time (us)")
            ax.set_title(f"{f.kind} {f.backend} n={f.group_size} {f.scope}\nalpha {f.alpha_s * 1e6:.3g} us, "
                         f"busbw {f.busbw_bytes_per_s / 1e9:.3g} GB/s", fontsize=9)
        ax.set_xscale("log"); ax.grid(True, which="both", alpha=0.3)
        if what == "coll":
            ax.set_yscale("log")
        else:                                  # efficiency curves: linear from 0, so the saturation shows
            ax.set_ylim(bottom=0)
            ax.xaxis.set_minor_formatter(NullFormatter())      # a narrow log range stacks its minor labels
            ax.xaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(0, 0)))
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(fits):]:
        ax.set_visible(False)
    fig.tight_layout()
    from simulator.atomic import write_with
    path = Path(path)
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".").lower() or None))
    plt.close(fig)
    return path

"""Price the kernels of a layer phase (simulator.kernels) on one device: the kernel-level compute model.

    gemm         a calibration's compute fit for the device when there is one (measured by our collector:
                 achieved FLOP/s = peak · F/(F + F½)), else the device's GEMM curve
                 (topologies.kernel_curves: tiles, waves on the SM count, split-K, fitted to gemm.csv)
    attention    the curve of the kernel's implementation on the device (attention_kernels.csv: FlashAttention-2,
                 cuDNN's forward for Transformer Engine on Hopper+, FlashAttention v1 for the Triton kernel;
                 topologies.kernel_curves.AttentionCurve); a device of an architecture
                 without a chart that has a calibration compute fit (e.g. the CPU of the closed loop) runs
                 it at the fit's rate
    elementwise  t0 + bytes / streaming bandwidth, t0 the launch-and-tail time of the GEMM fit (the shortest
                 kernel the sweep measured); the streaming bandwidth is the device's BabelStream measurement
                 (``microbench/hbm_stream.csv``: mean of Copy, Mul, Add and Triad) where there is one, else
                 HBM bytes/s · MEMORY_EFFICIENCY (``stream_bandwidth``)

``KernelPricer.time_s(kernel_list)`` sums the kernels (cached per list object); ``breakdown`` lists them.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

from simulator.kernels import ATTENTION, ELEMENTWISE, GEMM, Kernel, KernelList
from topologies.kernel_curves import attention_curve, gemm_curve, gemm_rate_label, has_attention_chart, read_rows
from topologies.specs import AcceleratorSpec

# Fraction of peak HBM bandwidth streaming kernels reach on a device without its own BabelStream measurement:
# STREAM-like copies reach ~85-90 % on A100/H100 HBM in vendor and independent microbenchmarks (the same figure as
# topologies.cost's roofline default; Azure's BabelStream runs, below, give 81 % on A100, 88 % on H100, 85 % on H200).
MEMORY_EFFICIENCY = 0.85
STREAM_CSV = Path(__file__).parent / "microbench" / "hbm_stream.csv"
#: the BabelStream kernels whose mean prices elementwise kernels (each reads and writes; Dot only reads)
STREAM_KERNELS = ("Copy", "Mul", "Add", "Triad")


@lru_cache(maxsize=1)
def _stream_rows() -> dict[str, dict[str, float]]:
    """device -> {BabelStream kernel: bytes/s} from ``hbm_stream.csv``."""
    out: dict[str, dict[str, float]] = {}
    for row in read_rows(STREAM_CSV):
        out.setdefault(row["device"], {})[row["kernel"]] = float(row["tb_per_s"]) * 1e12
    return out


def stream_bandwidth(acc: AcceleratorSpec) -> tuple[float, str]:
    """(bytes/s elementwise kernels stream at on ``acc``, where the figure comes from): the mean of the
    device's measured BabelStream Copy, Mul, Add and Triad where ``hbm_stream.csv`` has all four, else the
    datasheet HBM bandwidth times MEMORY_EFFICIENCY."""
    measured = _stream_rows().get(acc.name, {})
    if all(k in measured for k in STREAM_KERNELS):
        bw = sum(measured[k] for k in STREAM_KERNELS) / len(STREAM_KERNELS)
        return bw, (f"BabelStream {bw / 1e12:.3g} TB/s (mean of Copy, Mul, Add, Triad; Azure AI-benchmarking-guide; "
                    f"{bw / acc.hbm_bytes_per_s:.3f} of HBM {acc.hbm_bytes_per_s / 1e12:.3g} TB/s)")
    bw, label = datasheet_bandwidth(acc, MEMORY_EFFICIENCY)
    return bw, label + " (no streaming measurement)"


def datasheet_bandwidth(acc: AcceleratorSpec, fraction: float) -> tuple[float, str]:
    """(``fraction`` of the datasheet HBM bandwidth in bytes/s, its label)."""
    return acc.hbm_bytes_per_s * fraction, f"HBM {acc.hbm_bytes_per_s / 1e12:.3g} TB/s x {fraction}"


class KernelPricer:
    """Kernel times on one accelerator. ``compute_fit``: a calibration ComputeFit that replaces the GEMM
    curve (kernel by kernel: attention and elementwise kernels keep their defaults)."""

    def __init__(self, acc: AcceleratorSpec, compute_fit=None, memory_efficiency: float | None = None):
        self.acc = acc
        self.compute_fit = compute_fit
        # an explicit fraction of the datasheet HBM bandwidth overrides the measured rate (what-if)
        self.mem_per_s, self._stream_source = (stream_bandwidth(acc) if memory_efficiency is None
                                               else datasheet_bandwidth(acc, memory_efficiency))
        self._gemm = {dt: gemm_curve(acc, dt) for dt in ("bf16", "fp8")}
        self._attention = attention_curve(acc)
        self._attention_by_fit = compute_fit is not None and not has_attention_chart(acc)
        self.t0_s = self._gemm["bf16"].params.t0_s
        self._cache: dict[int, tuple[KernelList, float]] = {}
        self._narrow: dict = {}                 # (dtype, SMs) -> the GEMM curve on that many SMs

    def kernel_time_s(self, k: Kernel) -> float:
        if k.kind == GEMM:
            if k.chunks > 1 or k.sm_margin > 0:
                return self._overlapped_gemm_s(k)
            if self.compute_fit is not None and k.dtype == "bf16":
                return k.flops / self.compute_fit.achieved_flops_per_s(k.flops) if k.flops else 0.0
            return self._gemm[k.dtype].time_s(k.m, k.n, k.k, k.batch)
        if k.kind == ATTENTION:
            if self._attention_by_fit:
                return k.flops / self.compute_fit.achieved_flops_per_s(k.flops) if k.flops else 0.0
            return self._attention.time_s(k)
        if k.kind == ELEMENTWISE:
            return self.t0_s + k.bytes / self.mem_per_s
        raise ValueError(f"unknown kernel kind {k.kind!r}")

    def _overlapped_gemm_s(self, k: Kernel) -> float:
        """A GEMM that overlaps a collective: ``chunks`` GEMMs of ceil(m / chunks) rows each (the ring
        exchange's or the pipeline's pieces), on the SMs the communication leaves (``sm_margin``: the device
        then has sm_count - margin SMs and that share of its peak; tiles and waves follow)."""
        chunks = max(1, int(k.chunks))
        rows = -(-int(k.m) // chunks)
        sms = self.acc.sm_count or 0
        left = max(sms - int(k.sm_margin), 1) if sms else 0
        share = left / sms if sms else 1.0
        if self.compute_fit is not None and k.dtype == "bf16":
            f = k.flops / chunks
            return chunks * f / (self.compute_fit.achieved_flops_per_s(f) * share) if f else 0.0
        curve = self._gemm[k.dtype]
        if left and left != sms:
            key = (k.dtype, left)
            if key not in self._narrow:
                self._narrow[key] = dataclasses.replace(curve, sm_count=left,
                                                        peak_flops_per_s=curve.peak_flops_per_s * share)
            curve = self._narrow[key]
        return chunks * curve.time_s(rows, k.n, k.k, k.batch)

    def time_s(self, kl: KernelList) -> float:
        """Seconds of a whole kernel list (one op), cached per list object."""
        hit = self._cache.get(id(kl))
        if hit is not None and hit[0] is kl:
            return hit[1]
        t = sum(self.kernel_time_s(k) for k in kl.kernels)
        self._cache[id(kl)] = (kl, t)
        return t

    def breakdown(self, kl: KernelList) -> list[dict]:
        """One row per kernel: name, kind, shape, FLOPs, bytes, time (s), achieved FLOP/s."""
        rows = []
        for k in kl.kernels:
            t = self.kernel_time_s(k)
            shape = (f"{k.batch}x" if k.batch > 1 else "") + f"{k.m}x{k.n}x{k.k}" if k.kind == GEMM else (
                f"b{k.batch} s{k.seq_q}x{k.seq_kv} h{k.heads} d{k.head_dim}{' causal' if k.causal else ''}"
                f"{f' window {k.window}' if k.window else ''}"
                if k.kind == ATTENTION else "")
            if k.kind == GEMM and (k.chunks > 1 or k.sm_margin):     # TP communication overlap (userbuffers)
                shape += (f" in {k.chunks} chunks" if k.chunks > 1 else "") + (
                    f", {k.sm_margin} SMs to comm" if k.sm_margin else "")
            rows.append({"kernel": k.name, "kind": k.kind, "dtype": k.dtype, "shape": shape, "flops": k.flops,
                         "bytes": k.bytes, "time_s": t, "tflops_per_s": k.flops / t / 1e12 if t > 0 else 0.0})
        return rows

    def gemm_rate(self, dtype: str = "bf16") -> str:
        """How GEMMs of ``dtype`` are rated on this device: a calibration's fit, or the curve's sustained or
        burst rate (kernel_curves.gemm_rate_label)."""
        if self.compute_fit is not None and dtype == "bf16":
            return f"calibration ({self.compute_fit.device})"
        return gemm_rate_label(self.acc, dtype)

    def describe(self) -> dict:
        """Which curves price this device (for results' provenance)."""
        g = self._gemm["bf16"].params
        return {
            "device": self.acc.name,
            "gemm_rate": {dt: self.gemm_rate(dt) for dt in ("bf16", "fp8")},
            "gemm_bf16": ("calibration compute fit " + self.compute_fit.device) if self.compute_fit is not None
            else g.source,
            "gemm_fp8": self._gemm["fp8"].params.source,
            "attention": ("calibration compute fit " + self.compute_fit.device) if self._attention_by_fit
            else self._attention.source,
            "elementwise": f"{self._stream_source} + {g.t0_s * 1e6:.2f} us",
        }


# ---------------------------------------------------------------------------------------------- reports
def _priced_lists(programs, cost, rank: int | None):
    """(rank, {id: (KernelList, ops using it, op phase)}) for the representative rank with the most kernel
    time (``rank`` to choose one): the compute ops priced by their kernels (not by a layer fit)."""
    pricer = getattr(cost, "kernels", None)
    if pricer is None or not hasattr(cost, "prices_by_kernels"):
        return None, {}
    ranks = [rank] if rank is not None else list(programs.ops)
    if len(ranks) > 16:                      # full mode: a spread of ranks (stages are the outer axis)
        ranks = ranks[::len(ranks) // 16]
    best = (None, {}, -1.0)
    for r in ranks:
        lists: dict[int, list] = {}
        pieces: dict[int, list] = {}         # a layer phase cut into pieces (TP overlap): reported whole
        for op in programs.ops[r]:
            kl = op.kernels
            if not cost.prices_by_kernels(op):
                continue                     # priced by a calibration's layer fit instead
            bucket = pieces if kl.parent is not None else lists
            e = bucket.get(id(kl))
            if e is None:
                bucket[id(kl)] = [kl, 1]
            else:
                e[1] += 1
        for kl, n in pieces.values():        # the whole list as often as its most used piece
            e = lists.setdefault(id(kl.parent), [kl.parent, 0])
            e[1] = max(e[1], n)
        total = sum(pricer.time_s(kl) * n for kl, n in lists.values())
        if total > best[2]:
            best = (r, lists, total)
    return best[0], best[1]


def _kernel_time_by(programs, cost, rank: int | None, key) -> dict[str, float]:
    """One rank's kernel-priced compute time (the rank ``_priced_lists`` picks) summed by ``key(kernel)``, in
    seconds over the step; {} when no op is priced by its kernels."""
    r, lists = _priced_lists(programs, cost, rank)
    if r is None:
        return {}
    out: dict[str, float] = {}
    pricer = cost.kernels
    for kl, n in lists.values():
        for k in kl.kernels:
            name = key(k)
            out[name] = out.get(name, 0.0) + pricer.kernel_time_s(k) * n
    return out


def kernel_time_shares(programs, cost, rank: int | None = None, top: int = 5) -> list[dict]:
    """The kernels that dominate one rank's kernel-priced compute time: [{kernel, time_s, share}], largest
    first (kernels of the same name summed over the step)."""
    by_name = _kernel_time_by(programs, cost, rank, lambda k: k.name.replace(" dgrad", "").replace(" wgrad", ""))
    if not by_name:
        return []
    total = sum(by_name.values()) or 1.0
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return [{"kernel": k, "time_s": t, "share": t / total} for k, t in rows]


def kernel_kind_shares(programs, cost, rank: int | None = None) -> dict[str, float]:
    """Where one rank's kernel-priced compute time goes by kernel kind: {gemm, attention, elementwise: share}
    (the rank ``_priced_lists`` picks; {} when no op is priced by its kernels)."""
    by_kind = _kernel_time_by(programs, cost, rank, lambda k: k.kind)
    total = sum(by_kind.values())
    return {kind: t / total for kind, t in by_kind.items()} if total > 0 else {}


def layer_breakdown(programs, cost, rank: int | None = None) -> dict:
    """Per-kernel time of every distinct layer phase of one rank's step: {rank, phases: [{label, ops,
    time_s, kernels: [rows of KernelPricer.breakdown]}]} (kernel-priced ops only)."""
    r, lists = _priced_lists(programs, cost, rank)
    if r is None:
        return {"rank": None, "phases": []}
    pricer = cost.kernels
    phases = []
    for kl, n in lists.values():
        phases.append({"label": kl.label, "stack": kl.stack, "dtype": kl.dtype, "ops": n,
                       "time_s": pricer.time_s(kl), "kernels": pricer.breakdown(kl)})
    phases.sort(key=lambda p: -p["time_s"] * p["ops"])
    # kernel times are one typical GPU's; the job's ops take slowest_gpu_factor times as long (its slowest GPU
    # sets the pace, topologies.variation)
    return {"rank": r, "phases": phases, "slowest_gpu_factor": getattr(cost, "slowest_gpu_factor", 1.0)}

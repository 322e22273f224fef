"""GEMM and attention efficiency curves, fitted from published kernel microbenchmarks.

Data: ``topologies/microbench/gemm.csv`` and ``attention_kernels.csv``, copied from
``../shared/validation`` (each row keeps its ``source``: OpenXLA's sm_90 matmul table, Azure's cuBLASLt
runs, ml-engineering's MAMF best shapes, the FlashAttention-2/-3 benchmark charts), plus OpenXLA's sm_100
(Blackwell) matmul table, BF16 and FP8, from a later TensorFlow commit, and Azure's GB200 FP8 cuBLASLt sweep
(its ND GB200 v6 results page) and GB300's (ND GB300 v6, in a fork of that guide). Nothing here is fitted to
end-to-end training runs.

GEMM model (per device and dtype). cuBLAS splits C[M,N] into tiles (tm × tn, the best of 128×128 and
128×256, CUTLASS's Hopper/Ampere tile shapes) and, when the tiles do not fill the SMs, splits K (split-K
s ∈ {1, 2, 4, 8, 16} with K/s >= 256); the tiles run in waves of ``sm_count``. With the tile and split
that finish first::

    compute = waves · 2·tm·tn·(K/s) / (eta · peak / sm_count) · (1 + k_half / (K/s))
    time    = t0 + max(compute, bytes / (beta · HBM bytes/s)),   bytes = batch·((MK + KN)·dtype + 2·MN)

(the output C is BF16 for BF16 and FP8 inputs alike).

``eta`` (fraction of the datasheet peak the microbenchmarks reach), ``k_half`` (per-tile prologue /
epilogue cost in K), ``t0`` (launch and tail) and ``beta`` (achieved HBM fraction of small-K GEMMs) are
fitted by least squares on log time over a fixed grid, with ``eta`` capped by the device's published
maximum achievable matmul FLOP/s (ml-engineering's MAMF: the best of a brute-force search over shapes)
where there is one: the model's fastest shape runs at ``eta · peak``, so no shape may beat the measured
best one. (The XLA table's few points above MAMF, +2 % at most, are single un-throttled timings.) Devices without their own sweep borrow the
parameters of the nearest architecture that has one and keep their own peak, SM count and HBM bandwidth;
one best-shape (MAMF) point, where published, sets their ``eta`` (fitted to that point, capped as for the
sweeps so that no shape runs faster than it). B200 and GB200 (both sm_100, which the XLA table does not tell
apart) take ``k_half``, ``t0`` and ``beta`` from the sm_100 sweep and ``eta`` from their own MAMF points: the
sweep's per-tile cost in K is Blackwell's own (BF16 192, FP8 64 against Hopper's 32: a tile's k-loop is shorter
on the faster tensor cores, its fixed cost not). Against Hopper's shape parameters, which they borrowed before,
BF16 GEMMs of 256-2,048 rows run 8-12 % slower and training-size ones (4k-16k rows, 1k-28k columns, 4k-28k
deep) 2-5 %; FP8 ones move by -1 to +3 %. The two sources disagree at GB200's BF16 best shape (4096 x 9728 x
2048): the sweep's per-tile cost prices it 16 % below its measured 1,822 TFLOP/s (the capped eta keeps every
shape at or below it).

Sustained rate. Those microbenchmarks time bursts: a GPU at its boost clock. A training job holds every GPU of
a node at its power limit, where the clock settles lower. Where a device (or the same die at the same power
limit) has a published sustained / burst pair (``gemm_sustained.csv``: ml-engineering's MSMF, the best rate a
shape holds for 2 s at the power limit on an 8-GPU node under load, over MAMF, the best burst of the same run),
``eta`` is multiplied by MSMF / MAMF (H100 SXM and H200 BF16: 0.888; B200: 0.828 / 0.832) and capped at
MSMF (no shape beats the best sustained rate measured). Azure's sweeps (H100, H200, GB200 and GB300 FP8, A100 FP16:
``STEADY_STATE_SWEEPS``) are not bursts: each shape ran 10,000 warm-up and 1,000 timed iterations on one GPU,
seconds to minutes at the power limit, so their fit is already the sustained rate (no factor; MSMF, where
measured, still caps it), and the burst best-shape point of the same device caps ``eta`` without joining
their fit. GB200's BF16 curve (no sweep) takes its FP8 sweep's best rate over its FP8 MAMF (0.804) as the
factor (``SWEEP_SUSTAINED_TRANSFER``: MSMF / MAMF is dtype-independent to 0.5% where both are measured). The
500 W H100 (H100-HBM2e) takes the 700 W rates as an upper bound: a lower power limit only lowers the clock a
saturated GPU holds. Elsewhere the burst rate stays, and the curve's ``source`` says so. Attention kernels keep
their charts' (burst) rates: no sustained attention measurement is published.

Attention model (per implementation, device, pass, causal mask and head dim): achieved FLOP/s against the
sequence length s through the chart's measured points (``SeqCurve``: linear in log s between them,
1/rate = a + b/s through the two end points beyond them). FLOPs follow the
FlashAttention benchmark's convention: forward 4·b·s²·heads·d (halved when causal), backward 2.5x forward.
The charts give forward and forward+backward; the backward time is the difference. Where only
forward+backward is published (A100), forward and backward run at that rate.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from simulator import atomic
from simulator.kernels import Kernel

DATA = Path(__file__).parent / "microbench"
GEMM_CSV = DATA / "gemm.csv"
ATTENTION_CSV = DATA / "attention_kernels.csv"
FITS_JSON = DATA / "gemm_fits.json"
SUSTAINED_CSV = DATA / "gemm_sustained.csv"

TILES = ((128, 128), (128, 256))       # CUTLASS / cuBLAS tensor-core tile shapes on sm_80 / sm_90
SPLITS = (1, 2, 4, 8, 16)
MIN_SPLIT_K = 256
# fit grid (documented so a reader can redo the fit)
ETA_GRID = np.round(np.arange(0.50, 1.0001, 0.01), 3)
K_HALF_GRID = (0.0, 32.0, 64.0, 96.0, 128.0, 192.0, 256.0)
T0_GRID_S = np.round(np.arange(1.0, 10.01, 0.25), 2) * 1e-6
BETA_GRID = np.round(np.arange(0.3, 1.0001, 0.05), 2)


def read_rows(path: Path) -> list[dict]:
    """Rows of a microbenchmark CSV (``#`` comment lines skipped)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


# ------------------------------------------------------------------------------------------------ GEMM
@dataclass(frozen=True)
class GemmParams:
    eta: float
    k_half: float
    t0_s: float
    beta: float
    source: str = ""


def _effective_flops(shapes: np.ndarray, sm_count: int, k_half: float) -> np.ndarray:
    """Effective FLOPs of each (batch, m, n, k) row: the best over tiles and K splits of
    waves · 2·tm·tn·(K/s)·(1 + k_half/(K/s)) · sm_count (divide by eta · peak for seconds)."""
    b, m, n, k = (shapes[:, i].astype(float) for i in range(4))
    best = np.full(len(shapes), np.inf)
    for tm, tn in TILES:
        tiles = b * np.ceil(m / tm) * np.ceil(n / tn)
        for s in SPLITS:
            kk = k / s
            ok = (s == 1) | (kk >= MIN_SPLIT_K)
            waves = np.ceil(tiles * s / sm_count)
            work = waves * 2 * tm * tn * kk * (1 + k_half / kk) * sm_count
            best = np.where(ok, np.minimum(best, work), best)
    return best


OUT_BYTES = 2.0      # a GEMM's output is BF16 for BF16 and FP8 inputs alike (Transformer Engine's FP8 GEMMs, the
                     # XLA table's f8e4m3fn x f8e4m3fn -> bf16)


def gemm_bytes(b, m, n, k, dtype_bytes: float):
    """HBM bytes of a (b ×) m×n×k GEMM: inputs A, B at ``dtype_bytes`` per element, the output C in BF16."""
    return b * (dtype_bytes * (m * k + k * n) + OUT_BYTES * m * n)


@dataclass(frozen=True)
class GemmCurve:
    """Time of a GEMM on one device and dtype (see module doc)."""

    params: GemmParams
    peak_flops_per_s: float
    sm_count: int
    hbm_bytes_per_s: float
    dtype_bytes: float = 2.0

    def time_s(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """Seconds of a (batch ×) m×n×k GEMM; cached per curve and shape (the tile search costs ~0.2 ms)."""
        return _gemm_time_s(self, m, n, k, batch)

    def _time_s(self, m: int, n: int, k: int, batch: int) -> float:
        if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
            return 0.0
        p = self.params
        if self.sm_count:
            work = float(_effective_flops(np.array([[batch, m, n, k]]), self.sm_count, p.k_half)[0])
        else:
            work = 2.0 * batch * m * n * k * (1 + p.k_half / k)
        compute = work / (p.eta * self.peak_flops_per_s)
        mem = gemm_bytes(batch, m, n, k, self.dtype_bytes) / (p.beta * self.hbm_bytes_per_s)
        return p.t0_s + max(compute, mem)


@lru_cache(maxsize=65536)
def _gemm_time_s(curve: GemmCurve, m: int, n: int, k: int, batch: int) -> float:
    return curve._time_s(m, n, k, batch)


def fit_gemm(shapes: np.ndarray, times_s: np.ndarray, peak: float, sm_count: int, hbm: float,
             dtype_bytes: float = 2.0, source: str = "", eta_max: float = 1.0) -> GemmParams:
    """Least-squares fit (log time) of eta (<= eta_max), k_half, t0, beta on the grids above."""
    b, m, n, k = (shapes[:, i].astype(float) for i in range(4))
    mem = gemm_bytes(b, m, n, k, dtype_bytes) / hbm
    logt = np.log(times_s)
    etas = ETA_GRID[ETA_GRID <= eta_max + 1e-12]
    if not len(etas):
        etas = np.array([round(eta_max, 3)])
    best = None
    for kh in K_HALF_GRID:
        work = _effective_flops(shapes, sm_count, kh) / peak            # seconds at eta = 1
        comp = work[None, :] / etas[:, None]                                  # eta x shapes
        memb = mem[None, :] / BETA_GRID[:, None]                              # beta x shapes
        base = np.maximum(comp[:, None, :], memb[None, :, :])                 # eta x beta x shapes
        pred = T0_GRID_S[:, None, None, None] + base[None]                    # t0 x eta x beta x shapes
        err = ((np.log(pred) - logt) ** 2).mean(axis=-1)
        i = np.unravel_index(np.argmin(err), err.shape)
        if best is None or err[i] < best[0]:
            best = (err[i], GemmParams(float(etas[i[1]]), float(kh), float(T0_GRID_S[i[0]]),
                                       float(BETA_GRID[i[2]]), source))
    return best[1]


def _gemm_points(rows, hardware: str, dtype_prefix: tuple) -> tuple[np.ndarray, np.ndarray]:
    sel = [r for r in rows if r["hardware"].startswith(hardware) and r["dtype"].startswith(dtype_prefix)]
    shapes = np.array([[int(r["batch"]), int(r["m"]), int(r["n"]), int(r["k"])] for r in sel], dtype=float)
    flops = 2 * shapes.prod(axis=1)
    rate = np.array([float(r["tflops_per_s"]) * 1e12 for r in sel])
    return shapes, flops / rate


# Which published sweep fits which device. (hardware prefix in gemm.csv, dtype prefixes, reference device)
# BF16 / FP16 run at the same tensor-core rate on A100 and H100 (datasheets), so FP16 sweeps fit BF16.
GEMM_SWEEPS = {
    ("hopper", "bf16"): (("sm_90", "NVIDIA H100 SXM"), ("BF16",), "H100-SXM"),
    # Azure's steady-state sweeps (STEADY_STATE_SWEEPS): their own points only; the burst best-shape point of
    # the same device caps eta (SWEEP_MAMF) but does not join a fit of sustained timings
    ("hopper", "fp8"): (("H100 80GB HBM3",), ("FP8",), "H100-SXM"),
    ("hopper-h200", "fp8"): (("H200 141GB",), ("FP8",), "H200"),
    ("ampere", "bf16"): (("A100-SXM4-80GB",), ("FP16", "BF16"), "A100-80GB"),
    ("gb200", "fp8"): (("GB200 185GB",), ("FP8",), "GB200"),
    ("gb300", "fp8"): (("GB300 288GB",), ("FP8",), "GB300"),
    # OpenXLA's sm_100 table (B200 and GB200 are both sm_100; the file does not say which ran it): fitted for its
    # shape parameters (k_half, t0, beta); each Blackwell device's eta comes from its own best-shape point
    ("blackwell", "bf16"): (("sm_100",), ("BF16",), "B200"),
    ("blackwell", "fp8"): (("sm_100",), ("FP8",), "B200"),
}
# Sweeps timed at the power limit: Azure's AI-benchmarking-guide runs superbench's cublaslt_gemm on one GPU with
# 10,000 warm-up and 1,000 timed iterations per shape (Benchmarks/GEMMCublasLt.py: -w 10000 -i 1000; the results
# pages say "10,000 warmup iterations"): an 8192^3 FP8 GEMM on H100 is then ~9 s of continuous load, a 16384^3 FP16
# one on A100 ~380 s, far past the 2 s in which MSMF settles. Their large shapes are sustained rates already (H100
# FP8 16384^3: 1,377 TFLOP/s against the H200's MSMF of 1,354 on a loaded node), so no burst-to-sustained factor
# applies to them (it did until the twenty-eighth session: H100 FP8 GEMMs priced 7-11% under the sweep's own
# large-shape points). sweep -> the devices that run at the sweep GPU's power limit (the others of the family run
# lower and take the sweep as an upper bound)
STEADY_STATE_SWEEPS = {
    ("hopper", "fp8"): ("H100-SXM",),
    ("hopper-h200", "fp8"): ("H200",),
    ("ampere", "bf16"): ("A100-80GB", "A100-40GB"),
    ("gb200", "fp8"): ("GB200",),
    ("gb300", "fp8"): ("GB300",),
}
# A device whose steady-state sweep covers one dtype only (GB200: FP8): the ratio of that sweep's best measured
# rate to the device's best burst (MAMF) in the same dtype slows its burst curve in the other dtype, as MSMF /
# MAMF does where measured (that ratio is the same in both dtypes to 0.5% on H200, 0.888 / 0.888, and B200,
# 0.828 / 0.832). device -> the sweep (family, dtype)
SWEEP_SUSTAINED_TRANSFER = {"GB200": ("gb200", "fp8")}
# the best-shape point (ml-engineering MAMF) that caps each sweep's eta: (hardware in gemm.csv, dtype prefix)
SWEEP_MAMF = {
    ("hopper", "bf16"): ("NVIDIA H100 SXM", "BF16"), ("hopper", "fp8"): ("NVIDIA H100 SXM", "FP8"),
    ("hopper-h200", "fp8"): ("NVIDIA H200 SXM", "FP8"), ("ampere", "bf16"): ("NVIDIA A100 SXM", "BF16"),
    ("gb200", "fp8"): ("NVIDIA GB200 SXM", "FP8"),
}
# one best-shape point (ml-engineering MAMF) per device without a sweep: (hardware in gemm.csv, dtype prefix)
MAMF_POINTS = {
    ("B200", "bf16"): ("NVIDIA B200 SXM", "BF16"), ("B200", "fp8"): ("NVIDIA B200 SXM", "FP8"),
    ("GB200", "bf16"): ("NVIDIA GB200 SXM", "BF16"),
    ("B300", "bf16"): ("NVIDIA B300 SXM", "BF16"), ("B300", "fp8"): ("NVIDIA B300 SXM", "FP8"),
}
# (device, dtype) priced by a sweep of its own in that dtype only
DTYPE_SWEEP_FAMILY = {("H200", "fp8"): "hopper-h200", ("GB200", "fp8"): "gb200", ("GB300", "fp8"): "gb300"}
FAMILY = {"H100-SXM": "hopper", "H100-PCIe": "hopper", "H100-HBM2e": "hopper", "H200": "hopper",
          "A100-80GB": "ampere", "A100-40GB": "ampere"}
# devices without a sweep of their own whose architecture has one: its per-tile cost (k_half), launch time (t0)
# and small-K bandwidth (beta) are theirs; the rest borrow Hopper's
# (Blackwell Ultra, sm_103, has no XLA sweep of its own: B300 and GB300 take sm_100's; GB300 has no MAMF point
# either and keeps that sweep's eta, B200's, in BF16; its FP8 is Azure's GB300 sweep, STEADY_STATE_SWEEPS)
SHAPE_FAMILY = {"B200": "blackwell", "GB200": "blackwell", "B300": "blackwell", "GB300": "blackwell"}


@lru_cache(maxsize=None)
def gemm_params(family: str, dtype: str) -> GemmParams:
    """Fitted GEMM parameters of a sweep in GEMM_SWEEPS, as stored in FITS_JSON (``python -m
    topologies.kernel_curves`` refits and rewrites it; a test checks the stored fit matches the data)."""
    stored = json.loads(FITS_JSON.read_text()) if FITS_JSON.exists() else {}
    entry = stored.get(f"{family}/{dtype}")
    if entry is not None:
        return GemmParams(**entry)
    return fit_gemm_sweep(family, dtype)


def fit_gemm_sweep(family: str, dtype: str) -> GemmParams:
    """Fit GEMM parameters to the points of one sweep (GEMM_SWEEPS)."""
    from topologies.specs import get_accelerator
    hardware, dtypes, ref = GEMM_SWEEPS[(family, dtype)]
    rows = read_rows(GEMM_CSV)
    parts = [_gemm_points(rows, h, dtypes) for h in hardware]
    shapes = np.concatenate([p[0] for p in parts if len(p[0])])
    times = np.concatenate([p[1] for p in parts if len(p[0])])
    acc = get_accelerator(ref)
    peak = acc.peak_fp8_flops if dtype == "fp8" else acc.peak_bf16_flops
    src = f"fit to {len(times)} points of gemm.csv ({', '.join(hardware)}; {'/'.join(dtypes)})"
    eta_max = 1.0
    cap = SWEEP_MAMF.get((family, dtype))
    if cap is not None:
        rate = mamf_flops_per_s(*cap)
        if rate:
            eta_max = rate / peak
            src += f"; eta <= MAMF {rate / 1e12:.1f} TFLOP/s ({cap[0]} {cap[1]})"
    return fit_gemm(shapes, times, peak, acc.sm_count, acc.hbm_bytes_per_s, 1.0 if dtype == "fp8" else 2.0, src,
                    eta_max)


@lru_cache(maxsize=None)
def mamf_flops_per_s(hardware: str, dtype_prefix: str) -> float | None:
    """The published maximum achievable matmul FLOP/s (best shape) of a device and dtype in gemm.csv."""
    rows = [r for r in read_rows(GEMM_CSV) if r["hardware"] == hardware and r["dtype"].startswith(dtype_prefix)
            and "MAMF" in r.get("notes", "")]
    return max(float(r["tflops_per_s"]) for r in rows) * 1e12 if rows else None


def _spec(device):
    from topologies.specs import get_accelerator
    return get_accelerator(device) if isinstance(device, str) else device


# Which sustained-vs-burst measurement (gemm_sustained.csv) applies to which device: the same die at the same power
# limit under the same load, or, as an upper bound, the same board at a higher limit (a lower power limit can only
# lower the clock a saturated GPU holds). Devices not listed keep the burst rate and say so (H100 PCIe BF16,
# B300 / GB300, TPU, Ascend: no such measurement at or above their power limit), unless their curve is a sweep
# timed at the power limit (STEADY_STATE_SWEEPS: A100, H100 / H200 / GB200 / GB300 FP8) or takes such a sweep's
# sustained / burst ratio (SWEEP_SUSTAINED_TRANSFER: GB200 BF16). Where a bound is all there is, the model stays
# on its optimistic side, as for the 500 W H100 above.
# device -> (hardware in gemm_sustained.csv, why it applies, whether it only bounds the device's rate from above)
SUSTAINED_SOURCES = {
    "H100-SXM": ("NVIDIA H200 SXM", "the same GH100 die (132 SMs, same peaks) at the same 700 W limit", False),
    "H100-HBM2e": ("NVIDIA H200 SXM", "an upper bound: the same GH100 die at 700 W, where this part runs at "
                   "500 W and holds a lower clock still (unmeasured)", True),
    "H200": ("NVIDIA H200 SXM", "this device", False),
    "B200": ("NVIDIA B200 SXM", "this device", False),
}


@dataclass(frozen=True)
class SustainedRate:
    """The sustained / burst ratio of a device's best matmul rate (MSMF / MAMF of one mamf-finder run)."""

    factor: float
    msmf_flops_per_s: float
    mamf_flops_per_s: float
    source: str
    upper_bound: bool = False       # the measurement bounds the device's sustained rate from above only
    why: str = ""                   # the measured GPU and dtype, and why it applies to this device
    basis: str = "MSMF / MAMF"      # which two measurements the factor divides

    @property
    def label(self) -> str:
        """In a few words, for results' pricing and simulate's table."""
        return f"sustained x{self.factor:.3f} ({self.basis}{', upper bound' if self.upper_bound else ''})"


@lru_cache(maxsize=None)
def sustained_rate(device_name: str, dtype: str) -> SustainedRate | None:
    """MSMF / MAMF of the measurement SUSTAINED_SOURCES names for a device and dtype (bf16 | fp8), or None.

    The best-shape points and the XLA sweeps are burst timings (the GPU at its boost clock; Azure's sweeps are not:
    STEADY_STATE_SWEEPS, which take no factor); a training job holds
    every GPU of the node at its power limit, where the clock settles lower. The ratio of the best rate a shape
    holds over 2 s at the power limit (MSMF) to the best burst (MAMF), measured in one run on an 8-GPU node
    with the other GPUs loaded, converts a burst rate into a sustained one. Measured with mamf-finder's
    version-4 MAMF (median of the 5 fastest boost iterations), which can sit a little above the older
    definition (mean of 100 iterations) behind our sweeps' caps, so the conversion errs slightly slow."""
    entry = SUSTAINED_SOURCES.get(device_name)
    if entry is None:
        return _transferred_sustained_rate(device_name, dtype)
    hardware, why, upper_bound = entry
    prefix = {"bf16": "BF16", "fp8": "FP8"}[dtype]
    rows = [r for r in read_rows(SUSTAINED_CSV) if r["hardware"] == hardware and r["dtype"].startswith(prefix)]
    if not rows:
        return None
    r = rows[0]
    msmf, mamf = float(r["msmf_tflops_per_s"]) * 1e12, float(r["mamf_tflops_per_s"]) * 1e12
    return SustainedRate(msmf / mamf, msmf, mamf,
                         f"x {msmf / mamf:.3f} sustained at the power limit: MSMF / MAMF {msmf / 1e12:.0f} / "
                         f"{mamf / 1e12:.0f} TFLOP/s of {hardware} {prefix} (mamf-finder v4, 8-GPU node under "
                         f"load; {why})", upper_bound, f"{hardware} {prefix}, 8-GPU node under load; {why}")


def _transferred_sustained_rate(device_name: str, dtype: str) -> SustainedRate | None:
    """SWEEP_SUSTAINED_TRANSFER: the best rate of the device's steady-state sweep over its MAMF in the sweep's
    dtype, as the sustained factor of its other dtype (None for the sweep's own dtype: the sweep prices it)."""
    entry = SWEEP_SUSTAINED_TRANSFER.get(device_name)
    if entry is None or entry[1] == dtype or (device_name, dtype) not in MAMF_POINTS:
        return None
    _, sweep_dtype = entry
    hardware, prefixes, _ = GEMM_SWEEPS[entry]
    shapes, times = _gemm_points(read_rows(GEMM_CSV), hardware, prefixes)
    best = float((2.0 * shapes.prod(axis=1) / times).max())
    burst = mamf_flops_per_s(*SWEEP_MAMF[entry])
    mamf = mamf_flops_per_s(*MAMF_POINTS[(device_name, dtype)])
    factor = best / burst
    why = (f"{hardware[0]} {sweep_dtype.upper()}: its sweep's best rate at the power limit, {best / 1e12:.0f} "
           f"TFLOP/s, over its best burst (MAMF), {burst / 1e12:.0f}; MSMF / MAMF is the same in both dtypes to 0.5% "
           "on H200 and B200")
    return SustainedRate(factor, factor * mamf, mamf,
                         f"x {factor:.3f} sustained at the power limit: the {why}", False, why,
                         f"{sweep_dtype.upper()} sweep / MAMF")


def gemm_rate_label(device, dtype: str = "bf16") -> str:
    """How a device's GEMM curve for ``dtype`` is rated, in a few words (results' pricing, simulate's table):
    ``sustained (sweep at the power limit...)`` for a steady-state sweep, ``sustained xF (MSMF / MAMF)`` for a
    burst curve converted (``, upper bound`` where the measurement bounds the device's rate from above only), or
    ``burst (...)``."""
    acc = _spec(device)
    dtype = _gemm_dtype(acc, dtype)
    steady = _steady_state_sweep(acc, dtype)
    if steady is not None:
        capped = ", MSMF cap" if sustained_rate(acc.name, dtype) is not None else ""
        return f"sustained (sweep at the power limit{capped}{'' if steady else ', upper bound'})"
    s = sustained_rate(acc.name, dtype)
    return "burst (no sustained measurement)" if s is None else s.label


def _sweep_family(acc, dtype: str) -> str | None:
    """The family in GEMM_SWEEPS whose sweep prices ``acc`` in ``dtype`` (after _gemm_dtype), or None."""
    fam = DTYPE_SWEEP_FAMILY.get((acc.name, dtype)) or FAMILY.get(acc.name)
    return fam if fam is not None and (fam, dtype) in GEMM_SWEEPS else None


def _steady_state_sweep(acc, dtype: str) -> bool | None:
    """None if ``acc``'s curve in ``dtype`` is not fitted to a steady-state sweep (STEADY_STATE_SWEEPS); else
    whether ``acc`` runs at that sweep GPU's power limit (True) or below it, so that the sweep bounds it (False)."""
    fam = _sweep_family(acc, dtype)
    devices = STEADY_STATE_SWEEPS.get((fam, dtype)) if fam is not None else None
    return None if devices is None else acc.name in devices


def _gemm_dtype(acc, dtype: str) -> str:
    """The dtype a device's GEMMs of ``dtype`` run in: FP8 recipes run BF16 GEMMs where there is no FP8 path."""
    return "bf16" if dtype == "fp8" and acc.peak_fp8_flops is None else dtype


@lru_cache(maxsize=None)
def gemm_curve(device, dtype: str = "bf16") -> GemmCurve:
    """The GEMM curve for an accelerator (spec or spec name) and dtype (bf16 | fp8)."""
    acc = _spec(device)
    dtype = _gemm_dtype(acc, dtype)
    peak = acc.peak_fp8_flops if dtype == "fp8" else acc.peak_bf16_flops
    fam = _sweep_family(acc, dtype)
    if fam is not None:
        params = gemm_params(fam, dtype)
    else:
        shape_fam = SHAPE_FAMILY.get(acc.name, "hopper")
        base = gemm_params(shape_fam, dtype)
        params = GemmParams(base.eta, base.k_half, base.t0_s, base.beta,
                            f"{shape_fam.capitalize()} {dtype} fit borrowed ({base.source})")
        mamf = MAMF_POINTS.get((acc.name, dtype))
        if mamf is not None:
            shapes, times = _gemm_points(read_rows(GEMM_CSV), mamf[0], (mamf[1],))
            curve1 = GemmCurve(GemmParams(1.0, base.k_half, base.t0_s, base.beta), peak, acc.sm_count,
                               acc.hbm_bytes_per_s, 1.0 if dtype == "fp8" else 2.0)
            eta = curve1.time_s(*map(int, shapes[0][[1, 2, 3, 0]])) / times[0]
            # as for the sweeps: the best shape of the search caps eta, so that no shape beats it (with
            # Hopper's k_half the point alone asks for more: the shapes that amortise the per-tile cost
            # better would then run above the best one measured)
            cap = mamf_flops_per_s(*mamf) / peak
            params = GemmParams(min(round(min(eta, 1.0), 3), cap), base.k_half, base.t0_s, base.beta,
                                f"eta from the MAMF best shape of {mamf[0]} {mamf[1]}, capped at its "
                                f"{cap * peak / 1e12:.1f} TFLOP/s; k_half, t0, beta from the "
                                f"{shape_fam.capitalize()} fit ({base.source})")
    sustained = sustained_rate(acc.name, dtype)
    steady = _steady_state_sweep(acc, dtype)
    if steady is not None:
        # timed at the power limit already: no burst-to-sustained factor; the best rate a loaded 8-GPU node
        # sustained (MSMF), where measured, still caps it (the sweep ran one GPU with its neighbours idle)
        src = f"{params.source}; sustained: the sweep ran each shape at the power limit (10,000 warm-up iterations)"
        if not steady:
            src += ", at a higher power limit than this device's: an upper bound"
        eta = params.eta
        if sustained is not None:
            eta = min(eta, sustained.msmf_flops_per_s / peak)
            src += f"; capped at MSMF {sustained.msmf_flops_per_s / 1e12:.0f} TFLOP/s ({sustained.why})"
        params = dataclasses.replace(params, eta=eta, source=src)
    elif sustained is None:
        params = dataclasses.replace(params, source=f"{params.source}; burst rate (no sustained measurement "
                                     "at this device's power limit)")
    else:
        # as the burst rate is capped at the best burst measured, the sustained one is capped at MSMF
        eta = min(params.eta * sustained.factor, sustained.msmf_flops_per_s / peak)
        params = dataclasses.replace(params, eta=eta, source=f"{params.source}; {sustained.source}")
    return GemmCurve(params, peak, acc.sm_count, acc.hbm_bytes_per_s, 1.0 if dtype == "fp8" else 2.0)


# ------------------------------------------------------------------------------------------------ attention
@dataclass(frozen=True)
class SeqCurve:
    """Achieved FLOP/s against sequence length, through the measured points.

    Between measured lengths: linear in log(seq) (the charts sample powers of two). Beyond either end:
    the saturating form 1/rate = a + b/seq through the two end points (rate grows as per-tile fixed costs
    and the causal diagonal's waste amortise over longer rows), held at the end value where those two
    points do not rise. Leave-one-out over every chart series (tests/topologies/test_kernel_curves.py):
    interior points within 9 %, the longest length extrapolated within 4 %, where one least-squares
    R·s/(s + s_half) through all points misses single measured points by up to 12 % (H100
    FlashAttention v1, hdim 128, 2k) and extrapolates the longest within 6 %.
    """

    seqs: tuple
    rates_flops_per_s: tuple

    def at(self, seq: float) -> float:
        s, r = self.seqs, self.rates_flops_per_s
        if len(s) == 1:
            return r[0]
        if s[0] < seq < s[-1]:
            return float(np.interp(math.log(seq), [math.log(x) for x in s], r))
        (s1, r1), (s2, r2) = ((s[0], r[0]), (s[1], r[1])) if seq <= s[0] else ((s[-2], r[-2]), (s[-1], r[-1]))
        end = r1 if seq <= s[0] else r2
        b = (1.0 / r1 - 1.0 / r2) / (1.0 / s1 - 1.0 / s2)
        a = 1.0 / r2 - b / s2
        if b <= 0 or a <= 0:
            return end
        return 1.0 / (a + b / seq)


def seq_curve(seqs, rates) -> SeqCurve:
    """The curve through measured (seq, FLOP/s) points; repeated lengths are averaged."""
    by: dict = {}
    for q, v in zip(seqs, rates):
        by.setdefault(float(q), []).append(float(v))
    keys = sorted(by)
    return SeqCurve(tuple(keys), tuple(sum(by[k]) / len(by[k]) for k in keys))


ATTENTION_DATA = {"hopper": "H100 80GB SXM5", "ampere": "A100 80GB SXM4"}
ATTENTION_KERNEL = "FlashAttention-2"
# The chart series that prices each attention implementation (Kernel.impl) per family. triton = the
# Triton FlashAttention of 2023 stacks (flash_attn_triton.py, llm-foundry's attn_impl: triton). The FA2 charts'
# "FlashAttention Triton" series is a different kernel: OpenAI's triton.ops.flash_attention (the benchmark
# script imports `from triton.ops.flash_attention import attention as attention_triton`). The kernel
# llm-foundry vendored (Tri Dao's, llmfoundry/models/layers/flash_attn_triton.py) documents its speed against
# the CUDA FlashAttention (v1): "Triton forward is generally faster than CUDA forward, while Triton backward is
# generally slower ... Overall Triton forward + backward is slightly slower than CUDA forward + backward." So
# FlashAttention v1's measured series prices it on both families (slightly optimistic, by that statement).
ATTENTION_SERIES = {
    ("hopper", "flash2"): "FlashAttention-2", ("ampere", "flash2"): "FlashAttention-2",
    ("hopper", "triton"): "FlashAttention", ("ampere", "triton"): "FlashAttention",
    ("hopper", "cudnn"): "cuDNN",
}
# Transformer Engine's DotProductAttention (impl "te", the megatron stack) runs cuDNN's fused attention on
# Hopper and later: its backend selection (get_attention_backend) disables FlashAttention "to give
# FusedAttention preference on Hopper+ for performance reasons"; on Ampere it runs flash-attn (FlashAttention-2).
# cuDNN's forward is charted beside FlashAttention-2 and -3 on H100 (the FlashAttention-3 README's chart). Its
# backward is charted beside FlashAttention-2's only without a causal mask (the FlashAttention-3 paper's
# backward chart, head dims 64 and 128: cuDNN 1.3-1.6x FlashAttention-2's rate); so cuDNN's backward is
# FlashAttention-2's backward as priced for the kernel's mask and shape, sped up by that measured ratio at the
# kernel's sequence length and head dim (``cudnn_backward_speedup``; a causal mask is assumed to leave the
# ratio as it is: no chart says otherwise).
TE_ATTENTION = {"hopper": "cudnn", "ampere": "flash2"}
FWD_BWD_FLOPS = 3.5          # FlashAttention benchmark: backward 2.5x forward FLOPs


def kernel_head_dim(head_dim: int, impl: str) -> int:
    """The head dimension an attention implementation's kernel computes with: its tiles are that wide, so
    a head dimension between two compiled ones costs the wider one's time (the padding is wasted work).
    FlashAttention-2 (flash_api.cpp: ``head_size_rounded = head_size <= 192 ? round_multiple(head_size, 32)
    : 256``, kernels for 32, 64, 96, 128, 160, 192, 256); the Triton FlashAttention of llm-foundry
    (flash_attn_triton.py: ``BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)``, masked loads where the
    head dimension is not that block). E.g. MPT-30B's 112 runs the 128-wide kernel in both."""
    d = max(int(head_dim), 1)
    if impl == "cudnn":
        return d            # priced at its own width between the charted ones (64, 128, 256)
    if impl == "triton":
        return max(1 << (d - 1).bit_length(), 16)
    return -(-d // 32) * 32 if d <= 192 else 256


def attention_series(family: str, impl: str) -> str:
    return ATTENTION_SERIES.get((family, impl or "flash2"), ATTENTION_KERNEL)


@lru_cache(maxsize=None)
def attention_fits(family: str, impl: str = "flash2") -> dict:
    """{(pass, causal, head_dim): SeqCurve} for an attention implementation on a family's chart."""
    hw = ATTENTION_DATA[family]
    series = attention_series(family, impl)
    groups: dict = {}
    for r in read_rows(ATTENTION_CSV):
        if r["hardware"] != hw or r["kernel"] != series:
            continue
        key = (r["pass"], r["causal"].startswith("true"), int(r["head_dim"]))
        groups.setdefault(key, []).append((int(r["seq_len"]), float(r["tflops_per_s"]) * 1e12))
    return {k: seq_curve(*zip(*v)) for k, v in groups.items()}


def _by_head_dim(fits: dict, pass_: str, causal: bool, head_dim: int, seq: float) -> float | None:
    """Rate at ``seq`` for ``head_dim``: log-linear between the fitted head dims, clamped outside."""
    dims = sorted(d for (p, c, d) in fits if p == pass_ and c == causal)
    if not dims:
        return None
    if head_dim <= dims[0] or head_dim >= dims[-1]:
        d = dims[0] if head_dim <= dims[0] else dims[-1]
        return fits[(pass_, causal, d)].at(seq)
    hi = next(d for d in dims if d >= head_dim)
    lo = max(d for d in dims if d <= head_dim)
    if hi == lo:
        return fits[(pass_, causal, lo)].at(seq)
    w = (math.log(head_dim) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return (1 - w) * fits[(pass_, causal, lo)].at(seq) + w * fits[(pass_, causal, hi)].at(seq)


@dataclass(frozen=True)
class AttentionCurve:
    family: str
    scale: float = 1.0        # peak ratio to the family's measured device (devices without a chart)
    #: FlashAttention-2's rate relative to the chart device where measured (``fa2_device_ratio``); 0: ``scale``
    fa2_scale: float = 0.0
    fa2_basis: str = ""

    def time_s(self, kern: Kernel) -> float:
        if kern.flops <= 0:
            return 0.0
        impl = kern.impl or "flash2"
        if impl == "te":
            impl = TE_ATTENTION.get(self.family, "flash2")
        scale = self.fa2_scale if impl == "flash2" and self.fa2_scale else self.scale
        seq = rate_seq(kern)
        speedup = 1.0
        if impl == "cudnn" and kern.pass_ != "fwd":
            # FlashAttention-2's backward for this mask, times cuDNN's charted speed-up over it (TE_ATTENTION)
            speedup = cudnn_backward_speedup(self.family, seq, kern.head_dim or 128)
            impl = "flash2"
        fits = attention_fits(self.family, impl)
        d = kernel_head_dim(kern.head_dim, impl) if kern.head_dim else kern.head_dim
        flops = kern.flops * (d / kern.head_dim) if kern.head_dim else kern.flops   # padded tiles' work
        fb = _by_head_dim(fits, "fwd+bwd", kern.causal, d, seq)
        fw = _by_head_dim(fits, "fwd", kern.causal, d, seq)
        if kern.pass_ == "fwd":
            rate = fw if fw is not None else fb
            return flops / (rate * scale)
        f_fwd = flops / (FWD_BWD_FLOPS - 1.0)
        if fw is None:
            return flops / (fb * scale * speedup)
        return max(FWD_BWD_FLOPS * f_fwd / fb - f_fwd / fw, flops / fw) / (scale * speedup)

    @property
    def source(self) -> str:
        te = TE_ATTENTION.get(self.family, "flash2")
        te_bwd = ", FlashAttention-2's backward x cuDNN's charted backward speed-up" if te == "cudnn" else ""
        return (f"{ATTENTION_KERNEL} (Triton stacks: {attention_series(self.family, 'triton')}; Transformer "
                f"Engine: {attention_series(self.family, te)} forward{te_bwd}) fit to "
                f"attention_kernels.csv ({ATTENTION_DATA[self.family]})"
                + (f" scaled by peak ratio {self.scale:.3f}" if self.scale != 1.0 else "")
                + (f"; FlashAttention-2 x{self.fa2_scale:.3f} ({self.fa2_basis})" if self.fa2_scale else "")
                + "; burst rates (no sustained attention measurement is published)")


def rate_seq(kern: Kernel) -> float:
    """The sequence length at which an attention kernel's rate is read off the charts: its keys, or for a causal
    sliding window of w keys (``Kernel.window``) 2w. Tile by tile, such a kernel gives each query row w keys
    (past the first w rows), as causal attention over 2w tokens does on average, and it pays the same per-row
    costs (loading Q, the softmax rescaling, writing O) and one partial diagonal tile per row of tiles (plus the
    window's partial left edge, not priced). No chart measures a windowed kernel."""
    seq = max(kern.seq_kv, 1)
    if kern.window and kern.causal:
        seq = min(seq, 2 * kern.window)
    return seq


def cudnn_backward_speedup(family: str, seq: float, head_dim: int) -> float:
    """cuDNN's backward rate over FlashAttention-2's, both measured without a causal mask at ``seq`` and
    ``head_dim`` (the FlashAttention-3 paper's backward chart; log-linear between its head dims 64 and 128,
    clamped outside); 1.0 where a family has no such chart."""
    cudnn = _by_head_dim(attention_fits(family, "cudnn"), "bwd", False, head_dim, seq)
    fa2 = _by_head_dim(attention_fits(family, "flash2"), "bwd", False, head_dim, seq)
    return cudnn / fa2 if cudnn and fa2 else 1.0


def has_attention_chart(device) -> bool:
    """Whether the accelerator's own architecture has a published attention chart (else it is scaled)."""
    return _spec(device).name in FAMILY


# FlashAttention-2 measured on one GPU of several devices at one configuration (Azure's runs of flash-attention's
# benchmark script): device-to-device ratios, not a chart (attention_azure.csv says why).
ATTENTION_AZURE_CSV = DATA / "attention_azure.csv"


@lru_cache(maxsize=1)
def _azure_fa2() -> dict[str, tuple[str, float]]:
    """device -> (configuration, TFLOP/s) of FlashAttention-2 in attention_azure.csv."""
    return {r["device"]: (r["config"], float(r["tflops_per_s"])) for r in read_rows(ATTENTION_AZURE_CSV)
            if r["kernel"] == "FlashAttention-2"}


def fa2_device_ratio(device) -> tuple[float, str] | None:
    """(FlashAttention-2's rate on ``device`` / on H100-SXM, basis) for Blackwell devices, else None.

    flash-attn 2's kernels are Ampere's (mma.sync tiles) on every GPU; Hopper's wgmma is FlashAttention-3's and
    Blackwell's tcgen05 is cuDNN's and FlashAttention-4's. So on Blackwell FlashAttention-2 does not gain the
    tensor-core peak ratio (x2.27-2.53 in BF16) the fused kernels are priced with: Azure's runs of the same script at
    the same stated configuration measure GB200 at 373.9 against H100's 327.9 TFLOP/s (x1.140). B200, B300 and
    GB300 run the same instruction path and take GB200's ratio (transferred: not measured on them)."""
    acc = _spec(device)
    if SHAPE_FAMILY.get(acc.name) != "blackwell":
        return None
    rows = _azure_fa2()
    (cfg, gb200), (ref_cfg, h100) = rows["GB200"], rows["H100-SXM"]
    if cfg != ref_cfg:
        raise ValueError(f"attention_azure.csv: GB200 ({cfg}) and H100-SXM ({ref_cfg}) at different configurations")
    basis = (f"Azure's FlashAttention-2 runs, GB200 / H100 {gb200} / {h100} TFLOP/s at {cfg}"
             + ("" if acc.name == "GB200" else "; transferred from GB200"))
    return gb200 / h100, basis


@lru_cache(maxsize=None)
def attention_curve(device) -> AttentionCurve:
    """The attention curve of an accelerator: its family's chart, else Hopper's scaled by the BF16 peak
    (FlashAttention-2 on Blackwell by its measured ratio to H100 instead: ``fa2_device_ratio``)."""
    from topologies.specs import get_accelerator
    acc = _spec(device)
    fam = FAMILY.get(acc.name)
    ref = {"hopper": "H100-SXM", "ampere": "A100-80GB"}
    fa2 = fa2_device_ratio(acc) if fam is None else None        # no chart of its own
    if fam is None:
        fam = "hopper"
    return AttentionCurve(fam, round(acc.peak_bf16_flops / get_accelerator(ref[fam]).peak_bf16_flops, 4),
                          *((round(fa2[0], 4), fa2[1]) if fa2 else ()))


def write_fits(path: Path = FITS_JSON) -> dict:
    """Refit every GEMM sweep and write the parameters to ``path``."""
    out = {f"{fam}/{dt}": dataclasses.asdict(fit_gemm_sweep(fam, dt)) for fam, dt in GEMM_SWEEPS}
    atomic.write_text(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    print(json.dumps(write_fits(), indent=1))

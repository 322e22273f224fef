"""Per-GPU speed variation and the slowest GPU of a synchronous job.

GPUs of one SKU do not all run at one speed: each die has its own voltage-frequency-temperature curve, and
power management and cooling differ from slot to slot, so each sustains its own clock under load. A
synchronous training job joins its ranks in collectives every layer (TP, FSDP) or every step (DP), and the
slowest GPU sets the pace of all of them.

Model: relative sustained speed ~ Normal(1, sigma), independent per GPU. The compute of a job on N GPUs runs
at its slowest GPU's pace, so every kernel time is multiplied by

    slowest_gpu_factor(N, sigma) = 1 / (1 - sigma * E[max of N standard normals])

(1.0 for one GPU). Microbenchmarks (GEMM and attention charts, MAMF) measure one GPU, i.e. a typical one.

sigma comes from a measured spread, not from training runs: "I have seen 5% and higher differences on an
8-gpu node" (MAMF on every GPU of one node; ml-engineering, compute/accelerator/README.md, "Not all
accelerators are created equal"). A spread (max - min) of 5% over 8 GPUs gives
sigma = 0.05 / E[range of 8 normals] = 0.05 / 2.847 = 1.76%. Cluster-wide surveys find more (Sinha et al.,
"Not All GPUs Are Created Equal", SC'22: 8% average performance variation between same-SKU GPUs, outliers
up to 1.5x slower than the median GPU); outliers are faults (``--straggler``), not this model.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: Spread of sustained matmul speed across the 8 GPUs of one node (ml-engineering; see the module doc).
NODE_SPREAD = 0.05
NODE_GPUS = 8
#: Largest relative std accepted (a spread this wide is a fault, not variation: use --straggler)
MAX_SIGMA = 0.2


@lru_cache(maxsize=1)
def _grid() -> tuple:
    x = np.linspace(-12.0, 12.0, 24_001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.fromiter(map(math.erf, (x / math.sqrt(2)).tolist()), dtype=float, count=len(x)))
    return x, pdf, cdf


@lru_cache(maxsize=None)
def expected_max_std_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by quadrature of n·x·φ(x)·Φ(x)^(n-1)."""
    if n < 1:
        raise ValueError(f"need at least one GPU, got {n}")
    if n == 1:
        return 0.0
    x, pdf, cdf = _grid()
    y = x * n * pdf * np.power(cdf, n - 1)
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


#: Relative standard deviation of one GPU's sustained speed (1.76%): NODE_SPREAD over the expected range of
#: NODE_GPUS normals (twice the expected maximum, by symmetry).
GPU_SPEED_SIGMA = NODE_SPREAD / (2 * expected_max_std_normal(NODE_GPUS))


def slowest_gpu_factor(n: int, sigma: float = GPU_SPEED_SIGMA) -> float:
    """Multiplier on compute time of a synchronous job on ``n`` GPUs whose speeds vary with ``sigma``."""
    if not (0.0 <= sigma < MAX_SIGMA):
        raise ValueError(f"GPU speed variation must be in [0, {MAX_SIGMA}), got {sigma}")
    if sigma == 0.0 or n <= 1:
        return 1.0
    return 1.0 / (1.0 - sigma * expected_max_std_normal(int(n)))

"""Default calibrations for H100 and H200 (HGX/DGX, 8 GPUs per node), derived from first principles.

No GPU was available to measure them: every number below comes from a datasheet figure and a stated
assumption, written down here so that a reader can redo the arithmetic. ``python -m traces.data.defaults``
regenerates ``traces/data/h100.json`` and ``h200.json`` (the test suite checks that they match). Measure
your own with ``clustersim collect --bench collectives`` and ``clustersim calibrate`` when you can.

Compute (per GPU, dense BF16 tensor cores)
    peak = 132 SMs x 4 tensor cores x 1024 FLOP/clock x 1.83 GHz = 989.4e12 FLOP/s: the H100 SXM5 datasheet
    figure (1,979 TFLOP/s "with sparsity" / 2). The H200 has the same GH100 compute die and clocks, so the
    same peak (its datasheet lists the same 1,979 TFLOP/s with sparsity); its larger, faster HBM3e does not
    change a compute-bound GEMM. Real large GEMMs sustain less under the power limit: this is an upper bound.
    half_saturation_flops = peak x 5 us: a kernel costs its FLOPs at peak plus a fixed launch-and-tail
    latency of about 5 us, so an op of F FLOPs takes F/peak + 5 us and reaches half the peak at F = peak x 5 us.

Collectives (NCCL, busbw in nccl-tests' convention; time = alpha + size x bus_factor / busbw)
    intra-node: NVLink 4 through NVSwitch, 18 links x 25 GB/s = 450 GB/s per direction per GPU (the
    "900 GB/s bidirectional" of the datasheet; same on H200). Ring and direct algorithms are bounded by a
    GPU's per-direction link bandwidth, so busbw = 450e9 B/s. (Check, not a fit: published nccl-tests
    all_reduce busbw on 8 x H100 SXM is 460-480 GB/s with NVLink SHARP doing reductions in the switch.)
    inter-node: one 400 Gb/s ConnectX-7 NIC per GPU (rail-optimised) = 50e9 B/s per direction; the NIC is
    the bottleneck of hierarchical collectives, so busbw = 50e9 B/s.
    alpha = launch + steps x hop latency, with launch = 5 us (as for compute), an NVLink hop = 1 us
    (LL protocol step through NVSwitch), an InfiniBand hop = 3 us (NIC + one switch level + NIC).
    Steps: ring all_reduce 2(n-1), all_gather / reduce_scatter n-1, broadcast / reduce n-1 (pipelined
    chain), all_to_all 1 (all peers at once), p2p 1. Across nodes (8 GPUs each): the intra-node phases plus
    a tree over nodes for all_reduce / broadcast / reduce (2 log2 nodes, log2 nodes hops) and a ring over
    nodes for all_gather / reduce_scatter (nodes - 1); all_to_all and p2p cross one IB hop.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from simulator.calibration import Calibration, CollectiveFit, ComputeFit

HERE = Path(__file__).parent
GPUS_PER_NODE = 8
LAUNCH_S = 5e-6              # kernel launch + tail latency (assumption, see module doc)
NVLINK_HOP_S = 1e-6          # one LL-protocol step through NVSwitch (assumption)
IB_HOP_S = 3e-6              # NIC -> switch -> NIC (assumption)
NVLINK_BYTES_PER_S = 18 * 25e9     # NVLink 4: 18 links x 25 GB/s per direction (H100/H200 datasheets)
NIC_BYTES_PER_S = 400e9 / 8        # ConnectX-7, 400 Gb/s per GPU
BF16_DENSE_FLOPS = 132 * 4 * 1024 * 1.83e9   # = 989.4e12, H100/H200 SXM datasheet (sparse figure / 2)

GPUS = {
    "h100": {"device": "NVIDIA H100 80GB HBM3", "peak": BF16_DENSE_FLOPS, "hbm": "80 GB HBM3, 3.35 TB/s"},
    "h200": {"device": "NVIDIA H200", "peak": BF16_DENSE_FLOPS, "hbm": "141 GB HBM3e, 4.8 TB/s"},
}
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "p2p")
INTRA_SIZES = (2, 4, 8)
INTER_SIZES = (16, 64, 256, 1024)


def _steps_intra(kind: str, n: int) -> int:
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
        return n - 1
    return 1


def _alpha(kind: str, n: int) -> float:
    if n <= GPUS_PER_NODE:
        return LAUNCH_S + _steps_intra(kind, n) * NVLINK_HOP_S
    nodes = n // GPUS_PER_NODE
    intra = _steps_intra(kind, GPUS_PER_NODE) * NVLINK_HOP_S if kind not in ("all_to_all", "p2p") else 0.0
    if kind == "all_reduce":
        inter = 2 * math.log2(nodes)
    elif kind in ("broadcast", "reduce"):
        inter = math.log2(nodes)
    elif kind in ("all_gather", "reduce_scatter"):
        inter = nodes - 1
    else:
        inter = 1
    return LAUNCH_S + intra + inter * IB_HOP_S


def default_calibration(gpu: str) -> Calibration:
    spec = GPUS[gpu]
    cal = Calibration(source={
        "kind": "first principles (no measurement)",
        "gpu": gpu, "device": spec["device"], "hbm": spec["hbm"],
        "derivation": "traces/data/defaults.py (module docstring): datasheet peak dense BF16 "
                      f"{spec['peak']:.4g} FLOP/s; F_half = peak x {LAUNCH_S:g} s launch latency; NVLink 4 "
                      f"{NVLINK_BYTES_PER_S:.3g} B/s per direction intra-node; 400 Gb/s NIC per GPU "
                      f"({NIC_BYTES_PER_S:.3g} B/s) inter-node; alpha = {LAUNCH_S:g} s + steps x hop "
                      f"(NVLink {NVLINK_HOP_S:g} s, IB {IB_HOP_S:g} s)",
        "references": [
            "NVIDIA H100 Tensor Core GPU datasheet: 1,979 TFLOP/s BF16 with sparsity (989 dense), NVLink 900 GB/s",
            "NVIDIA H200 Tensor Core GPU datasheet: 1,979 TFLOP/s BF16 with sparsity, 4.8 TB/s, NVLink 900 GB/s",
            "nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, "
            "reduce_scatter)",
            "published 8 x H100 SXM nccl-tests all_reduce busbw 460-480 GB/s (check of the 450 GB/s bound)",
        ],
        "caveat": "upper bounds: real GEMMs sustain less than the datasheet peak; calibrate from your traces",
    })
    cal.compute.append(ComputeFit(device=spec["device"], peak_flops_per_s=spec["peak"],
                                  half_saturation_flops=spec["peak"] * LAUNCH_S))
    for kind in KINDS:
        for n in INTRA_SIZES + INTER_SIZES:
            if kind == "p2p" and n not in (2, 16):
                continue
            size = 2 if kind == "p2p" else n
            scope = "intra" if n <= GPUS_PER_NODE else "inter"
            bw = NVLINK_BYTES_PER_S if scope == "intra" else NIC_BYTES_PER_S
            cal.collectives.append(CollectiveFit(kind=kind, group_size=size, scope=scope, alpha_s=_alpha(kind, n),
                                                 busbw_bytes_per_s=bw, backend="nccl"))
    return cal


def path_of(gpu: str) -> Path:
    return HERE / f"{gpu}.json"


def main() -> int:
    for gpu in GPUS:
        default_calibration(gpu).save(path_of(gpu))
        print(f"wrote {path_of(gpu)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

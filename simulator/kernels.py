"""Kernel descriptions: what one GPU kernel of a layer phase computes (contract module).

A compute op of a transformer layer carries a ``KernelList`` (``Op.kernels``): the kernels a real
implementation launches for that op, with their shapes, FLOPs and bytes. ``schedules.kernels`` writes
them (per stack: fused Megatron-Core + Transformer Engine, or eager torchtitan); the cost model
(``topologies.kernel_cost``) prices each one and sums. One KernelList object is shared by every op of
the same layer shape and phase, so the engine's op count does not grow. Units: FLOPs, bytes.

Kinds
    gemm         C[M,N] = A[M,K]·B[K,N], ``batch`` independent products (grouped GEMMs of MoE experts);
                 ``dtype`` bf16 | fp8 (Transformer Engine FP8 GEMM); ``chunks`` / ``sm_margin``: a GEMM
                 that overlaps a TP collective (Transformer Engine userbuffers) runs in chunks of rows and
                 may leave SMs to the communication kernel
    attention    fused attention core (FlashAttention); ``pass_`` fwd | bwd; ``seq_q``, ``seq_kv``,
                 ``head_dim``, ``heads`` (query heads on this rank), ``batch`` (sequences), ``causal``,
                 ``impl`` the kernel implementation (flash2 = FlashAttention-2, triton = the Triton
                 FlashAttention of 2023-era stacks), ``window`` the keys per query of a sliding-window
                 kernel (0: causal over the whole sequence)
    elementwise  memory-bound kernel (norm, rotary, activation, residual add, cast/amax, cross-entropy,
                 optimizer step); priced by ``bytes``
"""
from __future__ import annotations

from dataclasses import dataclass

GEMM, ATTENTION, ELEMENTWISE = "gemm", "attention", "elementwise"
KERNEL_KINDS = (GEMM, ATTENTION, ELEMENTWISE)


@dataclass(frozen=True)
class Kernel:
    """One kernel launch. ``flops`` are the FLOPs the kernel executes (causal attention: the unmasked half),
    ``bytes`` what it reads plus writes in device memory."""

    name: str
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    dtype: str = "bf16"
    pass_: str = "fwd"
    seq_q: int = 0
    seq_kv: int = 0
    head_dim: int = 0
    heads: int = 0
    causal: bool = False
    impl: str = ""
    chunks: int = 1        # gemm: run as this many GEMMs of ceil(m / chunks) rows (communication overlap)
    sm_margin: int = 0     # gemm: SMs left to a concurrent communication kernel (not used by the GEMM)
    window: int = 0        # attention: a sliding window's keys per query (0: none)


class KernelList:
    """The kernels of one compute op, in launch order, with a label (e.g. ``"dense layer forward"``).
    Identity-hashed and immutable: the cost model caches its time per (object, device)."""

    __slots__ = ("label", "kernels", "stack", "dtype", "parent")

    def __init__(self, label: str, kernels, stack: str = "", dtype: str = "bf16", parent: "KernelList | None" = None):
        self.label = label
        self.kernels = tuple(kernels)
        self.stack = stack
        self.dtype = dtype
        self.parent = parent      # a piece of this list (a layer phase cut at its overlapped GEMMs), or None

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    def __iter__(self):
        return iter(self.kernels)

    def __repr__(self) -> str:
        return f"<KernelList {self.label!r} {len(self.kernels)} kernels>"

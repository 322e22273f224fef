"""Training strategies the collector runs, as a registry: name -> builder(ctx) -> Strategy.

Each builder takes a ``Context`` (rank, world, device, model shape, knobs) and returns a ``Strategy``:
``plan`` (the parallel degrees and knobs written to the manifest) and ``step(tokens, targets)`` (one
optimizer step on this rank's batch). Every strategy is written with torch.distributed on the default
(world) process group, so it runs on NCCL with GPUs and on gloo with CPUs alike. Imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from traces.models import ModelConfig


@dataclass(frozen=True)
class Context:
    """What a strategy needs to build itself.

    batch          samples per data-parallel rank per step (split into ``microbatches`` for PP)
    bucket_cap_mb  DDP / ZeRO-1 gradient bucket size in MiB (DDP's unit)
    """

    rank: int
    world: int
    device: torch.device
    dtype: torch.dtype
    cfg: ModelConfig
    batch: int
    bucket_cap_mb: float = 25.0
    microbatches: int = 4
    lr: float = 1e-3


class Strategy:
    """One way to train the model. ``data_rank``: which data shard this rank reads (ranks holding replicas
    of the same model shard but different data have different data ranks)."""

    name = ""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.plan: dict = {}
        self.data_rank = ctx.rank

    model: torch.nn.Module
    opt: torch.optim.Optimizer

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """One training step; returns the local loss (a float). The default: forward, loss, backward,
        optimizer step, with whatever communication ``self.model`` / ``self.opt`` do inside."""
        self.opt.zero_grad(set_to_none=True)
        loss = cross_entropy(self.model(tokens), targets)
        loss.backward()
        self.opt.step()
        return loss.item()


def base_plan(ctx: Context, **degrees) -> dict:
    """The manifest's plan: degrees of every axis (default 1) plus batch bookkeeping."""
    plan = {"dp": 1, "tp": 1, "pp": 1, "ep": 1, "zero_stage": 0, "fsdp": False, "microbatches": 1,
            "batch_per_rank": ctx.batch, "optimizer": "adamw", "lr": ctx.lr}
    plan.update(degrees)
    plan["micro_batch"] = ctx.batch // plan["microbatches"]
    plan["global_batch"] = ctx.batch * plan["dp"]
    return plan


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_model(ctx: Context, tp_rank: int = 0, ep_rank: int = 0, **kw):
    """This rank's part of the model (``kw``: Transformer's stage bounds, TP / EP degrees and groups) on
    ``ctx.device`` in ``ctx.dtype``, holding its slice of one reference model initialised with seed 0 on
    every rank: replicated parameters start equal without a broadcast, and every strategy computes the
    same step-0 loss on the same batch as the unsharded model (the tests check it)."""
    from traces.models import Transformer, load_shard
    torch.manual_seed(0)
    full = Transformer(ctx.cfg)
    part = load_shard(Transformer(ctx.cfg, **kw), full, tp_rank, ep_rank) if kw else full
    return part.to(device=ctx.device, dtype=ctx.dtype)


def _registry() -> dict[str, Callable[[Context], Strategy]]:
    from traces.strategies import data_parallel, expert_parallel, pipeline_parallel, tensor_parallel
    return {
        "ddp": data_parallel.DDP,
        "zero1": data_parallel.Zero1,
        "fsdp": data_parallel.FSDP,
        "tp": tensor_parallel.TensorParallel,
        "pp": pipeline_parallel.Pipeline1F1B,
        "ep": expert_parallel.ExpertParallel,
    }


STRATEGIES = ("ddp", "zero1", "fsdp", "tp", "pp", "ep")


def build(name: str, ctx: Context) -> Strategy:
    """Build strategy ``name`` (one of STRATEGIES)."""
    reg = _registry()
    if name not in reg:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return reg[name](ctx)

"""Megatron-style tensor parallelism over the whole world with explicit all_reduces (see
traces.models): every rank reads the same batch."""
from __future__ import annotations

import torch
import torch.distributed as dist

from traces.strategies import Context, Strategy, base_plan, build_model


class TensorParallel(Strategy):
    name = "tp"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.model = build_model(ctx, tp_rank=ctx.rank, tp=ctx.world, tp_group=dist.group.WORLD)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=ctx.lr)
        self.data_rank = 0
        self.plan = base_plan(ctx, tp=ctx.world, sequence_parallel=False,
                              replicated=["embedding", "norms", "lm_head"])

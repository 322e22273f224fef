"""Data parallelism: DDP (bucketed all_reduce overlapping backward), ZeRO-1 (DDP gradients plus
ZeroRedundancyOptimizer: each rank updates a shard of the optimizer state, then broadcasts its
parameters) and FSDP2 (``fully_shard`` per block and on the root: all_gather parameters before use,
reduce_scatter gradients)."""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from traces.strategies import Context, Strategy, base_plan, build_model


class DDP(Strategy):
    name = "ddp"
    zero_stage = 0

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        model = build_model(ctx)
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=ctx.bucket_cap_mb)
        self.opt = self.optimizer(self.model.parameters())
        self.plan = base_plan(ctx, dp=ctx.world, zero_stage=self.zero_stage, bucket_cap_mb=ctx.bucket_cap_mb)

    def optimizer(self, params):
        return torch.optim.AdamW(params, lr=self.ctx.lr)


class Zero1(DDP):
    name = "zero1"
    zero_stage = 1

    def optimizer(self, params):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        # parameters_as_bucket_view: one broadcast per owner rank after the step, not one per tensor
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=self.ctx.lr,
                                       parameters_as_bucket_view=True)


class FSDP(Strategy):
    name = "fsdp"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        model = build_model(ctx)
        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=ctx.lr)
        self.plan = base_plan(ctx, dp=ctx.world, zero_stage=3, fsdp=True, reshard_after_forward=True,
                              fsdp_units="per block + root")

"""Expert parallelism over the whole world: every block's MLP is a mixture of experts whose experts are
sharded over the ranks (token exchange with all_to_all_single, see traces.models.MoE); the dense
parameters are replicated and data-parallel, their gradients summed with one flat all_reduce after the
backward (as one DDP bucket)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from traces.strategies import Context, Strategy, base_plan, build_model, cross_entropy


class ExpertParallel(Strategy):
    name = "ep"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        if not ctx.cfg.experts:
            raise ValueError("ep needs a model with experts (--experts E, a multiple of the world size)")
        self.model = build_model(ctx, ep_rank=ctx.rank, ep=ctx.world, ep_group=dist.group.WORLD)
        named = list(self.model.named_parameters())
        self.dense = [p for n, p in named if ".experts." not in n]
        self.expert = [p for n, p in named if ".experts." in n]
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=ctx.lr)
        self.plan = base_plan(ctx, dp=ctx.world, ep=ctx.world, experts=ctx.cfg.experts, top_k=ctx.cfg.top_k,
                              capacity_factor=ctx.cfg.capacity_factor, dense_grad_sync="one flat all_reduce")

    def step(self, tokens, targets):
        self.opt.zero_grad(set_to_none=True)
        loss = cross_entropy(self.model(tokens), targets)
        loss.backward()
        grads = [p.grad for p in self.dense]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= self.ctx.world
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)
        for p in self.expert:     # expert gradients sum over every rank's tokens: same 1/world scaling
            p.grad /= self.ctx.world
        self.opt.step()
        return loss.item()

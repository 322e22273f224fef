"""Pipeline parallelism over the whole world (one stage per rank) with explicit send/recv and the 1F1B
schedule (Narayanan et al. 2021, PipeDream-Flush): stage s runs min(P - s - 1, M) warm-up forwards,
then alternates one forward and one backward, then drains the remaining backwards.

Sends are ``isend`` (waited at the end of the step) and receives blocking ``recv``, which cannot deadlock
in 1F1B order and avoids the batched isend/irecv that hangs ``torch.distributed.pipelining`` on gloo.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from traces.models import split_layers
from traces.strategies import Context, Strategy, base_plan, build_model, cross_entropy


class Pipeline1F1B(Strategy):
    name = "pp"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        if ctx.batch % ctx.microbatches:
            raise ValueError(f"batch ({ctx.batch}) must be divisible by microbatches ({ctx.microbatches})")
        self.stages = ctx.world
        self.stage = ctx.rank
        self.bounds = split_layers(ctx.cfg.layers, self.stages)
        first, last = self.bounds[self.stage]
        self.model = build_model(ctx, first=first, last=last)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=ctx.lr)
        self.data_rank = 0
        self.plan = base_plan(ctx, pp=self.stages, microbatches=ctx.microbatches, schedule="1f1b",
                              stage_layers=[list(b) for b in self.bounds])

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def step(self, tokens, targets):
        ctx, m = self.ctx, self.ctx.microbatches
        self.opt.zero_grad(set_to_none=True)
        inputs, targs = tokens.chunk(m), targets.chunk(m)
        shape = (ctx.batch // m, tokens.shape[1], ctx.cfg.hidden)
        pending: list = []        # (work, tensor) of isends: the tensor must live until the send completes
        stash: list = []          # (input activation, output) per in-flight micro-batch, FIFO
        losses = []

        def forward(i):
            if self.is_first:
                x = inputs[i]
            else:
                x = torch.empty(shape, device=ctx.device, dtype=ctx.dtype)
                dist.recv(x, self.stage - 1)
                x.requires_grad_()
            y = self.model(x)
            if self.is_last:
                y = cross_entropy(y, targs[i]) / m
                losses.append(y.detach())
            else:
                out = y.detach()
                pending.append((dist.isend(out, self.stage + 1), out))
            stash.append((x, y))

        def backward():
            x, y = stash.pop(0)
            if self.is_last:
                y.backward()
            else:
                g = torch.empty_like(y)
                dist.recv(g, self.stage + 1)
                y.backward(g)
            if not self.is_first:
                pending.append((dist.isend(x.grad, self.stage - 1), x.grad))

        warm = min(self.stages - self.stage - 1, m)
        for i in range(warm):
            forward(i)
        for i in range(warm, m):
            forward(i)
            backward()
        for _ in range(warm):
            backward()
        for work, _ in pending:
            work.wait()
        self.opt.step()
        return float(sum(losses)) if losses else 0.0

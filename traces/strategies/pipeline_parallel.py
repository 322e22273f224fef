"""Pipeline parallelism over the whole world (one stage per rank) with explicit send/recv and the 1F1B
schedule (Narayanan et al. 2021, PipeDream-Flush): stage s runs min(P - s - 1, M) warm-up forwards,
then alternates one forward and one backward, then drains the remaining backwards.

Point-to-point goes through ``_P2P``: a send is held until this stage's next receive and, when that
receive is from the same neighbour, both are posted together with ``batch_isend_irecv`` (one NCCL group),
as Megatron-LM's send_forward_recv_backward / send_backward_recv_forward do: two neighbours that send to
each other at the same moment (1F1B's steady state) cannot deadlock on NCCL, where a pair's sends and
receives share one stream. Everything is waited for at the end of the step. (``torch.distributed.pipelining``
is not used: it hangs on gloo.)
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from traces.models import split_layers
from traces.strategies import Context, Strategy, base_plan, build_model, cross_entropy


class _P2P:
    """Sends held until the next receive and batched with it when both involve the same peer."""

    def __init__(self):
        self.held: tuple | None = None     # (tensor, peer) of a send not posted yet
        self.pending: list = []            # (work, tensor): tensors must live until their send completes

    def send(self, tensor, peer: int) -> None:
        self.flush()
        self.held = (tensor, peer)

    def recv(self, buf, peer: int) -> None:
        ops = []
        if self.held is not None and self.held[1] == peer:
            ops.append(dist.P2POp(dist.isend, *self.held))
            self.pending.append((None, self.held[0]))
            self.held = None
        else:
            self.flush()
        ops.append(dist.P2POp(dist.irecv, buf, peer))
        works = dist.batch_isend_irecv(ops)
        works[-1].wait()
        self.pending.extend((w, None) for w in works[:-1])

    def flush(self) -> None:
        """Post the held send alone."""
        if self.held is not None:
            tensor, peer = self.held
            self.held = None
            (work,) = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer)])
            self.pending.append((work, tensor))

    def wait_all(self) -> None:
        self.flush()
        for work, _ in self.pending:
            if work is not None:
                work.wait()
        self.pending.clear()


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
        p2p = _P2P()
        stash: list = []          # (input activation, output) per in-flight micro-batch, FIFO
        losses = []

        def forward(i):
            if self.is_first:
                x = inputs[i]
            else:
                x = torch.empty(shape, device=ctx.device, dtype=ctx.dtype)
                p2p.recv(x, self.stage - 1)
                x.requires_grad_()
            y = self.model(x)
            if self.is_last:
                y = cross_entropy(y, targs[i]) / m
                losses.append(y.detach())
            else:
                p2p.send(y.detach(), self.stage + 1)
            stash.append((x, y))

        def backward():
            x, y = stash.pop(0)
            if self.is_last:
                y.backward()
            else:
                g = torch.empty_like(y)
                p2p.recv(g, self.stage + 1)
                y.backward(g)
            if not self.is_first:
                p2p.send(x.grad, self.stage - 1)

        warm = min(self.stages - self.stage - 1, m)
        for i in range(warm):
            forward(i)
        for i in range(warm, m):
            forward(i)
            backward()
        for _ in range(warm):
            backward()
        p2p.wait_all()
        self.opt.step()
        return float(sum(losses)) if losses else 0.0

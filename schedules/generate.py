"""Program generators: turn (model, plan) into per-rank programs of one training step.

One *template* program is written per pipeline stage (per stage and EP rank when routing is skewed): the
stage's schedule order (``schedules.pipeline``) expanded into ops, with process groups and peers left
symbolic. Every rank then instantiates its stage's template: ops without rank-specific fields are shared
objects, collectives are shared by the members of a group, so 16,384 programs cost little more than their
list slots. Symmetric mode instantiates one representative per class (stage x CP rank [x EP rank when
skewed]); both modes use the same template, so they simulate to the same step time.

Streams
    compute              compute ops and the collectives on the critical path: TP (Megatron f/g: all-reduce,
                         or all-gather / reduce-scatter with SP) and EP all-to-all dispatch / combine
    dp_comm              data-parallel traffic overlapping compute: DDP / ZeRO-1/2 gradient buckets
                         (launched when their last gradient is ready), ZeRO-1/2 parameter all-gathers,
                         ZeRO-3 / FSDP per-layer all-gathers (prefetched) and reduce-scatters, tied
                         embedding all-reduce
    pp_send_*, pp_recv_* one stream per pipeline neighbour and direction; receives are posted in the
                         sender's production order, compute waits on them
    cp_send, cp_recv     ring attention: KV blocks passed around the CP group, one per ring step (Transformer
                         Engine's P2P ring); under torch's context parallelism (torchtitan stacks) one
                         all-gather of the KV blocks per attention pass, and backward the fp32 dK, dV
                         accumulators passed around the ring (``_gathered_ring_steps``)

Per layer, micro-batch and phase (forward / backward, or backward-input and backward-weight for ZB-H1):
    [FSDP all-gather] -> [TP AG] attention (+ CP ring steps) [TP RS|AR] -> [EP a2a, experts, EP a2a]
    -> [TP AG] MLP [TP RS|AR]      (dense layers fold attention and MLP into one compute op)
Memory events: activations are allocated by the forward and freed by the backward (B frees all but the
part W still needs under ZB-H1); gathered FSDP weights and unsharded gradients are transient buffers.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from schedules import memory as mem
from schedules.kernels import (FSDP1_STACKS, TORCH_CP_STACKS, attention_head_dims, attention_kv_heads,
                               optimizer_step_bytes, phase_kernels, ub_chunks, ub_segments)
from schedules.models import ModelSpec, hybrid_blocks, model_flops_per_step
from schedules.pipeline import Action, layout, next_hop, overlapped_pairs, prev_hop
from schedules.plan import ParallelPlan, recompute_flops, selective_extra_flops
from simulator.calibration import bus_factor
from simulator.errors import ConfigError
from simulator.kernels import ATTENTION, KernelList
from simulator.program import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, COLLECTIVE, FORWARD, OPTIMIZER, RECV, SEND,
                               Op, Programs, no_gc)

PHASE = {"F": FORWARD, "B": BACKWARD, "Bi": BACKWARD_INPUT, "W": BACKWARD_WEIGHT}
ADAM_FLOPS_PER_PARAM = 12.0   # moment updates, bias correction, update: ~a dozen FLOPs per parameter


@dataclass
class Unit:
    """A piece of a stage the program handles as one: a transformer layer, the embedding or the LM head.
    FLOPs and bytes are per rank and per micro-batch."""

    name: str
    layer: int | None
    dense_params: float              # per rank, before ZeRO sharding
    expert_params: float
    f_main: float                    # forward FLOPs outside the experts (incl. attention core)
    f_core: float                    # attention core forward FLOPs (part of f_main)
    f_exp: float                     # routed experts forward FLOPs
    act: float                       # activation bytes kept from forward to backward
    w_frac: float = 0.0              # part of ``act`` only W needs
    transient: float = 0.0           # full / op recompute: activations rebuilt during backward; head: logits
    moe: bool = False
    kind: str = "layer"              # layer | embedding | head
    recompute: str = "none"          # this layer's recomputation (``ParallelPlan.layer_recompute``)
    f_rec: float = 0.0               # op recompute: FLOPs of the GEMMs recomputed before backward
    transient_b: float | None = None   # head: what its backward holds while the loss's gradient runs (None: transient)
    local: tuple = ("", 0)           # the layer's local attention (ModelSpec.local_attention; ("", 0): global)
    block: str = ""                  # a hybrid model's layer: its one block (ModelSpec.layer_kind: M, *, -, E)
    lora_params: float = 0.0         # LoRA: the unit's adapter parameters per rank (what trains, see _grad_sizes)


@dataclass
class Template:
    """A stage's program with symbolic groups and peers: refs[i] is None or ("g", family) / ("pp", stage)
    / ("cp", offset)."""

    key: tuple
    stage: int
    ops: list[Op] = field(default_factory=list)
    refs: dict[int, tuple] = field(default_factory=dict)
    by_family: dict[str, list[int]] | None = None      # filled on first instantiation
    p2p: list[tuple] | None = None


class _StageBuilder:
    def __init__(self, model: ModelSpec, plan: ParallelPlan, stage: int, orders: list[list[Action]],
                 load: float, families: dict[str, str], ep_copies: float | None = None):
        self.m, self.p, self.s = model, plan, stage
        self.orders = orders
        self.load = load
        self.fam = families                       # role -> group family ("grad_dense" -> "dp" ...)
        self.t = Template((stage, load), stage)
        self.dt = model.dtype_bytes
        self.tokens_rank = plan.micro_batch * plan.seq / plan.cp
        self.act_msg = self.tokens_rank * model.hidden * self.dt / (plan.tp if plan.sp else 1)
        self.tp_bytes = self.tokens_rank * model.hidden * self.dt
        self.ep_bytes = ep_dispatch_bytes(model, plan)            # top_k copies per token: what experts compute
        self.ep_wire_bytes = ep_dispatch_bytes(model, plan, ep_copies)  # what the dispatcher sends (dedup)
        self.nv = plan.pieces
        self.units = self._units()
        self.zero = plan.zero_stage
        self.dp_size = plan.dp * plan.cp
        self.edp_size = plan.edp
        self.kernel_lists: dict = {}
        self.unit_recipes: dict = {}               # _unit_ops: a unit's ops per cost signature, to replay
        self.ext_ops: set = set()                  # ops of the unit being written that carry its deps (besides
        #                                            its first op, which always does)

    # ------------------------------------------------------------------ units
    def _units(self) -> list[list[Unit]]:
        m, p = self.m, self.p
        div = p.tp * p.cp
        lora = mem.lora_layer_rank_params(m, p)
        out = []
        cache: dict[bool, Unit] = {}
        for c, layers in enumerate(mem.stage_chunks(m, p, self.s)):
            vs = p.piece(self.s, c)
            units = []
            if vs == 0:
                units.append(Unit("embedding", None, m.embedding_params() / p.tp, 0.0, 0.0, 0.0, 0.0, 0.0,
                                  kind="embedding"))
            for l in layers:
                moe = m.is_moe_layer(l)
                rc = p.layer_recompute(l)
                local = m.local_attention(l)
                block = m.layer_kind(l)
                key = (moe, rc, local, block)
                u = cache.get(key)
                if u is None:
                    lf = m.layer_flops(l, p.seq, p.micro_batch)
                    d, e = mem.layer_param_split(m, p, l)
                    u = Unit("", l, d, e, (lf.forward - lf.experts) / div, lf.attn_core / div,
                             lf.experts * self.load / div, mem.layer_activation_bytes(m, p, l),
                             mem.weight_grad_fraction(m, p, l), mem.backward_transient_bytes(m, p, l), moe,
                             recompute=rc, f_rec=recompute_flops(m, p, l) if rc == "op" else
                             selective_extra_flops(m, p, l) if rc == "selective" else 0.0, local=local,
                             block=block)
                    cache[key] = u
                units.append(Unit(mem.layer_name(m, l), l, u.dense_params, u.expert_params, u.f_main, u.f_core, u.f_exp, u.act,
                                  u.w_frac, u.transient, u.moe, recompute=u.recompute, f_rec=u.f_rec, local=u.local,
                                  block=u.block, lora_params=lora))
            if vs == self.nv - 1:
                head = mem.head_unit_params(m, p, self.s)        # + final norm, MTP projections
                act, act_w = mem.head_activation_bytes(m, p)
                f_head = m.head_flops(p.seq, p.micro_batch) + m.mtp_extra_flops(p.seq, p.micro_batch)
                units.append(Unit("lm_head", None, head, 0.0, f_head / div, 0.0, 0.0,
                                  act, act_w / act if act else 0.0, mem.head_transient_bytes(m, p), kind="head",
                                  transient_b=mem.head_transient_bytes(m, p, backward=True)))
            out.append(units)
        return out

    # ------------------------------------------------------------------ emit helpers
    def emit(self, op: Op, ref: tuple | None = None) -> int:
        self.t.ops.append(op)
        i = len(self.t.ops) - 1
        if ref is not None:
            self.t.refs[i] = ref
        return i

    def coll(self, name, kind, family, size, stream="compute", deps=(), **kw) -> int:
        return self.emit(Op(COLLECTIVE, name, stream, deps, collective=kind, size_bytes=size, **kw), ("g", family))

    def comp(self, name, flops, mem_bytes, deps=(), **kw) -> int:
        return self.emit(Op("compute", name, "compute", deps, flops=flops, mem_bytes=mem_bytes, **kw))

    # ------------------------------------------------------------------ build
    def build(self) -> Template:
        p, s = self.p, self.s
        order = self.orders[s]
        self.last_grad_action = {}                  # chunk -> index of the action producing its last gradients
        self.first_grad_action = {}                 # chunk -> index of the action producing its first gradients
        for i, a in enumerate(order):
            if a.phase in ("B", "W"):
                self.last_grad_action[a.chunk] = i
                self.first_grad_action.setdefault(a.chunk, i)
        self.recv_idx = self._post_recvs()
        self.usages = self._fsdp_usages(order)
        self.residency = mem.fsdp_residency(p, [((order[i].chunk, u.name), order[i].phase) for i, u in self.usages])
        self.ag_idx: dict[int, int] = {}           # usage -> FSDP all-gather op
        self.usage_last: dict[int, int] = {}        # usage -> last op index
        self.usage_pos = 0
        self._usage_cursor = -1
        self.param_ag: dict[tuple, int] = {}        # (chunk, unit name) -> ZeRO-1/2 parameter all-gather
        self.first_fwd_done: set[tuple] = set()
        self.dp_ops: list[int] = []
        if self.zero in (1, 2) and p.overlap_param_gather and self.dp_size > 1:
            self._param_gathers_at_start()
        pairs = overlapped_pairs(p.schedule, p.pp, p.num_microbatches, p.virtual_stages, s)
        skip = False
        for i, a in enumerate(order):
            if skip:
                skip = False
                continue
            if i in pairs:
                start = len(self.t.ops)
                self._action(i, a)
                mid = len(self.t.ops)
                self._action(i + 1, order[i + 1])
                self._overlap(start, mid, len(self.t.ops))
                skip = True
            else:
                self._action(i, a)
        self._step_end()
        return self.t

    # DualPipe's F&B chunks -------------------------------------------------------------------------
    def _overlap(self, start: int, mid: int, end: int) -> None:
        """Overlap the forward in ops [start, mid) with the backward in [mid, end) across the EP
        all-to-all (DeepSeek-V3 report, sec. 3.2.1, fig. 4): each pass is cut after every all-to-all; the
        compute stream alternates the two passes' pieces while each all-to-all runs on the ``ep_overlap``
        stream, so one pass's dispatch/combine hides behind the other's compute. The pair's pipeline sends
        go last, in the order the receivers expect. Without EP all-to-alls nothing changes."""
        ops = self.t.ops

        def is_a2a(i):
            return ops[i].kind == COLLECTIVE and ops[i].strategy == "ep"

        groups = [list(range(start, mid)), list(range(mid, end))]
        if not all(any(is_a2a(i) for i in g) for g in groups):
            return
        sends = [i for i in range(start, end) if ops[i].kind == SEND and ops[i].stream.startswith("pp_send")]
        segs = []
        for g in groups:
            cur, out = [], []
            prev_compute = None
            for i in g:
                if i in sends:
                    continue
                op = ops[i]
                cur.append(i)
                if is_a2a(i):
                    if prev_compute is not None:          # explicit now: it leaves the compute stream
                        op.deps = tuple(sorted(set(op.deps) | {prev_compute}))
                    op.stream = "ep_overlap"
                    out.append(cur)
                    cur = []
                    nxt = next((j for j in g if j > i and ops[j].stream == "compute"), None)
                    if nxt is not None:
                        ops[nxt].deps = tuple(sorted(set(ops[nxt].deps) | {i}))
                elif op.stream == "compute":
                    prev_compute = i
            if cur:
                out.append(cur)
            segs.append(out)
        new = []
        for k in range(max(len(segs[0]), len(segs[1]))):
            for g in segs:
                if k < len(g):
                    new += g[k]
        new += sends
        assert sorted(new) == list(range(start, end))
        pos = {old: start + n for n, old in enumerate(new)}
        moved = [ops[i] for i in new]
        for op in moved:
            op.deps = tuple(pos.get(d, d) for d in op.deps)
        ops[start:end] = moved
        self.t.refs = {pos.get(k, k): v for k, v in self.t.refs.items()}
        self.usage_last = {k: pos.get(v, v) for k, v in self.usage_last.items()}
        self.ag_idx = {k: pos.get(v, v) for k, v in self.ag_idx.items()}
        self.dp_ops = [pos.get(v, v) for v in self.dp_ops]
        self.last_compute = pos.get(self.last_compute, self.last_compute)

    # p2p -------------------------------------------------------------------------------------------
    def _stream_tag(self, other: int) -> str:
        p = self.p.pp
        if p == 2:
            return ""
        return "_next" if other == (self.s + 1) % p else "_prev"

    def _hop(self, stage: int, a: Action, forward: bool) -> tuple[int, int] | None:
        """(stage, chunk) action ``a`` of ``stage`` sends to (forward: activations on, else gradients back);
        None at the model's end or when the next piece is on the same stage (the V layout's turn)."""
        p = self.p
        h = (next_hop if forward else prev_hop)(p.schedule, p.pp, p.virtual_stages, stage, a.chunk)
        return None if h is None or h[0] == stage else h

    def _messages(self, stage: int) -> list[tuple]:
        """(kind, mb, target chunk, dst stage) of every message ``stage`` sends, in its order."""
        out = []
        for a in self.orders[stage]:
            if a.phase == "F":
                h = self._hop(stage, a, True)
                if h is not None:
                    out.append(("act", a.mb, h[1], h[0]))
            elif a.phase in ("B", "Bi"):
                h = self._hop(stage, a, False)
                if h is not None:
                    out.append(("grad", a.mb, h[1], h[0]))
        return out

    def _post_recvs(self) -> dict[tuple, int]:
        p = self.p.pp
        idx = {}
        if p == 1:
            return idx
        for q in sorted({(self.s - 1) % p, (self.s + 1) % p}):
            tag = self._stream_tag(q)
            for kind, mb, c, dst in self._messages(q):
                if dst != self.s:
                    continue
                ph = FORWARD if kind == "act" else (BACKWARD_INPUT if self.p.splits_backward else BACKWARD)
                idx[(kind, mb, c)] = self.emit(
                    Op(RECV, f"recv {kind} mb{mb}", "pp_recv" + tag, (), size_bytes=self.act_msg, microbatch=mb,
                       phase=ph, strategy="pp"), ("pp", q))
        return idx

    # FSDP ------------------------------------------------------------------------------------------
    def _fsdp_usages(self, order) -> list[tuple[int, Unit]]:
        if self.zero < 3 or self.dp_size == 1:
            return []
        out = []
        for i, a in enumerate(order):
            units = self.units[a.chunk]
            if a.phase == "F":
                out += [(i, u) for u in units]
            elif a.phase in ("B", "Bi"):
                out += [(i, u) for u in reversed(units)]
        return out

    def _lora_tp_items(self, u: Unit, back: bool) -> list[tuple]:
        """The TP collectives of a layer's LoRA adapters, as Megatron-Bridge's ParallelLinearAdapter runs them
        (``lora_style`` megatron; none without LoRA): a row-parallel target's adapter (proj, fc2) gathers its m×h
        output over the TP group in forward (gather_output) and, under SP, scatters it back to the sequence shards,
        whose backward is an all-gather; without SP a column-parallel target's adapter (qkv, fc1) copies its
        input into the TP region, whose backward all-reduces the input gradient. Under SP a column-parallel
        adapter reads the norm output its base linear gathered: nothing more. Each is as large as the layer's
        own TP collectives and runs on the compute stream."""
        p = self.p
        if not p.lora_rank or p.lora_style != "megatron":      # dtensor: rank-r intermediates only, not priced
            return []
        mixer, mlp = hybrid_blocks(u.block)
        targets = [t for t in p.lora_targets if (t in ("qkv", "proj") and mixer) or (t in ("fc1", "fc2") and mlp
                                                                                    and not u.moe)]
        items = []
        for t in targets:
            if t in ("proj", "fc2") and (not back or p.sp):
                items.append(("tp", "all_gather"))
            elif t in ("qkv", "fc1") and back and not p.sp:
                items.append(("tp", "all_reduce"))
        return items

    def _gather_sizes(self, u: Unit) -> list[tuple[str, float]]:
        """(role, parameters) of the unit that ZeRO-3 / FSDP gathers (every parameter, frozen or not)."""
        out = []
        if u.dense_params and self.dp_size > 1:
            out.append(("grad_dense", u.dense_params))
        if u.expert_params and self.edp_size > 1:
            out.append(("grad_expert", u.expert_params))
        return out

    def _grad_sizes(self, u: Unit) -> list[tuple[str, float]]:
        """(role, parameters) of the unit that take gradients (reduced over data parallelism, updated, and
        under ZeRO-1/2 gathered after the update): every parameter, or under LoRA the adapters alone."""
        if not self.p.lora_rank:
            return self._gather_sizes(u)
        return [("grad_dense", u.lora_params)] if u.lora_params and self.dp_size > 1 else []

    def _ensure_gathers(self, upto: int) -> None:
        pf = self.p.fsdp_prefetch
        while self.usage_pos <= min(upto, len(self.usages) - 1):
            j = self.usage_pos
            _, u = self.usages[j]
            prev = j - pf - 1
            deps = (self.usage_last[prev],) if prev >= 0 else ()
            last = None
            for role, n in (self._gather_sizes(u) if self.residency[j][0] else ()):
                b = n * self.dt
                last = self.coll(f"fsdp AG {u.name}", "all_gather", self.fam[role], b, "dp_comm", deps,
                                 alloc=(("buffers", b),), layer=u.layer, strategy="fsdp")
                self.dp_ops.append(last)
            if last is not None:
                self.ag_idx[j] = last
            self.usage_pos += 1

    # actions ---------------------------------------------------------------------------------------
    def _action(self, i: int, a: Action) -> None:
        p = self.p
        units = self.units[a.chunk]
        deps = []
        src = (a.phase == "F" and self._hop(self.s, a, False)) or \
            (a.phase in ("B", "Bi") and self._hop(self.s, a, True))
        if src:     # the input comes from another stage (a local V turn follows the compute stream's order)
            deps.append(self.recv_idx[("act" if a.phase == "F" else "grad", a.mb, a.chunk)])
        seq = units if a.phase == "F" else list(reversed(units))
        last = None
        zero2_buckets = self.zero == 2 and a.phase in ("B", "W")
        grad_bucket_now = (self.zero in (0, 1) and a.phase in ("B", "W") and self.last_grad_action.get(a.chunk) == i
                           and p.overlap_grad_reduce)
        buckets = _Buckets(self, "reduce_scatter" if self.zero >= 1 else "all_reduce") \
            if (zero2_buckets or grad_bucket_now) else None
        self.cur_action = i
        for u in seq:
            udeps = list(deps)
            deps = []
            if p.tp_comm_overlap and last is not None:
                udeps.append(last)      # the unit before may end on the tp_overlap stream (its last reduce-scatter)
            usage = None
            if self.usages and a.phase != "W":
                usage = self.usage_pos_of(i, u)
                self._ensure_gathers(usage + p.fsdp_prefetch)
                if usage in self.ag_idx:
                    copy_out = p.fsdp and p.stack not in FSDP1_STACKS
                    udeps.append(self._fsdp_copy_out(u, a, self.ag_idx[usage]) if copy_out else self.ag_idx[usage])
            if a.phase == "F" and (a.chunk, u.name) in self.param_ag and (a.chunk, u.name) not in self.first_fwd_done:
                udeps.append(self.param_ag[(a.chunk, u.name)])
                self.first_fwd_done.add((a.chunk, u.name))
            _, last = self._unit_ops(u, a, udeps, released=usage is not None and self.residency[usage][1])
            if usage is not None:
                self.usage_last[usage] = last
            if a.phase in ("B", "W"):
                if self.zero >= 3 and (p.pp == 1 or self.last_grad_action[a.chunk] == i):
                    self._fsdp_reduce(u, a, last)
                elif buckets is not None:
                    buckets.add(u, last)
        if buckets is not None:
            buckets.flush_all()
        # pipeline send
        if a.phase in ("F", "B", "Bi"):
            h = self._hop(self.s, a, a.phase == "F")
            if h is not None:
                self._send("act" if a.phase == "F" else "grad", a, h[0], last)
        self.last_compute = last

    def usage_pos_of(self, action_idx: int, u: Unit) -> int:
        # usages are consumed in order; find the next one matching this (action, unit)
        j = self._usage_cursor = self._usage_cursor + 1
        ai, uu = self.usages[j]
        assert ai == action_idx and uu is u, "FSDP usage order out of sync"
        return j

    def _send(self, kind: str, a: Action, dst: int, dep: int) -> None:
        tag = self._stream_tag(dst)
        ph = FORWARD if kind == "act" else PHASE[a.phase]
        self.emit(Op(SEND, f"send {kind} mb{a.mb}", "pp_send" + tag, (dep,), size_bytes=self.act_msg, microbatch=a.mb,
                     phase=ph, strategy="pp"), ("pp", dst))

    # one unit ------------------------------------------------------------------------------------
    def _unit_ops(self, u: Unit, a: Action, deps: list[int], released: bool) -> tuple[int, int]:
        """Emit the ops of unit ``u`` for action ``a``; return (first, last) op indices. ``released``: FSDP
        frees the unit's gathered parameters after this use.

        Units of equal numbers (the layers of a stage) run the same ops in every micro-batch of a phase:
        the first time, ``_write_unit_ops`` writes them and they are kept as a recipe; later units copy the
        recipe's ops with their own names, labels and dependencies (the same ops, written faster)."""
        back_grads = a.phase in ("B", "W") and self.zero >= 2 and (
            self.zero == 2 or self.p.pp == 1 or self.first_grad_action[a.chunk] == self.cur_action)
        key = (u.kind, u.moe, u.local, u.block, u.recompute, u.dense_params, u.expert_params, u.f_main, u.f_core, u.f_exp,
               u.act, u.w_frac, u.transient, u.f_rec, a.phase, released, back_grads)
        ops, refs = self.t.ops, self.t.refs
        start = len(ops)
        recipe = self.unit_recipes.get(key)
        if recipe is None:
            self.ext_ops = set()
            first, last = self._write_unit_ops(u, a, deps, released)
            name = u.name if u.kind != "layer" else f"{a.phase} {u.name}"
            rows = []
            ext = tuple(deps)
            for j in range(start, len(ops)):
                op = ops[j]
                outer = j == start or j in self.ext_ops     # ops written with the unit's deps
                inner = op.deps[len(ext):] if outer and op.deps[:len(ext)] == ext else op.deps
                if j == start and inner or any(d < start for d in inner):  # not self-contained: never replayed
                    self.unit_recipes[key] = False
                    return first, last
                rows.append((op.copy(), refs.get(j), tuple(d - start for d in inner),      # (later edits stay)
                             1 if op.name == name else 2 if op.name == f"{name} ring" else 0, outer))
            self.unit_recipes[key] = (rows, first - start, last - start)
            return first, last
        if recipe is False:
            self.ext_ops = set()
            return self._write_unit_ops(u, a, deps, released)
        rows, first, last = recipe
        name = u.name if u.kind != "layer" else f"{a.phase} {u.name}"
        layer, mb = u.layer, a.mb
        for k, (op, ref, inner, named, outer) in enumerate(rows):
            new = op.copy()
            new.deps = (tuple(deps) if outer else ()) + (tuple(d + start for d in inner) if inner else ())
            new.layer, new.microbatch = layer, mb
            if named:
                new.name = name if named == 1 else f"{name} ring"
            ops.append(new)
            if ref is not None:
                refs[start + k] = ref
        return start + first, start + last

    def _write_unit_ops(self, u: Unit, a: Action, deps: list[int], released: bool) -> tuple[int, int]:
        """``_unit_ops`` written out op by op."""
        p, m = self.p, self.m
        ph = PHASE[a.phase]
        mb = a.mb
        lab = dict(layer=u.layer, microbatch=mb, phase=ph)
        back = a.phase != "F"
        tp = p.tp > 1 and a.phase != "W"
        ep = u.moe and p.ep > 1 and a.phase != "W"
        pbytes = (u.dense_params + u.expert_params) * self.dt
        # FLOPs of this phase (per rank)
        lin_main = u.f_main - u.f_core
        # LoRA: no weight gradients of the frozen model; the adapters' FLOPs (each pass as a forward)
        wgrad, f_lora = (0.0, 2.0 * u.lora_params * p.micro_batch * p.seq / p.cp) if p.lora_rank else (1.0, 0.0)
        if a.phase == "F":
            main, exp = u.f_main + f_lora, u.f_exp
        elif a.phase == "W":
            main, exp = lin_main * wgrad + f_lora, u.f_exp * wgrad
        else:
            main = lin_main + 2 * u.f_core + (lin_main * wgrad + f_lora if a.phase == "B" else 0.0) + f_lora
            exp = u.f_exp * (1 + wgrad if a.phase == "B" else 1)
            if u.kind != "layer":
                pass                # recomputation applies to transformer layers only
            elif u.recompute == "full":
                main, exp = main + u.f_main + f_lora, exp + u.f_exp
            elif u.recompute == "selective":      # Megatron's recompute_modules (core_attn by default)
                mods = p.recompute_modules
                main += (u.f_core if "core_attn" in mods and u.block != "M" else 0.0) + u.f_rec
                if "moe" in mods:
                    exp += u.f_exp
            elif u.recompute == "op":
                main += u.f_rec
        if u.kind == "embedding":
            main = 0.0
        # memory events on the first / last op of the unit
        alloc, free = [], []
        tb = u.transient if u.transient_b is None else u.transient_b     # held while the backward runs
        if a.phase == "F" and u.act:
            alloc.append(("activations", u.act))
            if u.kind == "head" and u.transient:     # the logits while the loss runs
                alloc.append(("activations", u.transient)); free.append(("activations", u.transient))
        elif a.phase == "B":
            if u.act:
                free.append(("activations", u.act))
            if tb:
                alloc.append(("activations", tb)); free.append(("activations", tb))
        elif a.phase == "Bi":
            if u.act * (1 - u.w_frac):
                free.append(("activations", u.act * (1 - u.w_frac)))
            if tb:
                alloc.append(("activations", tb)); free.append(("activations", tb))
        elif a.phase == "W" and u.act * u.w_frac:
            free.append(("activations", u.act * u.w_frac))
        if released:
            free += [("buffers", n * self.dt) for _, n in self._gather_sizes(u)]
        if back and a.phase != "Bi" and self.zero >= 2 and (
                self.zero == 2 or p.pp == 1 or self.first_grad_action[a.chunk] == self.cur_action):
            # unsharded gradients until their reduce-scatter (ZeRO-3 under PP: accumulated over the step)
            alloc += [("buffers", n * p.grad_buffer_bytes_per_param) for _, n in self._grad_sizes(u)]
        memb = pbytes + u.act
        back_coll = "reduce_scatter" if p.sp else "all_reduce"
        if u.kind == "embedding":
            seq = [("c", main, self.tp_bytes + pbytes)]
            if tp and not back:
                seq.append(("tp", back_coll))
        elif u.kind == "head":
            seq = [("c", main, memb)]
            if tp and back:
                seq.append(("tp", back_coll))
            elif tp and p.sp:
                seq.insert(0, ("tp", "all_gather"))
        elif a.phase == "W":
            seq = [("c", main + exp, memb)]
        else:
            ring = p.cp > 1 and u.f_core > 0
            core_step = 0.0
            if ring:     # attention-core FLOPs of this phase, spread over the cp ring steps
                core = u.f_core if a.phase == "F" else (
                    2 * u.f_core + (u.f_core if u.recompute == "full" or (
                        u.recompute == "selective" and "core_attn" in p.recompute_modules) else 0.0))
                core_step = core / p.cp
            attn = [("attn", main - core_step * (p.cp - 1), memb, core_step, p.cp - 1 if ring else 0)]
            # Transformer Engine's userbuffers overlap (plan.tp_comm_overlap): the attention block's and the
            # dense MLP's TP collectives run beside the layer's GEMMs; ("tp", kind, "ub", c): c > 0 for a
            # forward reduce-scatter whose last of c chunks is exposed after its GEMM
            ub = p.tp_comm_overlap and tp and u.kind == "layer"
            if ub:
                attn = [("tp", "all_gather", "ub", 0, "qkv fprop")] + attn + \
                    [("tp", back_coll, "ub", ub_chunks(p.dtype, "proj fprop", p.tp), "proj fprop")]
            elif tp and hybrid_blocks(u.block)[0]:     # (a hybrid model's MLP-only layer has no mixer block)
                attn = ([("tp", "all_gather")] if p.sp else []) + attn + [("tp", back_coll)]
            if not hybrid_blocks(u.block)[1]:       # a hybrid model's mixer-only layer: no MLP block
                mlp = []
            elif u.moe:
                a2a = [("ep",)] if ep else []
                experts = [("c", exp, u.expert_params * self.dt)]
                if p.folded:
                    # Megatron's alltoall dispatcher on the expert grid: the rank's own (sequence-parallel)
                    # tokens go to their EP ranks, which gather them over the experts' TP group (etp)
                    if p.expert_tp > 1:
                        experts = [("etp", "all_gather")] + experts + [("etp", "reduce_scatter")]
                    mlp = a2a + experts + a2a
                    if tp and m.shared_experts:     # the shared experts stay tensor-parallel (SP gather / scatter)
                        mlp = [("tp", "all_gather")] + mlp + [("tp", back_coll)]
                else:
                    mlp = a2a + experts + a2a
                    if tp:
                        mlp = ([("tp", "all_gather")] if p.sp else []) + mlp + [("tp", back_coll)]
            elif ub:
                mlp = [("tp", "all_gather", "ub", 0, "fc1 fprop"),
                       ("tp", "reduce_scatter", "ub", ub_chunks(p.dtype, "fc2 fprop", p.tp), "fc2 fprop")]
            else:      # the dense MLP's FLOPs are in the attention op; only its TP collectives remain
                mlp = ([("tp", "all_gather"), ("tp", "reduce_scatter")] if tp and p.sp else
                       [("tp", "all_reduce")] if tp else [])
            seq = attn + mlp
            if back:   # backward runs the layer in reverse; Megatron's f/g conjugates swap AG and RS
                fwd_comm = [x for x in seq if x[0] in ("tp", "etp", "ep")]
                seq = [(x[0], _swap(x[1])) + ((x[2], 0, BACKWARD_SLOT[x[4]]) if _overlapped(x) else ())
                       if x[0] in ("tp", "etp") else x for x in reversed(seq)]
                if ub:      # the bulk all-gathers of the saved (sequence-sharded) GEMM inputs for wgrad
                    seq += [("tp", "all_gather", "ub", 0, "qkv dgrad")] + \
                        ([] if u.moe else [("tp", "all_gather", "ub", 0, "fc1 dgrad")])
                if u.recompute == "full":
                    # full recomputation re-runs the layer's forward, its TP collectives and expert
                    # all-to-alls included (Megatron's CheckpointFunction, torch.utils.checkpoint)
                    seq = fwd_comm + seq
                elif u.recompute == "selective" and u.moe and "moe" in p.recompute_modules:
                    # Megatron's moe recompute module re-runs the MoE block's forward: its dispatch and
                    # combine all-to-alls (and expert-TP collectives) run again before its backward
                    seq = [x for x in fwd_comm if x[0] in ("ep", "etp")] + seq
        if tp and u.kind == "layer" and a.phase != "W":
            seq = seq + self._lora_tp_items(u, back)
            if back and u.recompute == "full":     # the recomputed forward runs the adapters' collectives again
                seq = self._lora_tp_items(u, False) + seq
        if any(map(_overlapped, seq)):
            return self._write_overlapped(u, a, seq, deps, lab, alloc, free)
        first = last = None
        for n, item in enumerate(seq):
            d = tuple(deps) if n == 0 else ()
            kw = dict(lab)
            if n == 0 and alloc:
                kw["alloc"] = tuple(alloc)
            if n == len(seq) - 1 and free:
                kw["free"] = tuple(free)
            idx = self._write_item(u, a, item, d, kw, lab)
            if first is None:
                first = idx
            last = idx
        return first, last

    def _write_overlapped(self, u: Unit, a: Action, seq: list, deps: list[int], lab: dict, alloc: list,
                          free: list) -> tuple[int, int]:
        """A layer's ops under TP communication overlap (Transformer Engine userbuffers). The items of ``seq``
        other than the overlapped TP collectives (tagged "ub") run in order on the compute stream, the
        layer's main compute op cut into pieces at its overlapped GEMMs (``ub_segments``); each overlapped
        collective runs on the ``tp_overlap`` stream beside the GEMM its userbuffers slot pairs it with
        (``_write_pieces``), and the piece after that GEMM waits for it. A collective whose GEMM the kernel
        list does not hold runs after the compute op. The unit ends when both streams are done."""
        ub: dict = {}
        for x in filter(_overlapped, seq):
            ub.setdefault(x[4], []).append(x)
        main = [x for x in seq if not _overlapped(x)]
        first = last = None
        after = None                      # a collective's end the next compute-stream op waits for
        for n, item in enumerate(main):
            d = tuple(deps) if n == 0 else ()
            if after is not None:
                d, after = d + (after,), None
            kw = dict(lab)
            if n == 0 and alloc:
                kw["alloc"] = tuple(alloc)
            if item[0] == "attn":
                idx, after = self._write_pieces(u, a, item, d, kw, lab, ub, last, deps)
            else:
                idx = self._write_item(u, a, item, d, kw, lab)
            first = idx if first is None else first
            last = idx
        for x in (x for items in ub.values() for x in items):     # no GEMM to pair with: after the op
            after = self.coll(f"tp {x[1]}", x[1], "tp", self.tp_bytes, "tp_overlap", (last,), strategy="tp", **lab)
        if after is not None:             # the unit ends with a collective: a zero-time wait after both streams
            last = self.emit(Op("compute", "tp overlap wait", "tp_overlap", (last,), duration_s=0.0, **lab))
        if free:
            self.t.ops[last].free = tuple(free)
        return first, last

    def _write_pieces(self, u: Unit, a: Action, item: tuple, d: tuple, kw: dict, lab: dict, ub: dict,
                      before: int | None, deps: list[int]) -> tuple[int, int | None]:
        """The layer's main compute op as its pieces (``ub_segments``), each overlapped GEMM beside its
        collective: the collective starts with the GEMM (after the piece before it); a forward
        reduce-scatter's last chunk (1/c of its bytes) starts when the GEMM ends (the pipelined chunks end
        with the last GEMM chunk), the rest beside it; the next piece waits for the collective. Ring
        attention's steps follow the piece holding the attention core. Returns (last compute op, the
        pending collective's end or None)."""
        name = u.name if u.kind != "layer" else f"{a.phase} {u.name}"
        pieces = ub_segments(self._kernels(u, a.phase, "attn"))
        total = sum(kl.flops for kl, _ in pieces)
        pending, last = None, before
        ring_after = max((j for j, (kl, _) in enumerate(pieces) if any(k.kind == ATTENTION for k in kl.kernels)),
                         default=0)
        for j, (kl, slot) in enumerate(pieces):
            sd = d if j == 0 else ()
            if pending is not None:
                sd, pending = sd + (pending,), None
            share = kl.flops / total if total else (1.0 if j == 0 else 0.0)
            idx = self.comp(name, item[1] * share, item[2] if j == 0 else 0.0, sd, kernels=kl,
                            **(kw if j == 0 else lab))
            items = ub.get(slot) if slot is not None else None
            if items:
                x = items.pop(0)
                if last is None:          # the unit's first op: the collective starts with the unit's deps
                    self.ext_ops.add(len(self.t.ops))
                    cd = tuple(deps)
                else:
                    cd = (last,) + sd
                size = self.tp_bytes * (1.0 - 1.0 / x[3]) if x[3] else self.tp_bytes
                pending = self.coll(f"tp {x[1]}", x[1], "tp", size, "tp_overlap", cd, strategy="tp", **lab)
                if x[3]:
                    pending = self.coll(f"tp {x[1]} (last chunk)", x[1], "tp", self.tp_bytes / x[3],
                                        "tp_overlap", (idx,), strategy="tp", **lab)
            last = idx
            if item[4] and j == ring_after:
                last = self._ring_steps(u, a, item, idx, lab)
        return last, pending

    def _ring_steps(self, u: Unit, a: Action, item: tuple, block_ready: int, lab: dict, free=None) -> int:
        """Ring attention after the op ``block_ready`` that attended to the rank's own KV block: item[4] steps
        that pass a KV block on and attend to the one received (item[3] FLOPs each); returns the last step's
        op, which carries ``free``."""
        if self.p.stack in TORCH_CP_STACKS:
            return self._gathered_ring_steps(u, a, item, block_ready, lab, free)
        name = u.name if u.kind != "layer" else f"{a.phase} {u.name}"
        kv = self._kv_bytes() * (2 if a.phase != "F" else 1)
        idx = block_ready
        for step in range(item[4]):
            self.emit(Op(SEND, "cp kv", "cp_send", (block_ready,), size_bytes=kv, strategy="cp", **lab), ("cp", 1))
            block_ready = self.emit(Op(RECV, "cp kv", "cp_recv", (), size_bytes=kv, strategy="cp", **lab),
                                    ("cp", -1))
            fr = {"free": free} if free and step == item[4] - 1 else {}
            idx = self.comp(f"{name} ring", item[3], 0.0, (block_ready,), **lab, **fr,
                            kernels=self._kernels(u, a.phase, "ring"))
        return idx

    def _gathered_ring_steps(self, u: Unit, a: Action, item: tuple, block_ready: int, lab: dict, free=None) -> int:
        """torch's context parallelism (``TORCH_CP_STACKS``): one all-gather of every rank's K, V block (the
        gathered cp blocks), issued with the rank's own block and waited before the first of the item[4] other
        blocks. Backward also passes the fp32 dK, dV accumulators on (twice the bf16 block's bytes): this rank's
        after its own block, then after each other block the one received from the previous rank (its wait
        before the accumulation), and a last hop brings each rank its own accumulated gradients, which the
        layer's backward waits for (a zero-time op on the compute stream). Returns the last compute op, which
        carries ``free``."""
        name = u.name if u.kind != "layer" else f"{a.phase} {u.name}"
        kv = self._kv_bytes()
        backward = a.phase != "F"
        gathered = self.coll("cp kv all-gather", "all_gather", "cp", kv * self.p.cp, "cp_send", (block_ready,),
                             strategy="cp", **lab)
        dkv = 2 * kv
        if backward:
            self.emit(Op(SEND, "cp dkv", "cp_send", (block_ready,), size_bytes=dkv, strategy="cp", **lab), ("cp", 1))
        idx = block_ready
        for step in range(item[4]):
            fr = {"free": free} if free and step == item[4] - 1 and not backward else {}
            idx = self.comp(f"{name} ring", item[3], 0.0, (gathered,) if step == 0 else (), **lab, **fr,
                            kernels=self._kernels(u, a.phase, "ring"))
            if backward:
                got = self.emit(Op(RECV, "cp dkv", "cp_recv", (), size_bytes=dkv, strategy="cp", **lab), ("cp", -1))
                self.emit(Op(SEND, "cp dkv", "cp_send", (idx, got), size_bytes=dkv, strategy="cp", **lab), ("cp", 1))
        if backward:
            got = self.emit(Op(RECV, "cp dkv", "cp_recv", (), size_bytes=dkv, strategy="cp", **lab), ("cp", -1))
            idx = self.emit(Op("compute", "cp dkv wait", "compute", (got,), duration_s=0.0, strategy="cp",
                               **lab, **({"free": free} if free else {})))
        return idx

    def _write_item(self, u: Unit, a: Action, item: tuple, d: tuple, kw: dict, lab: dict) -> int:
        """Emit one item of a unit's sequence (a compute op, with ring attention's steps, or a
        collective); returns the index of its last op."""
        p = self.p
        name = u.name if u.kind != "layer" else f"{a.phase} {u.name}"
        if item[0] in ("c", "attn"):
            kl = self._kernels(u, a.phase, "attn" if item[0] == "attn" else "c")
            idx = self.comp(name, item[1], item[2], d, kernels=kl,
                            **(kw if item[0] == "c" or not item[4] else
                               {k: v for k, v in kw.items() if k != "free"}))
            if item[0] == "attn" and item[4]:     # our own KV block first, then the ring's
                idx = self._ring_steps(u, a, item, idx, lab, kw.get("free"))
        elif item[0] == "tp":
            idx = self.coll(f"tp {item[1]}", item[1], "tp", self.tp_bytes, "compute", d, strategy="tp", **kw)
        elif item[0] == "etp":      # the routed tokens of the expert TP group (gathered size)
            idx = self.coll(f"etp {item[1]}", item[1], "etp", self.ep_bytes * p.expert_tp, "compute", d,
                            strategy="ep", **kw)
        else:
            idx = self.coll("ep all_to_all", "all_to_all", "ep", self.ep_wire_bytes, "compute", d, strategy="ep",
                            **kw)
        return idx

    def _kernels(self, u: Unit, phase: str, item: str):
        """The shared KernelList of a compute op of unit ``u`` (schedules.kernels), cached per shape."""
        key = (u.kind, u.moe, u.local, u.block, u.recompute, phase, item)
        kl = self.kernel_lists.get(key)
        if kl is None:
            m, p, ph = self.m, self.p, PHASE[phase]
            layer = u.layer
            if u.kind != "layer":
                kl = phase_kernels(m, p, None, ph, part=u.kind)
            elif item == "ring":
                kl = phase_kernels(m, p, layer, ph, part="ring")
            elif not u.moe:
                kl = phase_kernels(m, p, layer, ph, part="layer")
            elif item == "attn":
                kl = phase_kernels(m, p, layer, ph, part="attention")
            elif phase == "W":       # one op holds the attention block's and the experts' weight gradients
                a_ = phase_kernels(m, p, layer, ph, part="attention")
                e_ = phase_kernels(m, p, layer, ph, part="experts", load=self.load)
                kl = KernelList(f"moe layer {ph}", a_.kernels + e_.kernels, a_.stack, a_.dtype)
            else:
                kl = phase_kernels(m, p, layer, ph, part="experts", load=self.load)
            self.kernel_lists[key] = kl
        return kl

    def _kv_bytes(self) -> float:
        """Bytes of this rank's K, V block that context parallelism passes on: the attention kernel's K and V
        inputs, at the query heads under repeat_kv and MLA, else at the kv heads. MLA too: Megatron-Core
        up-projects K and V per head before Transformer Engine's attention (multi_latent_attention.py,
        ``qkv_up_proj_and_rope_apply``), whose ring passes those; torch's rotates what its kernel reads."""
        m, p = self.m, self.p
        width = attention_kv_heads(m, p) * sum(attention_head_dims(m))
        return self.tokens_rank * width * self.dt

    # data parallel ---------------------------------------------------------------------------------
    def _fsdp_copy_out(self, u: Unit, a: Action, gather: int) -> int:
        """FSDP2 (per-parameter sharding) copies the all-gathered flat buffer out into the unit's parameters
        on the compute stream before using them (``foreach_all_gather_copy_out``): read + write of the
        unsharded parameter bytes. ZeRO-3 with flat buffers uses views and has no such copy."""
        nbytes = sum(n for _, n in self._gather_sizes(u)) * self.dt
        return self.comp(f"fsdp copy-out {u.name}", 0.0, 2 * nbytes, (gather,), layer=u.layer, microbatch=a.mb,
                         phase=PHASE[a.phase], strategy="fsdp")

    def _fsdp_reduce(self, u: Unit, a: Action, last: int) -> None:
        if self.p.splits_backward and a.phase == "Bi":
            return
        if self.p.fsdp:
            # FSDP2 copies the unit's unsharded gradients into the reduce-scatter input (in the reduction's
            # precision) on the compute stream (``foreach_reduce_scatter_copy_in``): read g, write r bytes per
            # element. FSDP1 casts its flat gradient to the reduction's precision where it differs
            # (``_post_backward_hook``), then divides it in place (pre-divide): read g, write r; read + write r
            n = sum(n for _, n in self._grad_sizes(u))
            g, r = self.p.grad_bytes_per_param, self.p.grad_reduce_bytes
            fsdp1 = self.p.stack in FSDP1_STACKS
            cast = g + r if r != g else 0.0         # FSDP1's cast of the flat gradient, where the precisions differ
            per = cast + 2 * r if fsdp1 else g + r
            what = "grad pre-divide" if fsdp1 else "copy-in"
            if n:
                last = self.comp(f"fsdp {what} {u.name}", 0.0, n * per, (last,), layer=u.layer,
                                 microbatch=a.mb, phase=PHASE[a.phase], strategy="fsdp")
        for role, n in self._grad_sizes(u):
            self.dp_ops.append(self.coll(f"fsdp RS {u.name}", "reduce_scatter", self.fam[role],
                                         n * self.p.grad_reduce_bytes, "dp_comm", (last,),
                                         free=(("buffers", n * self.p.grad_buffer_bytes_per_param),),
                                         layer=u.layer, microbatch=a.mb, strategy="fsdp"))

    def _bucket_plan(self, forward: bool) -> list[tuple[str, float, list[tuple[int, str]]]]:
        """Gradient/parameter buckets of this stage: (role, params, [(chunk, unit name)])."""
        out = []
        cur = {"grad_dense": [0.0, []], "grad_expert": [0.0, []]}
        limit = self.p.bucket_bytes / self.p.grad_bytes_per_param
        chunks = range(len(self.units)) if forward else reversed(range(len(self.units)))
        for c in chunks:
            units = self.units[c] if forward else list(reversed(self.units[c]))
            for u in units:
                for role, n in self._grad_sizes(u):
                    b = cur[role]
                    b[0] += n
                    b[1].append((c, u.name))
                    if b[0] >= limit:
                        out.append((role, b[0], b[1]))
                        cur[role] = [0.0, []]
        for role, b in cur.items():
            if b[0]:
                out.append((role, b[0], b[1]))
        return out

    def _param_bytes(self, role: str, n: float, members: list[tuple[int, str]]) -> float:
        """Bytes of a ``role`` parameter bucket of ``n`` parameters: the model's dtype, but 1 byte for the
        transformer layers' weights under ``fp8_param_gather`` (Megatron-Core gathers the FP8 parameters)."""
        if not getattr(self.p, "fp8_param_gather", False) or self.p.lora_rank:     # LoRA: BF16 adapters only
            return n * self.dt
        unit = self._unit_by_key
        other = sum(sz for key in members if unit[key].kind != "layer"        # embedding, head: BF16
                    for r, sz in self._gather_sizes(unit[key]) if r == role)
        return (n - other) * 1.0 + other * self.dt

    @cached_property
    def _unit_by_key(self) -> dict[tuple[int, str], Unit]:
        """(chunk, unit name) -> unit: the keys the buckets of ``_bucket_plan`` name their members by."""
        return {(c, u.name): u for c, units in enumerate(self.units) for u in units}

    def _param_gathers_at_start(self) -> None:
        """ZeRO-1/2 with overlapped parameter gathers: the previous step's updated shards are all-gathered
        at the start of the step, each bucket before the first forward of its units."""
        for role, n, members in self._bucket_plan(forward=True):
            idx = self.coll("zero param AG", "all_gather", self.fam[role], self._param_bytes(role, n, members),
                            "dp_comm", (), strategy="zero")
            self.dp_ops.append(idx)
            for key in members:
                self.param_ag[key] = idx

    def _step_end(self) -> None:
        p = self.p
        last = self.last_compute
        if self.zero in (0, 1) and not p.overlap_grad_reduce and self.dp_size > 1:
            kind = "reduce_scatter" if self.zero == 1 else "all_reduce"
            for role, n, _ in self._bucket_plan(forward=False):
                self.dp_ops.append(self.coll(f"dp grad {kind}", kind, self.fam[role], n * p.grad_reduce_bytes,
                                             "dp_comm", (last,), strategy="dp" if self.zero == 0 else "zero"))
        if p.pp > 1 and self.m.tied_embeddings and self.s in (0, p.pp - 1) and layout(p.schedule) == "loop" \
                and not p.lora_rank:        # (a frozen embedding takes no gradient)
            size = self.m.embedding_params() / p.tp * p.grad_reduce_bytes
            self.dp_ops.append(self.coll("embedding grad all_reduce", "all_reduce", "embed", size, "dp_comm",
                                         (last,), strategy="pp"))
        dense, expert = mem.trainable_rank_params(self.m, p, self.s)
        if self.zero >= 1:
            n_upd = dense / max(1, self.dp_size) + expert / max(1, self.edp_size)
        else:
            n_upd = dense + expert
        states = optimizer_step_bytes(p.stack, n_upd, self.dt, p.grad_bytes_per_param, p.optimizer_bytes_per_param)
        if p.schedule == "dualpipe" and p.pp > 1:
            # DualPipe keeps two copies of every piece (on stages s and pp-1-s): their gradients are summed
            # before the optimizer step (after the data-parallel reduction, on what this rank updates)
            deps = (last,) + ((self.dp_ops[-1],) if self.dp_ops else ())
            self.dp_ops.append(self.coll("mirror grad all_reduce", "all_reduce", "mirror",
                                         n_upd * p.grad_reduce_bytes, "dp_comm", deps, strategy="pp"))
        deps = (last,) + ((self.dp_ops[-1],) if self.dp_ops else ())
        opt = self.comp("optimizer step", ADAM_FLOPS_PER_PARAM * n_upd, states, deps, phase=OPTIMIZER)
        if self.zero in (1, 2) and not p.overlap_param_gather and self.dp_size > 1:
            for role, n, members in self._bucket_plan(forward=True):
                self.coll("zero param AG", "all_gather", self.fam[role], self._param_bytes(role, n, members), "dp_comm",
                          (opt,), strategy="zero")


#: the userbuffers slot of a forward collective's conjugate in backward: the gradient's all-gather beside
#: the row-parallel dgrad (ring exchange), the dgrad output's reduce-scatter beside the column-parallel wgrad
BACKWARD_SLOT = {"qkv fprop": "qkv wgrad", "proj fprop": "proj dgrad", "fc1 fprop": "fc1 wgrad",
                 "fc2 fprop": "fc2 dgrad"}


def _overlapped(item: tuple) -> bool:
    """A unit item that is a TP collective under userbuffers overlap: ("tp", kind, "ub", last chunks, slot)."""
    return item[0] == "tp" and len(item) > 2


def _swap(kind: str) -> str:
    return {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}.get(kind, kind)


class _Buckets:
    """Gradient buckets filled in backward order; a bucket's collective starts when its last gradient is
    ready (the op that produced it ends)."""

    def __init__(self, b: _StageBuilder, kind: str):
        self.b, self.kind = b, kind
        self.limit = b.p.bucket_bytes
        self.cur = {"grad_dense": [0.0, None], "grad_expert": [0.0, None]}

    def add(self, u: Unit, last: int) -> None:
        for role, n in self.b._grad_sizes(u):
            c = self.cur[role]
            c[0] += n
            c[1] = last
            if c[0] * self.b.p.grad_reduce_bytes >= self.limit:
                self._flush(role)

    def _flush(self, role: str) -> None:
        n, dep = self.cur[role]
        if n:
            b = self.b
            size = n * b.p.grad_reduce_bytes
            strategy = "dp" if self.kind == "all_reduce" else "zero"
            kw = {"free": (("buffers", n * b.p.grad_buffer_bytes_per_param),)} if b.zero == 2 else {}
            b.dp_ops.append(b.coll(f"dp grad {self.kind}", self.kind, b.fam[role], size, "dp_comm", (dep,),
                                   strategy=strategy, **kw))
        self.cur[role] = [0.0, None]

    def flush_all(self) -> None:
        for role in list(self.cur):
            self._flush(role)


# ---------------------------------------------------------------------------------------------- assembly
def _families(plan: ParallelPlan) -> dict[str, str]:
    dense = "dp_cp" if plan.cp > 1 else "dp"
    expert = "edp" if plan.ep > 1 else dense
    return {"grad_dense": dense, "grad_expert": expert}


#: GPUs per scale-up (NVLink) domain assumed by ``build_programs`` when its caller names none: a DGX node
DEFAULT_SCALE_UP_DOMAIN = 8


def ep_dispatch_bytes(model: ModelSpec, plan: ParallelPlan, destinations: float | None = None) -> float:
    """Bytes one rank sends in an expert-parallel dispatch (or combine) all-to-all per micro-batch: its
    sequence-parallel share of the micro-batch's tokens, ``destinations`` copies each (default top_k: the
    alltoall dispatcher; ``ep_destinations`` for the deduplicating ones), hidden-wide activations."""
    copies = model.top_k if destinations is None else destinations
    return plan.micro_batch * plan.seq / plan.cp / plan.tp * copies * model.hidden * model.dtype_bytes


def expected_distinct(experts: int, top_k: int, units: int, groups: int = 0, group_topk: int = 0) -> float:
    """Expected number of ``units`` (GPUs or domains, each holding experts/units of the ``experts`` in expert
    order) that hold at least one of a token's ``top_k`` experts, for uniform routing: top_k distinct experts
    at random, units · (1 - C(experts - per, top_k) / C(experts, top_k)), per = experts / units. With group-
    limited routing (``groups`` groups of experts in expert order, a token's experts drawn from ``group_topk``
    of them, DeepSeek-V3's 4 of 8): the groups at random, then top_k of their experts at random; exact over
    every choice of groups (up to 100,000 of them; else as without groups, which counts more units)."""
    if units <= 1:
        return float(units)
    grouped = 0 < group_topk < groups and experts % groups == 0 and math.comb(groups, group_topk) <= 100_000
    if not grouped or experts % units:
        per = experts / units
        if per == int(per):
            miss = math.comb(experts - int(per), top_k) / math.comb(experts, top_k)
        else:                   # experts not spread evenly: draws with replacement (an upper bound on misses)
            miss = (1.0 - 1.0 / units) ** top_k
        return units * (1.0 - miss)
    per_g, per_u = experts // groups, experts // units
    pool = group_topk * per_g
    draws = math.comb(pool, top_k)
    total = 0.0
    for chosen in itertools.combinations(range(groups), group_topk):
        held: dict[int, int] = {}          # unit -> its experts among the chosen groups'
        for g in chosen:
            a, b = g * per_g, (g + 1) * per_g
            for u in range(a // per_u, (b - 1) // per_u + 1):
                held[u] = held.get(u, 0) + min(b, (u + 1) * per_u) - max(a, u * per_u)
        total += sum(1.0 - math.comb(pool - m, top_k) / draws for m in held.values())
    return total / math.comb(groups, group_topk)


def ep_destinations(model: ModelSpec, plan: ParallelPlan, scale_up_domain: int | None = None) -> float:
    """Copies of a token one dispatch (or combine) puts on the wire, per routed token: top_k under Megatron-
    Core's alltoall dispatcher (one per routed expert, even two on one GPU). Its flex dispatcher with DeepEP or
    HybridEP sends a token once to each GPU holding one of its experts when the EP group lies in one scale-up
    domain (``expected_distinct`` over the EP ranks), and once to each other domain holding one across domains
    (RDMA to the GPU of the same rail there, which forwards it over NVLink: ``expected_distinct`` over the
    domains the group spans; the NVLink forwarding is not counted). Uniform routing within the model's
    group-limited routing (DeepSeek-V3: 4 of 8 expert groups per token, which caps the GPUs and nodes a token
    reaches); the worst EP group of the plan."""
    if plan.moe_dispatcher == "alltoall" or plan.ep <= 1 or not model.experts:
        return float(model.top_k)
    domain = scale_up_domain or DEFAULT_SCALE_UP_DOMAIN
    groups = [g for g in plan.groups("ep") if len(g) > 1]
    span = max((len({r // domain for r in g}) for g in groups), default=1)
    units = len(groups[0]) if span == 1 and groups else span
    return expected_distinct(model.experts, model.top_k, units, model.router_groups, model.router_group_topk)


def ep_load(plan: ParallelPlan, e: int, capacity_factor: float | None) -> float:
    """Relative expert load of EP rank e (1 = uniform); capped by the capacity factor (tokens dropped)."""
    if plan.ep == 1 or not plan.skew:
        f = 1.0
    else:
        f = 1.0 + plan.skew * (1.0 - 2.0 * e / (plan.ep - 1))
    return f if capacity_factor is None else min(f, capacity_factor)


def build_programs(model: ModelSpec, plan: ParallelPlan, world_size: int | None = None, *,
                   symmetric: bool = True, scale_up_domain: int | None = None) -> Programs:
    """Programs of one training step of ``model`` under ``plan``.

    symmetric=True: one representative per class of identical ranks (stage x CP rank, x EP rank when the
    routing is skewed), ``Programs.classes`` set; False: every rank, classes None. ``scale_up_domain``: GPUs
    per NVLink domain of the cluster (default ``DEFAULT_SCALE_UP_DOMAIN``), which decides what a deduplicating
    MoE dispatcher sends (``ep_destinations``)."""
    if world_size is None:
        world_size = plan.world_size
    plan.validate(model, world_size)
    if model.params_only:
        raise ConfigError(f"model {model.name} is given only by its parameter count; programs need its shape "
                          f"(--model PRESET or --layers/--hidden/--heads)")
    progs = Programs(world_size=world_size, ops={})
    fams = ["tp", "cp", "dp", "pp", "ep", "edp", "dp_cp", "embed", "mirror"] + (["etp"] if plan.folded else [])
    gid_of: dict[str, list] = {}                # family -> each rank's group id (-1: none)
    for fam in fams:
        groups = [] if fam == "embed" and not model.tied_embeddings else \
            [g for g in plan.groups(fam) if len(g) > 1]
        table = np.full(world_size, -1, dtype=np.int64)
        if groups:
            ids = [progs.add_group(g, fam) for g in groups]
            if len({len(g) for g in groups}) == 1:      # a family's groups are of one size (a mesh axis)
                table[np.array(groups, dtype=np.int64)] = np.array(ids, dtype=np.int64)[:, None]
            else:
                for gid, g in zip(ids, groups):
                    table[list(g)] = gid
        gid_of[fam] = table.tolist()
    orders = [list(plan.stage_order(s, model)) for s in range(plan.pp)]
    families = _families(plan)
    skewed = plan.skew > 0 and plan.ep > 1
    ep_copies = ep_destinations(model, plan, scale_up_domain)

    templates: dict[tuple, Template] = {}

    def templates_key(stage: int, e: int) -> tuple:
        """The template of pipeline stage ``stage`` and EP rank ``e`` (the EP rank matters when routing is skewed)."""
        return (stage, e if skewed else 0)

    def template(stage: int, e: int) -> Template:
        key = templates_key(stage, e)
        t = templates.get(key)
        if t is None:
            load = ep_load(plan, e if skewed else 0, model.capacity_factor) if skewed else \
                (1.0 if model.capacity_factor is None else min(1.0, model.capacity_factor))
            t = templates[key] = _StageBuilder(model, plan, stage, orders, load, families, ep_copies).build()
            t.key = key
        return t

    cache: dict[tuple, list[Op]] = {}

    def instantiate(t: Template, r: int) -> list[Op]:
        """Rank r's program: the template with groups and peers resolved; collectives are shared by the
        members of their group (cached per template, family and group), p2p ops are the rank's own."""
        if t.by_family is None:
            t.by_family, t.p2p = {}, []
            for i, ref in sorted(t.refs.items()):
                if ref[0] == "g":
                    t.by_family.setdefault(ref[1], []).append(i)
                else:
                    t.p2p.append((i, ref))
        out = list(t.ops)
        for fam, idxs in t.by_family.items():
            gid = gid_of[fam][r]
            if gid < 0:
                raise AssertionError(f"rank {r} has no {fam} group for {t.ops[idxs[0]]!r}")
            shared = cache.get((t.key, fam, gid))
            if shared is None:
                shared = cache[(t.key, fam, gid)] = [_clone(t.ops[i], group=gid) for i in idxs]
            for i, op in zip(idxs, shared):
                out[i] = op
        if t.p2p:
            cpc = plan.coords(r)["cp"]
            gpp, gcp = (None if g < 0 else g for g in (gid_of["pp"][r], gid_of["cp"][r]))
            for i, (axis, v) in t.p2p:
                if axis == "pp":
                    out[i] = _clone(t.ops[i], peer=plan.peer(r, "pp", v), group=gpp)
                else:
                    out[i] = _clone(t.ops[i], peer=plan.peer(r, "cp", (cpc + v) % plan.cp), group=gcp)
        return out

    static = {s: mem.model_state_bytes(model, plan, s) for s in range(plan.pp)}
    ub = mem.userbuffer_bytes(model, plan)
    if ub:                                   # TP-overlap userbuffers: resident all step
        static = {s: {**d, "buffers": d.get("buffers", 0.0) + ub} for s, d in static.items()}
    progs.templates = {}
    with no_gc():           # millions of new objects and no cycles
        if symmetric:
            progs.classes = {}
            for (s, cpc, e), ranks in _stage_classes(plan, world_size, skewed):
                rep = ranks[0] if plan.folded else plan.rank_of(cp=cpc, dp=e, pp=s)
                assert rep in ranks
                progs.ops[rep] = instantiate(template(s, e), rep)
                progs.templates[rep] = templates_key(s, e)
                progs.classes[rep] = tuple(ranks)
                progs.static_memory[rep] = dict(static[s])
        else:
            ep_of = plan.ep_indices()
            for r in range(world_size):
                c = plan.coords(r)
                e = int(ep_of[r])
                progs.ops[r] = instantiate(template(c["pp"], e), r)
                progs.templates[r] = templates_key(c["pp"], e)
                progs.static_memory[r] = static[c["pp"]]
    progs.tokens_per_step = float(plan.tokens_per_step)
    progs.model_flops_per_step = model_flops_per_step(model, plan.seq, plan.effective_global_batch, plan.lora_rank,
                                                      plan.lora_targets, plan.stack)
    progs.meta = {"model": model.name, "plan": plan.to_dict(), "schedule": plan.schedule,
                  "stage_layers": [[l for c in mem.stage_chunks(model, plan, s) for l in c] for s in range(plan.pp)],
                  "generator": "schedules.build_programs"}
    return progs


def _stage_classes(plan: ParallelPlan, world_size: int, skewed: bool) -> list:
    """[((stage, CP rank, EP rank or 0), ranks in order)] sorted by key: the ranks that run one template."""
    r = np.arange(world_size, dtype=np.int64)
    axis = {a: (r // plan._strides[a]) % plan.axis_sizes[a] for a in ("pp", "cp")}
    e = plan.ep_indices() if skewed else np.zeros_like(r)
    key = (axis["pp"] * plan.axis_sizes["cp"] + axis["cp"]) * plan.ep + e
    order = np.argsort(key, kind="stable")
    cut = np.flatnonzero(np.diff(key[order])) + 1
    out = []
    for ranks in np.split(order, cut):
        first = int(ranks[0])
        k = (int(axis["pp"][first]), int(axis["cp"][first]), int(e[first]))
        out.append((k, tuple(ranks.tolist())))
    return out


def _clone(op: Op, *, group=None, peer=None) -> Op:
    return op.regrouped(op.group if group is None else group, op.peer if peer is None else peer)


# ---------------------------------------------------------------------------------------------- volume
def comm_volume(programs: Programs) -> dict:
    """Bytes each rank sends per step (nccl-tests bus bytes: size x bus factor; p2p: size), by collective kind
    and by group family, maximum over rank classes. Returns {"by_kind": {...}, "by_family": {fam: {kind: B}}}."""
    by_kind: dict[str, float] = {}
    by_family: dict[str, dict[str, float]] = {}
    for rank, prog in programs.ops.items():
        kinds: dict[str, float] = {}
        fam: dict[str, dict[str, float]] = {}
        for op in prog:
            if op.kind == COLLECTIVE:
                g = programs.groups[op.group]
                b = op.size_bytes * bus_factor(op.collective, g.size)
                k, f = op.collective, g.family
            elif op.kind == SEND:
                b, k = op.size_bytes, "p2p"
                f = programs.groups[op.group].family if op.group is not None else "p2p"
            else:
                continue
            kinds[k] = kinds.get(k, 0.0) + b
            fam.setdefault(f, {})[k] = fam.get(f, {}).get(k, 0.0) + b
        for k, v in kinds.items():
            by_kind[k] = max(by_kind.get(k, 0.0), v)
        for f, d in fam.items():
            for k, v in d.items():
                by_family.setdefault(f, {})[k] = max(by_family.get(f, {}).get(k, 0.0), v)
    return {"by_kind": by_kind, "by_family": by_family}

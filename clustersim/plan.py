"""``clustersim plan``: validate a parallel plan, print memory per rank and communication per step.

Reusable pieces (stable names, for ``clustersim simulate`` and others):

- ``model_options`` / ``plan_options``: click decorators adding the model flags (``--model/-m``, ``--layers
  --hidden --ffn --heads --kv-heads --vocab --experts --top-k --params``) and the plan flags (``--gpus --tp
  --pp --dp --ep --cp --zero --fsdp --sp --schedule --virtual-stages --micro-batch --global-batch --seq
  --recompute --bucket-mb --fsdp-prefetch --axis-order --skew``).
- ``model_from_options(**kwargs) -> ModelSpec``: preset name or YAML path (``model``), a custom shape, a
  preset with shape overrides, or ``params`` alone (memory questions only). Extra kwargs are ignored.
- ``plan_from_options(**kwargs) -> ParallelPlan``: the plan from the same flags; dp defaults to
  gpus / (tp·pp·cp). Not validated (call ``plan.validate(model, gpus)``). Extra kwargs are ignored.
- ``plan_report(model, plan, hbm_bytes=None) -> dict``: what ``clustersim plan --json`` prints.
"""
from __future__ import annotations

import dataclasses
import json

import click

from schedules.kernels import DTYPES, GRAD_REDUCE_DTYPES, STACKS, default_stack
from schedules.memory import memory_per_rank
from schedules.models import (ModelSpec, check_moe_fields, custom_model, get_model, load_model_file, model_flops_per_step,
                             model_from_params)
from schedules.pipeline import SCHEDULES
from schedules.plan import (ATTENTION, DEFAULT_RECOMPUTE_MODULES, EXPERT_GRIDS, MOE_DISPATCHERS, RECOMPUTE,
                            RESHARD, ParallelPlan, check_bucket_mb, default_virtual_stages, lora_fields,
                            parse_memory_limit, parse_recompute_modules, parse_stage_layers, plan_notes)
from simulator.calibration import bus_factor
from simulator.errors import ConfigError
from simulator.inputs import MAX_BYTES

SHAPE_FLAGS = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "experts", "top_k", "mtp_layers",
               "sliding_window", "attention_chunk", "global_attention_every", "moe_layer_every", "hybrid_pattern",
               "mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups")


# ---------------------------------------------------------------------------------------------- options
def model_options(f):
    """Click options describing a model."""
    opts = [
        click.option("--model", "-m", default=None, help="Model preset (e.g. llama3-70b) or YAML file."),
        click.option("--layers", type=int, default=None, help="Custom model: transformer layers."),
        click.option("--hidden", type=int, default=None, help="Custom model: hidden size."),
        click.option("--ffn", type=int, default=None, help="Custom model: MLP width (default 4·hidden)."),
        click.option("--heads", type=int, default=None, help="Custom model: attention heads."),
        click.option("--kv-heads", type=int, default=None, help="Custom model: KV heads (default = heads)."),
        click.option("--vocab", type=int, default=None, help="Custom model: vocabulary (default 51,200)."),
        click.option("--experts", type=int, default=None, help="Custom model: routed experts (MoE)."),
        click.option("--top-k", type=int, default=None, help="Custom model: experts per token (default 2)."),
        click.option("--mtp-layers", type=int, default=None,
                     help="Multi-token-prediction modules on the last stage (DeepSeek-V3: 1; 0 turns them off)."),
        click.option("--sliding-window", type=int, default=None,
                     help="Sliding-window attention: keys each query attends to (GPT-OSS: 128; 0: none)."),
        click.option("--attention-chunk", type=int, default=None,
                     help="Chunked attention: each query attends causally within its chunk (Llama 4: 8192; 0: none)."),
        click.option("--global-attention-every", type=int, default=None,
                     help="With --sliding-window or --attention-chunk: every N-th layer attends to the whole "
                          "sequence (GPT-OSS: 2, Llama 4: 4)."),
        click.option("--moe-layer-every", type=int, default=None,
                     help="MoE model: every N-th layer has routed experts (Llama 4 Maverick: 2; default 1)."),
        click.option("--hybrid-pattern", default=None,
                     help="Hybrid model: one character per layer (M Mamba-2, * attention, - MLP, E MoE; Nemotron-H)."),
        click.option("--mamba-heads", type=int, default=None, help="Hybrid model: Mamba-2 heads."),
        click.option("--mamba-head-dim", type=int, default=None, help="Hybrid model: Mamba-2 head width (64)."),
        click.option("--mamba-state", type=int, default=None, help="Hybrid model: Mamba-2 state size (128)."),
        click.option("--mamba-groups", type=int, default=None, help="Hybrid model: Mamba-2 B/C groups (8)."),
        click.option("--params", type=float, default=None,
                     help="Model given by its parameter count only (e.g. 7.5e9): memory questions only."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def plan_options(f):
    """Click options describing a parallel plan."""
    opts = [
        click.option("--gpus", type=int, default=None, help="GPUs (default tp·pp·cp·dp)."),
        click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel degree."),
        click.option("--pp", type=int, default=1, show_default=True, help="Pipeline parallel degree."),
        click.option("--dp", type=int, default=None, help="Data parallel degree (default gpus/(tp·pp·cp))."),
        click.option("--ep", type=int, default=1, show_default=True,
                     help="Expert parallel degree (divides dp; or, with MoE parallel folding, tp·cp·dp/etp)."),
        click.option("--etp", type=int, default=None,
                     help="Expert tensor-parallel degree (default tp). Other than tp, or an ep that dp does not "
                          "hold, folds the experts over tp·cp·dp (Megatron-Core's expert grid)."),
        click.option("--expert-grid", type=click.Choice(EXPERT_GRIDS), default="folded", show_default=True,
                     help="MoE with cp > 1: Megatron-Core >= 0.10's expert grid (EP groups take CP peers first) or "
                          "<= 0.9's (EP inside data parallelism)."),
        click.option("--moe-dispatcher", type=click.Choice(MOE_DISPATCHERS), default="alltoall", show_default=True,
                     help="MoE token dispatcher: alltoall, or the deduplicating deepep / hybridep (a token once per "
                          "destination GPU in an NVLink domain, once per other domain)."),
        click.option("--cp", type=int, default=1, show_default=True, help="Context parallel degree."),
        click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True, help="ZeRO stage."),
        click.option("--fsdp", is_flag=True, help="FSDP full sharding (ZeRO-3, per-layer units)."),
        click.option("--sp", is_flag=True, help="Sequence parallelism with TP."),
        click.option("--tp-comm-overlap", is_flag=True,
                     help="Transformer Engine's TP communication overlap (userbuffers; needs --tp > 1, --sp)."),
        click.option("--schedule", type=click.Choice(sorted(SCHEDULES)), default="1f1b", show_default=True,
                     help="Pipeline schedule (zb = zb-h1)."),
        click.option("--stage-layers", default=None, help="Layers per pipeline stage (or per model piece), e.g. 7,8,8,7."),
        click.option("--first-stage-layers", type=int, default=None, help="Layers of the first stage (rest balanced)."),
        click.option("--last-stage-layers", type=int, default=None, help="Layers of the last stage (rest balanced)."),
        click.option("--memory-limit", default=None,
                     help="zb-auto: activation limit: micro-batches per stage, 1p/2p (ZB-1p/2p) or bytes per rank "
                          "with a unit (40GB, 500MB, 64GiB)."),
        click.option("--virtual-stages", type=int, default=None,
                     help="Model chunks per pipeline rank (interleaved; default 2 where every stage holds two "
                          "chunks, as simulate)."),
        click.option("--micro-batch", type=int, default=1, show_default=True, help="Sequences per micro-batch."),
        click.option("--global-batch", type=int, default=None,
                     help="Sequences per step (default dp·mb·4·pp with a pipeline, dp·mb without)."),
        click.option("--seq", type=int, default=2048, show_default=True, help="Sequence length (tokens)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default="none", show_default=True,
                     help="Activation recomputation: none | selective (Megatron: attention core) | full | op "
                          "(torchtitan's per-op selective checkpointing)."),
        click.option("--recompute-every", type=int, default=1, show_default=True,
                     help="With --recompute full: checkpoint only every N-th layer (torchtitan 'selective layer')."),
        click.option("--recompute-modules", default=None,
                     help="With --recompute selective: Megatron-Core's recompute_modules, comma-separated (core_attn "
                          "by default; layernorm, mla_up_proj, mlp, moe_act, moe, shared_experts)."),
        click.option("--bucket-mb", type=float, default=25.0, show_default=True, help="Gradient bucket (MB)."),
        click.option("--fsdp-prefetch", type=int, default=1, show_default=True,
                     help="ZeRO-3/FSDP: layers gathered ahead."),
        click.option("--axis-order", default="tp-cp-ep-dp-pp", show_default=True,
                     help="Rank mesh order, innermost first."),
        click.option("--skew", type=float, default=0.0, show_default=True,
                     help="MoE routing skew: extra load on the busiest EP rank (0..1)."),
        click.option("--attention", type=click.Choice(ATTENTION), default="flash", show_default=True,
                     help="Attention kernel: flash keeps no s×s scores; eager keeps them (Korthikanti's formulas)."),
        click.option("--fsdp-reshard-after-forward", type=click.Choice(RESHARD), default="auto", show_default=True,
                     help="FSDP: free gathered parameters after each forward (auto: only without PP)."),
        click.option("--dtype", type=click.Choice(DTYPES), default="bf16", show_default=True,
                     help="GEMM precision: fp8 keeps Transformer Engine's FP8 weight copies and saves FP8 GEMM "
                          "inputs for backward."),
        click.option("--stack", type=click.Choice(STACKS), default=None,
                     help="Training stack whose kernels save activations (default: the cluster's, megatron on "
                          "NVIDIA, else torchtitan; megatron without --cluster)."),
        click.option("--grad-reduce-dtype", type=click.Choice(GRAD_REDUCE_DTYPES), default="auto", show_default=True,
                     help="Precision of the data-parallel gradient reduction (auto: the stack's)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def model_from_options(model: str | None = None, params: float | None = None, **kw) -> ModelSpec:
    """The ModelSpec the model flags describe (see module docstring)."""
    shape = {k: kw[k] for k in SHAPE_FLAGS if kw.get(k) is not None}
    if params is not None:
        if model is not None or shape:
            raise ConfigError("--params describes a model by its size alone; do not combine it with --model or "
                              "shape flags")
        return model_from_params(params)
    if model is not None:
        base = load_model_file(model) if model.endswith((".yaml", ".yml")) else get_model(model)
        if not shape:
            return base
        try:
            spec = dataclasses.replace(base, name=f"{base.name}-custom", **shape)
        except TypeError as e:
            raise ConfigError(f"model override: {e}") from None
        return check_moe_fields(shape, spec, "model override")
    if "hybrid_pattern" in shape:
        shape.setdefault("layers", len(shape["hybrid_pattern"]))
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if k not in shape]
    if missing:
        raise ConfigError(f"no model: give --model PRESET (or a YAML file), --params N, or a custom shape "
                          f"(missing {', '.join(missing)})")
    return check_moe_fields(shape, custom_model(**shape), "model")


def plan_from_options(gpus: int | None = None, tp: int = 1, pp: int = 1, dp: int | None = None, ep: int = 1,
                      cp: int = 1, zero: int = 0, fsdp: bool = False, sp: bool = False, schedule: str = "1f1b",
                      virtual_stages: int | None = None, micro_batch: int = 1, global_batch: int | None = None,
                      seq: int = 2048, recompute: str = "none", recompute_every: int = 1,
                      recompute_modules=None, bucket_mb: float = 25.0, fsdp_prefetch: int = 1,
                      axis_order: str = "tp-cp-ep-dp-pp", skew: float = 0.0, stage_layers=None,
                      first_stage_layers: int | None = None, last_stage_layers: int | None = None,
                      memory_limit=None, attention: str = "flash",
                      fsdp_reshard_after_forward: str = "auto", dtype: str = "bf16", stack: str | None = None,
                      grad_reduce_dtype: str = "auto", etp: int | None = None, expert_grid: str = "folded",
                      tp_comm_overlap: bool = False, moe_dispatcher: str = "alltoall", **_ignored) -> ParallelPlan:
    """The ParallelPlan the plan flags describe; dp defaults to gpus / (tp·pp·cp); stack None: megatron;
    virtual_stages None: 1 (``plan`` passes the model's default, ``default_virtual_stages``)."""
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("dp", dp), ("gpus", gpus), ("etp", etp),
                    ("virtual-stages", virtual_stages)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ConfigError(f"--{name} must be a positive integer, got {v}")
    check_bucket_mb(bucket_mb)
    if dp is None:
        denom = tp * pp * cp
        if gpus is None:
            dp = 1
        elif gpus % denom:
            raise ConfigError(f"cannot infer dp: {gpus} GPUs are not divisible by tp·pp·cp = {tp}·{pp}·{cp} = "
                              f"{denom}; give --dp or change the degrees")
        else:
            dp = gpus // denom
    return ParallelPlan(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, sp=sp, zero=zero, fsdp=fsdp, micro_batch=micro_batch,
                        global_batch=global_batch, schedule=schedule, virtual_stages=virtual_stages or 1,
                        bucket_bytes=bucket_mb * 1e6, recompute=recompute, recompute_every=recompute_every,
                        recompute_modules=(parse_recompute_modules(recompute_modules) if recompute_modules
                                           else DEFAULT_RECOMPUTE_MODULES), seq=seq, fsdp_prefetch=fsdp_prefetch,
                        axis_order=axis_order, skew=skew, stage_layers=parse_stage_layers(stage_layers),
                        first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                        attention=attention, fsdp_reshard_after_forward=fsdp_reshard_after_forward,
                        dtype=dtype, stack=stack or "megatron", grad_reduce_dtype=grad_reduce_dtype, etp=etp or 0,
                        expert_grid=expert_grid or "folded", tp_comm_overlap=bool(tp_comm_overlap),
                        moe_dispatcher=moe_dispatcher or "alltoall", **parse_memory_limit(memory_limit, pp))


# ---------------------------------------------------------------------------------------------- report
def _params_only_comm(model: ModelSpec, plan: ParallelPlan) -> dict:
    """Data-parallel bytes per rank per step for a model known by its size (one gradient buffer)."""
    n = plan.dp * plan.cp
    if n == 1:
        return {"by_kind": {}, "by_family": {}}
    grads = model.param_count() / plan.tp * plan.grad_bytes_per_param
    params = model.param_count() / plan.tp * model.dtype_bytes
    m = plan.num_microbatches
    z = plan.zero_stage
    if z == 0:
        kinds = {"all_reduce": grads * bus_factor("all_reduce", n)}
    elif z == 1:
        kinds = {"reduce_scatter": grads * bus_factor("reduce_scatter", n),
                 "all_gather": params * bus_factor("all_gather", n)}
    elif z == 2:
        kinds = {"reduce_scatter": m * grads * bus_factor("reduce_scatter", n),
                 "all_gather": params * bus_factor("all_gather", n)}
    else:
        kinds = {"reduce_scatter": m * grads * bus_factor("reduce_scatter", n),
                 "all_gather": 2 * m * params * bus_factor("all_gather", n)}
    fam = "dp_cp" if plan.cp > 1 else "dp"
    return {"by_kind": kinds, "by_family": {fam: dict(kinds)}}


#: ``plan`` is a quick report: it builds one step's programs (one rank per stage) to count communication, and
#: refuses a plan whose programs would take more than a few seconds to build (``simulate`` has its own budget)
PLAN_MAX_OPS = 1_000_000         # ~15 s and 1.7 GB at the bound (DeepSeek-V3, PP16, 2 M ops: 31 s)
PLAN_MAX_GPUS = 1 << 20


def check_plan_size(model: ModelSpec, plan: ParallelPlan, world_size: int) -> None:
    """ResourceLimitError for a plan too large for ``plan`` to report on quickly: more than ``PLAN_MAX_GPUS``
    GPUs, or more than ``PLAN_MAX_OPS`` ops in its programs (a lower bound from the plan alone:
    ``guards.minimum_ops``), checked before anything proportional to them is built."""
    from clustersim.guards import minimum_ops
    from simulator.errors import ResourceLimitError
    if world_size > PLAN_MAX_GPUS:
        raise ResourceLimitError(f"plan: {world_size:,} GPUs exceed the {PLAN_MAX_GPUS:,} it reports on")
    ops = minimum_ops(model, plan, world_size, symmetric=True) if not model.params_only else 0
    if ops > PLAN_MAX_OPS:
        raise ResourceLimitError(
            f"plan: this step has at least {ops:,} ops ({plan.num_microbatches:,} micro-batches x "
            f"{model.layers:,} layers, forward and backward), over the {PLAN_MAX_OPS:,} plan builds to count "
            f"communication; use fewer layers, micro-batches or pipeline stages (simulate has its own budget)")


def plan_report(model: ModelSpec, plan: ParallelPlan, hbm_bytes: float | None = None,
                world_size: int | None = None, peak_flops: float | None = None,
                scale_up_domain: int | None = None) -> dict:
    """Validated plan, memory per rank class, fit, communication per step (bytes per rank, nccl-tests bus
    bytes, maximum over rank classes), pipeline stages (``stage_table``; with the device's dense bf16 peak
    ``peak_flops`` their compute time at peak). ``scale_up_domain``: GPUs per NVLink domain (the --cluster's),
    which decides what a deduplicating MoE dispatcher sends."""
    from schedules.generate import build_programs, comm_volume

    world_size = world_size or plan.world_size
    check_plan_size(model, plan, world_size)
    plan.validate(model, world_size)
    mem = memory_per_rank(model, plan, world_size=world_size)
    if model.params_only:
        vol = _params_only_comm(model, plan)
    else:
        vol = comm_volume(build_programs(model, plan, world_size, scale_up_domain=scale_up_domain))
    peak = max(d["total"] for d in mem.values())
    out = {
        "model": {"name": model.name, "parameters": model.param_count(),
                  "active_parameters": model.active_param_count() if not model.params_only else model.param_count()},
        "plan": plan.to_dict(),
        "world_size": world_size,
        "memory_bytes": mem,
        "peak_memory_bytes": peak,
        "device_memory_bytes": hbm_bytes,
        "fits_in_memory": None if hbm_bytes is None else bool(peak <= hbm_bytes),
        "comm_bytes_per_step": vol["by_kind"],
        "comm_bytes_per_step_by_group": vol["by_family"],
        "tokens_per_step": plan.tokens_per_step,
    }
    if not model.params_only:
        out["model_flops_per_step"] = model_flops_per_step(model, plan.seq, plan.effective_global_batch,
                                                           plan.lora_rank, plan.lora_targets, plan.stack)
        out["stages"] = stage_table(model, plan, peak_flops)
    return out


def stage_table(model: ModelSpec, plan: ParallelPlan, peak_flops: float | None = None) -> list[dict]:
    """Per pipeline stage: transformer layers of each chunk (piece order of the chunks), whether it holds the
    embedding / LM head, its multi-token-prediction modules (``mtp``), compute FLOPs per micro-batch per rank (forward + backward, recomputation excluded), that
    compute relative to the busiest stage, and with ``peak_flops`` its time at peak (s)."""
    from schedules import memory as mem

    div = plan.tp * plan.cp
    rows = []
    for s in range(plan.pp):
        chunks = mem.stage_chunks(model, plan, s)
        flops = sum(model.layer_flops(l, plan.seq, plan.micro_batch).total for ls in chunks for l in ls)
        head = mem.holds_head(model, plan, s)
        if head:
            flops += 3.0 * model.head_flops(plan.seq, plan.micro_batch)
        mtp = sum(1 for ls in chunks for l in ls if model.is_mtp_layer(l))     # MTP modules' layers (last piece)
        if mtp:
            flops += 3.0 * model.mtp_extra_flops(plan.seq, plan.micro_batch)
        rows.append({"stage": s, "layers": [sum(1 for l in ls if not model.is_mtp_layer(l)) for ls in chunks],
                     "mtp": mtp,
                     "first_layer": min((l for ls in chunks for l in ls), default=None),
                     "pieces": [plan.piece(s, c) for c in range(plan.chunks)],
                     "embedding": mem.holds_embedding(plan, s), "head": head, "flops_per_microbatch": flops / div})
    top = max(r["flops_per_microbatch"] for r in rows)
    for r in rows:
        r["relative_time"] = r["flops_per_microbatch"] / top
        if peak_flops:
            r["time_at_peak_s"] = r["flops_per_microbatch"] / peak_flops
    return rows


def _load_cluster(cluster: str | None, gpus: int):
    """The --cluster preset built for ``gpus`` GPUs (None without --cluster); built once per command."""
    if cluster is None:
        return None
    import topologies
    if cluster.endswith((".yaml", ".yml")):          # a cluster file, as simulate reads it
        return topologies.load_cluster_file(cluster, gpus=gpus)
    return topologies.load_cluster(cluster, gpus)


def _device_memory(device, hbm_gb: float | None) -> float | None:
    """Device memory in bytes: --hbm-gb where given, else the --cluster's device (None without either)."""
    if hbm_gb is not None:
        if not 0 < hbm_gb <= MAX_BYTES / 1e9:
            raise ConfigError(f"--hbm-gb must be a number of GB above 0 and at most {MAX_BYTES / 1e9:g} (1 PB), "
                              f"got {hbm_gb}")
        return hbm_gb * 1e9
    return None if device is None else float(device.hbm_bytes)


def _gb(b: float) -> str:
    return f"{b / 1e9:,.2f}"


@click.command("plan")
@model_options
@plan_options
@click.option("--cluster", default=None,
              help="Cluster preset or cluster YAML file whose device memory decides the fit (e.g. dgx-h100).")
@click.option("--hbm-gb", type=float, default=None, help="Device memory in GB (instead of --cluster).")
@click.option("--lora-rank", type=int, default=0, show_default=True,
              help="LoRA fine-tuning: rank-R adapters, the model frozen (as `simulate --lora-rank`).")
@click.option("--lora-targets", default=None, help="With --lora-rank: linears with adapters (qkv,proj,fc1,fc2).")
@click.option("--packed-doc-tokens", type=int, default=0, show_default=True,
              help="Sequences packed from documents of N tokens (as `simulate --packed-doc-tokens`).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
def plan(cluster, hbm_gb, lora_rank, lora_targets, packed_doc_tokens, as_json, **kw):
    """Validate a parallel plan; print memory per rank and communication per step.

    \b
    clustersim plan -m llama3-70b --gpus 1024 --tp 8 --pp 8 --seq 8192 --cluster dgx-h100
    clustersim plan --params 7.5e9 --dp 64 --zero 3 --hbm-gb 32 --json
    """
    model = model_from_options(**kw)
    if kw.get("virtual_stages") is None:       # as simulate: 2 for interleaved where every stage holds two chunks
        kw["virtual_stages"] = default_virtual_stages(kw.get("schedule", "1f1b"), kw.get("pp", 1), model.layers)
    p = plan_from_options(**kw)
    p = dataclasses.replace(p, **lora_fields(lora_rank, lora_targets))
    if packed_doc_tokens and model.params_only:
        raise ConfigError(f"--packed-doc-tokens prices attention within each document, which needs the model's "
                          f"shape; {model.name} is given only by its parameter count (use --model PRESET or "
                          f"--layers/--hidden/--heads)")
    if packed_doc_tokens:
        from clustersim.experiment import check_packed_context_parallel
        from schedules.models import packed
        check_packed_context_parallel(p.cp, packed_doc_tokens, p.seq)
        given = tuple(k for k in ("sliding_window", "attention_chunk") if kw.get(k) is not None)
        model = packed(model, packed_doc_tokens, p.seq, given)
    gpus = kw.get("gpus") or p.world_size
    c = _load_cluster(cluster, gpus)
    device = None if c is None else c.device(0)
    if c is not None:
        from clustersim.experiment import check_device_dtype
        check_device_dtype(p.dtype, c.accelerator, p.fp8_recipe)
    if kw.get("stack") is None and c is not None:      # the stack simulate prices on this cluster by default
        p = dataclasses.replace(p, stack=default_stack(c.accelerator.vendor))
    hbm = _device_memory(device, hbm_gb)
    peak = float(device.peak_bf16_flops) if device is not None and p.pp > 1 else None     # dense bf16 peak
    rep = plan_report(model, p, hbm, gpus, peak, scale_up_domain=getattr(c, "domain_size", None))
    rep["notes"] = plan_notes(p)
    if hbm_gb is not None and device is not None:
        rep["notes"].append(f"--hbm-gb {hbm_gb:g} stands for the {c.accelerator.name}'s own "
                            f"{device.hbm_bytes / 1e9:.1f} GB of the --cluster")
    if model.params_only:
        rep["notes"].append("--params knows the model by its parameter count only: parameters, gradients and "
                            "optimizer state are counted, activations are not (--seq, --cp, --recompute and the "
                            "micro-batch change nothing here); give a model (-m, or --layers/--hidden/--heads) "
                            "for them")
    try:            # (the table too: it printed inf GB and "does not fit" where JSON refused)
        text = json.dumps(rep, indent=2, sort_keys=True, default=float, allow_nan=False)
    except ValueError:      # a figure overflowed (e.g. --params 1e308): no invalid JSON on stdout
        raise ConfigError("plan: a memory or communication figure is not finite (is --params or a size "
                          "beyond any real model?)") from None
    if as_json:
        click.echo(text)
        return
    _print(rep, model, p)


def _print(rep: dict, model: ModelSpec, p: ParallelPlan) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    degrees = " ".join(f"{k}{getattr(p, k)}" for k in ("tp", "pp", "dp", "ep", "cp") if getattr(p, k) > 1) or "1 GPU"
    extras = [x for x, on in [("sp", p.sp), ("tp-comm-overlap", p.tp_comm_overlap),
                              (f"zero{p.zero_stage}", p.zero_stage), ("fsdp", p.fsdp),
                              (f"recompute {p.recompute}" + (f" every {p.recompute_every}" if p.recompute_every > 1 else "")
                               + (f" ({','.join(p.recompute_modules)})" if p.recompute_modules != DEFAULT_RECOMPUTE_MODULES else ""),
                               p.recompute != "none"),
                              (f"lora{p.lora_rank}({','.join(p.lora_targets)})", p.lora_rank)] if on]
    from clustersim.simulate import param_str
    con.print(f"[bold]{model.name}[/bold] ({param_str(model)} parameters) on {rep['world_size']:,} GPUs: "
              f"{degrees} {' '.join(extras)}")
    if p.pp > 1:
        con.print(f"schedule {p.schedule}" + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else "")
                  + f", {p.num_microbatches} micro-batches of {p.micro_batch} × {p.seq} tokens")
    con.print(f"global batch {p.effective_global_batch} sequences = {rep['tokens_per_step']:,} tokens per step"
              + (f"; {rep['model_flops_per_step']:.3e} model FLOPs" if "model_flops_per_step" in rep else ""))
    con.print(f"precision / stack: {p.dtype} / {p.stack}"
              + (f", gradients reduced in {p.grad_reduce_dtype}" if p.grad_reduce_dtype != "auto" else ""))
    for note in rep.get("notes", ()):
        con.print(f"note: {note}", highlight=False)
    t = Table(title="memory per rank (GB)", title_justify="left")
    for c in ("ranks", "params", "grads", "optim", "activ", "buffers", "total"):
        t.add_column(c, justify="right" if c != "ranks" else "left")
    hbm = rep["device_memory_bytes"]
    for name, d in rep["memory_bytes"].items():
        total = _gb(d["total"])
        if hbm is not None and d["total"] > hbm:
            total = f"[red]{total}[/red]"
        t.add_row(name, *(_gb(d[c]) for c in ("parameters", "gradients", "optimizer", "activations", "buffers")),
                  total)
    con.print(t)
    if hbm is None:
        con.print("fit: unknown (give --cluster PRESET or --hbm-gb)")
    else:
        verdict = "[green]fits[/green]" if rep["fits_in_memory"] else "[red]does not fit[/red]"
        con.print(f"peak {_gb(rep['peak_memory_bytes'])} GB of {_gb(hbm)} GB: {verdict}")
    if p.pp > 1 and rep.get("stages"):
        t = Table(title="pipeline stages (compute per micro-batch and rank, forward + backward)", title_justify="left")
        at_peak = "time_at_peak_s" in rep["stages"][0]
        for c in ("stage", "layers", "holds", "TFLOPs", "rel. time") + (("ms at peak",) if at_peak else ()):
            t.add_column(c, justify="left" if c in ("layers", "holds") else "right")
        for r in rep["stages"]:
            holds = " ".join(x for x, on in (("embedding", r["embedding"]), ("head", r["head"]),
                                             (f"MTP x{r['mtp']}", r["mtp"])) if on)
            t.add_row(str(r["stage"]), "+".join(map(str, r["layers"])) + f" = {sum(r['layers'])}", holds,
                      f"{r['flops_per_microbatch'] / 1e12:,.2f}", f"{r['relative_time']:.3f}",
                      *((f"{r['time_at_peak_s'] * 1e3:,.1f}",) if at_peak else ()))
        con.print(t)
    t = Table(title="communication per step, bytes sent per rank (GB, bus bytes)", title_justify="left")
    for c in ("group", "kind", "GB"):
        t.add_column(c, justify="right" if c == "GB" else "left")
    for fam, kinds in sorted(rep["comm_bytes_per_step_by_group"].items()):
        for kind, b in sorted(kinds.items()):
            t.add_row(fam, kind, _gb(b))
    con.print(t)

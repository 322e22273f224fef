"""An experiment: cluster + model + parallel plan + network, from CLI flags or a YAML file, run end to end.

    topology (topologies.load_cluster) + model (schedules.models) + plan (schedules.plan)
        -> schedules.build_programs -> simulator.engine.run -> metrics

YAML experiment files hold the same keys as the ``simulate`` flags (dashes or underscores), e.g.::

    cluster: dgx-h100
    gpus: 1024
    model: llama3-70b          # or a mapping {layers: 32, hidden: 4096, heads: 32, ...}
    tp: 8
    pp: 8
    dp: 16
    seq: 8192
    global_batch: 1024
    micro_batch: 1
    schedule: interleaved
    virtual_stages: 2
    network: flow
    faults: {stragglers: {5: 1.2}, seed: 1}

Files are loaded with ``yaml.safe_load``; unknown keys, wrong types and duplicate keys are errors.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

from clustersim.paths import NonEmptyPath
from schedules.pipeline import SCHEDULES as _SCHEDULES
from simulator.calibration import CALIBRATION_SCOPES
from simulator.errors import ConfigError, PlanError, ProgramError
from simulator.inputs import brief
from simulator.yamlio import load_yaml as _load_yaml

NETWORKS = ("ideal", "analytical", "flow", "astra")
MODES = ("symmetric", "full")
SCHEDULES = tuple(_SCHEDULES)
RECOMPUTE = ("none", "selective", "full", "op")
ATTENTION = ("flash", "eager")
ATTENTION_KERNELS = ("auto", "flash2", "triton")
RESHARD = ("auto", "true", "false")
DTYPES = ("bf16", "fp8")
STACKS = ("megatron", "torchtitan", "llm-foundry", "torchtitan-compile", "torchtitan-compile-loss")
GRAD_REDUCE_DTYPES = ("auto", "bf16", "fp32")
FP8_RECIPES = ("delayed", "current", "mxfp8")        # schedules.kernels.FP8_RECIPES
EXPERT_GRIDS = ("folded", "carved")
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")     # schedules.plan.MOE_DISPATCHERS
LORA_STYLES = ("megatron", "dtensor")                    # schedules.plan.LORA_STYLES
#: option -> its allowed values (checked in one place; the error says "unknown <option> ...; choose one of")
CHOICES = {"network": NETWORKS, "calibration_scope": CALIBRATION_SCOPES, "mode": MODES, "schedule": SCHEDULES,
           "dtype": DTYPES, "stack": STACKS, "recompute": RECOMPUTE, "attention": ATTENTION,
           "attention_kernel": ATTENTION_KERNELS,
           "grad_reduce_dtype": GRAD_REDUCE_DTYPES, "expert_grid": EXPERT_GRIDS, "fp8_recipe": FP8_RECIPES,
           "moe_dispatcher": MOE_DISPATCHERS, "lora_style": LORA_STYLES}
MODEL_FIELDS = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "experts", "top_k", "mtp_layers",
                "sliding_window", "attention_chunk", "global_attention_every", "moe_layer_every", "mamba_heads",
                "mamba_head_dim", "mamba_state", "mamba_groups")
#: model fields that may be 0 (the others are positive)
ZERO_OK_FIELDS = ("experts", "mtp_layers", "sliding_window", "attention_chunk", "global_attention_every")
MODEL_FLAGS = ("gated_mlp", "tied_embeddings")      # true/false model fields (custom model or overrides)
MODEL_TEXT = ("hybrid_pattern",)                    # string model fields (custom model or overrides)


@dataclass
class Experiment:
    """Everything one simulation needs. Sizes: seq in tokens, batches in sequences, bucket in bytes."""

    cluster: str = "dgx-h100"
    gpus: int | None = None
    model: str | dict | None = "llama3-8b"
    params: float | None = None
    model_config: str | None = None      # a Hugging Face config.json
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    ep: int = 1
    etp: int | None = None               # expert tensor parallelism (None: tp; see schedules.plan)
    expert_grid: str = "folded"          # EP groups with cp > 1: Megatron-Core >= 0.10 (folded) or <= 0.9 (carved)
    cp: int = 1
    sp: bool = False
    zero: int = 0
    fsdp: bool = False
    schedule: str = "1f1b"
    virtual_stages: int | None = None    # None: 2 for the interleaved schedule, else 1
    micro_batch: int = 1
    global_batch: int | None = None
    seq: int = 4096
    recompute: str = "none"
    recompute_every: int = 1             # recompute full: checkpoint only every N-th layer (torchtitan's "2")
    recompute_modules: tuple[str, ...] | None = None   # recompute selective: Megatron's modules (None: core_attn)
    bucket_mb: float = 25.0
    fsdp_prefetch: int = 1
    overlap_grad_reduce: bool = True
    tp_comm_overlap: bool = False        # Transformer Engine userbuffers TP overlap (megatron stack, tp > 1, sp)
    moe_dispatcher: str = "alltoall"     # MoE token dispatcher: alltoall | deepep | hybridep (deduplicating)
    overlap_param_gather: bool = True
    skew: float = 0.0
    axis_order: str = "tp-cp-ep-dp-pp"
    layer_split: str = "balanced"
    stage_layers: str | list | None = None   # "7,8,8,7": layers per stage (or per model piece)
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    memory_limit: str | float | None = None  # zb-auto: micro-batches per stage, or "2p"
    attention: str = "flash"
    attention_kernel: str = "auto"       # the FlashAttention kernel priced (auto: the stack's)
    fsdp_reshard_after_forward: str = "auto"
    network: str = "analytical"
    mode: str | None = None          # None: symmetric where valid, else full
    calibration: str | None = None
    calibration_scope: str = "matching"   # "any": apply a calibration measured on other hardware
    algorithm: str | None = None
    astra_system: str | None = None      # --network astra: ASTRA-sim system JSON (default: ring everywhere)
    dtype: str = "bf16"
    fp8_recipe: str = "delayed"      # Transformer Engine's FP8 scaling (megatron stack): delayed | current | mxfp8
    fp8_param_gather: bool = False   # Megatron-Core --fp8-param-gather: FP8-only block weights, 1-byte param gather
    stack: str | None = None         # None: the cluster's default (schedules.kernels.default_stack)
    grad_reduce_dtype: str = "auto"  # gradient reduction precision (auto: the stack's, schedules.kernels)
    gpu_variation: float | None = None   # relative std of GPU speed (None: topologies.variation's default)
    lora_rank: int = 0               # LoRA fine-tuning: adapters of this rank, the model frozen (0: train every weight)
    lora_targets: tuple[str, ...] | None = None   # linears with adapters (None: qkv, proj, fc1, fc2)
    packed_doc_tokens: int = 0       # sequences packed from documents of this many tokens (attention within each)
    lora_style: str = "megatron"     # how LoRA adapters run under TP: megatron (Megatron-Bridge) | dtensor
    faults: dict = field(default_factory=dict)
    name: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if v not in (None, {}, [])}

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        model = self.model if isinstance(self.model, str) else "custom"
        return (f"{model} tp{self.tp} pp{self.pp} dp{self.dp} "
                + (f"ep{self.ep} " if self.ep > 1 else "") + (f"etp{self.etp} " if self.etp else "")
                + (f"cp{self.cp} " if self.cp > 1 else "")
                + f"{self.schedule}")


# ---------------------------------------------------------------------------------------------- parsing
def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _as_int(value, key: str, minimum: int | None = 1) -> int:
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{key}: expected an integer, got {brief(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ConfigError(f"{key}: expected an integer, got {brief(value)}")
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {brief(value)}") from None
    if not isinstance(value, int):
        raise ConfigError(f"{key}: expected an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}: must be >= {minimum}, got {value}")
    if value > 10**9:
        raise ConfigError(f"{key}: {value} is unreasonably large")
    return value


def _as_float(value, key: str, positive: bool = True) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a number, got {brief(value)}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected a number, got {brief(value)}") from None
    if not math.isfinite(v) or (positive and v <= 0) or v < 0:
        raise ConfigError(f"{key}: expected a finite {'positive' if positive else 'non-negative'} number, got {brief(value)}")
    return v


def option_keys(mapping: dict, where: str) -> dict:
    """One source's options (a YAML file's, a compare variant's) with their keys spelled with underscores
    (``global-batch`` -> ``global_batch``), so that a later source overrides them whichever spelling each used;
    an option spelled both ways in the one mapping is a ConfigError (the later would win silently)."""
    out: dict = {}
    spelled: dict = {}
    for raw_key, value in mapping.items():
        if not isinstance(raw_key, str):
            raise ConfigError(f"{where}: option names must be strings, got {brief(raw_key)}")
        key = raw_key.replace("-", "_")
        if key in spelled:
            raise ConfigError(f"{where}: {spelled[key]!r} and {raw_key!r} are the same option; give it once")
        spelled[key] = raw_key
        out[key] = value
    return out


def _named(where: str, key: str) -> str:
    """How a message names option ``key``: as typed on the command line (``--kv-heads``) where the options came
    from it (``where`` "options"), else ``<where>: key`` (a YAML file, a compare variant)."""
    return f"--{key.replace('_', '-')}" if where == "options" else f"{where}: {key}"


def experiment_from_dict(data: dict, where: str = "experiment") -> Experiment:
    """Build and type-check an Experiment from a mapping (YAML or CLI); raise ConfigError naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of options, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(Experiment)}
    kw: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    for key, value in option_keys(data, where).items():       # global-batch and global_batch: one option
        if key in MODEL_FIELDS or key in MODEL_FLAGS or key in MODEL_TEXT:
            if value is not None:
                custom[key] = value
            continue
        if key == "bucket_bytes":
            key, value = "bucket_mb", (None if value is None else _as_float(value, f"{where}: bucket_bytes") / 1e6)
        if key not in names:
            raise ConfigError(f"{where}: unknown option {brief(key)}; known: "
                              f"{', '.join(sorted(names | set(MODEL_FIELDS) | set(MODEL_FLAGS) | set(MODEL_TEXT)))}")
        if value is None:
            continue
        kw[key] = value
    exp = Experiment()
    for key, value in kw.items():
        w = _named(where, key)
        if key in ("gpus", "tp", "pp", "dp", "ep", "etp", "cp", "virtual_stages", "micro_batch", "global_batch", "seq",
                   "first_stage_layers", "last_stage_layers", "recompute_every"):
            value = _as_int(value, w)
        elif key in ("lora_rank", "packed_doc_tokens"):
            value = _as_int(value, w, minimum=0)
        elif key == "lora_targets":
            from schedules.plan import parse_lora_targets
            value = parse_lora_targets(value, w)
        elif key == "zero":
            value = _as_int(value, w, minimum=0)
            _check(value <= 3, f"{w}: ZeRO stage must be 0, 1, 2 or 3, got {value}")
        elif key == "fsdp_prefetch":
            value = _as_int(value, w, minimum=0)
        elif key in ("sp", "fsdp", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                     "fp8_param_gather"):
            _check(isinstance(value, bool), f"{w}: expected true or false, got {brief(value)}")
        elif key in ("bucket_mb", "params"):
            value = _as_float(value, w)
            if key == "bucket_mb":
                from schedules.plan import check_bucket_mb
                check_bucket_mb(value, w)
        elif key in CHOICES:
            known = CHOICES[key]
            _check(value in known, f"{w}: unknown {key.replace('_', ' ')} {brief(value)}; choose one of "
                                   f"{', '.join(known)}")
        elif key == "fsdp_reshard_after_forward":
            value = {True: "true", False: "false"}.get(value, value) if isinstance(value, bool) else value
            _check(value in RESHARD, f"{w}: expected one of {', '.join(RESHARD)}, got {brief(value)}")
        elif key == "skew":
            value = _as_float(value, w, positive=False)
            _check(value <= 1.0, f"{w}: must be between 0 and 1, got {value}")
        elif key == "gpu_variation":
            value = _as_float(value, w, positive=False)
            from topologies.variation import MAX_SIGMA
            _check(value < MAX_SIGMA, f"{w}: relative std of GPU speed must be below {MAX_SIGMA}, got {value}")
        elif key in ("cluster", "calibration", "algorithm", "name", "axis_order", "layer_split", "astra_system",
                     "model_config"):
            _check(isinstance(value, str) and value != "", f"{w}: expected a non-empty string, got {brief(value)}")
        elif key == "model":
            _check(isinstance(value, (str, dict)), f"{w}: expected a preset name or a mapping of model fields")
        elif key == "faults":
            _check(isinstance(value, dict), f"{w}: expected a mapping (stragglers, jitter, seed, ...)")
        elif key == "recompute_modules":
            from schedules.plan import parse_recompute_modules
            value = parse_recompute_modules(value, w)
        elif key == "stage_layers":
            from schedules.plan import parse_stage_layers
            value = ",".join(map(str, parse_stage_layers(value)))
        elif key == "memory_limit":
            _check(isinstance(value, (str, int, float)) and not isinstance(value, bool),
                   f"{w}: expected micro-batches (16) or a multiple of pp (2p), got {value!r}")
        setattr(exp, key, value)
    if exp.model_config is not None and isinstance(kw.get("model"), str):
        raise ConfigError(f"{where}: give --model or --model-config, not both")
    if custom and any(k.replace("-", "_") == "model" and v is None for k, v in data.items()):
        exp.model = None                     # custom model from fields only
    if custom:
        for k, v in custom.items():
            if k in MODEL_FLAGS:
                _check(isinstance(v, bool), f"{_named(where, k)}: expected true or false, got {v!r}")
            elif k in MODEL_TEXT:
                _check(isinstance(v, str) and v != "",
                       f"{_named(where, k)}: expected a non-empty string, got {brief(v)}")
            else:
                custom[k] = _as_int(v, _named(where, k), minimum=0 if k in ZERO_OK_FIELDS else 1)
        if isinstance(exp.model, dict):
            exp.model = {**exp.model, **custom}
        elif isinstance(exp.model, str):
            exp.model = {"base": exp.model, **custom}      # a preset with some fields overridden
        else:
            exp.model = custom
    return exp


def load_yaml(path: str | Path) -> Any:
    """Safely load an experiment YAML file (see simulator.yamlio)."""
    return _load_yaml(path, "experiment file")


def load_experiment(path: str | Path) -> Experiment:
    """An Experiment from a YAML file."""
    return experiment_from_dict(load_yaml(path), where=str(path))


# ---------------------------------------------------------------------------------------------- click
def simulate_options(f: Callable) -> Callable:
    """Add every ``simulate`` option to a click command (shared by simulate, compare, search...)."""
    opts = [
        click.option("-c", "--config", "config", type=NonEmptyPath(dir_okay=False), help="YAML experiment file."),
        click.option("--cluster", help="Cluster preset (see `clustersim topology --list`) or a YAML file."),
        click.option("--gpus", type=int, help="Number of GPUs (ranks)."),
        click.option("--model", "-m", help="Model preset (llama3-8b, llama3-70b, llama3-405b, gpt3-175b, ...)."),
        click.option("--params", type=float, help="Model given by its parameter count only (memory questions)."),
        click.option("--layers", type=int), click.option("--hidden", type=int), click.option("--ffn", type=int),
        click.option("--heads", type=int), click.option("--kv-heads", type=int), click.option("--vocab", type=int),
        click.option("--experts", type=int), click.option("--top-k", type=int),
        click.option("--mtp-layers", type=int, help="Multi-token-prediction modules (DeepSeek-V3: 1 by default; 0 "
                     "turns them off): each runs a transformer layer, a 2h -> h projection and the shared LM head "
                     "and loss on the last pipeline stage."),
        click.option("--sliding-window", type=int, help="Sliding-window attention: keys each query attends to "
                     "(Mistral 7B v0.1: 4096, GPT-OSS: 128; 0: none). The fused kernel skips the tiles outside it."),
        click.option("--attention-chunk", type=int, help="Chunked attention (Llama 4: 8192): each query attends "
                     "causally within its chunk of this many tokens (0: none)."),
        click.option("--global-attention-every", type=int, help="With --sliding-window or --attention-chunk: every "
                     "N-th layer attends to the whole sequence (GPT-OSS: 2, Gemma 3: 6, Llama 4: 4; 0, the default: "
                     "every layer attends locally)."),
        click.option("--moe-layer-every", type=int, help="MoE model: every N-th layer has routed experts, the others "
                     "a dense MLP of width --ffn (Llama 4 Maverick: 2; default 1: every layer)."),
        click.option("--hybrid-pattern", help="Hybrid model (Nemotron-H): one character per layer, M a Mamba-2 "
                     "mixer, * attention, - a dense MLP, E an MoE MLP (Megatron-Core's hybrid_override_pattern; "
                     "its length is --layers)."),
        click.option("--mamba-heads", type=int, help="Hybrid model: Mamba-2 heads (d_inner = heads x "
                     "--mamba-head-dim)."),
        click.option("--mamba-head-dim", type=int, help="Hybrid model: Mamba-2 head width (default 64)."),
        click.option("--mamba-state", type=int, help="Hybrid model: Mamba-2 state size N (default 128)."),
        click.option("--mamba-groups", type=int, help="Hybrid model: Mamba-2 B/C groups (default 8)."),
        click.option("--gated-mlp/--no-gated-mlp", default=None,
                     help="SwiGLU MLP with 3 matrices (Llama) or a 2-matrix GELU MLP (GPT, the custom default)."),
        click.option("--tied-embeddings/--untied-embeddings", default=None, help="LM head shares the embedding."),
        click.option("--model-config", type=NonEmptyPath(dir_okay=False),
                     help="Hugging Face config.json (Llama, Mistral, Mixtral, Qwen, DeepSeek V2/V3, GPT-OSS, Llama 4, Nemotron-H)."),
        click.option("--tp", type=int, help="Tensor-parallel degree."),
        click.option("--pp", type=int, help="Pipeline-parallel degree (stages)."),
        click.option("--dp", type=int, help="Data-parallel degree (default: GPUs / (tp·pp·cp))."),
        click.option("--ep", type=int, help="Expert-parallel degree."),
        click.option("--etp", type=int, help="Expert tensor-parallel degree (default tp); other than tp, or an ep "
                     "that dp does not hold, folds the experts over tp·cp·dp (Megatron-Core's expert grid)."),
        click.option("--expert-grid", type=click.Choice(EXPERT_GRIDS),
                     help="MoE with cp > 1: folded (Megatron-Core >= 0.10, the default: EP groups take CP peers "
                     "first) or carved (<= 0.9: EP inside data parallelism)."),
        click.option("--moe-dispatcher", type=click.Choice(MOE_DISPATCHERS),
                     help="MoE token dispatcher: alltoall (Megatron-Core's default: a token goes once per routed "
                     "expert) | deepep | hybridep (its flex dispatcher: once per GPU holding one of the token's "
                     "experts inside an NVLink domain, once per other domain across domains)."),
        click.option("--cp", type=int, help="Context-parallel degree."),
        click.option("--zero", type=click.IntRange(0, 3), help="ZeRO stage 0-3."),
        click.option("--fsdp", is_flag=True, default=None, help="Fully sharded data parallel (ZeRO-3 style)."),
        click.option("--sp", is_flag=True, default=None, help="Megatron sequence parallelism with TP."),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
                     help="Transformer Engine's TP communication overlap (userbuffers, Megatron-Bridge "
                          "tp_comm_overlap): TP all-gathers / reduce-scatters beside the GEMMs they feed, the "
                          "GEMMs chunked; needs --tp > 1, --sp and the megatron stack. Optimistic: the HBM "
                          "traffic of the copies is not modelled."),
        click.option("--schedule", type=click.Choice(SCHEDULES), help="Pipeline schedule."),
        click.option("--virtual-stages", type=int, help="Model chunks per stage (interleaved 1F1B)."),
        click.option("--micro-batch", type=int, help="Micro-batch size (sequences)."),
        click.option("--global-batch", type=int, help="Global batch size (sequences per step)."),
        click.option("--seq", type=int, help="Sequence length (tokens)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), help="Activation recomputation: none | selective "
                     "(Megatron: attention core) | full | op (torchtitan's per-op selective checkpointing)."),
        click.option("--recompute-every", type=int, help="With --recompute full: checkpoint only every N-th layer "
                     "(torchtitan's selective_ac_option N, 'selective layer'); default 1 = every layer."),
        click.option("--recompute-modules", help="With --recompute selective: the modules recomputed, Megatron-Core's "
                     "recompute_modules, comma-separated: core_attn (the default), layernorm, mla_up_proj, mlp, "
                     "moe_act, moe, shared_experts."),
        click.option("--bucket-mb", type=float, help="DDP / ZeRO gradient bucket size in MB (1e6 bytes)."),
        click.option("--fsdp-prefetch", type=int, help="FSDP / ZeRO-3: layers all-gathered ahead (0 = none)."),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=None,
                     help="Reduce gradients during backward (default) or after it."),
        click.option("--skew", type=float, help="MoE routing skew 0..1 (busiest EP rank gets 1+skew times the load)."),
        click.option("--axis-order", help="Rank mesh order, innermost first (default tp-cp-ep-dp-pp)."),
        click.option("--layer-split", type=click.Choice(["balanced", "even"]), help="Layers over pipeline stages."),
        click.option("--stage-layers", help="Layers per pipeline stage (or per model piece), e.g. 7,8,8,7."),
        click.option("--first-stage-layers", type=int, help="Layers of the first pipeline stage (rest balanced)."),
        click.option("--last-stage-layers", type=int, help="Layers of the last pipeline stage (rest balanced)."),
        click.option("--memory-limit", help="zb-auto: activation limit: micro-batches per stage, 1p/2p (ZB-1p/2p) or bytes per rank with a unit (40GB, 500MB, 64GiB)."),
        click.option("--network", type=click.Choice(NETWORKS),
                     help="ideal (free) | analytical | flow (contention) | astra (ASTRA-sim's analytical model)."),
        click.option("--astra-system", type=NonEmptyPath(dir_okay=False),
                     help="--network astra: ASTRA-sim system JSON (collective algorithm per dimension, chunking)."),
        click.option("--attention", type=click.Choice(ATTENTION),
                     help="Attention kernel: flash (default, no s×s scores kept) | eager (the s×s scores go "
                          "through HBM: QK^T and PV batched GEMMs, softmax and dropout kernels, and are kept for "
                          "backward; pre-FlashAttention Megatron, e.g. the 2021 GPT runs)."),
        click.option("--attention-kernel", type=click.Choice(ATTENTION_KERNELS),
                     help="FlashAttention kernel priced with --attention flash: auto (default: the stack's: "
                          "Megatron's Transformer Engine runs cuDNN on Hopper and later, FlashAttention-2 on "
                          "Ampere; llm-foundry the Triton kernel; torchtitan FlashAttention-2) | flash2 | triton."),
        click.option("--fsdp-reshard-after-forward", type=click.Choice(RESHARD),
                     help="FSDP: free gathered parameters after each forward (auto: only without PP)."),
        click.option("--mode", type=click.Choice(MODES), help="symmetric (default where valid) | full per-rank."),
        click.option("--calibration", type=NonEmptyPath(dir_okay=False), help="Calibration JSON (clustersim calibrate)."),
        click.option("--calibration-scope", type=click.Choice(CALIBRATION_SCOPES),
                     help="matching (default): use only fits of the cluster's device and backend, refuse a "
                          "calibration that covers neither; any: apply it whatever it was measured on."),
        click.option("--algorithm", help="Force a collective algorithm (ring, tree, hierarchical, ...)."),
        click.option("--dtype", type=click.Choice(DTYPES), help="GEMM precision: bf16 (default) or fp8 "
                     "(Transformer Engine FP8 GEMMs in the transformer blocks)."),
        click.option("--fp8-recipe", type=click.Choice(FP8_RECIPES), help="Transformer Engine's FP8 scaling "
                     "(megatron stack, --dtype fp8): delayed (default: scales from an amax history), current "
                     "(each tensor's amax read before its cast; norms write BF16, then a quantize kernel) or mxfp8 "
                     "(block scaling, Blackwell: a scale per 32 elements; norms write BF16, then a quantize)."),
        click.option("--fp8-param-gather/--no-fp8-param-gather", default=None,
                     help="Megatron-Core's --fp8-param-gather (--dtype fp8, megatron stack, --zero 1 or 2): the "
                          "transformer-block GEMM weights kept in FP8 only (no BF16 copy), the optimizer casting "
                          "its updated shard and the parameter all-gather carrying 1 byte per such weight."),
        click.option("--gpu-variation", type=float, help="Relative std of one GPU's sustained speed; compute runs at "
                     "the slowest of the job's GPUs (default 0.0176 on GPUs, from a 5% spread on an 8-GPU node; "
                     "0 turns it off)."),
        click.option("--stack", type=click.Choice(STACKS), help="Training stack whose kernels are priced: "
                     "megatron (Megatron-Core + TE, fused; default on NVIDIA), torchtitan (eager), llm-foundry "
                     "(eager, Triton FlashAttention, as MosaicML's MPT benchmarks ran), torchtitan-compile "
                     "(torch.compile: one kernel per pointwise chain; loss eager, torchtitan before 2025-04) or "
                     "torchtitan-compile-loss (the loss compiled too, torchtitan from 2025-04)."),
        click.option("--grad-reduce-dtype", type=click.Choice(GRAD_REDUCE_DTYPES),
                     help="Precision of the data-parallel gradient reduction: auto (default: the stack's, fp32 "
                          "under torchtitan and llm-foundry, the gradients' own (bf16) under megatron), bf16 or fp32."),
        click.option("--lora-rank", type=int, help="LoRA fine-tuning: rank-R adapters beside the --lora-targets "
                     "linears of every layer, the model frozen (no weight gradients; gradients, optimizer state "
                     "and data-parallel reduction for the adapters only). 0 (default): every weight trains."),
        click.option("--lora-targets", help="With --lora-rank: comma-separated linears with adapters, of qkv, proj, "
                     "fc1, fc2 (default: all four, Megatron-Bridge's LoRA default)."),
        click.option("--lora-style", type=click.Choice(LORA_STYLES),
                     help="With --lora-rank under TP: megatron (default: Megatron-Bridge's adapters, whose own TP "
                     "collectives are priced) or dtensor (PyTorch DTensor's LoRA-aware parallel styles, NeMo "
                     "AutoModel: only rank-r intermediates cross the TP group)."),
        click.option("--packed-doc-tokens", type=int, help="Sequences packed from documents of N tokens "
                     "(fine-tuning data with per-document attention masks): attention within each document. "
                     "For documents of varying length N = Σ sᵢ² / seq."),
    ]
    for o in reversed(opts):
        f = o(f)
    from clustersim.faults import fault_options
    return fault_options(f)


OPTION_KEYS = ("cluster", "gpus", "model", "params", "model_config", "gated_mlp", "tied_embeddings", "layers", "hidden", "ffn", "heads", "kv_heads", "vocab",
               "experts", "top_k", "mtp_layers", "sliding_window", "attention_chunk", "global_attention_every",
               "moe_layer_every", "hybrid_pattern", "mamba_heads", "mamba_head_dim", "mamba_state", "mamba_groups",
               "moe_dispatcher", "tp", "pp", "dp", "ep", "etp", "expert_grid", "cp", "zero", "fsdp", "sp", "tp_comm_overlap", "schedule", "virtual_stages",
               "micro_batch", "global_batch", "seq", "recompute", "recompute_every", "recompute_modules", "bucket_mb", "network", "mode", "calibration",
               "algorithm", "fsdp_prefetch", "overlap_grad_reduce", "skew", "axis_order", "layer_split",
               "astra_system", "stage_layers", "first_stage_layers", "last_stage_layers", "memory_limit",
               "attention", "attention_kernel", "fsdp_reshard_after_forward", "dtype", "stack",
               "calibration_scope", "gpu_variation", "grad_reduce_dtype", "fp8_recipe", "fp8_param_gather",
               "lora_rank", "lora_targets", "packed_doc_tokens", "lora_style")


def experiment_from_options(config: str | None = None, **options) -> Experiment:
    """An Experiment from click options: the YAML file (if any) first, then flags given on the command line."""
    data: dict = {}
    if config:
        loaded = load_yaml(config)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config}: expected a mapping of options at the top level")
        data.update(option_keys(loaded, config))      # the command line below overrides either spelling
    for k in OPTION_KEYS:
        v = options.get(k)
        if v is not None:
            data[k] = v
    if any(data.get(k) is not None for k in MODEL_FIELDS) and "model" not in data and "model_config" not in data:
        data["model"] = None
    from clustersim.faults import FAULT_OPTION_KEYS, faults_from_options
    fault_flags = {k: options.get(k) for k in FAULT_OPTION_KEYS}
    if data.get("faults") is not None or any(v not in (None, (), []) for v in fault_flags.values()):
        faults = data.get("faults")
        if faults is not None and not isinstance(faults, dict):
            raise ConfigError(f"{config or 'options'}: faults: expected a mapping (stragglers, jitter, seed, ...)")
        data["faults"] = faults_from_options(faults, **fault_flags)
    return experiment_from_dict(data, where=config or "options")


# ---------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    experiment: Experiment
    result: Any            # SimResult
    metrics: Any           # Metrics
    model: Any
    plan: Any
    cluster: Any
    notes: list = field(default_factory=list)
    cost: Any = None       # the ClusterCostModel that priced the run (before fault wrappers)
    programs: Any = None
    calibration: str = "none"      # which calibration fits apply (cost model's calibration_summary)

    def summary(self) -> dict:
        """The stable ``--json`` contract (see README): metrics plus plan and provenance."""
        m = self.metrics
        d = {
            "step_time_s": m.step_time_s, "tokens_per_s": m.tokens_per_s, "tflops_per_gpu": m.tflops_per_gpu,
            "mfu": m.mfu, "bubble_fraction": m.bubble_fraction, "exposed_comm_fraction": m.exposed_comm_fraction,
            "overlap_fraction": m.overlap_fraction, "peak_memory_bytes": m.peak_memory_bytes,
            "fits_in_memory": m.fits_in_memory, "world_size": m.world_size, "plan": _plan_dict(self.plan),
            "events_simulated": m.events_simulated, "wall_time_s": m.wall_time_s,
            "hardware_tflops_per_gpu": m.hardware_tflops_per_gpu, "compute_fraction": m.compute_fraction,
            "memory_capacity_bytes": m.memory_capacity_bytes, "represented_ops": m.represented_ops,
            "mode": m.mode, "network": self.experiment.network, "cluster": self.experiment.cluster,
            "model": self.model.name if hasattr(self.model, "name") else str(self.experiment.model),
            "dtype": getattr(self.plan, "dtype", "bf16"), "stack": getattr(self.plan, "stack", None),
            "fp8_recipe": getattr(self.plan, "fp8_recipe", "delayed"),
            "fp8_param_gather": getattr(self.plan, "fp8_param_gather", False),
            "grad_reduce_dtype": _reduce_dtype(self.plan),
            "notes": list(self.notes), "calibration": self.calibration, "comm_by_axis": m.comm_by_axis,
            "model_params": self.model.param_count() if hasattr(self.model, "param_count") else None,
            "mtp_layers": getattr(self.model, "mtp_layers", 0),
            "evidence": self.evidence(),
        }
        if self.cost is not None and hasattr(self.cost, "pricing"):
            d["pricing"] = {"calibration_file": self.experiment.calibration, **self.cost.pricing()}
            if self.programs is not None:
                from topologies.kernel_cost import kernel_time_shares
                d["top_kernels"] = kernel_time_shares(self.programs, self.cost)
        return d

    def evidence(self) -> dict | None:
        """How predictions of this kind (device × precision × dense/MoE, and stack) compared with published
        runs in the latest whole validate run (clustersim.evidence); None without a named accelerator."""
        acc = getattr(getattr(self.cluster, "accelerator", None), "name", None)
        if acc is None:
            return None
        from clustersim.evidence import evidence_for
        ev = evidence_for(acc, getattr(self.plan, "dtype", "bf16"), bool(getattr(self.model, "is_moe", False)),
                          getattr(self.plan, "stack", None), gpus=getattr(self.metrics, "world_size", None),
                          model=getattr(self.model, "name", None))
        # the published runs were predicted without a calibration, over a modelled network
        exp = self.experiment
        if ev.get("rows") and exp.calibration:
            ev["caveat"] = "of the uncalibrated model; this prediction uses a calibration"
        elif ev.get("rows") and exp.network == "ideal":
            ev["caveat"] = "of the analytical network; this prediction's ideal network costs nothing"
        return ev

    def breakdown(self) -> dict:
        """Per-kernel time of each layer phase of the busiest representative rank (topologies.kernel_cost)."""
        from topologies.kernel_cost import layer_breakdown
        if self.cost is None or self.programs is None:
            return {"rank": None, "phases": []}
        return layer_breakdown(self.programs, self.cost)


def _reduce_dtype(plan) -> str | None:
    """The gradient reduction precision the plan ran ('bf16' or 'fp32', auto resolved by its stack)."""
    if not hasattr(plan, "grad_reduce_dtype"):
        return None
    from schedules.kernels import grad_reduce_dtype
    return grad_reduce_dtype(plan.stack, plan.grad_reduce_dtype, plan.grad_bytes_per_param)


def _plan_dict(plan) -> dict:
    if hasattr(plan, "to_dict"):
        return plan.to_dict()
    return dataclasses.asdict(plan) if dataclasses.is_dataclass(plan) else dict(plan)


def resolve_model(exp: Experiment):
    """The ModelSpec an experiment names (preset, custom mapping, YAML file, or parameter count), its attention
    confined to packed documents where ``packed_doc_tokens`` says so (schedules.models.packed)."""
    from schedules import models
    model = _named_model(exp)
    if exp.packed_doc_tokens:
        given = tuple(exp.model) if isinstance(exp.model, dict) else ()
        return models.packed(model, exp.packed_doc_tokens, exp.seq, given)
    return model


def check_packed_context_parallel(cp: int, doc_tokens: int, seq: int) -> None:
    """Packed documents under context parallelism are not modelled: refuse them with that reason (the plan's
    own check would see the documents only as chunked attention and blame the model)."""
    if cp > 1 and 0 < doc_tokens < seq:
        raise PlanError(f"context parallelism (cp {cp}) with sequences packed from documents of {doc_tokens} tokens "
                        f"(--packed-doc-tokens) is not modelled: each document would be split over the CP ranks "
                        f"(as Transformer Engine's THD path does), while the ring here splits whole sequences; "
                        f"use --cp 1")


def _named_model(exp: Experiment):
    from schedules import models
    if exp.model_config is not None:
        base = models.model_from_hf_config(exp.model_config)
        for f in dataclasses.fields(base):          # the same bound as the command-line shape options
            v = getattr(base, f.name)
            if isinstance(v, int) and not isinstance(v, bool):
                _as_int(v, f"{exp.model_config}: {f.name}", minimum=None)
        fields = {k: v for k, v in exp.model.items() if k != "base"} if isinstance(exp.model, dict) else {}
        models.check_model_fields(fields, "model override")
        return models.check_moe_fields(fields, dataclasses.replace(base, **fields), "model override")
    if exp.params is not None and exp.model in (None, "llama3-8b") and not isinstance(exp.model, dict):
        return models.model_from_params(exp.params)
    if exp.params is not None:
        raise ConfigError("--params describes a model by its size alone; do not combine it with --model or shape "
                          "flags")
    if isinstance(exp.model, dict) and "base" in exp.model:
        fields = {k: v for k, v in exp.model.items() if k != "base"}
        if not isinstance(exp.model["base"], str):
            raise ConfigError(f"model: base must name a preset, got {exp.model['base']!r}")
        base = models.get_model(exp.model["base"])
        models.check_model_fields(fields, "model override")
        return models.check_moe_fields(fields, dataclasses.replace(base, **fields), "model override")
    if isinstance(exp.model, dict):
        fields = dict(exp.model)
        models.check_model_fields(fields, "model")
        if "hybrid_pattern" in fields:
            fields.setdefault("layers", len(fields["hybrid_pattern"]))
        for k in ("layers", "hidden", "heads"):
            if k not in fields:
                raise ConfigError(f"custom model needs --{k} (given: {', '.join(sorted(fields)) or 'nothing'})")
        return models.check_moe_fields(fields, models.custom_model(**fields), "model")
    if exp.model is None:
        raise ConfigError("no model: give --model PRESET or --layers/--hidden/--heads")
    if exp.model.endswith((".yaml", ".yml")):
        return models.load_model_file(exp.model)
    return models.get_model(exp.model)


def virtual_stages(exp: Experiment, model) -> int:
    """The experiment's virtual stages: as given, else ``schedules.plan.default_virtual_stages``."""
    from schedules.plan import default_virtual_stages
    if exp.virtual_stages is not None:
        return exp.virtual_stages
    return default_virtual_stages(exp.schedule, exp.pp, getattr(model, "layers", 0))


def resolve_plan(exp: Experiment, model, world_size: int):
    """The validated ParallelPlan of an experiment (dp defaults to GPUs / (tp·pp·cp))."""
    from schedules.plan import (DEFAULT_RECOMPUTE_MODULES, ParallelPlan, lora_fields, parse_memory_limit,
                                parse_stage_layers)

    from clustersim.guards import check_budget
    # every layer runs at least a forward and a backward op: a model the resource guard refuses on that
    # alone (a config.json of 10^15 layers) is refused before validation walks its layers one by one
    check_budget(2 * max(int(model.layers), 1), "symmetric")
    dp = exp.dp
    if dp is None:
        denom = exp.tp * exp.pp * exp.cp
        if world_size % denom:
            raise ConfigError(f"cannot infer dp: {world_size} GPUs are not divisible by tp·pp·cp = "
                              f"{exp.tp}·{exp.pp}·{exp.cp} = {denom}")
        dp = world_size // denom
        exp.dp = dp
    global_batch = exp.global_batch if exp.global_batch is not None else dp * exp.micro_batch * max(exp.pp, 1) * 2
    kw = dict(dp=dp, tp=exp.tp, pp=exp.pp, ep=exp.ep, etp=exp.etp or 0, expert_grid=exp.expert_grid, cp=exp.cp, sp=exp.sp, zero=exp.zero, fsdp=exp.fsdp,
              micro_batch=exp.micro_batch, global_batch=global_batch, schedule=exp.schedule,
              virtual_stages=virtual_stages(exp, model), bucket_bytes=exp.bucket_mb * 1e6, recompute=exp.recompute,
              recompute_every=exp.recompute_every, recompute_modules=exp.recompute_modules or DEFAULT_RECOMPUTE_MODULES,
              seq=exp.seq, fsdp_prefetch=exp.fsdp_prefetch, overlap_grad_reduce=exp.overlap_grad_reduce,
              overlap_param_gather=exp.overlap_param_gather, skew=exp.skew, axis_order=exp.axis_order,
              layer_split=exp.layer_split, stage_layers=parse_stage_layers(exp.stage_layers),
              first_stage_layers=exp.first_stage_layers, last_stage_layers=exp.last_stage_layers,
              attention=exp.attention, attention_kernel=exp.attention_kernel, dtype=exp.dtype,
              fp8_recipe=exp.fp8_recipe, fp8_param_gather=exp.fp8_param_gather,
              stack=exp.stack or "megatron", fsdp_reshard_after_forward=exp.fsdp_reshard_after_forward,
              grad_reduce_dtype=exp.grad_reduce_dtype, tp_comm_overlap=exp.tp_comm_overlap,
              moe_dispatcher=exp.moe_dispatcher, **lora_fields(exp.lora_rank, exp.lora_targets, exp.lora_style),
              **parse_memory_limit(exp.memory_limit, exp.pp))
    names = {f.name for f in dataclasses.fields(ParallelPlan)}
    plan = ParallelPlan(**{k: v for k, v in kw.items() if k in names})
    check_packed_context_parallel(exp.cp, exp.packed_doc_tokens, exp.seq)
    plan.validate(model, world_size)
    return plan


def build_cost_model(exp: Experiment, cluster):
    from simulator.calibration import Calibration, check_scope
    from topologies.cost import ClusterCostModel
    check_scope(exp.calibration_scope, exp.calibration)
    if exp.astra_system is not None and exp.network != "astra":
        raise ConfigError(f"--astra-system configures --network astra's collectives (network is {exp.network}): "
                          f"add --network astra or drop --astra-system")
    cal = Calibration.load(exp.calibration) if exp.calibration else None
    if exp.network == "astra":
        # per-dimension collective algorithms and chunking as ASTRA-sim's analytical backend (issue 14)
        from topologies.astra import load_system
        from topologies.multidim import ClusterMultiDimCostModel
        base = ClusterCostModel(cluster, network="analytical", calibration=cal, algorithm=exp.algorithm,
                            calibration_scope=exp.calibration_scope, gpu_variation=exp.gpu_variation)
        return ClusterMultiDimCostModel(base, cluster, load_system(exp.astra_system))
    return ClusterCostModel(cluster, network=exp.network, calibration=cal, algorithm=exp.algorithm,
                            calibration_scope=exp.calibration_scope, gpu_variation=exp.gpu_variation)


def load_cluster_for(exp: Experiment):
    import topologies
    if exp.cluster.endswith((".yaml", ".yml")):
        # built once, at the size asked for (a file valid for --gpus need not be valid at its default size)
        cluster = topologies.load_cluster_file(exp.cluster, gpus=exp.gpus)
    else:
        cluster = topologies.load_cluster(exp.cluster, exp.gpus)
    if exp.gpus is None:
        exp.gpus = cluster.world_size
    return cluster


def run_experiment(exp: Experiment, progress: Callable[[int, int], None] | None = None,
                   check_budget: bool = True, validate: bool = True, timeline: bool = False,
                   announce: Callable[[str], None] | None = None) -> Outcome:
    """Run one experiment end to end and return its Outcome (result, metrics, resolved model/plan/cluster).
    ``announce(line)`` hears a wall-time and memory estimate before a full-mode run of more than
    ``guards.ANNOUNCE_ABOVE_OPS`` ops.

    ``validate=False`` skips the static program checks (the search does, for generated programs that the
    schedules tests already validate); deadlocks are still detected by the engine."""
    from clustersim.startup import import_simpy, process_runs_one_simulation
    import_simpy()
    from simulator.engine import run
    from simulator.metrics import compute_metrics
    t0 = time.perf_counter()
    # the cyclic collector is paused while the run builds its (acyclic) cluster tables and programs and, in
    # symmetric mode, runs the engine: each full collection would walk all of them again (~0.1 s of a
    # 16k-GPU symmetric run). Full mode resumes it for the engine's run (which pauses it itself while it sets
    # up and runs), frozen first where the process ends after this one simulation (below). A process
    # that ends after this one simulation (`simulate`, clustersim.startup) leaves it paused after a
    # symmetric run without a timeline (only a summary or JSON follows): re-enabling it would only collect,
    # once, the young objects the run built (cli.exit_process); a report folder's plots make garbage
    # cycles, so the collector runs for them
    was = gc.isenabled()
    gc.disable()
    symmetric = False
    try:
        cluster, model, plan, cost, base_cost, programs, notes, failures, cost_summary = _setup(
            exp, check_budget, timeline, announce)
        symmetric = programs.symmetric
        if was and not symmetric:
            if process_runs_one_simulation():
                # full mode in a process that ends after this one simulation: what the set-up built (the
                # programs' ops, acyclic and alive to the end) leaves the collector's reach before it resumes, else its
                # first collections walk all of it again (the young generation holds everything made while
                # it was paused); the heap is frozen at exit anyway (cli.exit_process)
                gc.freeze()
            gc.enable()
        result = run(programs, cost, progress=progress, failures=failures, check=validate)
        metrics = compute_metrics(result)
    finally:
        if was and not (symmetric and not timeline and process_runs_one_simulation()):
            gc.enable()
    metrics.wall_time_s = time.perf_counter() - t0
    priced_by = getattr(base_cost, "base", base_cost)       # --network astra wraps the cluster's cost model
    for note in (headroom_note(metrics.peak_memory_bytes, metrics.memory_capacity_bytes),
                 getattr(priced_by, "forced_algorithm_note", lambda: None)(),
                 cluster_latency_note(exp, cluster, priced_by),
                 late_failure_note(failures, metrics.step_time_s)):
        if note:
            notes.append(note)
    return Outcome(exp, result, metrics, model, plan, cluster, notes, base_cost, programs, cost_summary)


def cluster_latency_note(exp: Experiment, cluster, priced_by) -> str | None:
    """``topologies.nccl.latency_setting_note`` for a run that has priced its collectives: a forced route-level
    algorithm that did not apply to some group left that group to NCCL's model (``forced_missed``)."""
    if exp.network not in ("analytical", "flow"):
        return None
    from topologies.nccl import latency_setting_note
    return latency_setting_note(cluster, None if getattr(priced_by, "forced_missed", None) else exp.algorithm)


def late_failure_note(failures: dict | None, step_time_s: float) -> str | None:
    """A note when every injected device failure (rank -> seconds) falls after the step has ended: the run is
    the fault-free one."""
    if not failures or not all(t >= step_time_s for t in failures.values()):
        return None
    first = min(failures.values())
    return (f"every device failure comes after the step ends ({step_time_s:.4g} s; the first at {first:.4g} s): "
            f"nothing fails in this step")


#: fraction of device memory above which a plan that fits is flagged: the model counts tensors, not what the
#: caching allocator loses to fragmentation, nor the CUDA context, NCCL buffers and library workspaces
TIGHT_MEMORY_FRACTION = 0.95


def headroom_note(peak_bytes: float, capacity_bytes: float) -> str | None:
    """A note when the peak fits but leaves less than 1 - TIGHT_MEMORY_FRACTION of device memory free."""
    if not capacity_bytes or not TIGHT_MEMORY_FRACTION * capacity_bytes < peak_bytes <= capacity_bytes:
        return None
    return (f"peak memory is {peak_bytes / capacity_bytes:.0%} of device memory: allocator fragmentation, the CUDA "
            f"context and NCCL/library buffers (not modelled) may not leave room; real runs this full often "
            f"slow down on allocator retries or fail with out-of-memory")


def stack_for(exp: Experiment, cluster) -> str:
    """The training stack an experiment prices: its own, else the cluster vendor's default."""
    from schedules.kernels import default_stack
    return exp.stack or default_stack(cluster.accelerator.vendor)


def check_device_dtype(dtype: str, accelerator, fp8_recipe: str = "delayed") -> None:
    """Refuse a precision the device cannot run: FP8 GEMMs need an FP8 tensor-core path (Transformer Engine
    and torchao's Float8 both require CUDA compute capability 8.9 or newer: Ada, Hopper, Blackwell). A100,
    TPU v5p and Ascend 910C have none (``AcceleratorSpec.peak_fp8_flops`` is None). MXFP8's block-scaled GEMMs
    are Blackwell's (Transformer Engine's MXFP8 recipe requires compute capability 10.0): refused on a device
    the NCCL model knows as Ampere or Hopper."""
    if dtype == "fp8" and getattr(accelerator, "peak_fp8_flops", None) is None:
        raise PlanError(f"--dtype fp8: {accelerator.name} has no FP8 tensor cores (FP8 training needs an FP8 GEMM "
                        f"path: Ada, Hopper or Blackwell GPUs); use --dtype bf16")
    from topologies.nccl import ARCH
    arch = ARCH.get(getattr(accelerator, "name", None))
    if dtype == "fp8" and fp8_recipe == "mxfp8" and arch in ("ampere", "hopper"):
        raise PlanError(f"--fp8-recipe mxfp8: {accelerator.name} is a {arch.title()} GPU, and MXFP8's block-scaled "
                        f"GEMMs need Blackwell tensor cores (Transformer Engine requires compute capability 10.0); "
                        f"use --fp8-recipe delayed or current")


def device_stack_notes(accelerator, stack: str, given_stack: str | None, attention_kernel: str = "auto") -> list[str]:
    """Notes for a device whose own software stack is not one of ours (a non-NVIDIA accelerator: TPU's XLA,
    Ascend's CANN): the stack's kernels stand in for it, and the CUDA-only parts the user asked for (Transformer
    Engine, a FlashAttention kernel) are priced as a stand-in too."""
    vendor = getattr(accelerator, "vendor", "NVIDIA")
    if vendor == "NVIDIA":
        return []
    name = getattr(accelerator, "name", "the device")
    notes = [f"{name} ({vendor}) runs its own compiler's kernels, which no stack here models: the {stack} stack"
             + ("" if given_stack else " (the default off NVIDIA)")
             + f" stands in with its kernel list and fusions, priced at {name}'s datasheet peaks with efficiency "
               f"curves borrowed from GPUs (the result's pricing.kernels says which)"]
    if given_stack == "megatron":
        notes.append(f"--stack megatron is Megatron-Core with Transformer Engine, whose fused kernels are CUDA "
                     f"kernels: on {name} only their fusion pattern is priced")
    from schedules.kernels import ATTENTION_IMPL
    if attention_kernel not in ("auto", ATTENTION_IMPL.get(stack)):
        what = "FlashAttention-2's CUDA kernel" if attention_kernel == "flash2" else \
            "the Triton FlashAttention kernel (a GPU kernel)"
        notes.append(f"--attention-kernel {attention_kernel} names {what}: on {name} its charted speed is "
                     f"scaled to the device's peak, a stand-in for the device's own attention")
    return notes


def sequence_notes(packed_doc_tokens: int, model, seq: int, given=()) -> list[str]:
    """Notes for attention options no shorter than the sequence (``seq`` tokens): packed documents of
    ``packed_doc_tokens`` and a sliding window or attention chunk the user gave (``given``: the model fields
    set on top of a preset or in a custom model; a preset's own window is what its model card says) then
    change nothing."""
    notes = []
    if packed_doc_tokens and packed_doc_tokens >= seq:
        notes.append(f"--packed-doc-tokens {packed_doc_tokens} is no shorter than the sequence ({seq}): each "
                     f"sequence is one document, attended as without packing")
    for name, what in (("sliding_window", "sliding window"), ("attention_chunk", "attention chunk")):
        n = getattr(model, name, 0) if model is not None and name in given else 0
        if n and n >= seq:
            notes.append(f"{model.name}'s {what} of {n} tokens spans the whole sequence ({seq}): its local layers "
                         f"attend as global ones")
    return notes


def inert_option_notes(exp: Experiment, plan, model=None) -> list[str]:
    """Notes for options the user gave that this plan leaves without effect (valid, but nothing to act on)."""
    notes = []
    if plan.ep == 1 and exp.moe_dispatcher != "alltoall":
        notes.append(f"--moe-dispatcher {exp.moe_dispatcher} deduplicates expert-parallel traffic, and ep 1 sends "
                     f"none: it changes nothing")
    if exp.expert_grid != "folded" and (plan.cp == 1 or not getattr(model, "experts", 0)):
        notes.append(f"--expert-grid {exp.expert_grid} places experts beside context parallelism (an MoE model "
                     f"with cp > 1): here it changes nothing")
    notes += sequence_notes(exp.packed_doc_tokens, model, plan.seq,
                            given=tuple(exp.model) if isinstance(exp.model, dict) else ())
    if plan.lora_rank and plan.tp == 1 and exp.lora_style != "megatron":
        notes.append(f"--lora-style {exp.lora_style} says how adapters run under tensor parallelism; at tp 1 the "
                     f"styles are the same")
    local = (getattr(model, "sliding_window", 0) or getattr(model, "attention_chunk", 0)) if model is not None else 0
    if plan.attention == "eager" and local and local < plan.seq // plan.cp:
        kind = "sliding window" if model.sliding_window else "chunk (or packed document)"
        notes.append(f"--attention eager computes every score and masks those outside each query's {kind} of "
                     f"{local} tokens: local attention saves no time or memory there (FlashAttention skips those "
                     f"tiles)")
    if exp.network == "ideal" and exp.algorithm:
        notes.append(f"--network ideal makes every communication free: --algorithm {exp.algorithm} changes nothing")
    return notes


def _setup(exp: Experiment, check_budget: bool, timeline: bool, announce):
    """run_experiment's set-up: the cluster, model, plan, cost model and (class-refined) programs."""
    from schedules import build_programs
    from simulator.symmetry import refine_classes
    cluster = load_cluster_for(exp)
    world = cluster.world_size
    model = resolve_model(exp)
    given_stack = exp.stack
    exp.stack = stack_for(exp, cluster)
    check_device_dtype(exp.dtype, cluster.accelerator, exp.fp8_recipe)
    plan = resolve_plan(exp, model, world)
    cost = build_cost_model(exp, cluster)
    base_cost = cost
    priced_by = getattr(cost, "base", cost)       # --network astra wraps the cluster's cost model
    cost_summary = priced_by.calibration_summary() if hasattr(priced_by, "calibration_summary") else "none"
    notes: list[str] = list(getattr(priced_by, "calibration_notes", ()))
    notes += device_stack_notes(cluster.accelerator, exp.stack, given_stack, exp.attention_kernel)
    if world < cluster.n_gpus:
        notes.append(f"the cluster's placement lists {world} rank(s) on its {cluster.n_gpus} devices: {world} "
                     f"rank(s) run, the other devices stay idle (--gpus sets the devices; the placement, the ranks)")
    if plan.lora_rank:
        from schedules.memory import lora_rank_params
        trainable = sum(lora_rank_params(model, plan, s) for s in range(plan.pp)) * plan.tp
        share = trainable / model.param_count()
        notes.append(f"LoRA rank {plan.lora_rank} on {', '.join(plan.lora_targets)}: {trainable / 1e6:,.1f} M adapter "
                     f"parameters train ({share:.3%} of the model), the model is frozen"
                     + ("; the adapters outnumber the model's own parameters: a rank this wide is no low-rank "
                        "adaptation (full training of the targets would be cheaper)" if share >= 1 else ""))
    if exp.packed_doc_tokens and model.attention_chunk == exp.packed_doc_tokens and exp.packed_doc_tokens < plan.seq:
        window = getattr(_named_model(exp), "sliding_window", 0)
        notes.append(f"sequences packed from documents of {exp.packed_doc_tokens} tokens: each layer attends "
                     f"causally within its document" + (" (priced as chunked attention)" if plan.attention != "eager"
                                                         else "")
                     + (f"; {model.name}'s sliding window of {window} tokens is no shorter than a document: it "
                        f"never applies" if window else ""))
    from schedules.plan import plan_notes
    notes += plan_notes(plan)
    if plan.schedule == "interleaved" and exp.virtual_stages is None and not (plan.virtual_stages == 1 and plan.pp > 1):
        notes.append(f"interleaved 1F1B with {plan.virtual_stages} virtual stages per pipeline rank (--virtual-stages)")
    if isinstance(exp.model, dict) and "base" not in exp.model and "gated_mlp" not in exp.model \
            and exp.model_config is None:
        notes.append(f"custom model: {'SwiGLU' if model.gated_mlp else '2-matrix GELU (GPT-style)'} MLP, "
                     f"{model.param_count() / 1e9:.2f} B parameters; --gated-mlp / --no-gated-mlp chooses")
    from schedules.models import MEGATRON_GPT_2021_PRESETS
    if model.name in MEGATRON_GPT_2021_PRESETS and plan.attention == "flash":
        notes.append(f"{model.name} is a model of Megatron-LM's 2021 runs, which predate FlashAttention: "
                     f"--attention eager prices the attention core they ran (validation/megatron_lm_2021.csv)")
    notes += inert_option_notes(exp, plan, model)
    failures = None
    fault_breaks = False
    if exp.faults:
        from topologies import faults as fault_mod
        spec = fault_mod.faults_from_dict(exp.faults)
        notes += fault_mod.inert_fault_notes(spec)
        if exp.network == "ideal" and (spec.link_failures or spec.link_degradation):
            notes.append("--network ideal makes every communication free: failed and degraded links change nothing")
        cost, failures = fault_mod.apply_faults(cost, cluster, spec, world)
        fault_breaks = fault_mod.breaks_symmetry(spec)
    mode = exp.mode
    if mode == "symmetric" and fault_breaks:
        raise ConfigError("jitter and failed or degraded links break rank symmetry (stragglers and device failures "
                          "do not: they get classes of their own): use --mode full")
    symmetric = mode != "full" and not fault_breaks
    # before any structure proportional to the plan: a lower bound on the op count is checked first
    from clustersim.guards import check_budget as guard, minimum_ops
    guard(minimum_ops(model, plan, world, symmetric), "symmetric" if symmetric else "full", timeline=timeline,
          network=exp.network)
    if not symmetric and check_budget:
        # size the full run from its symmetric twin before building 16k programs
        from clustersim.guards import check_budget as guard
        twin = build_programs(model, plan, world, symmetric=True, scale_up_domain=cluster.domain_size)
        guard(twin.represented_op_count, "full", symmetric_ops=twin.op_count, timeline=timeline, network=exp.network)
    programs = build_programs(model, plan, world, symmetric=symmetric, scale_up_domain=cluster.domain_size)
    if hasattr(cost, "bind"):
        cost = cost.bind(programs)
    if programs.symmetric:
        # ranks of a class must also cost the same: uneven placements split classes (simulator.symmetry)
        try:
            refined = refine_classes(programs, cost)
        except ProgramError as e:
            if mode == "symmetric":
                raise ConfigError(f"symmetric mode is not valid here: {e}; use --mode full") from None
            notes.append(f"symmetric mode not valid ({e}); simulated every rank")
            programs = build_programs(model, plan, world, symmetric=False, scale_up_domain=cluster.domain_size)
        else:
            programs = refined.programs
            if refined.note():
                notes.append(refined.note())
                if getattr(cost, "contention_aware", False) and getattr(cost, "factors", None):   # stragglers
                    notes.append("under the flow network a class's transfers share one rate, so with stragglers "
                                 "single ops may end slightly apart from a full run's (README: symmetric mode); "
                                 "--mode full simulates every rank")
    if check_budget:
        from clustersim.guards import check_budget as guard
        est = guard(programs, "symmetric" if programs.symmetric else "full", timeline=timeline, network=exp.network)
        from clustersim.guards import ANNOUNCE_ABOVE_OPS, estimate_line
        if announce is not None and not programs.symmetric and est.ops > ANNOUNCE_ABOVE_OPS:
            announce(estimate_line(est, exp.network, timeline))
    return cluster, model, plan, cost, base_cost, programs, notes, failures, cost_summary

"""``clustersim validate``: simulate published end-to-end training runs and report the prediction error.

The runs are ``validation/published_runs.csv``: rows copied from the project's shared collection of
published measurements (``../shared/validation/training_throughput.csv``, each row keeping its ``source``)
whose model and hardware we have presets for (``validation/build_published_runs.py`` makes the copy). Each
row is mapped to an Experiment (``row_experiment``): model preset (with the layer count of reduced "proxy"
configs), cluster preset, plan (tp/pp/cp/ep/virtual stages, data parallelism and its sharding as the
framework runs it, micro and global batch, recomputation), dtype and stack when this build has them.
Rows that cannot be expressed are listed with the reason, never dropped.

These rows are validation only: nothing in the simulator is fitted to them.

Per row: published vs predicted tokens/s per GPU (the error is predicted / published - 1), model TFLOP/s
per GPU (each framework's own definition on the published side, ours — schedules.models — on the
predicted side), peak memory where published. Per group (hardware × precision × dense/MoE): median and
90th-percentile absolute error and the mean signed error.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import click

from clustersim.paths import NonEmptyPath
from schedules.models import MEGATRON_GPT_2021_PRESETS
from simulator.errors import ClusterSimError, ConfigError

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "validation" / "published_runs.csv"
#: CUDA graphs of the Megatron-Bridge performance config behind each Megatron-Bridge row (its header says how it was
#: read): ``cuda_graphs_of``, ``summarize_by_cuda_graphs``
BRIDGE_CUDA_GRAPHS = ROOT / "validation" / "bridge_cuda_graphs.csv"
RUN_COLUMNS = ("model", "hardware", "precision", "framework", "gpus")     # read without a default
#: columns read as numbers (empty where the source does not state them)
NUMERIC_COLUMNS = ("gpus", "seq_len", "gbs", "mbs", "tp", "pp", "cp", "vp", "ep", "etp", "fsdp", "dp", "ga",
                   "num_layers", "tokens_per_s_per_gpu", "tokens_per_s_total", "model_tflops_per_gpu", "mfu_pct",
                   "step_time_s", "peak_memory_gib")
CLUSTER_FILES = ROOT / "validation" / "clusters"
GIB = 2**30


def _published_size(preset: str) -> str:
    """'megatron-gpt-1.7b' -> '1.7B', 'megatron-gpt-1t' -> '1.0T': the paper's size as our CSV names it."""
    size = preset.removeprefix("megatron-gpt-")
    return "1.0T" if size == "1t" else size[:-1] + "B"


# published model name -> model preset (schedules.models; sources there)
MODEL_PRESETS = {
    "Llama 3 8B": "llama3-8b", "Llama 3.1 8B": "llama3-8b", "Llama 3 70B": "llama3-70b",
    "Llama 3.1 70B": "llama3-70b", "Llama 3.1 405B": "llama3-405b",
    "Llama 2 7B": "llama2-7b", "Llama 2 13B": "llama2-13b", "Llama 2 70B": "llama2-70b",
    "GPT-3 175B": "gpt3-175b", "Nemotron-4 15B": "nemotron4-15b", "Nemotron-4 340B": "nemotron4-340b",
    "Grok-1 314B": "grok1-314b", "DeepSeek-V3 671B": "deepseek-v3",
    "GPT-3 5B": "gpt3-5b", "GPT-3 20B": "gpt3-20b", "Nemotron 8B": "nemotron3-8b", "Nemotron 22B": "nemotron3-22b",
    # NeMo AutoModel's "Qwen3 MoE 30B" is Qwen3-30B-A3B (its performance summary's model column)
    "Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3 MoE 30B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Kimi K2": "kimi-k2", "GPT-OSS 120B": "gpt-oss-120b", "GPT-OSS 20B": "gpt-oss-20b",
    "Llama 4 Maverick 400B": "llama4-maverick", "Qwen2.5 7B": "qwen2.5-7b", "Qwen2.5 32B": "qwen2.5-32b",
    # hybrid Mamba-2 models (ModelSpec.hybrid_pattern); NeMo AutoModel's "Nemotron V3 Nano 30B" is Nemotron 3 Nano
    "Nemotron-H 56B": "nemotron-h-56b", "Nemotron 3 Nano": "nemotron-3-nano", "Nemotron V3 Nano 30B": "nemotron-3-nano",
    **{f"MPT-{n}": f"mpt-{n}" for n in ("125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b")},
    # Megatron-LM's GPT family (Narayanan et al. 2021; validation/megatron_lm_2021.csv): "Megatron GPT 1.7B" ...
    **{f"Megatron GPT {_published_size(n)}": n for n in MEGATRON_GPT_2021_PRESETS},
}

#: Models of the published runs without a preset, by name prefix, and what of their architecture is not modelled
UNMODELLED_ARCHITECTURES = (
    *((prefix, "hybrid Mamba-2 / attention layers with LatentMoE (experts in a compressed latent width) and MTP, "
               "not modelled (hybrid Mamba-2 models are, as Nemotron-H and Nemotron 3 Nano)")
      for prefix in ("Nemotron 3 Super", "Nemotron V3 Super", "Nemotron 3 Ultra", "Nemotron V3 Ultra")),
    ("DeepSeek-V4", "its compressed sparse attention is not modelled"),
    ("nanotron", "the Ultra-Scale Playbook's sweep models, run on Hopper GPUs of an unstated SKU at an unstated "
                 "precision"),
)

# hardware class -> cluster preset (or a cluster file in validation/clusters)
CLUSTERS = {"A100-40GB": "dgx-a100-40gb.yaml", "A100": "dgx-a100", "H100": "dgx-h100", "H200": "dgx-h200",
            "B200": "dgx-b200", "GB200": "gb200-nvl72", "B300": "dgx-b300", "GB300": "gb300-nvl72"}

#: GB200 jobs of 64·k GPUs (not a multiple of the rack's 72) run on racks with 64 GPUs in use each (16 of 18
#: compute trays): NVIDIA's Megatron-Bridge GB200 recipes, "64 GB200 GPUs in one NVLink domain"
NVL72, NVL_IN_USE = 72, 64
#: NVL72 hardware -> (racks with 64 GPUs in use, {GPUs of one rack: its cluster file}): jobs smaller than a rack
#: run on compute trays of one rack, one NVLink domain (8 GPUs: two trays; 32: eight); GB300's recipes place
#: their jobs as GB200's do (Megatron-Bridge's gb300 performance recipes: 64 HybridEP ranks per NVLink domain,
#: as gb200's)
NVL72_SLICES = {"GB200": ("gb200-nvl72-64.yaml", {8: "gb200-nvl72-8.yaml", 32: "gb200-nvl72-32.yaml"}),
                "GB300": ("gb300-nvl72-64.yaml", {8: "gb300-nvl72-8.yaml", 32: "gb300-nvl72-32.yaml"})}
TRAYS = {8: "two", 32: "eight"}             # compute trays (4 GPUs each) of those slices
#: single-GPU runs: one GPU of the hardware's node (validation/clusters): hardware class -> cluster file
ONE_GPU_CLUSTERS = {"H100": "dgx-h100-1.yaml"}
#: the H100 96GB HBM2e hosts of torchtitan's benchmarks (Grand Teton; validation/clusters)
GRAND_TETON = "grand-teton-h100.yaml"

MEGATRON = ("Megatron", "NeMo")                 # frameworks running Megatron-Core (+ Transformer Engine)
#: Megatron-LM as Narayanan et al. 2021 ran it (v2.x): before FlashAttention (2022; Megatron-LM took it up in
#: 2023) the attention core is baddbmm, the fused scale-mask-softmax, dropout and bmm (``--attention eager``);
#: before the distributed optimizer (2022) plain data parallelism: ``DDP_impl='local'`` all-reduces the gradient
#: buffer after the whole forward-backward (training.py ``allreduce_gradients``), ``'torch'`` (PyTorch DDP)
#: in buckets during backward (the framework names which, as the paper's run_table_1.sh chose per model);
#: and before sequence parallelism (Korthikanti et al. 2022): TP all-reduces, norms and dropout on every TP rank
MEGATRON_2021 = "Megatron-LM 2021"
TORCH_FSDP = ("torchtitan", "AutoModel", "llm-foundry")
JAX_FSDP = ("MaxText", "Paxml")


class NotExpressible(ClusterSimError):
    """A published run the simulator cannot express (the message says why)."""


# ---------------------------------------------------------------------------------------------- loading
def load_runs(path: str | Path = PUBLISHED) -> list[dict]:
    """Rows of a published-runs CSV (``#`` comment lines skipped), values as strings ('' when empty)."""
    from simulator.inputs import load_csv

    p = Path(path)
    if not p.is_file() and not p.is_absolute() and (ROOT / p).is_file():
        p = ROOT / p            # the project's own sets by their repository path, from any directory
    if not p.is_file():
        raise ConfigError(f"published runs file {p} not found")
    rows = load_csv(p, "published runs file", required=RUN_COLUMNS)
    seen: set[str] = set()
    for n, r in enumerate(rows):
        rid = (r.get("id") or "").strip()
        if rid and rid in seen:      # a row counted twice would weigh twice in every statistic
            raise ConfigError(f"published runs file {p}: id {rid!r} appears twice (row {n + 1})")
        seen.add(rid)
        for col in NUMERIC_COLUMNS:  # text in a number's column was read as "not stated"
            v = (r.get(col) or "").strip()
            if v:
                try:
                    float(v)
                except ValueError:
                    raise ConfigError(f"published runs file {p}: row {rid or n + 1}: {col} {v!r} is not a number "
                                      f"(leave it empty where the source does not state it)") from None
    return rows


def hardware_class(hardware: str) -> str | None:
    """'A100-40GB', 'A100', 'H100', 'H200', 'B200', 'GB200', 'B300', 'GB300' or None (an unnamed Hopper SKU)."""
    h = hardware.strip()
    if h.startswith("A100 40GB"):
        return "A100-40GB"
    for cls in ("A100", "H100", "H200", "GB200", "B200", "GB300", "B300"):
        if h.startswith(cls):
            return cls
    return None


def precision_class(precision: str) -> str | None:
    """'bf16', 'fp16', 'fp8' (FP8, FP8-CS, FP8-MX, MXFP8, torchao float8) or None (NVFP4, unstated)."""
    p = precision.strip().upper()
    if p.startswith("BF16"):
        return "bf16"
    if p.startswith("FP16"):
        return "fp16"
    if p.startswith(("FP8", "MXFP8")):
        return "fp8"
    return None


#: torchtitan compiles the loss with the model from 2025-04-02 (bbb1b616e, build_cross_entropy_loss); its
#: benchmark documents name the month they ran in (benchmarks/llama3_h100_202412_torchtitan.md, ..._202506_...)
TORCHTITAN_LOSS_COMPILED_FROM = 202504


def stack_of(framework: str, source: str = "") -> str | None:
    if any(k in framework for k in MEGATRON):
        return "megatron"
    if "llm-foundry" in framework:
        return "llm-foundry"
    if any(k in framework for k in TORCH_FSDP):
        if "torch.compile" not in framework:
            return "torchtitan"
        month = re.search(r"_(20\d\d)-?(\d\d)_", source)     # benchmarks/..._202412_..., ..._2025-06_...
        late = month is not None and int(month.group(1) + month.group(2)) >= TORCHTITAN_LOSS_COMPILED_FROM
        return "torchtitan-compile-loss" if late else "torchtitan-compile"
    return None


#: Composer's FSDP mixed-precision modes as llm-foundry's benchmark tables name them ("MP Mode"): PURE reduces
#: gradients in the compute dtype; DEFAULT in fp32 from Composer 0.16.4 (2023-10-11). The tables' DEFAULT rows
#: are the runs of llm-foundry PR #543 (2023-10-19): its submit_benchmarks.py installs llm-foundry's v0.3.0
#: branch (``mosaicml>=0.16.3,<0.17``) in the mosaicml/pytorch:2.1.0 image (torch 2.1.0, 2023-10-04); its
#: PURE rows are the earlier runs kept from before (Composer 0.14-0.15, where DEFAULT too reduced in bf16)
COMPOSER_REDUCE = {"PURE": "bf16", "DEFAULT": "fp32"}


#: the FlashAttention kernel a benchmark's launch scripts state where its table does not: (model, table) ->
#: kernel. llm-foundry PR #838 (5e85bd62d, 2024-01-06) added the "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
#: table with scripts/train/benchmarking/sweep.py, which launches the 1b, 3b, 7b and 70b runs with
#: ``--attn_impl flash`` (13b and 30b: ``--attn_impl triton``) from llm-foundry main installed as
#: ``.[gpu-flash2]`` (flash-attn 2.x); submit_benchmarks.py writes ``args.attn_impl`` into the run's
#: ``attn_config``. The sweep's shard strategies, micro-batches and checkpointing are the table's; its
#: ``--fsdp_config_mixed_precision PURE`` never reaches mod_parameters, hence the table's MP Mode DEFAULT.
LLM_FOUNDRY_LARGE_SCALE = "llm-foundry README (H100 80GB BF16 (Large Scale, >= 128 GPUs))"
LAUNCH_SCRIPT_ATTENTION = {(m, LLM_FOUNDRY_LARGE_SCALE): "flash2" for m in ("MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b")}
#: the same where a benchmark's script sets Transformer Engine's attention backend: (model, commit of the source
#: document) -> (kernel, note). dgxc-benchmarking v25.05's nemotronh launches NeMo 7a8f1cc's
#: scripts/performance/llm/pretrain_nemotronh_56b.py, whose custom_env_vars set NVTE_FUSED_ATTN=0: TE's
#: FlashAttention backend (flash-attn), not cuDNN's fused attention. The NeMo 25.04.01 container's flash-attn is
#: taken as version 2 (FlashAttention-3 is a separate install TE uses when present; no source here says that
#: container has it)
SCRIPT_ATTENTION_BACKEND = {
    ("Nemotron-H 56B", "68eaf7e117bf16cb018861ce101e8f80925f74d8"):
        ("flash2", "FlashAttention-2: the benchmark's NeMo script (pretrain_nemotronh_56b.py) sets NVTE_FUSED_ATTN=0, "
                   "Transformer Engine's flash-attn backend instead of cuDNN's (flash-attn 2 assumed: FlashAttention-3 "
                   "is a separate install)"),
}


#: configurations a benchmark's own launch script states where its README table does not: (model, commit of
#: the source document) -> virtual pipeline stages. NVIDIA dgxc-benchmarking v25.04 and v25.04.01
#: (nemotron/launch.sh at 741c886 and 85380ff: ``MODEL_SIZE = 340b ... VP=12``, passed as ``-vp $VP``)
LAUNCH_SCRIPT_VP = {("Nemotron-4 340B", "741c886025a7665a1d690c05ff12ac29c1be7252"): 12,
                    ("Nemotron-4 340B", "85380ffe02eac74e1d07e556b28cdcf7cce2d2f0"): 12}

#: a layer count a README states and a later revision of it corrects, with the same measured numbers: (model,
#: commit of the source document) -> (layers, note). dgxc-benchmarking v25.05 (68eaf7e) llama4/README.md lists
#: Llama 4 Maverick with 32 layers; v25.05.01 (60d6fd3) lists the same runs (same step times) with 48, the
#: model's own; its launch.sh sets no layer count, and GB200's PP2 x VP12 needs a multiple of 24 layers
CORRECTED_LAYERS = {
    ("Llama 4 Maverick 400B", "68eaf7e117bf16cb018861ce101e8f80925f74d8"):
        (48, "48 layers: the benchmark's v25.05.01 README corrects this revision's 32 for the same measured runs "
             "(its launch.sh sets no layer count; PP2 x VP12 needs a multiple of 24)"),
}


#: activation checkpointing a benchmark's recipe states where its published table does not: Megatron-Bridge
#: v0.3.0-v0.5.0 (NeMo 26.02-26.06) run its GB200 Llama performance configs with the recipes'
#: ``recompute_granularity = None`` (src/megatron/bridge/recipes/llama/llama3.py) and no recompute_num_layers
#: (scripts/performance/configs/llama/llama31_workload_base_configs.py ``LLAMA31_405B_PRETRAIN_CONFIG_GB200_
#: {FP8_CS,FP8_MX}_V2``: TP4 PP16 VP4 / VP8; llama3_workload_base_configs.py ``LLAMA3_70B_PRETRAIN_CONFIG_GB200_
#: FP8_CS_V2``: Megatron FSDP, mbs 2, ``cpu_offloading_num_layers=40``). GB300: the same recipes (v0.2.0 and v0.3.0
#: set no recompute granularity: Megatron-Core's default, none) with the GB300 configs of v0.2.0
#: (scripts/performance/configs/llama3/workload_base_configs.py ``LLAMA3_70B_GB300_FP8_CS_BASE_CONFIG``: Megatron
#: FSDP, mbs 2, ``cpu_offloading_num_layers=20``; ``..._FP8_MX_...``: PP4 VP5) and v0.3.0-v0.5.0
#: (``LLAMA3_70B_PRETRAIN_CONFIG_GB300_{FP8_CS,FP8_MX}_V*``, ``LLAMA31_405B_PRETRAIN_CONFIG_GB300_{FP8_CS,FP8_MX}_V2``:
#: TP4 PP8 VP4 / TP2 PP8 CP2 VP4, no offloading). (hardware, model, NeMo release, FSDP, precision class: these
#: Llama recipes are FP8 ones) -> (recompute, note); the
#: 70B runs' activation offloading to the Grace CPU is not modelled (simulated as kept).
RECIPE_RELEASES = ("NeMo 26.02", "NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06")
_QWEN3_30B_RELEASES = RECIPE_RELEASES + ("NeMo 26.06.01", "NeMo 26.08")
#: GPT-OSS 120B in BF16: Megatron-Bridge's GB300 and B300 configs (GPT_OSS_120B_*_{GB300,B300}_BF16_V1 / V2,
#: checked at v0.2.0-v0.5.0) set no recompute modules and capture attention and the router in CUDA graphs
GPT_OSS_RELEASES = ("NeMo 25.11",) + RECIPE_RELEASES[:-1]          # the BF16 rows' releases, 25.11-26.04.01
RECIPE_RECOMPUTE = {
    **{("GB200", "Llama 3.1 405B", rel, False, "fp8"): ("none", "Megatron-Bridge's GB200 recipe (LLAMA31_405B_"
                                                        "PRETRAIN_CONFIG_GB200_*_V2) runs without activation "
                                                        "recomputation")
       for rel in RECIPE_RELEASES},
    **{("GB200", "Llama 3 70B", rel, True, "fp8"): ("none", "Megatron-Bridge's GB200 recipe (LLAMA3_70B_PRETRAIN_"
                                                    "CONFIG_GB200_FP8_CS_V2) runs without recomputation and offloads "
                                                    "40 layers' activations to the CPU (not modelled: simulated as "
                                                    "kept on the GPU)")
       for rel in RECIPE_RELEASES},
    **{("GB300", model, rel, fsdp, "fp8"): ("none", f"Megatron-Bridge's GB300 recipe ({cfg}) runs without "
                                                    f"activation recomputation{extra}")
       for rel in ("NeMo 25.11",) + RECIPE_RELEASES
       for model, fsdp, cfg, extra in (
           ("Llama 3 70B", True, "LLAMA3_70B_*_GB300_FP8_CS_*: Megatron FSDP, mbs 2",
            " and offloads 20 layers' activations to the CPU (not modelled: simulated as kept on the GPU)"),
           ("Llama 3 70B", False, "LLAMA3_70B_*_GB300_FP8_MX_*: PP4 VP5", ""),
           ("Llama 3.1 405B", False, "LLAMA31_405B_*_GB300_*", ""))},
    **{(hw, "GPT-OSS 120B", rel, False, "bf16"): ("none", f"Megatron-Bridge's {hw} config (GPT_OSS_120B_*_{hw}_"
                                                          f"BF16_V1 / V2, v0.2.0-v0.5.0) runs without activation "
                                                          f"recomputation")
       for hw in ("GB300", "B300") for rel in GPT_OSS_RELEASES},
    # Qwen3-30B-A3B's MXFP8 configs on B300 and GB300 (QWEN3_30B_A3B_PRETRAIN_CONFIG_{B300,GB300}_FP8_MX_V1, mbs 8,
    # qwen/qwen3_workload_base_configs.py at v0.3.0-v0.5.1, set_qwen3_common_configs clearing the recipe's recompute;
    # v0.6.0's perf_recipes/qwen/gb300/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config, None),
    # its H100 FP8-CS and Qwen3-235B-A22B's B200 FP8-MX configs of v0.2.0 (NeMo 25.11; their parallelism differs from
    # the rows' in VP only, and every variant of the file's history sets no recompute), Llama 3 70B's GB200 FP8-CS
    # config of v0.2.0 (LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG: Megatron FSDP, mbs 2, 40 layers' activations
    # offloaded to the CPU, not modelled)
    **{(hw, "Qwen3-30B-A3B", rel, False, "fp8"): ("none", f"Megatron-Bridge's Qwen3-30B-A3B {hw} config "
                                                          f"({hw}_FP8_MX_V1) runs without activation recomputation")
       for hw in ("B300", "GB300") for rel in _QWEN3_30B_RELEASES},
    ("H100", "Qwen3-30B-A3B", "NeMo 25.11", False, "fp8"): (
        "none", "Megatron-Bridge's Qwen3-30B-A3B H100 FP8-CS config (v0.2.0) runs without activation recomputation"),
    ("B200", "Qwen3-235B-A22B", "NeMo 25.11", False, "fp8"): (
        "none", "Megatron-Bridge's Qwen3-235B-A22B B200 FP8-MX config (v0.2.0) runs without activation "
                "recomputation"),
    ("GB200", "Llama 3 70B", "NeMo 25.11", True, "fp8"): (
        "none", "Megatron-Bridge's GB200 recipe (LLAMA3_70B_GB200_FP8_CS_BASE_CONFIG, v0.2.0) runs without "
                "recomputation and offloads 40 layers' activations to the CPU (not modelled: simulated as kept on "
                "the GPU)"),
    # Nemotron 3 Nano's Blackwell configs (scripts/performance/configs/nemotronh/nemotron_3_nano_workload_base_configs
    # .py at v0.3.1, nemotron_3_workload_base_configs.py at v0.4.0-v0.5.1, perf_recipes/nemotronh/gb300 at v0.6.0:
    # {B200,GB200,B300,GB300}_FP8_MX_V1, EP8, mbs 2 / 2 / 4 / 4) set no recompute (the recipe's granularity None)
    **{(hw, "Nemotron 3 Nano", rel, False, "fp8"): ("none", f"Megatron-Bridge's Nemotron 3 Nano {hw} config "
                                                            f"({hw}_FP8_MX_V1) runs without activation recomputation")
       for hw in ("B200", "GB200", "B300", "GB300")
       for rel in RECIPE_RELEASES + ("NeMo 26.06.01", "NeMo 26.08")},
}
RECIPE_FRAMEWORK = "Megatron-Bridge"
#: Megatron-Bridge releases whose performance scripts have no FP8 delayed scaling: from v0.2.0 (NeMo 25.11)
#: scripts/performance/argument_parser.py offers ``--compute_dtype {bf16,fp8_cs,fp8_mx,fp8_sc,nvfp4}``, and its
#: Llama workload configs (llama3 / llama31_workload_base_configs.py) exist only as ``*_FP8_CS_V*`` and
#: ``*_FP8_MX_V*`` among the FP8 ones (checked at v0.3.0, v0.4.0, v0.5.0). Their summaries label the FP8_CS runs
#: "FP8-CS" (NeMo 25.11) and "FP8" (NeMo 26.02 on), the FP8_MX ones "FP8-MX" / "MXFP8". The same holds for the
#: Qwen3 MoE configs (qwen/qwen3_workload_base_configs.py, e.g. QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 and
#: QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1/V2 the only H100 FP8 ones; checked at v0.3.0, v0.4.0, v0.5.0).
CURRENT_SCALING_RELEASES = ("NeMo 25.11",) + RECIPE_RELEASES
CURRENT_SCALING_MODELS = ("Llama 3 8B", "Llama 3 70B", "Llama 3.1 405B", "Qwen3-30B-A3B", "Qwen3-235B-A22B",
                          "Nemotron 3 Nano")      # (its H100 FP8 config: H100_FP8_CS_V1, v0.3.1-v0.5.1)
#: FP8 parameters a benchmark's configs state for its FP8 runs: NeMo 1.x's ``model.fp8_params`` (Megatron-Core's
#: fp8_param_gather). dgxc-benchmarking v24.11.1 (35a9aec), v25.01 (8f5cbb3) and e6afea3: llama3.1/configure.sh
#: ``+model.fp8_params=$FP8_ENABLED``, nemotron/configure.sh ``+model.fp8_params=${FP8_ENABLED^}``,
#: grok1/configure.sh ``model.fp8_params=${FP8_ENABLED^}``, nemo_megatron/gpt3_175b_hydra.yaml ``fp8_params: true``;
#: at 741c886 and 85380ff the grok1 and GPT-3 ones as before (the Llama 3.1 and Nemotron runs there are NeMo 2.0
#: scripts whose precision plugin at that release is not read here). (model, commit, framework) -> note
_FP8_PARAMS_FILES = {"Grok-1 314B": "grok1/configure.sh", "GPT-3 175B": "nemo_megatron/gpt3_175b_hydra.yaml",
                     "Llama 3.1 405B": "llama3.1/configure.sh", "Llama 3.1 70B": "llama3.1/configure.sh",
                     "Llama 3.1 8B": "llama3.1/configure.sh", "Nemotron-4 15B": "nemotron/configure.sh",
                     "Nemotron-4 340B": "nemotron/configure.sh"}
_FP8_PARAMS_COMMITS = {
    **{c: tuple(_FP8_PARAMS_FILES) for c in ("35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae",
                                            "8f5cbb3799ea8cc031ed2c2cee1cbdbc15b240ad",
                                            "e6afea3aea32cdbe8c7fdc4f5c385d11272152a3")},
    **{c: ("Grok-1 314B", "GPT-3 175B") for c in ("741c886025a7665a1d690c05ff12ac29c1be7252",
                                                  "85380ffe02eac74e1d07e556b28cdcf7cce2d2f0")},
}
#: what running with FP8 parameters means here (the notes of the rows that do)
FP8_PARAMS_MEANING = "no BF16 copy of the block weights, the distributed optimizer gathers 1 byte per weight"
CONFIG_FP8_PARAMS = {(m, c, "NeMo"): f"FP8 parameters as the benchmark's {_FP8_PARAMS_FILES[m]} sets them "
                                     f"(fp8_params: {FP8_PARAMS_MEANING})"
                     for c, models in _FP8_PARAMS_COMMITS.items() for m in models}
#: dgxc-benchmarking v25.05 (68eaf7e) nemotronh/launch.sh runs NeMo's scripts/performance/llm/pretrain_nemotronh_56b.py
#: at the NeMo commit its setup.sh pins (7a8f1cc): FP8 delayed scaling ("ds", the default; launch.sh passes no -fr)
#: through bf16_with_fp8_mixed, which sets fp8_param_gather
CONFIG_FP8_PARAMS[("Nemotron-H 56B", "68eaf7e117bf16cb018861ce101e8f80925f74d8", "NeMo")] = (
    f"FP8 parameters as NeMo's pretrain_nemotronh_56b.py (bf16_with_fp8_mixed) sets them (fp8_param_gather: "
    f"{FP8_PARAMS_MEANING})")
#: NeMo AutoModel's performance summary (docs/performance-summary.mdx at 36044ad, the rows' source) points to its
#: benchmark configs (examples/benchmark/configs/*.yaml when the rows were written); each row's config as of the
#: commit where the row's figures first appear (89e3a9f, 2025-10-06: DeepSeek-V3, Kimi K2, GPT-OSS; 32f0a9b,
#: 2026-02-26: Qwen3 MoE 30B; bb0c0bf, 2026-02-25: Nemotron V3 Nano; 2013a4d, 2026-04-10: Llama3 70B's
#: custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml) -> (config, revision, activation_checkpointing, where the
#: config's plan differs from the table's: the table wins where it states a value).
AUTOMODEL_COMMIT = "36044ad3d139363fb6c73c24af2e7c6b65ec52f6"
AUTOMODEL_CONFIGS = {
    "DeepSeek-V3 671B": ("deepseek_v3_te_deepep.yaml", "89e3a9f", True, ""),
    "Kimi K2": ("kimi_k2_te_deepep.yaml", "89e3a9f", True, ""),
    "GPT-OSS 20B": ("gptoss_20b_te_deepep.yaml", "89e3a9f", True, ""),
    "GPT-OSS 120B": ("gptoss_120b_te_deepep.yaml", "89e3a9f", False,
                     "that config runs PP2 EP16 with global batch 256, the table PP1 with 512"),
    "Qwen3 MoE 30B": ("qwen3_moe_30b_te_deepep.yaml", "32f0a9b", True, ""),
    "Nemotron V3 Nano 30B": ("nemotron_nano_v3_te_deepep.yaml", "bb0c0bf", True, ""),
    "Llama 3 70B": ("custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", "2013a4d", True, ""),
}
#: NeMo AutoModel's LoRA benchmark configs behind the performance summary's fine-tuning rows
#: (examples/llm_finetune/*/*peft_benchmark*.yaml), each read at the commit where its row's figures first appear:
#: 2013a4d (2026-04-10; unchanged at 36044ad) for the TP2 runs, which also set FSDP2 with prefetch, torch.compile
#: and LoRA dim 16 on '*_proj'; 507bfb7 (2025-12-16) for the 1-GPU runs (match_all_linear: every linear but the
#: LM head; no activation_checkpointing key: FSDP2Manager's default, false).
class PeftConfig(NamedTuple):
    """What one of NeMo AutoModel's LoRA benchmark configs sets (``AUTOMODEL_PEFT_CONFIGS``)."""
    config: str                 # file name
    revision: str               # NVIDIA-NeMo/Automodel commit read
    checkpointing: bool         # activation_checkpointing
    sequence_parallel: bool
    async_tp: bool              # enable_async_tensor_parallel (not modelled)
    lora_dropout: float         # on each adapter's input (not priced)


#: (model, GPUs) -> PeftConfig
AUTOMODEL_PEFT_CONFIGS = {
    ("Llama 3 70B", 8): PeftConfig("custom_llama3_3_70b_instruct_peft_benchmark.yaml", "2013a4d", True, True, True, 0.0),
    ("Llama 3 70B", 16): PeftConfig("custom_llama3_3_70b_instruct_peft_benchmark_2nodes.yaml", "2013a4d", True, True,
                                    True, 0.0),
    ("Qwen2.5 32B", 8): PeftConfig("custom_qwen2_5_32b_peft_benchmark.yaml", "2013a4d", True, False, False, 0.0),
    ("Qwen2.5 32B", 16): PeftConfig("custom_qwen2_5_32b_peft_benchmark_2nodes.yaml", "2013a4d", True, False, False,
                                    0.0),
    ("Llama 3 8B", 1): PeftConfig("llama3_1_8b_peft_benchmark.yaml", "507bfb7", False, False, False, 0.1),
    ("Qwen2.5 7B", 1): PeftConfig("qwen2_5_7b_peft_benchmark.yaml", "507bfb7", False, False, False, 0.0),
}


def automodel_peft_config(row: dict) -> PeftConfig | None:
    """``AUTOMODEL_PEFT_CONFIGS``' entry of a NeMo AutoModel LoRA row of the summary at ``AUTOMODEL_COMMIT``."""
    if row.get("task") != "lora" or "AutoModel" not in row.get("framework", "") \
            or _commit_of(row.get("source", "")) != AUTOMODEL_COMMIT:
        return None
    return AUTOMODEL_PEFT_CONFIGS.get((row.get("model"), _int(row, "gpus")))


#: expert parallelism those configs set where the table's EP column is empty ("-") for a model whose kernel
#: optimizations name DeepEP (an expert-parallel dispatcher): model -> ep_size
AUTOMODEL_EP = {"GPT-OSS 20B": 8, "GPT-OSS 120B": 16}

#: the same from a benchmark's model config: (model, commit of the source document, framework) -> (recompute, note).
#: dgxc-benchmarking v24.11.1 (35a9aec) runs Nemotron-4 340B from nemotron/nemotron4-340b-synth.yaml
#: (configure.sh: ``--config-name=${MODEL}-${MODEL_SIZE}-synth``), which sets
#: ``activations_checkpoint_granularity: selective`` (Megatron's core-attention recomputation)
#: The JAX rows of dgxc-benchmarking state their checkpoint policies in their configs, neither expressible exactly:
#: MaxText (v25.02 8f5cbb3, maxtext/configure.sh: ``POLICY="save_qkv_proj"`` passed as ``remat_policy``) keeps only
#: the q/k/v projections' outputs; Paxml (v24.11.1 35a9aec, paxml/paxml_mod_configs.py ``Synthetic175BCkpt``:
#: ``CHECKPOINT_POLICY = SAVE_QKV_OUT_PROJ``) keeps those and the output projection's. Both re-run everything else
#: in backward; full recomputation, the nearest we price, also re-runs those projections.
CONFIG_RECOMPUTE = {
    **{(model, AUTOMODEL_COMMIT, "AutoModel"): (
        "full" if ac else "none",
        f"NeMo AutoModel's {config} sets activation_checkpointing: {str(ac).lower()} (the benchmark config its "
        f"performance summary points to, at {rev}, where the row's figures first appear)" + (differs and f"; {differs}"))
       for model, (config, rev, ac, differs) in AUTOMODEL_CONFIGS.items()},
    # dgxc-benchmarking v25.05 nemotronh: NeMo's performance script takes recompute layers and modules from
    # model_configs_h100.csv, which has no Nemotron-H row: no recomputation
    ("Nemotron-H 56B", "68eaf7e117bf16cb018861ce101e8f80925f74d8", "NeMo"):
        ("none", "the benchmark's NeMo performance script (pretrain_nemotronh_56b.py) sets no activation "
                 "recomputation (model_configs_h100.csv has no Nemotron-H row)"),
    ("Nemotron-4 340B", "35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae", "NeMo"):
        ("selective", "the benchmark's nemotron4-340b-synth.yaml sets activations_checkpoint_granularity: selective"),
    ("Llama 3 70B", "8f5cbb3799ea8cc031ed2c2cee1cbdbc15b240ad", "MaxText"):
        ("full", "the benchmark's maxtext/configure.sh sets remat_policy=save_qkv_proj (only the q/k/v projections' "
                 "outputs are kept): simulated as full recomputation, which also re-runs those projections"),
    ("GPT-3 175B", "35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae", "Paxml"):
        ("full", "the benchmark's paxml_mod_configs.py sets CHECKPOINT_POLICY = SAVE_QKV_OUT_PROJ (only the q/k/v "
                 "and output projections' outputs are kept): simulated as full recomputation, which also re-runs "
                 "those projections (a third of a GPT-3 layer's GEMM FLOPs: slower than the run by that)"),
    # Synthetic5BCkpt: CHECKPOINT_POLICY = SAVE_DOT_ONLY keeps every matmul's output and re-runs the elementwise
    # ops in backward: no GEMM is recomputed, so no recomputation is the nearest (the re-run elementwise passes,
    # a few percent of the step, are not priced: faster than the run by that)
    ("GPT-3 5B", "35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae", "Paxml"):
        ("none", "the benchmark's paxml_mod_configs.py sets CHECKPOINT_POLICY = SAVE_DOT_ONLY (every matmul's output "
                 "kept, elementwise ops re-run in backward): simulated without recomputation; the re-run elementwise "
                 "passes are not priced"),
}
#: Attention a benchmark's flags state: dgxc-benchmarking v24.11.1's paxml/configure.sh runs XLA with cuDNN's fused
#: attention and the Triton softmax fusion off (``--xla_gpu_enable_cudnn_fmha=false``,
#: ``--xla_gpu_enable_triton_softmax_fusion=false``): the attention core runs unfused, its s×s scores through HBM,
#: which ``--attention eager`` prices. (model, commit of the source document, framework) -> (attention, note)
CONFIG_ATTENTION = {
    (model, "35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae", "Paxml"):
        ("eager", "the benchmark's XLA flags turn cuDNN's fused attention off (--xla_gpu_enable_cudnn_fmha=false, "
                  "Triton softmax fusion off too): the attention core runs unfused, priced as --attention eager")
    for model in ("GPT-3 175B", "GPT-3 5B")     # configure.sh sets the same XLA_FLAGS for both sizes
}

#: Megatron-Core recompute modules a benchmark's launch script passes where its README table says nothing:
#: (model, commit of the source document, hardware class) -> modules. NVIDIA dgxc-benchmarking v25.05 (68eaf7e)
#: and v25.05.04 (1f6d9f4) deepseek_v3/pretraining/launch.sh: ``RM='mla_up_proj'`` on H100, ``RM='core_attn'`` on
#: GB200, passed as ``--recompute_modules $RM`` to NeMo's scripts.performance.llm.pretrain_deepseek_v3 (selective
#: granularity).
LAUNCH_SCRIPT_RECOMPUTE_MODULES = {
    ("DeepSeek-V3 671B", "68eaf7e117bf16cb018861ce101e8f80925f74d8", "H100"): ("mla_up_proj",),
    ("DeepSeek-V3 671B", "68eaf7e117bf16cb018861ce101e8f80925f74d8", "GB200"): ("core_attn",),
    ("DeepSeek-V3 671B", "1f6d9f40e4117d7c71b726f86074ac01c29f87f5", "H100"): ("mla_up_proj",),
    ("DeepSeek-V3 671B", "1f6d9f40e4117d7c71b726f86074ac01c29f87f5", "GB200"): ("core_attn",),
}

#: the same from Megatron-Bridge's performance configs (scripts/performance/configs/<model>/, the default config
#: variant v2; perf_recipes/ at v0.6.0), where the table's parallelism identifies the config: (model, hardware
#: class, pp, ep) -> ((releases, modules, config), ...), releases by tag (docs/releases/software-versions.md and
#: the docs' version list: NeMo 25.11 v0.2.x, 26.02 v0.3.0, 26.02.01 v0.3.1, 26.04 v0.4.0, 26.04.01 v0.4.2, 26.06
#: v0.5.0; 26.06.01 v0.5.1 and 26.08 v0.6.0 by their tags' dates). B200 PP16 EP8: DEEPSEEK_V3_B200_*_BASE_CONFIG
#: (v0.2.x) and DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 (v0.3.0-v0.4.0), recompute_modules=["mla_up_proj"];
#: B200 PP8 VP2 EP32: ..._B200_FP8_MX_V2 of v0.4.2, ["mla_up_proj", "mlp"]. The others below.
RECIPE_RECOMPUTE_MODULES = {
    ("DeepSeek-V3 671B", "B200", 16, 8): ((("NeMo 25.11", "NeMo 26.02", "NeMo 26.02.01", "NeMo 26.04"),
                                           ("mla_up_proj",), "DEEPSEEK_V3_B200 performance config"),),
    ("DeepSeek-V3 671B", "B200", 8, 32): ((("NeMo 26.04.01",), ("mla_up_proj", "mlp"),
                                           "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 (v0.4.2)"),),
    # B300 PP8 EP8 mbs 2: DEEPSEEK_V3_PRETRAIN_CONFIG_B300_V2 of v0.4.2 (NeMo 26.04.01) and v0.5.0 (26.06)
    ("DeepSeek-V3 671B", "B300", 8, 8): ((("NeMo 26.04.01", "NeMo 26.06"), ("mla_up_proj",),
                                          "DEEPSEEK_V3_PRETRAIN_CONFIG_B300_V2 (v0.4.2, v0.5.0: PP8, mbs 2)"),),
    # GB200 PP4 VP4 EP64: v0.2.x-v0.3.x ["mla_up_proj"], v0.4.0 and v0.4.2 (NeMo 26.04, 26.04.01) ["mlp"] (the
    # dense layers' MLPs only), v0.5.0-v0.6.0 (26.06-26.08) ["mla_up_proj"] again
    ("DeepSeek-V3 671B", "GB200", 4, 64): (
        (("NeMo 25.11", "NeMo 26.02", "NeMo 26.02.01"), ("mla_up_proj",), "DEEPSEEK_V3_GB200 performance config"),
        (("NeMo 26.04", "NeMo 26.04.01"), ("mlp",), "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2 (v0.4.0, v0.4.2)"),
        (("NeMo 26.06", "NeMo 26.06.01", "NeMo 26.08"), ("mla_up_proj",),
         "DeepSeek-V3 GB200 MXFP8 config (v0.5.0-v0.6.0)")),
    # GB300 PP2 VP8 EP32 mbs 2: DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2 of v0.3.0-v0.4.2
    ("DeepSeek-V3 671B", "GB300", 2, 32): ((("NeMo 26.02", "NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01"),
                                           ("mla_up_proj",), "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2 "
                                                             "(v0.3.0-v0.4.2)"),),
    # Kimi K2 on GB300 (KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX, kimi/kimi_workload_base_configs.py, v0.3.1-v0.5.0)
    ("Kimi K2", "GB300", 4, 64): ((("NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06"), ("mla_up_proj",),
                                  "KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX (v0.3.1-v0.5.0)"),),
    # GPT-OSS 120B in BF16 (configs/gpt_oss, v0.2.0-v0.5.0, V1 and V2 alike): recompute_modules=["layernorm",
    # "moe_act"] on H100 (PP4 EP8), B200 (EP64, or EP8 from v0.4.0's V2) and GB200 (EP64)
    **{("GPT-OSS 120B", hw, pp, ep): ((GPT_OSS_RELEASES, ("layernorm", "moe_act"),
                                       f"GPT_OSS_120B_*_{hw}_BF16 performance config (v0.2.0-v0.5.0)"),)
       for hw, pp, ep in (("H100", 4, 8), ("B200", 1, 64), ("B200", 1, 8), ("GB200", 1, 64))},
    # Nemotron 3 Nano on H100 (H100_FP8_CS_V1, v0.3.1-v0.5.1): recompute_modules=["moe", "layernorm", "core_attn",
    # "moe_act"] (moe re-runs the whole MoE block, moe_act included)
    ("Nemotron 3 Nano", "H100", 1, 8): ((("NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06"),
                                         ("moe", "layernorm", "core_attn"),
                                         "H100_FP8_CS_V1 Nemotron 3 Nano performance config (v0.3.1-v0.5.1; its "
                                         "moe_act is part of moe)"),),
}


def stated_recompute_modules(row: dict) -> tuple[tuple[str, ...], str] | None:
    """(Megatron recompute modules, where stated) of a row's launch script (``LAUNCH_SCRIPT_RECOMPUTE_MODULES``)
    or Megatron-Bridge performance config (``RECIPE_RECOMPUTE_MODULES``)."""
    hw = hardware_class(row.get("hardware", ""))
    hit = LAUNCH_SCRIPT_RECOMPUTE_MODULES.get((row.get("model"), _commit_of(row.get("source", "")), hw))
    if hit:
        return hit, "the benchmark's launch script (--recompute_modules)"
    if RECIPE_FRAMEWORK not in row.get("framework", ""):
        return None
    release = (row.get("release") or "").strip()
    for releases, modules, config in RECIPE_RECOMPUTE_MODULES.get((row.get("model"), hw, _int(row, "pp", 1),
                                                                   _int(row, "ep", 1)), ()):
        if release in releases:
            return modules, f"Megatron-Bridge's {config}"
    return None


def current_scaling_run(row: dict) -> bool:
    """Whether a row labelled plain "FP8" ran Transformer Engine's current scaling: a Megatron-Bridge Llama or
    Qwen3 run of a release whose performance scripts have no delayed scaling (``CURRENT_SCALING_RELEASES``)."""
    return (RECIPE_FRAMEWORK in row.get("framework", "") and row.get("model") in CURRENT_SCALING_MODELS
            and (row.get("release") or "").strip() in CURRENT_SCALING_RELEASES)


def stated_recompute(row: dict, fsdp: bool) -> tuple[str, str] | None:
    """(recompute, note) that a row's benchmark recipe or model config states where its table does not."""
    model = row.get("model")
    if RECIPE_FRAMEWORK in row.get("framework", ""):
        hw, release = hardware_class(row.get("hardware", "")), (row.get("release") or "").strip()
        hit = RECIPE_RECOMPUTE.get((hw, model, release, fsdp, precision_class(row.get("precision") or "")))
        if hit:
            return hit
    peft = automodel_peft_config(row)
    if peft:
        return ("full" if peft.checkpointing else "none",
                f"NeMo AutoModel's {peft.config} sets activation_checkpointing: {str(peft.checkpointing).lower()} "
                f"(read at {peft.revision}, where the row's figures first appear)")
    return _config_entry(CONFIG_RECOMPUTE, row)


def _config_entry(table: dict, row: dict):
    """A row's entry of a (model, commit of the source document, framework) table: one benchmark commit
    documents several frameworks' runs of one model (dgxc-benchmarking v24.11.1: GPT-3 175B under NeMo and
    Paxml), so the framework named in the key must be the row's."""
    commit = _commit_of(row.get("source", ""))
    fw = row.get("framework", "")
    for (model, c, framework), value in table.items():
        if model == row.get("model") and c == commit and framework in fw:
            return value
    return None


def _commit_of(source: str) -> str | None:
    m = re.search(r"/blob/([0-9a-f]{40})/", source)
    return m.group(1) if m else None


def composer_reduce_dtype(row: dict) -> str | None:
    """Gradient reduction precision of an llm-foundry row from its "MP mode" note (None: not stated)."""
    m = re.search(r"MP mode\s+([A-Z]+)", row.get("notes", ""))
    return COMPOSER_REDUCE.get(m.group(1)) if m else None


def group_of(row: dict) -> str:
    """Summary group: hardware × precision × dense/MoE."""
    model = MODEL_PRESETS.get(row["model"], "")
    from schedules.models import get_model
    moe = bool(model) and get_model(model).is_moe
    hw = (hardware_class(row["hardware"]) or "?").replace("-40GB", "")
    if hw == "H100" and "HBM2e" in row["hardware"]:
        hw = "H100-500W"      # a different SKU (96 GB HBM2e at 2.4 TB/s, 500 W limit): validation/clusters
    return group_label(hw, precision_class(row["precision"]) or row["precision"], moe)


def group_label(hardware: str, precision: str, moe: bool) -> str:
    """A summary group's name: 'H100 BF16 dense' (also clustersim.evidence's, for a simulation's kind)."""
    return f"{hardware} {precision.upper()} {'MoE' if moe else 'dense'}"


def release_head(row: dict) -> str:
    """The first token of a row's release ('torchtitan 9dec370' of 'torchtitan 9dec370 / torch 1963fc8 ...')."""
    return (row.get("release") or "").split(" /")[0].strip()


# ---------------------------------------------------------------------------------------------- mapping
def _num(row: dict, key: str) -> float | None:
    v = (row.get(key) or "").strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


#: count columns of a runs file that may be 0 (Megatron-Bridge's fsdp: 0 = DDP); every other count is >= 1
ZERO_COUNTS = ("fsdp",)


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    """A count column as an integer (``default`` where empty); a fraction or a count below 1 (below 0 for
    ``ZERO_COUNTS``) is no run's: NotExpressible naming the column (it had been rounded, or crashed the batch
    arithmetic at 0)."""
    x = _num(row, key)
    if x is None:
        return default
    least = 0 if key in ZERO_COUNTS else 1
    if x != int(x) or x < least:
        raise NotExpressible(f"{key} {row[key].strip()} is not a whole number >= {least}")
    return int(x)


#: a runs file's measured figures: none is negative
MEASURED_COLUMNS = ("tokens_per_s_per_gpu", "tokens_per_s_total", "model_tflops_per_gpu", "mfu_pct", "step_time_s",
                    "peak_memory_gib")


def published_tokens_per_gpu(row: dict) -> float | None:
    """Tokens/s per GPU as published: per GPU, else job total / GPUs, else gbs·seq / step time / GPUs."""
    gpus = _num(row, "gpus")
    v = _num(row, "tokens_per_s_per_gpu")
    tot = _num(row, "tokens_per_s_total")
    gbs, seq, step = _num(row, "gbs"), _num(row, "seq_len"), _num(row, "step_time_s")
    for name in MEASURED_COLUMNS:
        x = _num(row, name)
        if x is not None and x < 0:
            raise NotExpressible(f"{name} is negative ({x:g}): not a measurement")
    for name in ("gpus", "gbs", "seq_len"):
        _int(row, name)             # whole and >= 1 where given
    if v:
        return v
    if tot and gpus:
        return tot / gpus
    if gbs and seq and step and gpus:
        return gbs * seq / step / gpus
    return None


def _local_batch(row: dict) -> int | None:
    m = re.search(r"(?:local batch size|LBS=)\s*(\d+)", row.get("notes", ""), re.IGNORECASE)
    return int(m.group(1)) if m else None


def row_experiment(row: dict, experiment_fields: set[str] | None = None,
                   tp_overlap: bool = False) -> tuple[dict, list[str]]:
    """(Experiment keyword arguments, notes) for a published row; NotExpressible says why not.
    ``tp_overlap``: rows whose recipes overlap TP communication (``runs_tp_overlap``) run --tp-comm-overlap
    (off by default: see README, "validate")."""
    from schedules.models import get_model

    fields = experiment_fields if experiment_fields is not None else _experiment_fields()
    notes: list[str] = []
    task = row.get("task", "pretrain") or "pretrain"
    if task not in ("pretrain", "sft", "lora"):
        raise NotExpressible(f"task {task!r}: pre-training, SFT and LoRA steps are simulated")
    finetune = finetune_settings(row) if task != "pretrain" else None       # NotExpressible where unknown
    if "CHECK" in row.get("notes", ""):
        raise NotExpressible("the source's figures disagree with one another (CHECK in the data notes)")
    preset = MODEL_PRESETS.get(row["model"])
    if preset is None:
        why = next((w for prefix, w in UNMODELLED_ARCHITECTURES if row["model"].startswith(prefix)), None)
        raise NotExpressible(f"no model preset for {row['model']!r}" + (f": {why}" if why else ""))
    hw = hardware_class(row["hardware"])
    if hw is None:
        raise NotExpressible(f"no cluster preset for hardware {row['hardware']!r}")
    cluster = CLUSTERS[hw]
    if cluster.endswith(".yaml"):
        from topologies.specs import ACCELERATORS
        if "A100-40GB" not in ACCELERATORS:
            raise NotExpressible("no A100 40GB accelerator spec in this build")
        cluster = str(CLUSTER_FILES / cluster)
    prec = precision_class(row["precision"])
    if prec is None:
        raise NotExpressible(f"precision {row['precision']!r} is not BF16, FP16 or FP8")
    if "rowwise" in row["precision"].lower():
        raise NotExpressible("float8 rowwise scaling: its row-scaled GEMMs are not in the kernel data (the FP8 "
                             "GEMMs priced here are per-tensor scaled)")
    if prec == "fp16":
        prec = "bf16"
        notes.append("FP16 mixed precision simulated as BF16 (the same tensor-core peak and 2-byte elements)")
    kw: dict = {"cluster": cluster}
    if hw == "H100" and "HBM2e" in row["hardware"]:
        kw["cluster"] = str(CLUSTER_FILES / GRAND_TETON)
        notes.append("H100 96GB HBM2e (Grand Teton): its 2.4 TB/s and 96 GB as the source states, SXM5 compute with "
                     "GEMMs at the 700 W H100's sustained rate, an upper bound (the source puts its peak between SXM "
                     "and NVL; the further slowdown at 500 W is not modelled); reported in its own group")
    if "dtype" in fields:
        kw["dtype"] = prec
    elif prec != "bf16":
        raise NotExpressible("FP8 run: this build has no --dtype (BF16 only)")
    label = row["precision"].strip().upper()
    if label == "FP8-CS" and "fp8_recipe" in fields:
        # Megatron-Bridge's FP8-CS recipes: Transformer Engine's Float8CurrentScaling
        kw["fp8_recipe"] = "current"
    elif label == "FP8" and "fp8_recipe" in fields and current_scaling_run(row):
        kw["fp8_recipe"] = "current"
        notes.append("FP8 as Megatron-Bridge's performance scripts of this release run it for this model: its "
                     "FP8_CS config (Transformer Engine's current scaling; the scripts offer no delayed scaling)")
    if (label in ("MXFP8", "FP8-MX") and "fp8_recipe" in fields
            and not MODEL_PRESETS.get(row["model"], "").startswith("deepseek")):
        # MXFP8 block scaling; DeepSeek-V3's recipes fuse the norm's MXFP8 output from July 2026
        # (NVTE_NORM_FWD_USE_CUDNN, Megatron-Bridge cce4953): those rows keep the fused-norm casts
        kw["fp8_recipe"] = "mxfp8"
    stack = stack_of(row["framework"], row.get("source", ""))
    if stack and "stack" in fields:
        kw["stack"] = stack
    reduce = composer_reduce_dtype(row) if stack == "llm-foundry" else None
    if reduce and "grad_reduce_dtype" in fields:
        kw["grad_reduce_dtype"] = reduce
    attention = _config_entry(CONFIG_ATTENTION, row)
    if attention and "attention" in fields:
        kw["attention"] = attention[0]
        notes.append(attention[1])
    kernel = LAUNCH_SCRIPT_ATTENTION.get((row.get("model"), (row.get("release") or "").strip()))
    if kernel and "attention_kernel" in fields:
        kw["attention_kernel"] = kernel
        notes.append("FlashAttention-2: the benchmark's sweep.py launches this model with --attn_impl flash and "
                     "flash-attn 2 (llm-foundry PR #838), not the stack's Triton kernel")
    backend = SCRIPT_ATTENTION_BACKEND.get((row.get("model"), _commit_of(row.get("source", ""))))
    if backend and "attention_kernel" in fields:
        kw["attention_kernel"] = backend[0]
        notes.append(backend[1])
    gpus = _int(row, "gpus")
    seq = _int(row, "seq_len")
    config_seq = CONFIG_SEQ_LEN.get(release_head(row))
    if not seq and config_seq and _int(row, "mbs"):
        seq = config_seq
        notes.append(f"sequence {seq}: the train configs at the benchmark's commit ({release_head(row)}) "
                     f"set seq_len = {seq}; its table does not state it")
    if not gpus or not seq:
        raise NotExpressible("GPU count or sequence length not stated")
    if hw in NVL72_SLICES and gpus in NVL72_SLICES[hw][1]:
        kw["cluster"] = str(CLUSTER_FILES / NVL72_SLICES[hw][1][gpus])
        notes.append(f"{gpus} {hw} GPUs as {TRAYS[gpus]} compute trays of one NVL72 rack (one NVLink domain of "
                     f"{gpus})")
    elif gpus == 1 and hw in ONE_GPU_CLUSTERS:
        kw["cluster"] = str(CLUSTER_FILES / ONE_GPU_CLUSTERS[hw])
        notes.append(f"one {hw} GPU ({ONE_GPU_CLUSTERS[hw]}): nothing to communicate")
    elif hw in NVL72_SLICES and gpus % NVL72 and not gpus % NVL_IN_USE:
        kw["cluster"] = str(CLUSTER_FILES / NVL72_SLICES[hw][0])
        notes.append(f"{gpus} {hw} GPUs as {gpus // NVL_IN_USE} NVL72 rack(s) with 64 GPUs in use each "
                     f"(Megatron-Bridge's {hw} recipes: 64 GPUs in one NVLink domain)")
    base = get_model(preset)
    layers = _int(row, "num_layers")
    corrected = CORRECTED_LAYERS.get((row.get("model"), _commit_of(row.get("source", ""))))
    if corrected:
        layers = corrected[0]
        notes.append(corrected[1])
    kw["model"] = preset if layers in (None, base.layers) else {"base": preset, "layers": layers}
    if layers not in (None, base.layers):
        notes.append(f"proxy config with {layers} layers")
    tp, pp, cp, ep = (_int(row, k, 1) or 1 for k in ("tp", "pp", "cp", "ep"))
    if _int(row, "ep") is None and "AutoModel" in row.get("framework", "") \
            and _commit_of(row.get("source", "")) == AUTOMODEL_COMMIT and row.get("model") in AUTOMODEL_EP:
        ep = AUTOMODEL_EP[row["model"]]
        config, rev = AUTOMODEL_CONFIGS[row["model"]][:2]
        notes.append(f"expert parallelism {ep}: the table leaves EP empty beside DeepEP; NeMo AutoModel's {config} "
                     f"sets ep_size: {ep} (at {rev})")
    vp = _int(row, "vp", 1) or 1
    launch_vp = LAUNCH_SCRIPT_VP.get((row.get("model"), _commit_of(row.get("source", ""))))
    if not (row.get("vp") or "").strip() and launch_vp:
        vp = launch_vp
        notes.append(f"virtual stages {vp}: the benchmark's launch.sh passes -vp {vp} (its README table prints NA)")
    if gpus % (tp * pp * cp):
        raise NotExpressible(f"{gpus} GPUs not divisible by tp·pp·cp = {tp * pp * cp}")
    dp = gpus // (tp * pp * cp)
    fw = row["framework"]
    megatron_2021 = MEGATRON_2021 in fw
    mbs, gbs = _int(row, "mbs"), _int(row, "gbs")
    local = _local_batch(row)
    if megatron_2021:
        torch_ddp = "DDP torch" in fw
        kw.update(zero=0, overlap_grad_reduce=torch_ddp, attention="eager")
        notes.append("Megatron-LM 2021: eager attention core (no FlashAttention), no sequence parallelism, data "
                     "parallelism without the distributed optimizer, gradients all-reduced " +
                     ("in buckets during the backward pass (PyTorch DDP)" if torch_ddp else "after the backward pass"))
    elif any(k in fw for k in MEGATRON):
        fsdp = (_int(row, "fsdp") or 0) > 0
        if fsdp:
            kw["fsdp"] = True
        else:
            kw["zero"] = 1               # Megatron's distributed optimizer (NeMo / Megatron-Bridge recipes)
    elif any(k in fw for k in TORCH_FSDP + JAX_FSDP):
        if "SHARD_GRAD_OP" in fw:
            kw["zero"] = 2
        else:
            kw["fsdp"] = True
        deg = _int(row, "fsdp")
        if deg and deg < dp:
            notes.append(f"HSDP (shard {deg}, replicate {dp // deg}) simulated as FSDP over {dp}")
        if gbs is None and local:
            gbs = local * dp
        if mbs is None and pp == 1 and local:
            mbs = local
        pipe = TORCHTITAN_PP_DEFAULTS.get(release_head(row))
        if mbs is None and pp > 1 and local and pipe:
            # the table states the local batch and the schedule; the config defaults of that commit split it
            mbs, pieces = _torchtitan_pipeline(local, pp, "Interleaved" in fw, base.layers, pipe)
            kw["stage_layers"] = ",".join(map(str, pieces))
            if len(pieces) > pp:
                vp = len(pieces) // pp
            notes.append(f"pipeline as {release_head(row)}'s defaults split it: {pp} micro-batches of "
                         f"{mbs} (n_microbatches = pipeline degree), {len(pieces) // pp} stage(s) per rank, layers "
                         f"{','.join(map(str, pieces))} (generate_split_points)")
    else:
        raise NotExpressible(f"framework {fw!r} not mapped")
    if mbs is None or gbs is None:
        raise NotExpressible("micro-batch or global batch size not stated")
    if gbs % (mbs * dp):
        raise NotExpressible(f"global batch {gbs} is not a multiple of micro-batch {mbs} × dp {dp}")
    if pp > 1:
        interleaved = vp > 1 or "Interleaved" in fw
        kw["schedule"] = "interleaved" if interleaved else "1f1b"
        if vp > 1:
            kw["virtual_stages"] = vp
    ac = (row.get("activation_checkpointing") or "").strip().lower()
    recipe = None if ac else stated_recompute(row, bool(kw.get("fsdp")))
    modules = None if ac or recipe else stated_recompute_modules(row)
    if recipe:
        kw["recompute"] = recipe[0]
        notes.append(recipe[1])
    elif modules:
        kw.update(recompute="selective", recompute_modules=modules[0])
        notes.append(f"Megatron recompute modules {','.join(modules[0])}, as {modules[1]} sets them")
    elif ac in ("full", "true"):
        kw["recompute"] = "full"
    elif ac.startswith("selective"):
        kw.update(recompute_of_selective(fw, ac))
    kw.update(gpus=gpus, seq=seq, tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, sp=tp > 1 and not megatron_2021,
              micro_batch=mbs, global_batch=gbs)
    if base.mtp_layers:
        _mtp_and_layout(row, base, pp, vp, kw, notes)
    dispatcher = stated_moe_dispatcher(row, ep)
    if dispatcher and "moe_dispatcher" in fields:
        kw["moe_dispatcher"] = dispatcher[0]
        notes.append(dispatcher[1])
    etp = _int(row, "etp")
    if ep > 1 and not etp and RECIPE_FRAMEWORK in fw and row.get("model") in BRIDGE_ETP1_MODELS and tp > 1:
        etp = 1
        notes.append("expert tensor parallelism 1, as Megatron-Bridge's recipes for this model set it (the table "
                     "leaves ETP empty)")
    if ep > 1 and etp and etp != tp:     # the recipe's expert TP (Megatron's default is tp): folded experts
        kw["etp"] = etp
    if tp_overlap and runs_tp_overlap(row, stack, tp, base) and "tp_comm_overlap" in fields:
        kw["tp_comm_overlap"] = True
    if "async tp" in fw.lower() or "asynctp" in fw.lower():
        notes.append("torchtitan's async TP (micro-pipelined collective matmuls) is not modelled: its TP collectives "
                     "run in line, as the same table's vanilla-TP rows")
    fp8_params = _config_entry(CONFIG_FP8_PARAMS, row) if kw.get("dtype") == "fp8" else None
    if (fp8_params and kw.get("zero") in (1, 2) and kw.get("fp8_recipe", "delayed") != "mxfp8"
            and "fp8_param_gather" in fields):
        kw["fp8_param_gather"] = True
        notes.append(fp8_params)
    elif RECIPE_FRAMEWORK in fw and kw.get("fp8_recipe") in ("current", "mxfp8"):
        # Megatron-Bridge's bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed set fp8_param_gather
        if kw["fp8_recipe"] == "current" and kw.get("zero") in (1, 2) and "fp8_param_gather" in fields:
            kw["fp8_param_gather"] = True
            notes.append(f"FP8 parameters as the recipe keeps them (fp8_param_gather: {FP8_PARAMS_MEANING})")
        else:
            notes.append("the recipe's fp8_param_gather is not modelled here (" +
                         ("MXFP8 parameters" if kw["fp8_recipe"] == "mxfp8" else "with FSDP") +
                         "): BF16 weights with FP8 copies, gathered in BF16")
    if "AutoModel" in fw and "FlexAttn" in (row.get("notes") or ""):
        notes.append("its FlexAttention (PyTorch's flex_attention, as the table's kernel optimizations name it) is "
                     "priced as cuDNN's fused attention: no FlexAttention measurement is in the kernel data")
    if finetune is not None:
        if any(k not in fields for k in finetune[0]):
            raise NotExpressible("fine-tuning: this build has no --lora-rank / --packed-doc-tokens")
        kw.update(finetune[0])
        notes.append(finetune[1])
    if row.get("id") in SOURCE_FLAGS:
        notes.append(SOURCE_FLAGS[row["id"]])
    return kw, notes


#: Packed SQuAD as Megatron-Bridge's FLOP counter states it for the Llama 3 tokenizer
#: (src/megatron/bridge/training/utils/flop_utils.py, PR #2416): Σ sᵢ² = 842,603 per packed 4,096-token
#: sequence, i.e. documents of 842,603 / 4,096 = 206 tokens each for the same attention FLOPs
#: (schedules.models.packed). No statistic is published for the Llama 2 tokenizer.
SQUAD_PACKED_SUM_SQ_4096 = 842_603
SQUAD_DOC_TOKENS = round(SQUAD_PACKED_SUM_SQ_4096 / 4096)


def finetune_settings(row: dict) -> tuple[dict, str]:
    """(Experiment keyword arguments, note) of a fine-tuning row's recipe (task sft or lora), from what its
    framework's configs of that release set (docs/validation-notes.md, "Fine-tuning rows"); NotExpressible
    where they are not known."""
    task, fw = row["task"], row.get("framework", "")
    release = (row.get("release") or "").strip()
    packed = {"packed_doc_tokens": SQUAD_DOC_TOKENS}
    if RECIPE_FRAMEWORK in fw and release.startswith("NeMo 26.06") and _int(row, "seq_len") == 4096:
        if task == "lora":
            return ({"lora_rank": 16, "lora_targets": ("qkv",), **packed},
                    f"LoRA as Megatron-Bridge's Llama 3 70B fine-tuning performance config runs it (v0.5.0 "
                    f"llama3_llm_finetune.py, llama3_70b_peft_config: dim 16, alpha 32, on linear_qkv only) on "
                    f"SQuAD packed to 4,096 tokens (documents of {SQUAD_DOC_TOKENS} tokens: Σ sᵢ² = 842,603 per "
                    f"sequence, its FLOP counter's figure)")
        return ({}, "SFT: every weight trains on 4,096-token sequences as in pre-training; whether the runs packed "
                    "SQuAD (attention within each document, less of it) is not published: attention over the "
                    "whole sequence is priced, as the recipe's FLOP counter counts it (an upper bound on its time)")
    if "NeMo (Megatron-Core)" in fw and release.startswith("NeMo 24.07") and _int(row, "seq_len") == 4096:
        lora = {"lora_rank": 32, "lora_targets": ("qkv",)} if task == "lora" else {}
        what = ("LoRA (adapter dim 32 on attention_qkv, NeMo-Framework-Launcher 24.07 conf/peft/llama/sft.yaml "
                "and NeMo 1's default target)" if task == "lora" else "SFT (every weight trains)")
        return ({**lora, **packed},
                f"{what} on SQuAD v1.1 packed to 4,096 tokens (examples/peft/llama/h100/*.sh); documents of "
                f"{SQUAD_DOC_TOKENS} tokens, the Llama 3 tokenizer's packing statistic (none is published for "
                f"Llama 2's, whose tokens are more per document: attention a little more than priced)")
    if "AutoModel" in fw and _commit_of(row.get("source", "")) == AUTOMODEL_COMMIT and task == "lora":
        peft = automodel_peft_config(row)
        sp = {"sp": False} if peft and not peft.sequence_parallel and _int(row, "tp", 1) > 1 else {}
        return ({"lora_rank": 16, "lora_targets": ("qkv", "proj", "fc1", "fc2"), "lora_style": "dtensor", **sp},
                "LoRA as NeMo AutoModel's configs at 36044ad set it: dim 16, alpha 32 on every *_proj linear "
                "(q, k, v, o, gate, up, down: priced as one adapter beside each fused linear), mock data (one "
                "unpacked 4,096-token sequence per sample); under TP its DTensor LoRA-aware styles "
                "(ColwiseParallelLora / RowwiseParallelLora) move only the rank-16 intermediates"
                + (f"; {peft.config} sets sequence_parallel: false (TP without SP)" if sp else "")
                + (f"; {peft.config} sets enable_async_tensor_parallel: true, not modelled (its TP collectives run "
                   f"in line)" if peft and peft.async_tp else "")
                + (f"; its LoRA dropout {peft.lora_dropout:g} (a dropout kernel on each adapter's input) is not "
                   f"priced" if peft and peft.lora_dropout else ""))
    raise NotExpressible(f"task {task!r}: what the {fw} {release} fine-tuning recipe ran is not known here")


#: published figures their own source flags, by row id: the flag in the source's words. The rows stay in every
#: statistic (nothing is dropped for disagreeing with the model); the note says why they stand apart. Megatron-
#: Bridge's performance summary (docs/performance-summary-archive.md, 26.06.01 table) footnotes its GPT-OSS 120B
#: MXFP8 rows on GB300 and GB200 (20,288 and 18,304 tokens/s per GPU; the same configs published 33,166 /
#: 28,947 in 26.06 and 33,024 / 28,672 in 26.08).
SOURCE_FLAGS = {
    row_id: "the source flags this figure: \"Performance regression in GPT-OSS 120B pre-training is a known issue "
            "(NVIDIA/cudnn-frontend issue 256). It will be resolved with the next container release.\""
    for row_id in ("771", "902")}


#: Megatron-Bridge MoE models whose recipes set expert_tensor_parallel_size = 1 (Megatron-Core's default is the
#: TP size): v0.2.0 (NeMo 25.11) src/megatron/bridge/recipes/qwen/qwen3_moe.py (``expert_tensor_parallel_size: int =
#: 1``), v0.3.0 scripts/performance/configs/{qwen/qwen3,deepseek/deepseek}_workload_base_configs.py
#: (``expert_tensor_parallel_size=1``); rows whose table leaves ETP empty run it.
BRIDGE_ETP1_MODELS = ("Qwen3-30B-A3B", "Qwen3-235B-A22B", "DeepSeek-V3 671B")

#: Megatron-Bridge's DeepSeek-V3 recipe (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, unchanged from
#: v0.1.0rc4, NeMo 25.09, to v0.5.0): ``mtp_num_layers = 1`` (its performance configs keep it; the tables label
#: the runs without it "w/o MTP") and, for these (pp, vp), ``set_deepseek_v3_pipeline_model_parallel_layout``'s
#: layout: decoder layers per virtual stage in model order, the embedding with the first, the MTP module and the
#: loss with the last (other (pp, vp) keep Megatron's default split: our balanced one).
DEEPSEEK_V3_RECIPE_LAYOUTS = {(4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
                              (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,)}


#: NeMo 2.x's DeepSeek-V3 performance script as NVIDIA's dgxc-benchmarking launches it: (model, commit of the
#: source README) -> where that is read. deepseek_v3/pretraining/setup.sh of v25.05 (68eaf7e) and v25.05.04
#: (1f6d9f4) pins NeMo 7a8f1cc ("Llmb nemo r2.3.0", 2025-06-02), and launch.sh runs its
#: scripts/performance/llm/pretrain_deepseek_v3.py, which builds ``pretrain_recipe()``: that recipe's
#: ``use_mtp=True`` default gives the model ``mtp_num_layers=1`` (nemo/collections/llm/recipes/deepseek_v3.py),
#: and the script sets num_layers_in_first_pipeline_stage = 64 // pp - 1 and num_layers_in_last_pipeline_stage
#: = 64 // pp - 2 (the stages between take 64 // pp; 61 layers in all for the PP the benchmark runs).
NEMO_DEEPSEEK_PERF_SCRIPT = {
    ("DeepSeek-V3 671B", commit): "NeMo 7a8f1cc's scripts/performance/llm/pretrain_deepseek_v3.py, which "
                                  "dgxc-benchmarking's launch.sh runs"
    for commit in ("68eaf7e117bf16cb018861ce101e8f80925f74d8", "1f6d9f40e4117d7c71b726f86074ac01c29f87f5")}


def _nemo_deepseek_layout(pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage as NEMO_DEEPSEEK_PERF_SCRIPT's script sets them (one virtual stage)."""
    mid = 64 // pp
    return (mid - 1,) + (mid,) * (pp - 2) + (mid - 2,)


def _mtp_and_layout(row: dict, base, pp: int, vp: int, kw: dict, notes: list[str]) -> None:
    """Multi-token prediction and pipeline layout of a run of a model with MTP modules (DeepSeek-V3): what
    Megatron-Bridge's recipe, or the NeMo performance script a benchmark launches, sets; else (other
    frameworks, which do not state it) no MTP."""
    label = f"{row.get('notes', '')} {row.get('model_label_in_source', '')}"
    bridge = RECIPE_FRAMEWORK in row.get("framework", "")
    script = NEMO_DEEPSEEK_PERF_SCRIPT.get((row.get("model"), _commit_of(row.get("source", ""))))
    if script and not bridge:
        notes.append(f"{base.mtp_layers} MTP module on the last pipeline stage ({script}: the recipe's "
                     f"mtp_num_layers = 1)")
        layout = _nemo_deepseek_layout(pp) if pp > 1 and 64 % pp == 0 and vp == 1 else None
        if layout and sum(layout) == base.layers and "stage_layers" not in kw:
            kw["stage_layers"] = ",".join(map(str, layout))
            notes.append(f"pipeline layout of that script (PP{pp}): decoder layers {layout[0]} on the first stage, "
                         f"{layout[-1]} on the last{f', {layout[1]} on the others' if pp > 2 else ''}")
        return
    if not bridge:
        kw["mtp_layers"] = 0
        notes.append("multi-token prediction not stated by the source: simulated without the MTP module")
        return
    if "w/o MTP" in label:
        kw["mtp_layers"] = 0
        notes.append("without the MTP module, as the table's model label says (w/o MTP)")
    else:
        notes.append(f"{base.mtp_layers} MTP module on the last pipeline stage (Megatron-Bridge's DeepSeek-V3 recipe: "
                     f"mtp_num_layers = {base.mtp_layers})")
    layout = DEEPSEEK_V3_RECIPE_LAYOUTS.get((pp, vp))
    if layout and sum(layout) == base.layers and "stage_layers" not in kw:
        kw["stage_layers"] = ",".join(map(str, layout))
        notes.append(f"pipeline layout of Megatron-Bridge's DeepSeek-V3 recipe (PP{pp} VP{vp}): decoder layers "
                     f"{','.join(map(str, layout))} per virtual stage, the embedding with the first, the MTP module "
                     f"and the loss with the last")


#: MoE token dispatchers Megatron-Bridge's DeepSeek-V3 performance configs set (``moe_flex_dispatcher_backend``,
#: scripts/performance/configs/deepseek/; the launcher keeps it unless told otherwise: --moe_flex_dispatcher_backend
#: defaults to -1): v0.2.x (NeMo 25.11) HybridEP on GB200 and GB300, DeepEP on H100, none (alltoall) on B200;
#: v0.3.0-v0.5.x (NeMo 26.02-26.08) HybridEP everywhere (B300 and GB300 included: DEEPSEEK_V3_PRETRAIN_CONFIG_
#: {B300,GB300}_V1/V2) but v0.5.0's B200 FP8-MX V2 config (PP8 VP2 EP32, NeMo 26.04.01): DeepEP.
#: v0.1.x (NeMo 25.09) has no flex dispatcher (alltoall). (release, hardware class) -> backend; ("*", "B200", 32)
#: the EP32 exception.
BRIDGE_DEEPSEEK_DISPATCHER = {
    ("NeMo 25.11", "GB200"): "hybridep", ("NeMo 25.11", "GB300"): "hybridep", ("NeMo 25.11", "H100"): "deepep",
    **{(rel, hw): "hybridep" for rel in ("NeMo 26.02", "NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06",
                                         "NeMo 26.06.01", "NeMo 26.08")
       for hw in ("GB200", "B200", "H100", "GB300", "B300")},
    ("NeMo 26.04.01", "B200", 32): "deepep",
}


#: Other Megatron-Bridge MoE configs that set the flex dispatcher (moe_flex_dispatcher_backend): (model, hardware
#: class) -> ((releases, backend, configs), ...), read per release tag with each tag's own config lookup (from
#: v0.4.0 a config without a backend forces alltoall over the model recipe's deepep; at v0.3.1 the Qwen perf file
#: sets the type itself; GPT-OSS's v0.3.x scripts apply none). Rows whose parallelism matches no config of their
#: release (Qwen3-30B-A3B H100 26.02.01, Qwen3-235B-A22B GB200 / GB300 25.11, GPT-OSS B200 / B300 26.02.01) are
#: left at alltoall.
_ALL_26 = ("NeMo 26.02", "NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06", "NeMo 26.06.01", "NeMo 26.08")
BRIDGE_FLEX_DISPATCHER = {
    ("Qwen3-30B-A3B", "B300"): ((_ALL_26, "hybridep", "Qwen3-30B-A3B B300 MXFP8 performance configs"),),
    ("Qwen3-30B-A3B", "GB300"): ((_ALL_26, "hybridep", "Qwen3-30B-A3B GB300 MXFP8 performance configs"),),
    ("Qwen3-30B-A3B", "GB200"): ((("NeMo 25.11",) + _ALL_26, "hybridep",
                                  "Qwen3-30B-A3B GB200 MXFP8 performance configs"),),
    ("Qwen3-30B-A3B", "B200"): ((("NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01"), "hybridep",
                                 "Qwen3-30B-A3B B200 MXFP8 performance configs (v0.3.1-v0.4.2)"),),
    ("Qwen3-30B-A3B", "H100"): ((("NeMo 26.02",), "deepep", "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (v0.3.0)"),
                                (("NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06"), "hybridep",
                                 "Qwen3-30B-A3B H100 FP8-CS performance configs (v0.4.0-v0.5.0)")),
    ("Qwen3-235B-A22B", "GB200"): ((_ALL_26, "hybridep", "Qwen3-235B-A22B GB200 performance configs"),),
    ("Qwen3-235B-A22B", "GB300"): ((_ALL_26, "hybridep", "Qwen3-235B-A22B GB300 performance configs"),),
    ("Qwen3-235B-A22B", "B300"): ((("NeMo 26.04.01",), "hybridep", "Qwen3-235B-A22B B300 MXFP8 config (v0.4.2)"),),
    ("GPT-OSS 120B", "B200"): ((("NeMo 26.04",), "hybridep", "GPT-OSS 120B B200 BF16 config (v0.4.0)"),),
    ("GPT-OSS 120B", "GB200"): ((("NeMo 26.04", "NeMo 26.06", "NeMo 26.06.01", "NeMo 26.08"), "hybridep",
                                 "GPT-OSS 120B GB200 configs (BF16 v0.4.0, MXFP8 v0.5.0-v0.6.0)"),),
    ("GPT-OSS 120B", "B300"): ((("NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06"), "hybridep",
                                "GPT-OSS 120B B300 configs (v0.4.0-v0.5.0)"),),
    ("GPT-OSS 120B", "GB300"): ((("NeMo 26.06", "NeMo 26.06.01", "NeMo 26.08"), "hybridep",
                                 "GPT-OSS 120B GB300 MXFP8 configs (v0.5.0-v0.6.0)"),),
    ("Kimi K2", "GB300"): ((("NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06"), "hybridep",
                            "KIMI_K2_PRETRAIN_CONFIG_GB300 (v0.3.1-v0.5.0)"),),
    **{("Nemotron 3 Nano", hw): ((("NeMo 26.02.01", "NeMo 26.04", "NeMo 26.04.01", "NeMo 26.06", "NeMo 26.06.01",
                                   "NeMo 26.08"), "hybridep", "Nemotron 3 Nano performance configs, on every GPU"),)
       for hw in ("H100", "B200", "GB200", "B300", "GB300")},
}


def stated_moe_dispatcher(row: dict, ep: int) -> tuple[str, str] | None:
    """(moe_dispatcher, note) a MoE row's recipe or source states: Megatron-Bridge's performance configs
    (``BRIDGE_DEEPSEEK_DISPATCHER``, ``BRIDGE_FLEX_DISPATCHER``), NeMo AutoModel's table notes naming DeepEP; None:
    alltoall."""
    rel = (row.get("release") or "").strip()
    if ep > 1 and RECIPE_FRAMEWORK in row.get("framework", ""):
        for releases, backend, config in BRIDGE_FLEX_DISPATCHER.get(
                (row.get("model"), hardware_class(row.get("hardware", ""))), ()):
            if rel in releases:
                return backend, (f"{'HybridEP' if backend == 'hybridep' else 'DeepEP'} dispatch (Megatron-Core's "
                                 f"flex dispatcher), as Megatron-Bridge's {config} set it")
    fw, rel = row.get("framework", ""), (row.get("release") or "").strip()
    if ep > 1 and "AutoModel" in fw and "DeepEP" in (row.get("notes") or ""):
        return "deepep", "DeepEP dispatch, as the table's notes state (kernel optimizations: ... DeepEP)"
    if row.get("model") != "DeepSeek-V3 671B" or ep <= 1:
        return None
    if RECIPE_FRAMEWORK not in fw:
        return None
    hw = hardware_class(row.get("hardware", ""))
    backend = BRIDGE_DEEPSEEK_DISPATCHER.get((rel, hw, ep)) or BRIDGE_DEEPSEEK_DISPATCHER.get((rel, hw))
    if backend is None:
        return None
    return backend, (f"{'HybridEP' if backend == 'hybridep' else 'DeepEP'} dispatch (Megatron-Core's flex dispatcher), "
                     f"as Megatron-Bridge's DeepSeek-V3 performance config of {rel} sets it")


def runs_tp_overlap(row: dict, stack: str | None, tp: int, model) -> bool:
    """Whether a row ran Transformer Engine's TP communication overlap (userbuffers). NVIDIA's dense
    Megatron-Core recipes turn it on whenever TP > 1 (with SP): dgxc-benchmarking v24.11.1's YAMLs and
    launch scripts (``ub_tp_comm_overlap: true`` for GPT-3 175B and Llama 3.1 70B / 405B;
    nemotron/configure.sh passes ``model.ub_tp_comm_overlap=True`` for Nemotron-4 15B and 340B), Megatron-
    Bridge's H100 recipes (``CommOverlapConfig(tp_comm_overlap=True, ...)`` for GPT-3 175B, Llama 3 / 3.1
    70B and 405B) and its performance configs (llama31_llm_pretrain.py: on unless NVFP4). MoE recipes set
    it per model: dgxc-benchmarking's grok1/configure.sh passes ``model.ub_tp_comm_overlap=true`` (v24.11.1
    to v25.02.01; the attention block's collectives overlap, the experts' do not), Megatron-Bridge's
    DeepSeek recipes ``tp_comm_overlap=False``; other MoE rows keep their collectives in line."""
    fw = row.get("framework", "")
    return (stack == "megatron" and tp > 1 and any(k in fw for k in MEGATRON) and "AutoModel" not in fw
            and not model.is_hybrid         # (dgxc v25.05's Nemotron-H: NeMo's performance_mode off, no overlap)
            and (not model.experts or row.get("model") in TP_OVERLAP_MOE)
            and "NVFP4" not in row.get("precision", "").upper())


#: MoE models whose benchmark recipes state TP communication overlap (runs_tp_overlap)
TP_OVERLAP_MOE = ("Grok-1 314B",)


#: sequence lengths a benchmark's table omits, from the train configs at the commit it ran (release field's
#: first token -> seq_len): torchtitan's async-TP benchmark (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md)
#: ran at 820504e (2025-06-13), whose torchtitan/models/llama3/train_configs/llama3_8b.toml and llama3_70b.toml
#: set ``seq_len = 8192``
CONFIG_SEQ_LEN = {"torchtitan 820504e": 8192}


#: torchtitan's pipeline defaults at a benchmark's commit, where its table states only the local batch and the
#: schedule (release's first token -> stages per rank of a looped schedule). At 9dec370 (2024-12):
#: config_manager.py's ``--experimental.pipeline_parallel_microbatches`` defaults to None, which
#: pipelining_utils.build_pipeline_schedule turns into the pipeline degree; generate_split_points gives
#: single-stage schedules (1F1B) one stage per rank and multi-stage ones (Interleaved 1F1B) two, with
#: ``base = layers // stages`` and the remainder going one layer each to the middle stages from the second on.
TORCHTITAN_PP_DEFAULTS = {"torchtitan 9dec370": 2}


def _torchtitan_pipeline(local: int, pp: int, looped: bool, layers: int, looped_stages: int
                         ) -> tuple[int, list[int]]:
    """(micro-batch, layers of each model piece in order) of a torchtitan pipeline at its defaults
    (TORCHTITAN_PP_DEFAULTS): ``pp`` micro-batches per step, generate_split_points' layer split."""
    if local % pp:
        raise NotExpressible(f"local batch {local} does not split into {pp} micro-batches (torchtitan's default)")
    stages = pp * (looped_stages if looped else 1)
    if stages > layers:
        raise NotExpressible(f"{stages} pipeline stages for {layers} layers")
    base, extra = divmod(layers, stages)
    pieces = [base]
    for _ in range(stages - 2):
        take = 1 if extra > 0 else 0
        extra -= take
        pieces.append(base + take)
    pieces.append(layers - sum(pieces))
    return local // pp, pieces


#: torchtitan's "selective layer" frequency: config_manager.py's default ``selective_ac_option = "2"`` (2847ccce,
#: e7c0cae: "2 = checkpoint every other layer"); the published pages do not restate it
TORCHTITAN_LAYER_SAC_EVERY = 2


def recompute_of_selective(framework: str, ac: str) -> dict:
    """Experiment fields for a row's selective activation checkpointing. torchtitan's "selective" is one of
    two options of its own (``_apply_ac_to_transformer_block``): "selective layer" (an integer
    selective_ac_option: full checkpointing of every N-th block) and per-op SAC ("selective op", "per-op
    SAC"; also a bare "selective", as its Llama train_configs at 2847ccce, 9dec370 and e7c0cae set
    ``selective_ac_option = 'op'``). Other frameworks' selective is Megatron's (the attention core)."""
    if "torchtitan" not in framework:
        return {"recompute": "selective"}
    if "layer" in ac:
        return {"recompute": "full", "recompute_every": TORCHTITAN_LAYER_SAC_EVERY}
    return {"recompute": "op"}


#: Megatron-Core's output-discarding modules, which NVIDIA's MoE / MLA recipes reach for before full
#: recomputation (Megatron-Bridge's DeepSeek-V3 B300 BF16 v2 and B200 NVFP4 v2 configs:
#: ["mla_up_proj", "moe_act", "layernorm"]): a step of the ladder between core_attn and full for megatron-stack
#: rows of MoE or MLA models
LIGHT_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act")


def recompute_ladder(kw: dict, framework: str = "") -> list[dict]:
    """The recomputation settings an unstated row tries, least first: selective (the attention core), for MoE or
    MLA models run by Megatron-Core (the megatron stack, not NeMo AutoModel's PyTorch FSDP2) also selective with
    the light modules the model has, then full."""
    steps = [{"recompute": "selective"}]
    if kw.get("stack", "megatron") == "megatron" and "AutoModel" not in framework:
        from schedules.models import get_model
        model = kw.get("model")
        name = model.get("base") if isinstance(model, dict) else model
        m = get_model(name) if name in MODEL_PRESETS.values() else None
        if m is not None and (m.is_moe or m.is_mla):
            mods = tuple(x for x in LIGHT_MODULES if (x != "mla_up_proj" or m.is_mla) and (x != "moe_act" or m.is_moe))
            steps.append({"recompute": "selective", "recompute_modules": mods})
    return steps + [{"recompute": "full"}]


def _fit_unstated_recompute(row: dict, kw: dict, notes: list[str], out, network: str, rid: str):
    """A run that was published did fit in its GPUs' memory. When the source does not state activation
    checkpointing and the plan without it does not fit, use the least recomputation that fits
    (``recompute_ladder``), and say so in the row's notes. Never looks at throughput."""
    from clustersim.experiment import experiment_from_dict, run_experiment

    stated = (row.get("activation_checkpointing") or "").strip()
    m = out.metrics
    if stated or "recompute" in kw or m.peak_memory_bytes <= m.memory_capacity_bytes:
        return out, kw
    need = m.peak_memory_bytes / GIB
    ladder = recompute_ladder(kw, row.get("framework", ""))
    for n, step in enumerate(ladder):
        trial = {**kw, **step}
        res = run_experiment(experiment_from_dict({**trial, "network": network}, where=f"row {rid}"))
        if res.metrics.peak_memory_bytes <= res.metrics.memory_capacity_bytes or n == len(ladder) - 1:
            how = step["recompute"] + (f" --recompute-modules {','.join(step['recompute_modules'])}"
                                       if "recompute_modules" in step else "")
            notes.append(f"activation checkpointing not stated: {need:.0f} GiB without it exceeds "
                         f"{m.memory_capacity_bytes / GIB:.0f} GiB, simulated with --recompute {how}")
            return res, trial
    return out, kw


@lru_cache(maxsize=1)
def _experiment_fields() -> frozenset[str]:
    from clustersim.experiment import Experiment
    return frozenset(f.name for f in dataclasses.fields(Experiment))


# ---------------------------------------------------------------------------------------------- running
#: rows per worker process from which ``validate_rows`` runs a pool by default (smaller sets run in this process:
#: a worker's start and imports cost about a second)
POOL_FROM_ROWS = 16
#: worker processes at most by default: each holds its row's programs (up to ~1 GB for the largest rows)
DEFAULT_MAX_WORKERS = 8


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS says, as in a container with a CPU limit)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(rows: int) -> int:
    """Worker processes ``validate_rows`` uses when not told: one per usable CPU core (at most
    DEFAULT_MAX_WORKERS) once there are POOL_FROM_ROWS rows per worker; 1 (this process) below that."""
    return max(1, min(usable_cores(), DEFAULT_MAX_WORKERS, rows // POOL_FROM_ROWS))


def validate_rows(rows: list[dict], network: str = "analytical", progress=None,
                  tp_overlap: bool = False, workers: int | None = None) -> tuple[list[dict], list[dict]]:
    """Simulate every expressible row: (results, not expressible [{id, model, hardware, reason}]), both in
    the rows' order; ``tp_overlap``: as ``row_experiment``. ``workers``: processes that simulate rows side by
    side (None: ``default_workers``; 1: all in this process). Each row is simulated on its own, so the results
    do not depend on the number of workers. ``progress(done, total)`` is called as rows finish."""
    workers = default_workers(len(rows)) if workers is None else max(1, int(workers))
    outcomes: list = [None] * len(rows)
    if workers > 1 and len(rows) > 1:
        _run_in_pool(rows, network, tp_overlap, workers, outcomes, progress)
    finished = sum(o is not None for o in outcomes)
    for n, row in enumerate(rows):
        if outcomes[n] is None:         # in this process: all rows, or those a broken pool left
            outcomes[n] = validate_row(row, n, network, tp_overlap)
            finished += 1
            if progress:
                progress(finished, len(rows))
    done = [res for ok, res in outcomes if ok]
    skipped = [res for ok, res in outcomes if not ok]
    return done, skipped


def _run_in_pool(rows: list[dict], network: str, tp_overlap: bool, workers: int, outcomes: list,
                 progress) -> None:
    """Fill ``outcomes`` (by row index) from a pool of ``workers`` processes. A worker the OS kills (out of
    memory with several large rows side by side) breaks the pool: the rows it left unanswered stay None and
    ``validate_rows`` runs them in this process, one at a time; so do all rows where no pool can be made (a
    sandbox without process semaphores)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    try:
        pool = ProcessPoolExecutor(max_workers=min(workers, len(rows)))
    except (OSError, NotImplementedError, ImportError):
        return
    try:
        futures = {pool.submit(validate_row, row, n, network, tp_overlap): n for n, row in enumerate(rows)}
        finished = 0
        for f in as_completed(futures):
            outcomes[futures[f]] = f.result()       # a row's own error (not a ClusterSimError) is raised here
            finished += 1
            if progress:
                progress(finished, len(rows))
    except BrokenProcessPool:
        pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def validate_row(row: dict, n: int, network: str = "analytical", tp_overlap: bool = False) -> tuple[bool, dict]:
    """One row (index ``n`` in its file, for an id-less row): (True, result) or (False, {id, ..., reason}) when it
    cannot be expressed. A top-level function, so that a worker process can run it."""
    from clustersim.experiment import experiment_from_dict, headroom_note, run_experiment
    from topologies.kernel_cost import kernel_kind_shares

    rid = row.get("id") or str(n + 1)
    ident = {"id": rid, "model": row["model"], "hardware": row["hardware"], "gpus": row["gpus"],
             "precision": row["precision"], "framework": row["framework"], "source": row.get("source", "")}
    try:
        published = published_tokens_per_gpu(row)
        if published is None:
            raise NotExpressible("no throughput figure")
        kw, notes = row_experiment(row, _experiment_fields(), tp_overlap)
        out = run_experiment(experiment_from_dict({**kw, "network": network}, where=f"row {rid}"))
        out, kw = _fit_unstated_recompute(row, kw, notes, out, network, rid)
    except ClusterSimError as e:
        return False, {**ident, "reason": str(e)}
    m = out.metrics
    tight = headroom_note(m.peak_memory_bytes, m.memory_capacity_bytes)
    if tight:
        notes.append(tight)
    elif m.memory_capacity_bytes and m.peak_memory_bytes > m.memory_capacity_bytes:
        notes.append(f"the run fit; our memory model puts its peak at {m.peak_memory_bytes / GIB:.0f} GiB, over "
                     f"the device's {m.memory_capacity_bytes / GIB:.0f} GiB")
    gpus = out.plan.world_size
    pred = m.tokens_per_s / gpus
    tf_pub = _num(row, "model_tflops_per_gpu")
    mem_pub = _num(row, "peak_memory_gib")
    return True, {
        **ident, "group": group_of(row), "experiment": kw, "notes": notes,
        "published_tokens_per_s_per_gpu": published, "predicted_tokens_per_s_per_gpu": pred,
        "error": pred / published - 1.0,
        "published_model_tflops_per_gpu": tf_pub, "predicted_model_tflops_per_gpu": m.tflops_per_gpu,
        "tflops_error": (m.tflops_per_gpu / tf_pub - 1.0) if tf_pub else None,
        "published_step_time_s": _num(row, "step_time_s"), "predicted_step_time_s": m.step_time_s,
        "published_peak_memory_gib": mem_pub, "predicted_peak_memory_gib": m.peak_memory_bytes / GIB,
        "peak_memory_error": (m.peak_memory_bytes / GIB / mem_pub - 1.0) if mem_pub else None,
        "mfu": m.mfu, "stack": out.plan.stack, "task": (row.get("task") or "").strip() or None,
        # the published run's MFU on our FLOP count and peak (the MFU a simulation prints): mfu x published / predicted
        "published_mfu": m.mfu * published / pred if m.mfu and pred else None,
        # where the predicted step goes, to read an error against: bubble and exposed communication
        # (fractions of the step), and the comm per parallel axis
        "cuda_graphs": cuda_graphs_of(row),
        "bubble_fraction": m.bubble_fraction, "exposed_comm_fraction": m.exposed_comm_fraction,
        "exposed_comm_by_axis": {ax: d["exposed_fraction"] for ax, d in m.comm_by_axis.items()},
        # and how its compute time splits by kernel kind (GEMM, attention, elementwise), one rank's
        "kernel_shares": kernel_kind_shares(out.programs, out.cost),
    }


@lru_cache(maxsize=1)
def _bridge_cuda_graphs() -> dict[tuple, dict]:
    """``BRIDGE_CUDA_GRAPHS`` by (model, hardware class, precision label, release)."""
    import csv
    with BRIDGE_CUDA_GRAPHS.open(newline="") as f:
        return {(r["model"], r["hardware"], r["precision"], r["release"]): r
                for r in csv.DictReader(ln for ln in f if not ln.startswith("#"))}


def cuda_graphs_of(row: dict) -> str | None:
    """What the Megatron-Bridge performance config behind a Megatron-Bridge row captures in CUDA graphs
    (``BRIDGE_CUDA_GRAPHS``): "full iteration" (the whole forward and backward replayed: no host launch work),
    "partial: <scopes>" (Transformer Engine replays those modules; the rest launches from the host) or "none";
    None for other rows. Our model prices GPU work only, as a fully captured run has it: a diagnostic to read
    errors against, not an input to the prediction."""
    if RECIPE_FRAMEWORK not in row.get("framework", ""):
        return None
    hit = _bridge_cuda_graphs().get((row.get("model"), hardware_class(row.get("hardware", "")), row.get("precision"),
                            (row.get("release") or "").strip()))
    if hit is None:
        return None
    impl, scope = hit["cuda_graph_impl"], hit["cuda_graph_scope"].split()
    if impl == "full_iteration" or (impl == "local" and scope == ["full_iteration"]):
        return "full iteration"
    if impl == "none":
        return "none"
    return "partial: " + ", ".join(scope)


CUDA_GRAPH_CAPTURES = ("full iteration", "partial", "none")


def cuda_graph_bucket(result: dict) -> tuple[str, str] | None:
    """(kind "MoE" or "dense", capture: one of ``CUDA_GRAPH_CAPTURES``) of a validate result row with a
    ``cuda_graphs`` entry; None for the rest."""
    cg = result.get("cuda_graphs")
    if not cg:
        return None
    return ("MoE" if result["group"].endswith("MoE") else "dense"), cg.split(":")[0]


def summarize_by_cuda_graphs(results: list[dict]) -> list[dict]:
    """Per ``cuda_graph_bucket`` (dense / MoE, what the rows' configs capture in CUDA graphs), over the rows
    ``cuda_graphs_of`` knows: rows, median and 90th-percentile absolute error, mean signed error."""
    groups: dict[tuple, list[float]] = {}
    for r in results:
        bucket = cuda_graph_bucket(r)
        if bucket:
            groups.setdefault(bucket, []).append(r["error"])
    return [{"kind": kind, "cuda_graphs": cg, **error_stats(e)}
            for (kind, cg), e in sorted(groups.items(), key=lambda kv: (kv[0][0], CUDA_GRAPH_CAPTURES.index(kv[0][1])))]


def _percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    import numpy as np
    return float(np.percentile(np.asarray(xs, dtype=float), q))


def framework_family(framework: str) -> str:
    """The training framework a row ran, without its parallelism details: 'NeMo (Megatron-Core)' -> 'NeMo',
    'llm-foundry / Composer (FSDP FULL_SHARD)' -> 'llm-foundry', 'NeMo AutoModel (PyTorch, FSDP2)' ->
    'NeMo AutoModel'."""
    name = re.split(r"[(/]", framework, maxsplit=1)[0].strip()
    return name or framework.strip() or "?"


def summarize(results: list[dict], by_framework: bool = False) -> list[dict]:
    """Per group (and framework, with ``by_framework``): rows, median and 90th-percentile absolute error,
    mean signed error (fractions)."""
    groups: dict[tuple, list[float]] = {}
    for r in results:
        key = (r["group"], framework_family(r["framework"])) if by_framework else (r["group"],)
        groups.setdefault(key, []).append(r["error"])
    out = []
    for key in sorted(groups):
        row = {"group": key[0]}
        if by_framework:
            row["framework"] = key[1]
        out.append({**row, **error_stats(groups[key])})
    return out


def error_stats(errors: list[float]) -> dict:
    """rows, median and 90th-percentile absolute error, mean signed error of signed errors (fractions)."""
    return {"rows": len(errors), "median_abs_error": _percentile([abs(x) for x in errors], 50),
            "p90_abs_error": _percentile([abs(x) for x in errors], 90),
            "mean_signed_error": sum(errors) / len(errors)}


#: what a row's error is correlated with in ``error_correlations``: a name and how to read it off a result row
CORRELATES = (("predicted MFU", lambda r: r["mfu"]), ("bubble", lambda r: r["bubble_fraction"]),
              ("exposed comm", lambda r: r["exposed_comm_fraction"]),
              ("log2 GPUs", lambda r: math.log2(int(r["gpus"]))),
              ("log2 seq", lambda r: math.log2(int(r["experiment"]["seq"]))),
              ("attention share", lambda r: (r.get("kernel_shares") or {}).get("attention", 0.0)))


def error_correlations(results: list[dict], min_rows: int = 20) -> list[dict]:
    """Per (group, stack) with at least ``min_rows`` rows: the Pearson correlation of the signed error with
    where the predicted step goes (predicted MFU, bubble, exposed communication), with the scale (log2 GPUs)
    and with the sequence length (log2 seq: attention's share of a step grows with it); None where a quantity
    does not vary. A diagnostic of where the error lives, not a fit."""
    import numpy as np
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        cells.setdefault((r["group"], r.get("stack") or "?"), []).append(r)
    out = []
    for (group, stack), rs in sorted(cells.items()):
        if len(rs) < min_rows:
            continue
        e = np.array([r["error"] for r in rs], dtype=float)
        row = {"group": group, "stack": stack, "rows": len(rs)}
        for name, get in CORRELATES:
            x = np.array([get(r) for r in rs], dtype=float)
            const = bool(np.all(x == x[0])) or bool(np.all(e == e[0]))
            row[name] = None if const else float(np.corrcoef(x, e)[0, 1])
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------- output
def _print(results: list[dict], summary: list[dict], skipped: list[dict],
           by_framework: list[dict] | None = None, by_cuda_graphs: list[dict] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.width = max(con.width, 160)     # the per-row table's eleven columns on one line each when piped
    t = Table(title="published vs predicted (tokens/s per GPU; model TFLOP/s per GPU)")
    for c in ("id", "model", "hardware", "GPUs", "prec", "published", "predicted", "error", "TFLOP/s pub",
              "TFLOP/s pred", "mem GiB pub/pred"):
        t.add_column(c, justify="right" if c not in ("model", "hardware", "prec") else "left")
    for r in results:
        mem = (f"{r['published_peak_memory_gib']:.1f} / {r['predicted_peak_memory_gib']:.1f}"
               if r["published_peak_memory_gib"] else "")
        t.add_row(str(r["id"]), r["model"], r["group"].split()[0], str(r["gpus"]), r["precision"],
                  f"{r['published_tokens_per_s_per_gpu']:,.0f}", f"{r['predicted_tokens_per_s_per_gpu']:,.0f}",
                  f"{r['error']:+.1%}",
                  f"{r['published_model_tflops_per_gpu']:.0f}" if r["published_model_tflops_per_gpu"] else "",
                  f"{r['predicted_model_tflops_per_gpu']:.0f}", mem)
    con.print(t)
    def stats(title: str, keys: dict[str, str], groups: list[dict]) -> None:
        """A table of ``groups``: the ``keys`` columns (heading -> field), then rows and the three errors."""
        t = Table(title=title)
        for c in (*keys, "rows", "median |error|", "p90 |error|", "mean signed"):
            t.add_column(c, justify="left" if c in keys else "right")
        for g in groups:
            t.add_row(*(str(g[k]) for k in keys.values()), str(g["rows"]), f"{g['median_abs_error']:.1%}",
                      f"{g['p90_abs_error']:.1%}", f"{g['mean_signed_error']:+.1%}")
        con.print(t)

    stats("per group: error of tokens/s per GPU (predicted / published - 1)", {"group": "group"}, summary)
    if by_framework:
        stats("per group and framework", {"group": "group", "framework": "framework"}, by_framework)
    if by_cuda_graphs:
        stats("Megatron-Bridge rows by what their configs capture in CUDA graphs (a diagnostic: the model prices "
              "GPU work only)", {"kind": "kind", "CUDA graphs": "cuda_graphs"}, by_cuda_graphs)
    if skipped:
        reasons: dict[str, int] = {}
        for x in skipped:
            reasons[x["reason"]] = reasons.get(x["reason"], 0) + 1
        u = Table(title=f"{len(skipped)} rows not expressible")
        u.add_column("rows", justify="right")
        u.add_column("reason")
        u.add_column("ids")
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            ids = [x["id"] for x in skipped if x["reason"] == reason]
            u.add_row(str(n), reason, ", ".join(ids[:12]) + (" ..." if len(ids) > 12 else ""))
        con.print(u)


def plot(results: list[dict], path: str | Path) -> Path:
    """Predicted against published tokens/s per GPU, log axes, y = x and a ±10% band, coloured by group."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 6))
    xs = [r["published_tokens_per_s_per_gpu"] for r in results]
    ys = [r["predicted_tokens_per_s_per_gpu"] for r in results]
    lo = min(xs + ys) / 1.5 if xs else 1.0
    hi = max(xs + ys) * 1.5 if xs else 10.0
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="±10%")
    ax.plot(line, line, color="0.3", lw=1, label="y = x")
    groups = sorted({r["group"] for r in results})
    cmap = plt.get_cmap("tab10")
    for i, g in enumerate(groups):
        pts = [(r["published_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"]) for r in results
               if r["group"] == g]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color=cmap(i % 10), label=f"{g} ({len(pts)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published tokens/s per GPU")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.set_title("clustersim validate: published training runs")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    from clustersim.plots import save
    out = save(fig, path, dpi=120, tight=False)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------- command
@click.group("validate", invoke_without_command=True)
@click.option("--runs", "runs_path", type=NonEmptyPath(dir_okay=False), default=None,
              help="Published-runs CSV (default: validation/published_runs.csv; also shipped: "
                   "validation/megatron_lm_2021.csv, Megatron-LM's 2021 GPT runs on DGX A100).")
@click.option("--only", "only", default=None, help="Keep rows whose model, hardware or framework contains TEXT.")
@click.option("--ids", default=None, help="Comma-separated row ids to run.")
@click.option("--group", "group", default=None,
              help="Keep rows whose summary group (hardware × precision × dense/MoE, e.g. 'A100 BF16 dense') "
                   "contains TEXT.")
@click.option("--network", type=click.Choice(("ideal", "analytical", "flow")), default="analytical",
              show_default=True, help="Network model.")
@click.option("--plot", "plot_path", type=NonEmptyPath(dir_okay=False), default=None,
              help="Write predicted vs published (log axes, y = x, ±10% band) to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print rows, summary and the rows not expressible as JSON.")
@click.option("--tp-comm-overlap", "tp_overlap", is_flag=True,
              help="Run the rows whose NVIDIA recipes overlap TP communication with --tp-comm-overlap (an "
                   "idealised model: see README).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes that simulate rows side by side (default: one per CPU core, at most "
                   f"{DEFAULT_MAX_WORKERS}, once there are {POOL_FROM_ROWS} rows per process; 1: none). "
                   "The results do not depend on it.")
@click.pass_context
def validate(ctx, runs_path, only, ids, group, network, plot_path, as_json, tp_overlap, workers) -> None:
    """Simulate published training runs and report the error per row and per group
    (hardware × precision × dense/MoE). Subcommands validate other parts of the model."""
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise ConfigError(f"{', '.join(given)}: option(s) of the run of published rows, not of `validate "
                              f"{ctx.invoked_subcommand}`: give the subcommand's own options after its name "
                              f"(clustersim validate {ctx.invoked_subcommand} --help)")
        return
    if plot_path:
        from clustersim.calibrate import PLOT_SUFFIXES, _check_output
        _check_output(Path(plot_path), "--plot", PLOT_SUFFIXES)        # before minutes of simulation
    for name, text in (("--only", only), ("--group", group)):
        if text is not None and not text.strip():
            raise ConfigError(f"{name} '{text}' is empty: it would match every row (leave it out to run them all)")
    rows = load_runs(runs_path or PUBLISHED)
    if ids is not None:
        want = {x.strip() for x in ids.split(",") if x.strip()}
        if not want:
            raise ConfigError("--ids names no row id (give e.g. --ids 1,2)")
        unknown = sorted(want - {r.get("id") for r in rows}, key=lambda x: (len(x), x))
        if unknown:
            raise ConfigError(f"--ids: no row with id {', '.join(unknown[:10])}"
                              + (f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else "")
                              + f" in {Path(runs_path or PUBLISHED).name} (ids are the file's `id` column)")
        rows = [r for r in rows if r.get("id") in want]
    if only:
        o = only.lower()
        rows = [r for r in rows if any(o in r.get(k, "").lower() for k in ("model", "hardware", "framework"))]
    if group:
        g = group.lower()
        rows = [r for r in rows if g in group_of(r).lower()]
    if not rows:
        raise ConfigError("no published runs match the selection")
    from clustersim.simulate import DelayedProgress
    bar = DelayedProgress("validating", delay_s=1.0, enabled=sys.stderr.isatty(), unit="rows")
    try:
        results, skipped = validate_rows(rows, network=network, tp_overlap=tp_overlap, workers=workers, progress=bar)
    finally:
        bar.close()
    summary = summarize(results)
    frameworks = summarize(results, by_framework=True)
    if tp_overlap and not any((r.get("experiment") or {}).get("tp_comm_overlap") for r in results):
        click.echo("note: --tp-comm-overlap overlaps the TP communication of rows whose recipes do (Megatron "
                   "stacks with tp > 1); none of the selected rows does: it changed nothing", err=True)
    if plot_path:
        plot(results, plot_path)
    if as_json:
        click.echo(json.dumps({"rows": results, "summary": summary, "summary_by_framework": frameworks,
                               "summary_by_cuda_graphs": summarize_by_cuda_graphs(results),
                               "not_expressible": skipped, "error_correlations": error_correlations(results)},
                              indent=1))
    else:
        _print(results, summary, skipped, frameworks, summarize_by_cuda_graphs(results))
        if plot_path:
            click.echo(f"plot written to {plot_path}")



# Other validations are subcommands in their own modules, registered with ``validate.add_command(...)``
# (e.g. ``clustersim validate collectives``).

from clustersim.evidence import evidence_command  # noqa: E402
from clustersim.validate_collectives import collectives  # noqa: E402  (the subcommand's own module)
from clustersim.validate_diff import diff_command  # noqa: E402

validate.add_command(collectives)
validate.add_command(evidence_command)
validate.add_command(diff_command)

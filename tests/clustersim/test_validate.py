"""clustersim validate: the published-runs copy, the row -> experiment mapping, the error summary, and a small
subset simulated end to end (the whole set is benchmarks/validate.py)."""
import csv
import json
import re
from pathlib import Path

import pytest

from clustersim.validate import (NotExpressible, _experiment_fields, hardware_class, load_runs,
                                 published_tokens_per_gpu, row_experiment, summarize)
from clustersim.cli import main

SHARED = next((p / "shared" / "validation" / "training_throughput.csv" for p in Path(__file__).resolve().parents
               if (p / "shared" / "validation" / "training_throughput.csv").is_file()), Path("/nonexistent"))
FIELDS = _experiment_fields() - {"dtype", "stack", "tp_comm_overlap"}      # a build without those options


def _row(**kw):
    base = dict(hardware="H100-SXM (DGX-H100)", gpus="64", model="Llama 3 70B", task="pretrain", precision="BF16",
                framework="Megatron-Bridge / Megatron-Core", seq_len="8192", gbs="128", mbs="1", tp="4", pp="8",
                cp="1", vp="5", ep="", fsdp="0", num_layers="", activation_checkpointing="", notes="",
                tokens_per_s_per_gpu="1000", tokens_per_s_total="", step_time_s="")
    base.update(kw)
    return base


def test_published_runs_have_ids_and_sources():
    rows = load_runs()
    assert len(rows) > 500
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["source"].startswith("http") for r in rows)


@pytest.mark.skipif(not SHARED.is_file(), reason="shared validation data not present")
def test_published_runs_are_verbatim_copies():
    with SHARED.open(newline="") as f:
        shared = [tuple(sorted(r.items())) for r in csv.DictReader(ln for ln in f if not ln.startswith("#"))]
    ours = [tuple(sorted((k, v) for k, v in r.items() if k != "id")) for r in load_runs()]
    assert set(ours) <= set(shared)


@pytest.mark.skipif(not SHARED.is_file(), reason="shared validation data not present")
def test_every_shared_row_is_copied_with_a_stable_id():
    """Every row of the shared collection is in the copy (none dropped at copy time: validate lists what it
    cannot express), and the ids the earlier copies gave keep naming the same rows."""
    with SHARED.open(newline="") as f:
        shared = [r for r in csv.DictReader(ln for ln in f if not ln.startswith("#"))]
    rows = load_runs()
    assert len(rows) == len(shared)
    by_id = {r["id"]: r for r in rows}
    assert (by_id["586"]["hardware"], by_id["586"]["model"], by_id["586"]["release"]) == \
        ("GB200 (DGX-GB200)", "Llama 3.1 405B", "NeMo 25.11")
    assert (by_id["466"]["model"], by_id["466"]["gpus"]) == ("MPT-70b", "64")
    assert [r["id"] for r in rows] == [str(i) for i in range(1, len(rows) + 1)]


def test_models_without_a_preset_say_what_is_not_modelled():
    for model, why in (("DeepSeek-V4 Flash", "compressed sparse attention"), ("Nemotron 3 Super", "Mamba"),
                       ("Nemotron V3 Ultra 550B", "Mamba")):
        with pytest.raises(NotExpressible, match=why):
            row_experiment(_row(model=model), FIELDS)
    for model, preset in (("Nemotron 3 Nano", "nemotron-3-nano"), ("Nemotron-H 56B", "nemotron-h-56b")):
        assert row_experiment(_row(model=model), FIELDS)[0]["model"] == preset      # hybrid Mamba-2 presets


def test_qwen3_bridge_rows_run_the_recipes_expert_tp_and_current_scaling():
    fields = FIELDS | {"dtype", "stack", "fp8_recipe"}
    row = _row(model="Qwen3-235B-A22B", gpus="256", tp="2", pp="8", vp="4", ep="32", gbs="2048", precision="FP8",
               release="NeMo 26.04")
    exp, notes = row_experiment(row, fields)
    assert (exp["model"], exp["etp"], exp["fp8_recipe"], exp["dp"]) == ("qwen3-235b-a22b", 1, "current", 16)
    assert any("expert tensor parallelism 1" in n for n in notes)
    # a stated ETP wins; other frameworks keep Megatron-Core's default (the TP size)
    assert row_experiment(dict(row, etp="2"), fields)[0].get("etp") is None
    nemo = dict(row, framework="NeMo (Megatron-Core)", release="NeMo 24.07")
    exp, notes = row_experiment(nemo, fields)
    assert "etp" not in exp and "fp8_recipe" not in exp and not any("expert tensor" in n for n in notes)


def test_gb300_rows_run_on_racks_of_64_with_the_recipes_recomputation():
    fields = FIELDS | {"dtype", "stack", "fp8_recipe"}
    row = _row(hardware="GB300 (DGX-GB300)", gpus="64", tp="1", pp="1", vp="", fsdp="64", gbs="256", mbs="2",
               precision="FP8", release="NeMo 26.04")
    exp, notes = row_experiment(row, fields)
    assert exp["cluster"].endswith("gb300-nvl72-64.yaml") and exp["recompute"] == "none" and exp["fsdp"]
    assert any("GB300 recipe" in n and "offloads 20 layers" in n for n in notes)
    assert row_experiment(dict(row, gpus="8", fsdp="8", gbs="128"), fields)[0]["cluster"].endswith(
        "gb300-nvl72-8.yaml")
    b300, _ = row_experiment(_row(hardware="B300 (DGX-B300)", precision="MXFP8"), fields)
    assert b300["cluster"] == "dgx-b300" and b300["fp8_recipe"] == "mxfp8"
    from topologies.presets import load_cluster_file
    assert load_cluster_file(exp["cluster"], 64).accelerator.name == "GB300"


def test_paxml_gpt5b_runs_unfused_attention_without_recomputation():
    row = _row(model="GPT-3 5B", framework="Paxml (JAX)", gpus="16", gbs="64", mbs="4", tp="", pp="", vp="",
               fsdp="", release="dgxc-benchmarking v24.11.1", seq_len="2048",
               source="https://github.com/NVIDIA/dgxc-benchmarking/blob/35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae/"
                      "paxml/README_5b.md")
    exp, notes = row_experiment(row, FIELDS | {"attention"})
    assert (exp["model"], exp["attention"], exp["recompute"], exp["fsdp"]) == ("gpt3-5b", "eager", "none", True)
    assert any("SAVE_DOT_ONLY" in n for n in notes) and any("cudnn_fmha=false" in n for n in notes)


def test_megatron_row_maps_to_its_plan():
    kw, notes = row_experiment(_row(), FIELDS)
    assert kw == dict(cluster="dgx-h100", model="llama3-70b", zero=1, schedule="interleaved", virtual_stages=5,
                      gpus=64, seq=8192, tp=4, pp=8, cp=1, ep=1, dp=2, sp=True, micro_batch=1, global_batch=128)
    assert notes == []
    fsdp, _ = row_experiment(_row(fsdp="8", pp="1", vp="", tp="1", gbs="64"), FIELDS)
    assert fsdp["fsdp"] and "zero" not in fsdp and fsdp["dp"] == 64


def test_fsdp_framework_row_takes_local_batch_and_proxy_layers():
    row = _row(framework="torchtitan (FSDP + torch.compile)", gbs="", mbs="", tp="", pp="", vp="", fsdp="8",
               gpus="8", notes="Table 1; local batch size 2", activation_checkpointing="selective",
               hardware="H100 (Grand Teton; 96GB HBM2e, 500W power limit)", model="Llama 3.1 8B")
    kw, notes = row_experiment(row, FIELDS)
    # torchtitan's bare "selective" is its train_configs' selective_ac_option = 'op' (per-op checkpointing)
    assert (kw["fsdp"], kw["dp"], kw["micro_batch"], kw["global_batch"], kw["recompute"]) == (True, 8, 2, 16, "op")
    assert any("HBM2e" in n for n in notes)
    # the Grand Teton H100: 96 GB HBM2e at 2.4 TB/s as the source states, holding its published 84.5 GiB peaks
    from topologies.presets import load_cluster_file
    acc = load_cluster_file(kw["cluster"], 8).accelerator
    assert (acc.name, acc.hbm_bytes_per_s) == ("H100-HBM2e", 2.4e12) and acc.hbm_bytes > 84.5 * 2**30
    proxy, notes = row_experiment(_row(model="Llama 3.1 405B", num_layers="7", framework="NeMo (Megatron-Core)"),
                                  FIELDS)
    assert proxy["model"] == {"base": "llama3-405b", "layers": 7} and "7 layers" in notes[0]


@pytest.mark.parametrize("row, reason", [
    (_row(precision="FP8"), "FP8"), (_row(precision="NVFP4"), "NVFP4"), (_row(model="Nemotron 3 Super"), "no model preset"),
    (_row(hardware="Hopper GPUs, 8/node (SKU not stated)"), "no cluster preset"), (_row(mbs=""), "micro-batch"),
    (_row(notes="CHECK: gbs"), "CHECK"), (_row(gbs="101"), "not a multiple"),
    (_row(task="sft"), "fine-tuning recipe ran is not known"), (_row(task="rlhf"), "pre-training, SFT and LoRA"),
])
def test_rows_not_expressible_say_why(row, reason):
    with pytest.raises(NotExpressible, match=reason):
        row_experiment(row, FIELDS)


def test_fine_tuning_rows_run_their_recipes():
    """LoRA and SFT rows (docs/validation-notes.md, "Fine-tuning rows"): Megatron-Bridge's Llama 3 70B LoRA on
    linear_qkv, dim 16, packed SQuAD (Σ sᵢ² = 842,603 per 4,096 tokens: documents of 206); NeMo 24.07's dim 32;
    AutoModel's dim 16 on every projection, unpacked mock data; SFT as full training."""
    rows = {r["id"]: r for r in load_runs()}
    fields = _experiment_fields()
    kw, notes = row_experiment(rows["668"], fields)
    assert (kw["lora_rank"], kw["lora_targets"], kw["packed_doc_tokens"]) == (16, ("qkv",), 206)
    assert any("linear_qkv" in n for n in notes)
    kw, _ = row_experiment(rows["675"], fields)
    assert (kw["lora_rank"], kw["lora_targets"], kw["packed_doc_tokens"]) == (32, ("qkv",), 206)
    kw, _ = row_experiment(rows["696"], fields)
    assert (kw["lora_rank"], kw["lora_targets"]) == (16, ("qkv", "proj", "fc1", "fc2"))
    assert "packed_doc_tokens" not in kw
    kw, notes = row_experiment(rows["669"], fields)
    assert "lora_rank" not in kw and "packed_doc_tokens" not in kw and any("SFT" in n for n in notes)
    # AutoModel's LoRA benchmark configs (AUTOMODEL_PEFT_CONFIGS): Llama 3 70B TP2 with SP, Qwen2.5 32B TP2
    # without, both with activation checkpointing; the 1-GPU runs without it, on one GPU of a DGX H100
    for row_id, model, sp, recompute in (("696", "llama3-70b", True, "full"), ("700", "qwen2.5-32b", False, "full"),
                                         ("698", "llama3-8b", False, "none"), ("701", "qwen2.5-7b", False, "none")):
        kw, notes = row_experiment(rows[row_id], fields)
        assert (kw["model"], kw["sp"], kw["recompute"]) == (model, sp, recompute), row_id
        assert any("peft_benchmark" in n and "activation_checkpointing" in n for n in notes), row_id
    kw, notes = row_experiment(rows["701"], fields)
    assert kw["cluster"].endswith("dgx-h100-1.yaml") and kw["gpus"] == 1
    assert any("LoRA dropout 0.1" in n for n in row_experiment(rows["698"], fields)[1])
    # 32 GB200 / GB300 GPUs: eight compute trays of one rack (the presets take whole racks of 72)
    for row_id, file in (("763", "gb200-nvl72-32.yaml"), ("890", "gb300-nvl72-32.yaml")):
        kw, notes = row_experiment(rows[row_id], fields)
        assert kw["cluster"].endswith(file) and any("one NVLink domain of 32" in n for n in notes)


def test_fp8_passes_dtype_when_the_build_has_it():
    kw, _ = row_experiment(_row(precision="FP8-CS"), FIELDS | {"dtype", "stack"})
    assert kw["dtype"] == "fp8" and kw["stack"] == "megatron"


def test_fp8_cs_rows_run_transformer_engines_current_scaling():
    fields = FIELDS | {"dtype", "stack", "fp8_recipe"}
    assert row_experiment(_row(precision="FP8-CS"), fields)[0]["fp8_recipe"] == "current"
    assert "fp8_recipe" not in row_experiment(_row(precision="FP8"), fields)[0]      # delayed, the default
    # Megatron-Bridge's performance scripts of NeMo 25.11 on have no delayed scaling; their Llama FP8 runs are
    # the FP8_CS configs, labelled "FP8" from NeMo 26.02
    for release in ("NeMo 26.02", "NeMo 26.04.01", "NeMo 26.06"):
        exp, notes = row_experiment(_row(precision="FP8", release=release), fields)
        assert exp["fp8_recipe"] == "current" and any("FP8_CS" in n for n in notes)
    assert "fp8_recipe" not in row_experiment(_row(precision="FP8", release="NeMo 25.09"), fields)[0]
    assert "fp8_recipe" not in row_experiment(
        _row(precision="FP8", release="NeMo 26.02", framework="NeMo / Megatron-Core"), fields)[0]
    assert "fp8_recipe" not in row_experiment(
        _row(precision="FP8", release="NeMo 26.02", model="Nemotron-4 340B"), fields)[0]


def test_megatron_bridge_fp8_recipes_keep_fp8_parameters():
    """bf16_with_fp8_current_scaling_mixed sets fp8_param_gather: the current-scaling rows with the
    distributed optimizer run with it; MXFP8 rows and FSDP rows say it is not modelled."""
    fields = FIELDS | {"dtype", "stack", "fp8_recipe", "fp8_param_gather"}
    for label, release in (("FP8-CS", "NeMo 25.11"), ("FP8", "NeMo 26.04")):
        exp, notes = row_experiment(_row(precision=label, release=release), fields)
        assert exp["zero"] == 1 and exp["fp8_param_gather"] is True and any("fp8_param_gather" in n for n in notes)
    for row in (_row(precision="MXFP8", release="NeMo 26.04"), _row(precision="FP8-CS", fsdp="64", tp="1", pp="1",
                                                                     vp="")):
        exp, notes = row_experiment(row, fields)
        assert "fp8_param_gather" not in exp and any("fp8_param_gather is not modelled" in n for n in notes)
    assert "fp8_param_gather" not in row_experiment(_row(precision="FP8"), fields)[0]      # NeMo: delayed
    for mx in ("MXFP8", "FP8-MX"):
        assert row_experiment(_row(precision=mx), fields)[0]["fp8_recipe"] == "mxfp8"
        deepseek = _row(precision=mx, model="DeepSeek-V3 671B", tp="2", pp="4", ep="64", gpus="256", gbs="2048")
        assert "fp8_recipe" not in row_experiment(deepseek, fields)[0]
    assert {r["id"] for r in load_runs() if r["precision"] == "FP8-CS"} >= {"16", "17", "18", "565", "584"}


def test_deepseek_v3_multi_token_prediction_and_layout_as_each_recipe_sets_them():
    """Megatron-Bridge's recipe and the NeMo 2.x performance script dgxc-benchmarking v25.05 launches both run
    DeepSeek-V3 with one MTP module and their own pipeline layouts; a framework that states neither runs the
    model without MTP on the default split."""
    nemo = "https://github.com/NVIDIA/dgxc-benchmarking/blob/{}/deepseek_v3/pretraining/README.md"
    base = dict(model="DeepSeek-V3 671B", framework="NeMo (Megatron-Core)", tp="2", ep="64", vp="", seq_len="4096")
    for commit in ("68eaf7e117bf16cb018861ce101e8f80925f74d8", "1f6d9f40e4117d7c71b726f86074ac01c29f87f5"):
        for pp, gpus, layout in (("4", "256", "15,16,16,14"), ("16", "1024", ",".join(["3"] + ["4"] * 14 + ["2"])),
                                 ("8", "512", "7,8,8,8,8,8,8,6")):
            kw, notes = row_experiment(_row(**base, pp=pp, gpus=gpus, gbs=str(8 * int(gpus)),
                                            source=nemo.format(commit)), FIELDS)
            assert kw["stage_layers"] == layout and sum(map(int, layout.split(","))) == 61
            assert "mtp_layers" not in kw and any("1 MTP module" in n for n in notes)       # the preset's one module
    other = "https://github.com/NVIDIA/dgxc-benchmarking/blob/" + "0" * 40 + "/deepseek_v3/pretraining/README.md"
    kw, notes = row_experiment(_row(**base, pp="4", gpus="256", gbs="2048", source=other), FIELDS)
    assert kw["mtp_layers"] == 0 and "stage_layers" not in kw
    bridge = dict(base, framework="Megatron-Bridge / Megatron-Core", release="NeMo 26.02")
    kw, notes = row_experiment(_row(**bridge, pp="4", gpus="256", gbs="2048"), FIELDS)
    assert kw["stage_layers"] == "16,16,16,13" and "mtp_layers" not in kw
    kw, notes = row_experiment(_row(**bridge, pp="4", gpus="256", gbs="2048", notes="w/o MTP"), FIELDS)
    assert kw["mtp_layers"] == 0


def test_rows_their_source_flags_say_so_and_stay_in_the_statistics():
    runs = {r["id"]: r for r in load_runs()}
    for row_id, hardware, tokens in (("771", "GB200", "18304"), ("902", "GB300", "20288")):
        row = runs[row_id]
        assert (row["model"], row["precision"], row["tokens_per_s_per_gpu"]) == ("GPT-OSS 120B", "MXFP8", tokens)
        assert row["hardware"].startswith(hardware) and "26.06.01" in json.dumps(row)
        notes = row_experiment(row, FIELDS | {"dtype", "stack", "fp8_recipe"})[1]
        assert any("cudnn-frontend issue 256" in n for n in notes)


def test_nemo_automodel_rows_run_what_their_benchmark_configs_set():
    """AutoModel's performance summary points to its benchmark configs: activation checkpointing from them, EP
    from them where the table leaves it empty beside DeepEP, and DeepEP for every MoE row whose kernel
    optimizations name it (not only DeepSeek-V3's)."""
    runs = {r["id"]: r for r in load_runs()}
    fields = FIELDS | {"moe_dispatcher"}
    expect = {"693": (16, "none"), "694": (8, "full"), "695": (32, "full"), "702": (8, "full"), "703": (8, "full"),
              "291": (64, "full")}
    for row_id, (ep, recompute) in expect.items():
        row = runs[row_id]
        assert "AutoModel" in row["framework"] and "DeepEP" in row["notes"]
        kw, notes = row_experiment(row, fields)
        assert (kw["ep"], kw["recompute"], kw["moe_dispatcher"]) == (ep, recompute, "deepep"), row_id
        assert any("activation_checkpointing: " in n for n in notes)
    assert runs["693"]["ep"] == "" and any("ep_size: 16" in n for n in row_experiment(runs["693"], fields)[1])
    kw, notes = row_experiment(runs["293"], fields)              # dense Llama 3 70B: its config's checkpointing
    assert kw["recompute"] == "full" and "moe_dispatcher" not in kw
    assert any("FlexAttention" in n for n in row_experiment(runs["694"], fields)[1])


def test_cuda_graphs_of_megatron_bridge_rows_and_the_split_by_them():
    """Every Megatron-Bridge row has the CUDA-graph capture of its performance config (bridge_cuda_graphs.csv), read
    per release: full iteration from v0.5.0 on for the MXFP8 Qwen3 configs on GB200, none on H100, Transformer
    Engine scopes for Nemotron 3 Nano on Blackwell; other frameworks' rows have none recorded."""
    from clustersim.validate import MODEL_PRESETS, cuda_graphs_of, summarize_by_cuda_graphs
    runs = load_runs()
    bridge = [r for r in runs if "Megatron-Bridge" in r["framework"] and r["task"] == "pretrain"
              and r["precision"] in ("BF16", "FP8", "FP8-CS", "FP8-MX", "MXFP8") and r["model"] in MODEL_PRESETS]
    assert len(bridge) == 202 and all(cuda_graphs_of(r) for r in bridge)      # every one validate simulates
    def one(model, hw, prec, release):
        return next(cuda_graphs_of(r) for r in runs if r["model"] == model and r["hardware"].startswith(hw)
                    and r["precision"] == prec and r.get("release") == release)
    assert one("Qwen3-30B-A3B", "GB200", "MXFP8", "NeMo 26.06") == "full iteration"
    assert one("Qwen3-30B-A3B", "GB200", "MXFP8", "NeMo 26.04.01") == "partial: moe_router, moe_preprocess"
    assert one("Qwen3-30B-A3B", "H100", "FP8", "NeMo 26.06") == "none"
    assert one("Nemotron 3 Nano", "GB200", "MXFP8", "NeMo 26.06") == "partial: attn, mamba, moe_router, moe_preprocess"
    assert one("Llama 3 8B", "GB200", "FP8-CS", "NeMo 25.11") == "full iteration"       # impl local, full_iteration
    assert cuda_graphs_of(_row(framework="NeMo (Megatron-Core)")) is None
    rows = [{"group": "GB200 FP8 MoE", "cuda_graphs": "full iteration", "error": 0.1},
            {"group": "GB200 FP8 MoE", "cuda_graphs": "full iteration", "error": -0.3},
            {"group": "H100 FP8 MoE", "cuda_graphs": "partial: attn", "error": 0.5},
            {"group": "H100 FP8 MoE", "cuda_graphs": "partial: moe_router", "error": 0.7},
            {"group": "H100 BF16 dense", "cuda_graphs": "none", "error": 0.2},
            {"group": "H100 BF16 dense", "cuda_graphs": None, "error": 9.0}]
    split = {(g["kind"], g["cuda_graphs"]): g for g in summarize_by_cuda_graphs(rows)}
    assert set(split) == {("MoE", "full iteration"), ("MoE", "partial"), ("dense", "none")}
    assert split[("MoE", "full iteration")]["mean_signed_error"] == pytest.approx(-0.1)
    assert split[("MoE", "full iteration")]["median_abs_error"] == pytest.approx(0.2)
    assert split[("MoE", "partial")]["rows"] == 2 and split[("dense", "none")]["rows"] == 1


def test_nemotron_h_runs_the_attention_backend_its_script_sets():
    """NeMo's pretrain_nemotronh_56b.py (dgxc-benchmarking v25.05) sets NVTE_FUSED_ATTN=0: flash-attn, not cuDNN."""
    runs = {r["id"]: r for r in load_runs()}
    fields = FIELDS | {"attention_kernel", "dtype", "stack"}
    for row_id in ("688", "689", "690"):
        kw, notes = row_experiment(runs[row_id], fields)
        assert kw["attention_kernel"] == "flash2" and any("NVTE_FUSED_ATTN=0" in n for n in notes)
    other = dict(runs["688"], source=runs["688"]["source"].replace("68eaf7e", "0000000"))
    assert "attention_kernel" not in row_experiment(other, fields)[0]


def test_hardware_and_throughput_fallbacks():
    assert [hardware_class(h) for h in ("A100 40GB (RoCE)", "A100 80GB", "H100 80GB", "GB200 (DGX-GB200)",
                                        "B200 (DGX-B200)", "B300 (DGX-B300)", "Hopper GPUs, 8/node")] == \
        ["A100-40GB", "A100", "H100", "GB200", "B200", "B300", None]
    assert published_tokens_per_gpu(_row()) == 1000
    assert published_tokens_per_gpu(_row(tokens_per_s_per_gpu="", tokens_per_s_total="6400")) == 100
    step = _row(tokens_per_s_per_gpu="", step_time_s="2", gbs="128", seq_len="1000")
    assert published_tokens_per_gpu(step) == pytest.approx(128 * 1000 / 2 / 64)
    # a negative figure is not a measurement (it gave a 2,576,688% error and moved its group's statistics)
    with pytest.raises(NotExpressible, match="tokens_per_s_total is negative"):
        published_tokens_per_gpu(_row(tokens_per_s_per_gpu="", tokens_per_s_total="-5"))
    for column in ("peak_memory_gib", "model_tflops_per_gpu"):         # every measured figure, not only throughput
        with pytest.raises(NotExpressible, match=f"{column} is negative"):
            published_tokens_per_gpu(_row(**{column: "-1"}))


@pytest.mark.parametrize("column,value,least", [("mbs", "0", 1), ("mbs", "0.5", 1), ("gpus", "8.5", 1),
                                                ("gpus", "0", 1), ("gpus", "1e-300", 1), ("tp", "1.5", 1),
                                                ("cp", "0", 1), ("gbs", "128.5", 1), ("seq_len", "8192.5", 1),
                                                ("fsdp", "-1", 0)])
def test_a_count_that_is_no_whole_number_is_not_expressible(column, value, least):
    """Counts in a runs file are whole (fsdp may be 0: DDP): a fraction had been rounded (gpus 8.5 divided the
    published figure by 8.5 and simulated 8 GPUs), an mbs of 0 crashed the batch arithmetic (exit 3)."""
    row = _row()
    with pytest.raises(NotExpressible, match=rf"{column} {re.escape(value)} is not a whole number >= {least}"):
        published_tokens_per_gpu({**row, column: value})
        row_experiment({**row, column: value}, _experiment_fields())
    assert row_experiment({**row, "fsdp": "0"}, _experiment_fields())       # Megatron-Bridge's 0: DDP


def test_a_runs_file_with_one_id_twice_is_refused(tmp_path):
    from clustersim.validate import RUN_COLUMNS
    from simulator.errors import ConfigError
    cols = ("id",) + RUN_COLUMNS
    header = ",".join(cols)
    line = ",".join("7" if c in ("id", "gpus") else "x" for c in cols)
    (tmp_path / "runs.csv").write_text(f"{header}\n{line}\n{line}\n")
    with pytest.raises(ConfigError, match="id '7' appears twice"):
        load_runs(tmp_path / "runs.csv")
    cols = cols + ("gbs",)           # text in a number's column was read as "not stated"
    (tmp_path / "runs.csv").write_text(",".join(cols) + "\n" + ",".join(
        {"gbs": "abc", "gpus": "8"}.get(c, "x") for c in cols) + "\n")
    with pytest.raises(ConfigError, match="gbs 'abc' is not a number"):
        load_runs(tmp_path / "runs.csv")
    assert load_runs()                # the project's own file passes


def test_summary_closed_form():
    rows = [{"group": "g", "error": e} for e in (0.1, -0.2, 0.3, 0.0)] + [{"group": "h", "error": -0.5}]
    g, h = summarize(rows)
    assert g["rows"] == 4 and g["median_abs_error"] == pytest.approx(0.15)
    assert g["p90_abs_error"] == pytest.approx(0.2 + 0.7 * 0.1)        # linear interpolation between 0.2 and 0.3
    assert g["mean_signed_error"] == pytest.approx(0.05)
    assert (h["rows"], h["mean_signed_error"]) == (1, -0.5)


def test_summary_by_framework_splits_each_group_by_the_framework_family():
    rows = [{"group": "g", "framework": "NeMo (Megatron-Core)", "error": 0.1},
            {"group": "g", "framework": "NeMo (Megatron-Core)", "error": -0.3},
            {"group": "g", "framework": "llm-foundry / Composer (FSDP FULL_SHARD)", "error": 0.2},
            {"group": "h", "framework": "NeMo AutoModel (PyTorch, FSDP2)", "error": 0.4}]
    out = {(x["group"], x["framework"]): x for x in summarize(rows, by_framework=True)}
    assert set(out) == {("g", "NeMo"), ("g", "llm-foundry"), ("h", "NeMo AutoModel")}
    assert out[("g", "NeMo")]["rows"] == 2 and out[("g", "NeMo")]["mean_signed_error"] == pytest.approx(-0.1)
    assert out[("g", "NeMo")]["median_abs_error"] == pytest.approx(0.2)
    assert sum(x["rows"] for x in out.values()) == len(rows)


def test_cli_subset_json_and_plot(tmp_path, capsys):
    """A small subset end to end: a Megatron proxy row (H100), an llm-foundry row (A100), and a GB200 NVFP4 row
    that this build cannot price (listed with its reason)."""
    png = tmp_path / "v.png"
    assert main(["validate", "--ids", "54,510,590", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 1000
    rows = {r["id"]: r for r in out["rows"]}
    assert set(rows) == {"54", "510"}
    for r in rows.values():
        assert r["error"] == pytest.approx(r["predicted_tokens_per_s_per_gpu"] / r["published_tokens_per_s_per_gpu"] - 1)
        assert r["source"].startswith("http") and r["predicted_model_tflops_per_gpu"] > 0
        assert 0 <= r["bubble_fraction"] < 1 and 0 <= r["exposed_comm_fraction"] < 1
        assert all(0 <= f <= r["exposed_comm_fraction"] + 1e-12 for f in r["exposed_comm_by_axis"].values())
    assert rows["54"]["stack"] == "megatron" and rows["510"]["stack"] == "llm-foundry"
    assert set(rows["54"]["exposed_comm_by_axis"]) >= {"tp", "cp"} and set(rows["510"]["exposed_comm_by_axis"]) == {"dp"}
    assert {s["group"] for s in out["summary"]} == {"H100 BF16 dense", "A100 BF16 dense"}
    assert {(s["group"], s["framework"]) for s in out["summary_by_framework"]} == \
        {("H100 BF16 dense", "NeMo"), ("A100 BF16 dense", "llm-foundry")}
    skipped = {s["id"]: s["reason"] for s in out["not_expressible"]}
    assert "NVFP4" in skipped["590"]
    assert out["error_correlations"] == []          # no group or stack of 20+ rows in the subset


def test_peak_memory_model_state_difference_matches_published():
    """torchtitan Llama 3.1 8B (BF16, FSDP, selective AC) on 8 and 128 GPUs: the runs differ only in how far
    FSDP shards the 16 bytes/parameter of model state, so the peak-memory difference checks the memory model
    independently of activations (published: 77.0 vs 62.0 GiB)."""
    from clustersim.validate import validate_rows
    rows = {r["id"]: r for r in load_runs()}
    res, skipped = validate_rows([rows["402"], rows["403"]])
    assert not skipped
    a, b = res
    published = a["published_peak_memory_gib"] - b["published_peak_memory_gib"]
    predicted = a["predicted_peak_memory_gib"] - b["predicted_peak_memory_gib"]
    assert predicted == pytest.approx(published, abs=1.5)


def test_mpt_presets_match_published_parameter_counts():
    """llm-foundry's benchmark table prints NumParams for every MPT run: our presets (schedules.models) match it
    exactly once the parts we do not model are added: the run's learned position embedding (seq_len × d) and
    the biases (QKV 3d, output d, MLP 4d + d, two LayerNorms 2d per layer, final LayerNorm d)."""
    import re

    from clustersim.validate import MODEL_PRESETS
    from schedules.models import get_model

    checked = set()
    for r in load_runs():
        m = re.search(r"NumParams=(\d+)", r["notes"])
        if not m or not r["model"].startswith("MPT"):
            continue
        spec = get_model(MODEL_PRESETS[r["model"]])
        expected = spec.param_count() + (int(r["seq_len"]) + 11 * spec.layers + 1) * spec.hidden
        assert int(m.group(1)) == expected, r["model"]
        checked.add(r["model"])
    assert len(checked) == 9


def test_unstated_checkpointing_takes_the_least_recompute_that_fits():
    """A published run fit in memory: with activation checkpointing unstated and a plan that does not fit
    without it, validate simulates the least recomputation that fits and says so; a stated choice is kept."""
    from clustersim.validate import validate_rows
    row = _row(framework="MaxText (JAX)", gpus="128", tp="", pp="", vp="", cp="", fsdp="128", gbs="256", mbs="2",
               model="Llama 3 70B", id="x")
    (res,), skipped = validate_rows([row])
    assert not skipped
    assert res["experiment"]["recompute"] in ("selective", "full")
    assert any("not stated" in n for n in res["notes"])
    assert res["predicted_peak_memory_gib"] * GIB <= 81559 * 2**20          # the H100 SXM as nvidia-smi reports it
    (stated,), _ = validate_rows([{**row, "activation_checkpointing": "False"}])
    assert "recompute" not in stated["experiment"] and stated["predicted_peak_memory_gib"] * GIB > 81559 * 2**20


GIB = 2 ** 30


def test_torchtitan_selective_rows_map_to_its_own_options():
    """torchtitan's "selective layer" is full checkpointing of every 2nd block (config_manager's default
    selective_ac_option "2"), "selective op" its per-op policy; Megatron's selective stays the attention core."""
    tt = dict(framework="torchtitan (FSDP2 1D)", gbs="128", mbs="2", tp="", pp="", vp="", fsdp="64", gpus="64",
              notes="", hardware="A100 80GB", model="Llama 2 13B")
    layer, _ = row_experiment(_row(**tt, activation_checkpointing="selective layer"), FIELDS)
    op, _ = row_experiment(_row(**tt, activation_checkpointing="selective op"), FIELDS)
    assert (layer["recompute"], layer["recompute_every"]) == ("full", 2)
    assert op["recompute"] == "op" and "recompute_every" not in op
    mg, _ = row_experiment(_row(activation_checkpointing="selective"), FIELDS)
    assert mg["recompute"] == "selective" and "recompute_every" not in mg


def test_torchtitan_compiled_rows_compile_the_loss_from_april_2025():
    """torchtitan compiles the loss with the model from 2025-04-02 (bbb1b616e); its benchmark documents carry
    the month they ran in."""
    base = "https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/benchmarks/"
    tt = dict(framework="torchtitan (FSDP + torch.compile)", gbs="128", mbs="2", tp="", pp="", vp="", fsdp="64",
              gpus="64", notes="", hardware="H100-SXM (DGX-H100)", model="Llama 3 8B")
    stack = lambda src, fw=tt["framework"]: row_experiment(_row(**{**tt, "framework": fw}, source=src),
                                                            FIELDS | {"stack"})[0]["stack"]
    assert stack(base + "llama3_h100_202412_torchtitan.md") == "torchtitan-compile"
    assert stack(base + "llama3-8b_h200_202506_trainy-whitefiber.md") == "torchtitan-compile-loss"
    assert stack(base + "llama3-8b_h200_202506_trainy-whitefiber.md", "torchtitan (FSDP)") == "torchtitan"
    assert stack(base + "asyncTP_llama3_h100_2025-06_torchtitan.md") == "torchtitan-compile-loss"
    assert stack("https://example.org/no-date.md") == "torchtitan-compile"


def test_torchtitan_async_tp_table_runs_at_its_configs_sequence():
    """torchtitan's async-TP benchmark (820504e, 2025-06) does not state the sequence: its train configs at that
    commit set seq_len 8192. Its float8 rowwise rows are listed as not expressible (their row-scaled GEMMs are
    not in the kernel data); the async-TP rows say their collectives run in line."""
    rows = {r["id"]: r for r in load_runs()}
    for rid in ("388", "390", "391", "393", "394", "396", "397", "399"):
        kw, notes = row_experiment(rows[rid], _experiment_fields())
        assert kw["seq"] == 8192 and kw["stack"] == "torchtitan-compile-loss"
        assert any("seq_len = 8192" in n for n in notes)
        assert any("async TP" in n for n in notes) == (int(rid) < 394)
    for rid in ("389", "392", "395", "398"):
        with pytest.raises(NotExpressible, match="rowwise"):
            row_experiment(rows[rid], FIELDS)
    seqless = {**rows["391"], "release": "torchtitan 9dec370 / torch 1963fc8 (2024-12)"}
    with pytest.raises(NotExpressible, match="sequence length not stated"):
        row_experiment(seqless, FIELDS)


def test_gb200_jobs_of_64k_gpus_run_on_racks_with_64_in_use():
    """GB200 jobs whose GPU count is a multiple of 64 but not of 72 run on NVL72 racks with 64 GPUs in use each
    (Megatron-Bridge's GB200 recipes: 64 GPUs in one NVLink domain); multiples of 72 keep the preset."""
    from topologies.presets import load_cluster_file
    gb = dict(hardware="GB200 (NVL72)", tp="2", pp="1", cp="1", vp="", gbs="256", mbs="1")
    kw, notes = row_experiment(_row(**gb, gpus="128"), FIELDS)
    assert kw["cluster"].endswith("gb200-nvl72-64.yaml") and "64 GPUs in use" in notes[0]
    cluster = load_cluster_file(kw["cluster"], 128)
    assert (cluster.domain_size, cluster.n_domains) == (64, 2)
    kw, _ = row_experiment(_row(**{**gb, "gbs": "144"}, gpus="144"), FIELDS)
    assert kw["cluster"] == "gb200-nvl72"
    # 8 GPUs: two compute trays of one rack, one NVLink domain of 8
    kw, notes = row_experiment(_row(**{**gb, "tp": "1", "gbs": "16"}, gpus="8"), FIELDS)
    assert kw["cluster"].endswith("gb200-nvl72-8.yaml") and "two compute trays" in notes[0]
    cluster = load_cluster_file(kw["cluster"], 8)
    assert (cluster.domain_size, cluster.n_domains, cluster.accelerator.name) == (8, 1, "GB200")


def test_llm_foundry_rows_reduce_gradients_as_their_composer_mode():
    """llm-foundry's tables name Composer's FSDP mixed-precision mode: PURE reduces gradients in bf16, DEFAULT
    (the October 2023 runs, Composer 0.16.4) in fp32; rows of other stacks keep their stack's default."""
    lf = dict(framework="llm-foundry / Composer (FSDP FULL_SHARD)", model="MPT-7b", gbs="48", mbs="6", tp="", pp="",
              vp="", fsdp="8", gpus="8", seq_len="2048", hardware="H100 80GB")
    reduce = lambda notes, **kw: row_experiment(_row(**{**lf, **kw}, notes=notes),
                                                FIELDS | {"stack", "grad_reduce_dtype"})[0].get("grad_reduce_dtype")
    assert reduce("HFU=46%; MP mode DEFAULT") == "fp32"
    assert reduce("MP mode PURE") == "bf16"
    assert reduce("") is None
    assert reduce("MP mode DEFAULT", framework="NeMo") is None
    assert "grad_reduce_dtype" not in row_experiment(_row(**lf, notes="MP mode PURE"),
                                                     FIELDS - {"grad_reduce_dtype"})[0]


def test_llm_foundry_large_scale_rows_run_the_attention_their_sweep_launched():
    """llm-foundry's large-scale H100 table (PR #838) comes from sweep.py, which launches 1b/3b/7b/70b with
    --attn_impl flash and flash-attn 2 (13b/30b with triton): those rows price FlashAttention-2; the same models
    in other tables keep the stack's Triton kernel."""
    large = "llm-foundry README (H100 80GB BF16 (Large Scale, >= 128 GPUs))"
    base = dict(framework="llm-foundry / Composer (FSDP SHARD_GRAD_OP)", model="MPT-1b", gbs="6144", mbs="12",
                tp="", pp="", vp="", fsdp="", gpus="512", seq_len="2048", hardware="H100 80GB", release=large,
                notes="MP mode DEFAULT")
    fields = FIELDS | {"stack", "grad_reduce_dtype", "attention_kernel"}
    kw, notes = row_experiment(_row(**base), fields)
    assert kw["attention_kernel"] == "flash2" and kw["stack"] == "llm-foundry" and any("#838" in n for n in notes)
    for other in (dict(model="MPT-13b", gbs="8192", mbs="16"), dict(release="llm-foundry README (H100 80GB BF16)")):
        assert "attention_kernel" not in row_experiment(_row(**{**base, **other}), fields)[0]
    flash2 = []
    for r in load_runs():
        try:
            if row_experiment(r, _experiment_fields())[0].get("attention_kernel") == "flash2" \
                    and "llm-foundry" in r["framework"]:
                flash2.append(r["id"])
        except NotExpressible:
            pass
    assert flash2 == ["305", "306", "307", "308", "309", "310", "370", "371", "372", "373", "374", "375"]


def test_unstated_virtual_stages_come_from_the_benchmarks_launch_script():
    """dgxc-benchmarking v25.04 / v25.04.01 print VP "NA" for Nemotron-4 340B while their launch.sh passes
    -vp 12; a row that states its VP keeps it, other models and documents are untouched."""
    src = "https://github.com/NVIDIA/dgxc-benchmarking/blob/741c886025a7665a1d690c05ff12ac29c1be7252/nemotron/README.md"
    base = dict(model="Nemotron-4 340B", gpus="256", tp="8", pp="8", cp="1", vp="", gbs="64", mbs="1",
                seq_len="4096", framework="NeMo (Megatron-Core)", source=src)
    kw, notes = row_experiment(_row(**base))
    assert kw["virtual_stages"] == 12 and kw["schedule"] == "interleaved" and any("launch.sh" in n for n in notes)
    assert row_experiment(_row(**{**base, "vp": "4"}))[0]["virtual_stages"] == 4
    other = row_experiment(_row(**{**base, "source": src.replace("741c886025a7665a1d690c05ff12ac29c1be7252",
                                                                  "0" * 40)}))[0]
    assert other.get("virtual_stages", 1) == 1


def test_unstated_checkpointing_comes_from_the_benchmarks_recipe():
    """Megatron-Bridge v0.3-v0.5 (NeMo 26.02-26.06) run their GB200 Llama performance configs without
    recomputation: those rows simulate none, with a note, even where our memory model puts them over the
    device; NeMo 25.11 rows, other hardware, stated checkpointing and the TP-PP 70B runs are untouched."""
    import clustersim.validate as v
    base = dict(model="Llama 3.1 405B", hardware="GB200 (DGX-GB200)", gpus="256", tp="4", pp="16", cp="1", vp="4",
                gbs="1536", mbs="1", seq_len="8192", fsdp="0", precision="FP8", release="NeMo 26.04",
                framework="Megatron-Bridge / Megatron-Core", activation_checkpointing="")
    kw, notes = v.row_experiment(_row(**base))
    assert kw["recompute"] == "none" and any("LLAMA31_405B_PRETRAIN_CONFIG_GB200" in n for n in notes)
    for change in (dict(release="NeMo 25.11"), dict(hardware="B200 (DGX-B200)"),
                   dict(activation_checkpointing="full")):
        kw2, notes2 = v.row_experiment(_row(**{**base, **change}))
        assert not any("PRETRAIN_CONFIG" in n for n in notes2) and kw2.get("recompute") in (None, "full")
    fsdp70 = dict(base, model="Llama 3 70B", gpus="64", tp="1", pp="1", vp="", gbs="256", mbs="2", fsdp="64")
    kw, notes = v.row_experiment(_row(**fsdp70))
    assert kw["recompute"] == "none" and kw["fsdp"] and any("offloads 40 layers" in n for n in notes)
    tp_pp70 = dict(fsdp70, tp="2", pp="4", vp="5", mbs="1", fsdp="0", precision="MXFP8")
    assert "recompute" not in v.row_experiment(_row(**tp_pp70))[0]


def test_unstated_checkpointing_comes_from_the_benchmarks_model_config():
    """dgxc-benchmarking v24.11.1 runs Nemotron-4 340B from a YAML with selective recomputation: its rows
    simulate selective (also where our memory model would have forced full); other commits keep the rule."""
    src = "https://github.com/NVIDIA/dgxc-benchmarking/blob/35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae/nemotron/README_340b.md"
    base = dict(model="Nemotron-4 340B", gpus="128", tp="8", pp="8", cp="1", vp="12", gbs="32", mbs="1",
                seq_len="4096", framework="NeMo (Megatron-Core)", source=src)
    kw, notes = row_experiment(_row(**base))
    assert kw["recompute"] == "selective" and any("synth.yaml" in n for n in notes)
    other = row_experiment(_row(**{**base, "source": src.replace("35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae",
                                                                  "0" * 40)}))[0]
    assert "recompute" not in other
    assert row_experiment(_row(**{**base, "activation_checkpointing": "full"}))[0]["recompute"] == "full"


def test_jax_rows_take_the_checkpoint_policy_their_configs_state():
    """MaxText's configure.sh (save_qkv_proj) and Paxml's 175B config (SAVE_QKV_OUT_PROJ) keep only projection
    outputs: their rows run full recomputation (the nearest priced) and say what the config states, instead of
    'activation checkpointing not stated'."""
    rows = {r["id"]: r for r in load_runs()}
    for rid, words in (("1", "save_qkv_proj"), ("6", "save_qkv_proj"), ("294", "SAVE_QKV_OUT_PROJ")):
        kw, notes = row_experiment(rows[rid])
        assert kw["recompute"] == "full" and any(words in n for n in notes), (rid, notes)
        assert not any("not stated" in n for n in notes)
        # Paxml's XLA flags turn cuDNN's fused attention off: its attention core runs unfused (eager)
        assert kw.get("attention") == ("eager" if rid == "294" else None)
    # the same benchmark commit documents NeMo's GPT-3 175B runs too: their flags and checkpointing are NeMo's
    nemo = [r for r in rows.values() if r["model"] == "GPT-3 175B" and "35a9aecc" in r["source"]
            and "NeMo" in r["framework"]]
    assert nemo
    for r in nemo:
        kw, notes = row_experiment(r)
        assert "attention" not in kw and not any("paxml" in n or "XLA" in n for n in notes), (r["id"], kw, notes)


def test_nvidia_recipes_with_tp_run_the_tp_communication_overlap():
    """NVIDIA's Megatron-Core recipes overlap TP communication (userbuffers) whenever TP > 1: with
    validate --tp-comm-overlap dense rows and Grok-1 (dgxc's configure.sh) run --tp-comm-overlap; TP 1,
    DeepSeek-V3 (Megatron-Bridge: off), other frameworks and the eager stacks do not."""
    assert row_experiment(_row(), tp_overlap=True)[0]["tp_comm_overlap"] is True
    assert "tp_comm_overlap" not in row_experiment(_row())[0]          # off unless asked (README)
    grok = _row(model="Grok-1 314B", framework="NeMo (Megatron-Core)", tp="4", pp="8", cp="2", ep="8", vp="8",
                gpus="512", gbs="1024")
    assert row_experiment(grok, tp_overlap=True)[0]["tp_comm_overlap"] is True
    for change in (dict(tp="1", pp="8", gpus="32"), dict(model="DeepSeek-V3 671B", ep="8", gpus="256", pp="8",
                                                          vp="", gbs="512"),
                   dict(framework="torchtitan (FSDP + TP (2D))", fsdp="8", gpus="64", pp="1", vp="",
                        hardware="H100 (Grand Teton; 96GB HBM2e, 500W power limit)")):
        kw, _ = row_experiment(_row(**change), tp_overlap=True)
        assert "tp_comm_overlap" not in kw


MEGATRON_2021 = Path(__file__).resolve().parents[2] / "validation" / "megatron_lm_2021.csv"


def test_megatron_lm_2021_rows_run_as_megatron_ran_then():
    """Narayanan et al. 2021: FP16 (priced as BF16), eager attention, no sequence parallelism, plain DDP whose
    all-reduce follows the backward pass; the published step derives from the paper's eq. 3 figure."""
    rows = {r["id"]: r for r in load_runs(MEGATRON_2021)}
    assert load_runs("validation/megatron_lm_2021.csv") == list(rows.values())   # by its repository path too
    assert len(rows) == 16 and all(r["source"].startswith("https://arxiv.org/abs/2104.04473") for r in rows.values())
    kw, notes = row_experiment(rows["M7"])
    # the paper's reproduction script (examples/sc21/run_table_1.sh): MBS 2, 5 layers per virtual stage, DDP local
    assert kw == dict(cluster="dgx-a100", dtype="bf16", stack="megatron", model="megatron-gpt-145.6b", zero=0,
                      overlap_grad_reduce=False, attention="eager", schedule="interleaved", virtual_stages=2,
                      gpus=1536, seq=2048, tp=8, pp=8, cp=1, ep=1, dp=24, sp=False, micro_batch=2, global_batch=2304,
                      recompute="full")
    assert any("FP16" in n for n in notes)
    small, _ = row_experiment(rows["M1"])          # DDP torch: bucketed all-reduce during backward
    assert small["overlap_grad_reduce"] and small["micro_batch"] == 16 and "schedule" not in small
    # eq. 3 at 148 TFLOP/s per GPU on 1,536 GPUs
    B, s, l, h, V = 2304, 2048, 80, 12288, 51200
    F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert float(rows["M7"]["step_time_s"]) == pytest.approx(F / (148e12 * 1536), rel=1e-4)
    assert published_tokens_per_gpu(rows["M7"]) == pytest.approx(B * s / (F / (148e12 * 1536)) / 1536, rel=1e-4)


def test_megatron_lm_2021_small_models_within_ten_percent_with_their_eager_attention(capsys):
    """The smallest runs of the weak-scaling table are where the attention core's s×s traffic weighs most:
    priced as the kernels Megatron ran, within 10% of the published throughput; priced as FlashAttention (which
    did not exist yet) they would be far too fast."""
    from clustersim.experiment import experiment_from_dict, run_experiment
    from clustersim.validate import validate_rows
    rows = [r for r in load_runs(MEGATRON_2021) if r["id"] in ("M1", "M4")]
    done, skipped = validate_rows(rows)
    assert not skipped and len(done) == 2
    for r in done:
        assert abs(r["error"]) < 0.10, (r["id"], r["error"])
    m1 = done[0] if done[0]["id"] == "M1" else done[1]
    flash = run_experiment(experiment_from_dict({**m1["experiment"], "attention": "flash", "network": "analytical"}))
    assert flash.metrics.tokens_per_s / 32 / m1["published_tokens_per_s_per_gpu"] - 1 > 0.25


def test_megatron_2021_presets_point_at_the_attention_their_runs_used():
    """Simulating a megatron-gpt-* preset with the default FlashAttention notes that its published runs did not
    have it; with --attention eager the note is gone."""
    from clustersim.experiment import experiment_from_dict, run_experiment
    base = dict(cluster="dgx-a100", gpus=8, model="megatron-gpt-1.7b", seq=2048, global_batch=8, micro_batch=1,
                network="analytical")
    flash = run_experiment(experiment_from_dict(base))
    assert any("--attention eager" in n for n in flash.notes)
    eager = run_experiment(experiment_from_dict({**base, "attention": "eager"}))
    assert not any("--attention eager" in n for n in eager.notes)


def test_error_correlations_by_hand():
    """error_correlations: Pearson r per (group, stack) of 20+ rows, None where a quantity is constant; groups
    below the threshold are left out."""
    from clustersim.validate import error_correlations
    rows = [{"group": "H100 BF16 dense", "stack": "megatron", "error": 0.01 * i, "mfu": 0.4 + 0.01 * i,
             "bubble_fraction": 0.1 - 0.002 * i, "exposed_comm_fraction": 0.05, "gpus": str(2 ** (3 + i % 4)),
             "experiment": {"seq": 2 ** (9 + i % 5)}, "kernel_shares": {"gemm": 0.9 - 0.02 * i, "attention": 0.02 * i}}
            for i in range(20)]
    rows += [{"group": "A100 BF16 dense", "stack": "torchtitan", "error": 0.1, "mfu": 0.5, "bubble_fraction": 0.0,
              "exposed_comm_fraction": 0.0, "gpus": "64", "experiment": {"seq": 4096}}] * 5
    (c,) = error_correlations(rows)
    assert (c["group"], c["stack"], c["rows"]) == ("H100 BF16 dense", "megatron", 20)
    assert c["predicted MFU"] == pytest.approx(1.0) and c["bubble"] == pytest.approx(-1.0)
    assert c["exposed comm"] is None
    import numpy as np
    x = [3 + i % 4 for i in range(20)]
    assert c["log2 GPUs"] == pytest.approx(np.corrcoef(x, [0.01 * i for i in range(20)])[0, 1])
    assert c["log2 seq"] == pytest.approx(np.corrcoef([9 + i % 5 for i in range(20)], [0.01 * i for i in range(20)])[0, 1])
    assert c["attention share"] == pytest.approx(1.0)


def test_torchtitan_pipeline_rows_take_the_defaults_of_their_commit():
    """torchtitan's 405B 3D/4D tables (9dec370) state the local batch and the schedule only: at that commit the
    pipeline splits the local batch into pp micro-batches and generate_split_points gives 1F1B one stage per
    rank, Interleaved 1F1B two, the remainder of the layers one each to the middle stages."""
    from clustersim.validate import _torchtitan_pipeline
    assert _torchtitan_pipeline(32, 8, False, 126, 2) == (4, [15] + [16] * 6 + [15])
    assert _torchtitan_pipeline(32, 8, True, 126, 2) == (4, [7] + [8] * 14 + [7])
    assert _torchtitan_pipeline(8, 4, False, 10, 2) == (2, [2, 3, 3, 2])
    with pytest.raises(NotExpressible, match="micro-batches"):
        _torchtitan_pipeline(12, 8, False, 126, 2)
    rows = {r["id"]: r for r in load_runs()}
    f = _experiment_fields()
    one, _ = row_experiment(rows["386"], f)
    inter, notes = row_experiment(rows["387"], f)
    assert (one["micro_batch"], one["global_batch"], one["schedule"]) == (4, 256, "1f1b")
    assert one["stage_layers"] == "15,16,16,16,16,16,16,15" and "virtual_stages" not in one
    assert (inter["schedule"], inter["virtual_stages"], inter["micro_batch"]) == ("interleaved", 2, 4)
    assert inter["stage_layers"] == ",".join(["7"] + ["8"] * 14 + ["7"])
    assert any("generate_split_points" in n for n in notes)
    for rid, cp in (("382", 1), ("383", 2), ("384", 4), ("385", 8)):
        kw, _ = row_experiment(rows[rid], f)
        assert (kw["cp"], kw["dp"], kw["micro_batch"], kw["global_batch"]) == (cp, 8 // cp, 1, 8 * (8 // cp))


def test_dgxc_nemo_fp8_rows_keep_the_fp8_parameters_their_configs_state():
    """dgxc-benchmarking's NeMo 1.x configure scripts pass model.fp8_params for FP8 runs (v24.11.1 35a9aec:
    llama3.1/configure.sh): those rows run with fp8_param_gather; BF16 rows, other commits and other
    frameworks do not."""
    fields = FIELDS | {"dtype", "stack", "fp8_recipe", "fp8_param_gather"}
    src = "https://github.com/NVIDIA/dgxc-benchmarking/blob/{}/llama3.1/README.md"
    kw = dict(model="Llama 3.1 70B", framework="NeMo (Megatron-Core)", precision="FP8")
    exp, notes = row_experiment(_row(**kw, source=src.format("35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae")), fields)
    assert exp["fp8_param_gather"] is True and any("llama3.1/configure.sh" in n for n in notes)
    for other in (dict(precision="BF16"), dict(source=src.format("741c886025a7665a1d690c05ff12ac29c1be7252")),
                  dict(framework="MaxText (JAX)")):
        row = _row(**{**kw, "source": src.format("35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae"), **other})
        assert "fp8_param_gather" not in row_experiment(row, fields)[0]


def test_a_layer_count_a_later_readme_corrects_is_taken_corrected():
    """dgxc-benchmarking v25.05 lists Llama 4 Maverick's runs with 32 layers, v25.05.01 the same measured runs with
    48 (the model's): both rows run the 48-layer model, and the row says why."""
    rows = {r["id"]: r for r in load_runs()}
    old, new = rows["785"], rows["791"]
    assert (old["num_layers"], new["num_layers"], old["step_time_s"]) == ("32", "48", new["step_time_s"])
    exp_old, notes = row_experiment(old, FIELDS)
    exp_new, _ = row_experiment(new, FIELDS)
    assert exp_old["model"] == exp_new["model"] == "llama4-maverick"
    assert any("corrects this revision's 32" in n for n in notes)


def test_gpt_oss_bf16_rows_run_megatron_bridges_recompute():
    """Megatron-Bridge's GPT-OSS 120B BF16 configs (v0.2.0-v0.5.0): layernorm and moe_act recomputed on H100, B200
    and GB200, nothing on GB300 and B300; the MXFP8 rows (later releases, configs not read) are left unstated."""
    rows = {r["id"]: r for r in load_runs()}
    h100, _ = row_experiment(rows["653"], FIELDS)
    assert (h100["model"], h100["recompute"], tuple(h100["recompute_modules"])) == \
        ("gpt-oss-120b", "selective", ("layernorm", "moe_act"))
    gb300, notes = row_experiment(rows["836"], FIELDS)
    assert gb300["recompute"] == "none" and any("GB300 config" in n for n in notes)
    mx = row_experiment(rows["887"], FIELDS | {"dtype", "stack", "fp8_recipe"})[0]     # GB300 MXFP8, NeMo 26.06
    assert "recompute" not in mx


def test_rows_run_the_recompute_their_bridge_configs_set():
    """Megatron-Bridge's performance configs, read per release: DeepSeek-V3 on GB200 recomputes mla_up_proj, then
    the dense MLPs only (v0.4.x), then mla_up_proj again; Qwen3-30B-A3B's MXFP8 configs on B300 / GB300 recompute
    nothing; DeepSeek-V3 on GB300 and Kimi K2 recompute mla_up_proj."""
    from clustersim.validate import load_runs
    rows = {r["id"]: r for r in load_runs()}
    expected = {"594": ("mla_up_proj",), "601": ("mlp",), "608": ("mlp",), "615": ("mla_up_proj",),
                "620": ("mla_up_proj",), "835": ("mla_up_proj",), "820": ("mla_up_proj",), "847": ("mla_up_proj",)}
    for rid, modules in expected.items():
        exp, notes = row_experiment(rows[rid])
        assert (exp["recompute"], tuple(exp["recompute_modules"])) == ("selective", modules), rid
    for rid in ("800", "825", "844", "907", "652", "718", "583"):
        exp, notes = row_experiment(rows[rid])
        assert exp["recompute"] == "none" and any("without" in n and "recomputation" in n for n in notes), rid


def test_qwen3_blackwell_ultra_rows_run_hybridep_and_no_recompute():
    """Qwen3-30B-A3B's MXFP8 configs on B300 / GB300 (v0.3.0-v0.6.0) set HybridEP and no recomputation; other
    releases and hardware keep the alltoall dispatcher."""
    from clustersim.validate import load_runs, stated_moe_dispatcher
    rows = {r["id"]: r for r in load_runs()}
    for rid in ("800", "825", "844", "916"):
        exp, notes = row_experiment(rows[rid])
        assert exp["moe_dispatcher"] == "hybridep" and exp["recompute"] == "none", rid
    assert stated_moe_dispatcher(rows["652"], 8) is None           # H100, NeMo 25.11: alltoall
    assert stated_moe_dispatcher(dict(rows["800"], release="NeMo 25.11"), 8) is None
    # the other Bridge MoE configs, per release: DeepEP at v0.3.0 and HybridEP from v0.4.0 for Qwen3-30B-A3B on H100
    # (26.02.01's row matches no config of its release: alltoall), alltoall for Qwen3-235B-A22B on B200
    assert stated_moe_dispatcher(rows["655"], 8)[0] == "deepep"
    assert stated_moe_dispatcher(rows["663"], 16)[0] == "hybridep"
    assert stated_moe_dispatcher(rows["659"], 8) is None
    assert stated_moe_dispatcher(rows["733"], 8) is None
    assert stated_moe_dispatcher(rows["749"], 64)[0] == "hybridep" and stated_moe_dispatcher(rows["755"], 64) is None


def test_rows_simulated_side_by_side_give_the_same_results_in_the_same_order():
    """validate_rows with a pool of worker processes returns what it returns in one process (every field of every
    row, skipped rows included), in the rows' order, whatever order the workers finish in."""
    from clustersim.validate import validate_rows
    rows = {r["id"]: r for r in load_runs()}
    pick = [rows[i] for i in ("417", "526", "402", "403")] + [_row(task="lora"), _row(tokens_per_s_per_gpu="")]
    calls = []
    alone = validate_rows(pick, workers=1)
    pooled = validate_rows(pick, workers=2, progress=lambda i, n: calls.append((i, n)))
    assert json.dumps(pooled) == json.dumps(alone)
    assert [r["id"] for r in pooled[0]] == ["417", "526", "402", "403"] and len(pooled[1]) == 2
    assert calls[-1] == (6, 6) and [i for i, _ in calls] == sorted(i for i, _ in calls)


def test_a_broken_worker_pool_leaves_its_rows_to_this_process(monkeypatch):
    """A worker the OS kills (out of memory) breaks the pool: the rows it did not answer run in this process,
    one at a time, and the results are complete."""
    import concurrent.futures
    from concurrent.futures.process import BrokenProcessPool
    from clustersim.validate import validate_rows

    class Broken:
        def __init__(self, max_workers):
            pass

        def submit(self, fn, *args):
            f = concurrent.futures.Future()
            f.set_exception(BrokenProcessPool("a worker died"))
            return f

        def shutdown(self, wait=True, cancel_futures=False):
            pass

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Broken)
    rows = {r["id"]: r for r in load_runs()}
    done, skipped = validate_rows([rows["417"], _row(task="lora")], workers=2)
    assert [r["id"] for r in done] == ["417"] and len(skipped) == 1


def test_rows_run_in_this_process_where_no_pool_can_be_made(monkeypatch):
    import concurrent.futures
    from clustersim.validate import validate_rows

    def refuse(max_workers):
        raise OSError("sem_open: function not implemented")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", refuse)
    rows = {r["id"]: r for r in load_runs()}
    done, skipped = validate_rows([rows["417"], rows["402"]], workers=2)
    assert [r["id"] for r in done] == ["417", "402"] and not skipped


def test_default_workers_keep_small_sets_in_this_process(monkeypatch):
    from clustersim import validate as V
    monkeypatch.setattr(V, "usable_cores", lambda: 16)
    assert V.default_workers(5) == 1 and V.default_workers(40) == 2
    assert V.default_workers(803) == V.DEFAULT_MAX_WORKERS
    monkeypatch.setattr(V, "usable_cores", lambda: 1)
    assert V.default_workers(803) == 1


def test_usable_cores_follow_the_process_affinity(monkeypatch):
    from clustersim import validate as V
    monkeypatch.setattr(V.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert V.usable_cores() == 3
    monkeypatch.delattr(V.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(V.os, "cpu_count", lambda: None)
    assert V.usable_cores() == 1


def test_group_keeps_the_rows_of_one_summary_group(capsys):
    """--group selects rows by their summary group (case-insensitive substring), as the tables name them."""
    assert main(["validate", "--group", "h200 fp8", "--json", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] and {r["group"] for r in out["rows"]} == {"H200 FP8 dense"}
    assert [s["group"] for s in out["summary"]] == ["H200 FP8 dense"]
    assert main(["validate", "--group", "no such group"]) == 2


@pytest.mark.parametrize("option", ["--only", "--group"])
def test_an_empty_selection_is_refused(option, capsys):
    """--only '' matched every row (and ran them all for minutes), where --ids '' is refused."""
    assert main(["validate", option, ""]) == 2
    assert f"{option} '' is empty: it would match every row" in capsys.readouterr().err

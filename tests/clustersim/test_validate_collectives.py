"""clustersim validate collectives: published rows mapped onto presets, predicted, summarised."""
import json
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.validate_collectives import collective_rows, express, moe_rows, predict, predict_moe, summary

COLL_HEADER = ("hardware,platform,nodes,gpus_per_node,total_gpus,collective,algorithm,protocol,nccl_version,"
               "benchmark_tool,placement,size_bytes,size_label_in_source,time_s,algbw_GBps,busbw_GBps,notes,source")
MOE_HEADER = ("hardware,nic,library_version,kernel_mode,op,ep_size,topology,tokens_per_batch,hidden,topk,"
              "dispatch_dtype,combine_dtype,bottleneck_bandwidth_GBps,link,latency_s,num_sms,notes,source")
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "validation"


def _fixture(tmp_path):
    """A small file in the published format (three H100 sweep points, one forced ring, one unknown GPU)."""
    rows = [f'H100 80GB HBM3,"Azure ND H100 v5",1,8,8,all_reduce,NVLS,,2.18.5,nccl-tests,in-place,{s},x,,,{b},,src'
            for s, b in ((1024, 0.07), (2**20, 43.7), (2**24, 234.45), (2**30, 466.35))]
    rows.append("H200 (NVLink 4 / NVSwitch),8x H200 node,1,8,8,all_reduce,Ring (NCCL_NVLS_ENABLE=0),,,bench,,"
                "8589934592,8GiB,,,362.0,,src")
    rows.append("MI300X,some node,1,8,8,all_reduce,default,,,rccl-tests,,1048576,1M,,,40.0,,src")
    (tmp_path / "collectives.csv").write_text("# comment\n" + COLL_HEADER + "\n" + "\n".join(rows) + "\n")
    moe = ["H800 (~160 GB/s NVLink),CX7,DeepEP V1 (NVSHMEM),normal,dispatch,8,intranode,4096,7168,8,FP8,BF16,153,"
           "NVLink,,,,src",
           "H800,CX7,DeepEP V1 (NVSHMEM),low-latency (pure RDMA),dispatch,8,internode RDMA,128,7168,8,FP8,BF16,98,"
           "RDMA,7.7e-05,,,src"]
    (tmp_path / "moe_alltoall.csv").write_text(MOE_HEADER + "\n" + "\n".join(moe) + "\n")
    return tmp_path


def test_rows_expressed_predicted_and_summarised(tmp_path):
    d = _fixture(tmp_path)
    rows = predict(collective_rows(d / "collectives.csv"))
    assert [r.preset for r in rows] == ["dgx-h100"] * 4 + ["dgx-h200", None]
    assert "no preset for MI300X" in rows[-1].reason
    assert rows[4].algorithm == "ring" and rows[4].chosen == "ring"
    big = rows[3]
    assert big.chosen == "nvls" and abs(big.error) < 0.10          # 1 GiB: NCCL's NVLS model
    assert big.time_ratio == pytest.approx(1 / (1 + big.error), rel=1e-9)
    bands = {(s["hardware"], s["band"]): s for s in summary(rows)}
    assert bands[("H100", ">= 1 MiB")]["rows"] == 3 and bands[("H100", "< 64 KiB")]["rows"] == 1
    moe = predict_moe(moe_rows(d / "moe_alltoall.csv"))
    assert moe[0].preset == "dgx-h100" and moe[0].predicted_busbw > 0 and "low-latency" in moe[1].reason
    # H800 NVLink: 200 GB/s per direction x NCCL's 20.6 / 25 per link -> 164.8 GB/s, less the latency
    assert 150 < moe[0].predicted_busbw < 164.8


def test_express_multi_node_platforms():
    base = {"hardware": "H100 80GB HBM3", "platform": "GCP A3 Mega", "nodes": "2", "gpus_per_node": "8",
            "total_gpus": "16", "algorithm": "default"}
    m = express(base)
    assert m["preset"] == "dgx-h100" and m["gpus"] == 16 and m["overrides"]["nic_bandwidth"] == 25e9
    assert express({**base, "hardware": "GB200 (NVL72)", "platform": "rack", "nodes": "18 (trays)",
                    "gpus_per_node": "4", "total_gpus": "72"})["group"] == tuple(range(72))


def test_cli_text_json_plot_and_errors(tmp_path, capsys):
    d = _fixture(tmp_path)
    png = tmp_path / "v.png"
    assert main(["validate", "collectives", "--data", str(d), "--rows", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "H100" in out and "not expressible" in out and "MI300X" in out and png.stat().st_size > 10_000
    assert main(["validate", "collectives", "--data", str(d), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"summary", "bands", "bands_without_net_plugins", "rows", "not_expressed"} <= set(doc)
    assert {b["band"]: b["rows"] for b in doc["bands"]} == {"< 64 KiB": 1, ">= 1 MiB": 4}   # no 64 KiB - 1 MiB row
    assert all({"predicted_busbw_GBps", "published_busbw_GBps", "error", "predicted_time_s"} <= set(r)
               for r in doc["rows"])
    assert main(["validate", "collectives", "--data", str(tmp_path / "nowhere")]) == 2
    assert "--data" in capsys.readouterr().err


@pytest.mark.skipif(not (REAL / "collectives.csv").exists(), reason="published validation data not present")
def test_published_large_all_reduce_within_ten_percent():
    rows = predict(collective_rows(REAL / "collectives.csv"))
    big = [r for r in rows if r.error is not None and r.label in ("H100", "A100", "H200")
           and r.size_bytes >= 2**30]
    assert len(big) >= 20 and all(abs(r.error) < 0.10 for r in big)


def test_forced_algorithm_follows_the_source():
    base = {"hardware": "H100 80GB HBM3", "platform": "Azure ND H100 v5 (8 GPUs, NVLink/NVSwitch)", "nodes": "1",
            "gpus_per_node": "8", "total_gpus": "8", "algorithm": "NVLS (as stated in source text)"}
    assert express(base)["algorithm"] == "nvls"            # Azure's runner sets NCCL_ALGO=NVLS
    a100 = {**base, "hardware": "A100-SXM4-80GB", "platform": "Azure ND A100 v4 (8 GPUs, NVLink/NVSwitch)"}
    assert "algorithm" not in express(a100)                 # no NVLS on Ampere: the tuner's choice
    assert express({**base, "algorithm": "NVLS (NCCL default choice)"}).get("algorithm") is None
    assert express({**base, "algorithm": "Ring (NCCL_NVLS_ENABLE=0)"})["algorithm"] == "ring"


@pytest.mark.skipif(not (REAL / "collectives.csv").exists(), reason="published validation data not present")
def test_tuner_of_the_stated_release_picks_what_the_sources_say_nccl_picked():
    """Rows whose source names NCCL's own choice (GPU-count sweeps, 'RING/LL up to 1MiB, NVLS/SIMPLE from
    2MiB', 'tuner selected Ring'): the stated release's tuning model picks the same algorithm."""
    import re as _re
    rows = [r for r in predict(collective_rows(REAL / "collectives.csv")) if r.extra]
    checked = 0
    for r in rows:
        text = r.extra["algorithm"]
        if "default choice" in text or "selected" in text:
            stated = "nvls" if "NVLS" in text else "ring"
        elif _re.search(r"up to 1MiB.*from 2MiB", text):
            stated = "ring" if r.size_bytes <= 2**20 else "nvls"
        else:
            continue
        assert r.chosen == stated, (r.label, r.size_bytes, text, r.chosen)
        checked += 1
    assert checked >= 25


def test_harness_read_from_the_command_line():
    from clustersim.validate_collectives import harness
    assert harness({"benchmark_tool": "nccl-tests all_reduce_perf (-g 8, float sum)"}) == (8, False)
    assert harness({"benchmark_tool": "nccl-tests all_reduce_perf -b 8 -e 8G -f 2 -g 1 (mpirun -np 16)"}) == (1, False)
    assert harness({"benchmark_tool": "nccl-tests *_perf -b 16G -e 16G -g 8 -z 1"}) == (8, True)
    assert harness({"benchmark_tool": "ml-engineering all_reduce_bench.py (torch 2.9.1)"}) == (1, True)
    assert harness({"benchmark_tool": "not named in sentence (busbw reported)"}) == (1, False)


def test_torch_benchmark_rows_pay_pytorchs_per_call_host_time(tmp_path):
    """all_reduce_bench.py (torch.distributed, one call timed after a barrier): NCCL's time + PyTorch's per-call
    host time; nccl-tests rows have none."""
    from clustersim.validate_collectives import host_overhead_s
    from topologies import nccl_constants as C
    assert host_overhead_s({"benchmark_tool": "ml-engineering all_reduce_bench.py (torch 2.9.1)"}) == \
        C.TORCH_CALL_OVERHEAD_S
    assert host_overhead_s({"benchmark_tool": "nccl-tests all_reduce_perf (-g 8, float sum)"}) is None
    row = ('"H200 (single node, NVLink 4 / NVSwitch)","8x H200 node",1,8,8,all_reduce,default,,2.27.7,'
           '"ml-engineering all_reduce_bench.py (torch 2.9.1+cu130, cuda 13.0)",,65536,64KiB,,,2.93,,src')
    (tmp_path / "collectives.csv").write_text(COLL_HEADER + "\n" + row + "\n")
    (r,) = predict(collective_rows(tmp_path / "collectives.csv"))
    import topologies
    from simulator.costs import CommRequest
    from topologies.cost import ClusterCostModel
    model = ClusterCostModel(topologies.load_cluster("dgx-h200", 8), nccl_version="2.27.7")
    t = model.comm_time_s(CommRequest("all_reduce", tuple(range(8)), 65536))
    assert r.host_s == C.TORCH_CALL_OVERHEAD_S and r.blocking
    assert r.predicted_time_s == pytest.approx(t + C.TORCH_CALL_OVERHEAD_S)


def test_rows_run_as_their_harness_and_environment_ran_them(tmp_path):
    """A -g 8 row at 1 KiB takes 8 host launches (33.7 us > NCCL's 15 us ring); the A3 Mega row runs GCP's
    TCPXO profile (Ring,Tree x Simple, NCCL 2.21.5): 2.21.5's tuner prices tree Simple at 2 x (7 x 28 + 28) =
    448 us and ring Simple at 8.4 + 28 x 3.4 + 2 x 14 = 131.6 us (tuning.cc baseLat + hwLat NVLink / NET,
    2 nodes of 8, 30 steps of which 2 cross nodes), so it runs ring: 131.6 us."""
    rows = ['A100-SXM4-80GB,"Azure ND A100 v4",1,8,8,all_reduce,NVLS (as stated in source text),,2.18.5,'
            '"nccl-tests all_reduce_perf (-g 8, float sum)",in-place,1024,1K,,,0.04,,src',
            'H100 80GB HBM3,"GCP A3 Mega (per repo name)",2,8,16,all_reduce,default (not stated),,,'
            '"nccl-tests all_reduce_perf -b 8 -e 8G -f 2 -g 1",in-place,8,8,0.0001235,0.00,0.00,,src']
    (tmp_path / "collectives.csv").write_text(COLL_HEADER + "\n" + "\n".join(rows) + "\n")
    a100, a3 = predict(collective_rows(tmp_path / "collectives.csv"))
    assert a100.gpus_per_thread == 8 and a100.predicted_time_s == pytest.approx(33.7e-6)
    assert a3.env == {"algorithms": ("ring", "tree"), "protocols": ("simple",)} and a3.nccl_version == "2.21.5"
    assert a3.chosen == "ring"
    assert a3.predicted_time_s == pytest.approx((8.4 + 28 * 3.4 + 2 * 14.0) * 1e-6, rel=1e-3)


def test_efa_rows_carry_the_latency_aws_ofi_nccl_reports():
    base = {"hardware": "B200 (NVLink 5 intra-node; EFA v4)", "platform": "AWS p6-b200.48xlarge", "nodes": "4",
            "gpus_per_node": "8", "total_gpus": "32", "algorithm": "default (AWS ofi tuner plugin)"}
    assert express(base)["net_latency_us"] == 35.0          # platform-aws.cpp, p5en/p6-b200
    assert "net_latency_us" not in express({**base, "nodes": "1", "total_gpus": "8"})
    a3 = {**base, "hardware": "H100 80GB HBM3", "platform": "GCP A3 Mega", "nodes": "2", "total_gpus": "16"}
    assert "net_latency_us" not in express(a3)                # TCPXO reports 0

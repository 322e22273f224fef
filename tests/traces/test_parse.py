"""Parser tests on hand-made traces with known contents, committed torch 2.13 gloo samples, and corrupt files."""
from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import TraceError
from traces import kineto
from traces.parse import _nest, gemm_flops, load_trace, normalize_kind
from tests.traces import kineto_fixtures as fx

DATA = Path(__file__).parent / "data"


@pytest.fixture
def nccl_dir(tmp_path):
    for r in range(2):
        fx.write(fx.nccl_rank(r, skew_us=3.0 * r), tmp_path / "job" / f"rank{r}.json.gz", gz=(r == 0))
    return tmp_path / "job"


def test_nccl_fixture_exact(nccl_dir):
    t = load_trace(nccl_dir)
    assert t.rank_ids == [0, 1] and t.world_size == 2 and t.backend == "nccl" and t.has_gpu
    assert t.device(0) == "NVIDIA H100 80GB HBM3"
    assert list(t.steps["step"]) == [3, 4, 3, 4]
    assert np.allclose(t.steps["dur"], (fx.STEP_US - 1) * 1e-6)
    # rank 1 started 3 us later on the common clock
    s = t.steps.set_index(["rank", "step"])
    assert s.loc[(1, 3), "ts"] - s.loc[(0, 3), "ts"] == pytest.approx(3e-6, abs=1e-9)
    # kernels linked to the op that launched them (through the runtime call's correlation)
    k = t.kernels[t.kernels["rank"] == 0]
    assert list(k["op_name"]) == ["aten::addmm", "aten::mm", "nccl:all_reduce"] * 2
    assert t.cpu_ops.loc[k["op"].iloc[0], "name"] == "aten::addmm"
    assert list(k["is_comm"]) == [False, False, True] * 2
    # GPU end of each step: the NCCL kernel's end
    assert s.loc[(0, 3), "gpu_end"] == pytest.approx((450 + fx.NCCL_KERNEL_US) * 1e-6)
    # collectives: one per NCCL kernel, sizes from the args, sequence per group
    c = t.collectives
    assert len(c) == 4 and set(c["kind"]) == {"all_reduce"}
    assert (c["size_bytes"] == 4 * fx.ALLREDUCE_NELEMS).all()
    assert list(c["group_ranks"]) == [(0, 1)] * 4 and list(c["seq"]) == [0, 1, 0, 1]
    assert np.allclose(c["dur"], [fx.NCCL_KERNEL_US * 1e-6] * 2 + [(fx.NCCL_KERNEL_US - 3) * 1e-6] * 2)
    assert (c["timing"] == "gpu").all() and list(c["step"]) == [3, 4, 3, 4]
    assert t.cpu_ops.loc[c["op"].iloc[0], "name"] == "c10d::allreduce_"
    # FLOPs from Input Dims; backward node -> forward op by sequence number
    ops = t.cpu_ops
    addmm = ops[(ops["name"] == "aten::addmm") & (ops["rank"] == 0)]
    assert addmm["flops"].iloc[0] == 2 * 32 * 128 * 64
    bwd = ops[(ops["name"] == "AddmmBackward0") & (ops["rank"] == 0)]
    assert list(bwd["fwd_op"]) == list(addmm.index)
    # nesting
    rpc = ops[(ops["name"] == "record_param_comms") & (ops["rank"] == 0)].iloc[0]
    assert ops.loc[rpc["parent"], "name"] == "c10d::allreduce_"
    assert len(t.memory) == 4 and (t.memory["bytes"] == 4096).all()


def test_gz_and_plain_identical(tmp_path):
    a = fx.write(fx.nccl_rank(0), tmp_path / "a" / "t.json")
    b = fx.write(fx.nccl_rank(0), tmp_path / "b" / "t.json.gz", gz=True)
    ta, tb = load_trace(a), load_trace(b)
    for name in ("steps", "cpu_ops", "kernels", "collectives", "memory"):
        x, y = getattr(ta, name), getattr(tb, name)
        assert x.equals(y), name


def test_small_chunks_and_pretty_printing_give_same_result(tmp_path, monkeypatch):
    ref = load_trace(fx.write(fx.nccl_rank(1), tmp_path / "a.json"))
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 7)
    small = load_trace(fx.write(fx.nccl_rank(1), tmp_path / "b.json", indent=2))
    for name in ("steps", "cpu_ops", "kernels", "collectives"):
        assert getattr(ref, name).equals(getattr(small, name)), name


def test_missing_optional_fields(tmp_path):
    """No args at all on comms, no distributedInfo, no baseTimeNanoseconds: rank from the file name, sizes NaN."""
    tr = fx.nccl_rank(0, with_args=False)
    del tr["distributedInfo"], tr["baseTimeNanoseconds"], tr["deviceProperties"]
    t = load_trace(fx.write(tr, tmp_path / "trace_rank5.json"))
    assert t.rank_ids == [5]
    c = t.collectives
    assert len(c) == 2 and set(c["kind"]) == {"all_reduce"}
    assert c["size_bytes"].isna().all()
    assert t.cpu_ops["flops"].isna().all()


def test_old_format_variants(tmp_path):
    """ProfilerStep as a cpu_op, integer timestamps, events without args or dur, bare array format."""
    tr = fx.nccl_rank(0)
    for e in tr["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep"):
            e["cat"] = "cpu_op"
        if "ts" in e:
            e["ts"] = int(e["ts"])
    tr["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 100, "tid": 100,
                              "ts": int(5_000_100)})
    tr["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "k", "ts": "bad"})
    t = load_trace(fx.write(tr, tmp_path / "t.json"))
    assert list(t.steps["step"]) == [3, 4]
    arr = load_trace(fx.write(tr["traceEvents"], tmp_path / "bare.json"))
    assert len(arr.kernels) == len(t.kernels) == 6


@pytest.mark.parametrize("cut", [0.3, 0.75, 0.999])
def test_truncated_file_names_file(tmp_path, cut):
    text = json.dumps(fx.nccl_rank(0))
    p = tmp_path / "rank0.json"
    p.write_text(text[: int(len(text) * cut)])
    with pytest.raises(TraceError, match=r"rank0\.json.*truncated"):
        load_trace(p)


def test_truncated_gzip(tmp_path):
    raw = gzip.compress(json.dumps(fx.nccl_rank(0)).encode())
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match=r"rank0\.json\.gz.*(truncated|corrupt)"):
        load_trace(p)


@pytest.mark.parametrize("content,match", [
    ("", "empty file"),
    ('{"schemaVersion": 1}', "no 'traceEvents'"),
    ('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "expected ',' or ']'"),
    ('{"traceEvents": [{"ph": "X", "ts": 1,}]}', "invalid JSON"),
    ("hello", "not a JSON trace"),
    ('{"traceEvents": []} trailing', "extra data"),
    ('{"traceEvents": []}', "no CPU or GPU events"),
])
def test_bad_files(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceError, match=match) as e:
        load_trace(p)
    assert "bad.json" in str(e.value)


def test_bad_paths(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no trace files"):
        load_trace(tmp_path / "empty")
    fx.write(fx.nccl_rank(0), tmp_path / "dup" / "a.json")
    fx.write(fx.nccl_rank(0), tmp_path / "dup" / "b.json")
    with pytest.raises(TraceError, match="both hold rank 0"):
        load_trace(tmp_path / "dup")


def test_manifest_is_not_a_trace(tmp_path):
    fx.write(fx.nccl_rank(0), tmp_path / "run" / "rank0.json")
    (tmp_path / "run" / "manifest.json").write_text('{"strategy": "ddp"}')
    assert load_trace(tmp_path / "run").rank_ids == [0]


def test_gloo_fixture_worker_matching(tmp_path):
    fx.write(fx.gloo_rank(0), tmp_path / "g" / "a.json")
    fx.write(fx.gloo_rank(1), tmp_path / "g" / "b.json.gz", gz=True)
    t = load_trace(tmp_path / "g")
    assert not t.has_gpu and t.backend == "gloo" and t.device(0) == "cpu"
    c = t.collectives[t.collectives["rank"] == 0]
    assert list(c["kind"]) == ["all_reduce", "reduce_scatter"]
    assert list(c["impl"]) == ["all_reduce", "all_reduce"]          # FSDP's reduce_scatter on gloo
    assert list(c["size_bytes"]) == [4000.0, 4000.0]                   # nccl-tests: reduce_scatter input
    assert list(c["out_nelems"]) == [1000, 500]
    assert np.allclose(c["dur"], [200e-6, 300e-6]) and np.allclose(c["issue_ts"], [400e-6, 700e-6])
    assert list(c["stream"]) == ["gloo:300", "gloo:301"] and (c["timing"] == "worker").all()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_torch213_gloo_samples(strategy):
    """Real torch 2.13 CPU/gloo traces (tests/traces/data/make_gloo_samples.py): 2 ranks x 2 steps."""
    t = load_trace(DATA / f"torch213_gloo_{strategy}")
    assert t.rank_ids == [0, 1] and t.world_size == 2 and not t.has_gpu
    assert list(t.steps["step"]) == [2, 3, 2, 3]
    c = t.collectives
    assert (c["timing"] == "worker").all() and c["size_bytes"].notna().all()
    assert (c["group_ranks"] == (0, 1)).all()
    per = {r: g.sort_values("seq") for r, g in c.groupby("rank")}
    assert list(per[0]["kind"]) == list(per[1]["kind"])
    assert list(per[0]["size_bytes"]) == list(per[1]["size_bytes"])
    params = 64 * 256 + 256 + 256 * 64 + 64           # the model of make_gloo_samples.py, float32
    for step, g in per[0].groupby("step"):
        if strategy == "ddp":
            assert set(g["kind"]) == {"all_reduce"} and g["size_bytes"].sum() == 4 * params
        else:
            rs = g[g["kind"] == "reduce_scatter"]
            assert set(rs["impl"]) == {"all_reduce"}
            assert rs["size_bytes"].sum() == 4 * params       # every gradient reduce-scattered once
    # gloo work runs after its enqueue, on worker threads
    assert (c["ts"] >= c["issue_ts"]).all()


@pytest.mark.slow
def test_streaming_memory_is_bounded(tmp_path, monkeypatch):
    """Scanning a ~3 MB trace with 64 KiB chunks must not hold the file: peak well under its size."""
    tr = fx.nccl_rank(0)
    ev = tr["traceEvents"]
    tr["traceEvents"] = ev * 1200
    p = fx.write(tr, tmp_path / "big.json")
    size = p.stat().st_size
    assert size > 2.5e6
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 1 << 16)
    tracemalloc.start()
    n = sum(1 for _ in kineto.Scan(p).events())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == len(ev) * 1200
    assert peak < size / 10, (peak, size)


def test_normalize_kind():
    cases = {
        "c10d::allreduce_": "all_reduce", "nccl:all_reduce": "all_reduce", "allreduce": "all_reduce",
        "c10d::_allgather_base_": "all_gather", "_allgather_base": "all_gather", "all_gather": "all_gather",
        "c10d::allgather_into_tensor_coalesced_": "all_gather", "c10d::_reduce_scatter_base_": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter", "c10d::alltoall_base_": "all_to_all",
        "nccl:all_to_all": "all_to_all", "gloo:all_reduce": "all_reduce", "c10d::send": "send",
        "c10d::recv_": "recv", "c10d::barrier": "barrier", "c10d::broadcast_": "broadcast",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": "all_reduce",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "all_gather",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)": "sendrecv",
        "aten::mm": None, "wait": None, "": None,
    }
    for name, kind in cases.items():
        assert normalize_kind(name) == kind, name


def test_gemm_flops():
    assert gemm_flops("aten::mm", [[8, 16], [16, 4]]) == 2 * 8 * 16 * 4
    assert gemm_flops("aten::addmm", [[4], [8, 16], [16, 4], [], []]) == 2 * 8 * 16 * 4
    assert gemm_flops("aten::bmm", [[3, 8, 16], [3, 16, 4]]) == 2 * 3 * 8 * 16 * 4
    assert np.isnan(gemm_flops("aten::mm", None)) and np.isnan(gemm_flops("aten::mm", [[8], "x"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=40))
def test_nesting_matches_brute_force(items):
    """Build a proper forest per thread by construction, then compare _nest with the brute-force innermost
    enclosing interval."""
    ts, end, key = [], [], []
    for k, a, d in items:
        ts.append(float(a * 10)); end.append(float(a * 10 + d)); key.append(k)
    ts, end, key = np.array(ts), np.array(end), np.array(key)
    # keep only intervals that nest or are disjoint with every other on the same key
    keep = []
    for i in range(len(ts)):
        ok = True
        for j in keep:
            if key[i] != key[j]:
                continue
            disjoint = end[i] <= ts[j] or end[j] <= ts[i]
            nested = (ts[i] >= ts[j] and end[i] <= end[j]) or (ts[j] >= ts[i] and end[j] <= end[i])
            same = ts[i] == ts[j] and end[i] == end[j]
            if not (disjoint or nested) or same or end[i] == ts[i] or end[j] == ts[j]:
                ok = False
        if ok:
            keep.append(i)
    ts, end, key = ts[keep], end[keep], key[keep]
    parent, depth = _nest(ts, end, key)
    for i in range(len(ts)):
        enclosing = [j for j in range(len(ts)) if j != i and key[j] == key[i] and ts[j] <= ts[i] and end[i] <= end[j]]
        if not enclosing:
            assert parent[i] == -1
        else:
            inner = min(enclosing, key=lambda j: end[j] - ts[j])
            assert parent[i] == inner
            assert depth[i] == len(enclosing)


@pytest.mark.parametrize("key,value", [("host_name", ["a", "b"]), ("host_name", {}), ("baseTimeNanoseconds", float("nan")),
                                       ("baseTimeNanoseconds", 10 ** 30), ("distributedInfo", {"rank": 1, "world_size": 10 ** 30}),
                                       ("distributedInfo", []), ("deviceProperties", {"name": 3})])
def test_odd_top_level_values(tmp_path, key, value):
    tr = fx.gloo_rank(1)
    tr[key] = value
    t = load_trace(fx.write(tr, tmp_path / "rank1.json"))
    assert t.rank_ids == [1] and len(t.collectives) == 2

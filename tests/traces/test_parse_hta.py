"""Cross-check of the parser against Holistic Trace Analysis (the field's own analyser) on real GPU traces.

The traces (A100/V100, NCCL, three PyTorch versions) live in ../shared/traces/real-gpu beside the repository;
the test copies them into a temporary folder and skips when they are absent."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from traces.parse import load_trace

hta_trace = pytest.importorskip("hta.common.trace", reason="holistictraceanalysis (dev dependency) not installed")

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "real-gpu"
NAMES = ["a100_cnn_ddp_rank0_of2", "a100_recsys_rank3_of8", "v100_ddp_rank1_of2"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    if not all((REAL / f"{n}.json.gz").exists() for n in NAMES):
        pytest.skip(f"real GPU traces not found in {REAL.resolve()} (the CI checkout has ../shared beside the repo)")
    d = tmp_path_factory.mktemp("real-gpu")
    for n in NAMES:
        shutil.copy(REAL / f"{n}.json.gz", d / f"{n}.json.gz")
    return d


def _hta(path: Path):
    logging.getLogger("hta").setLevel(logging.ERROR)
    _meta, df, sym = hta_trace.parse_trace_file(str(path))
    names = sym.get_sym_table()
    df = df.assign(s_name=df["name"].map(lambda i: names[i]), s_cat=df["cat"].map(lambda i: names[i]))
    return df


@pytest.mark.parametrize("name", NAMES)
def test_same_as_hta(copies, name):
    path = copies / f"{name}.json.gz"
    ref = _hta(path)
    t = load_trace(path)
    # steps: same iterations, same durations (HTA rounds ns-resolution times to whole microseconds: ts up, end
    # down, so its durations are up to 2 us shorter)
    hs = ref[ref["s_name"].str.startswith("ProfilerStep")].sort_values("ts")
    assert list(t.steps["step"]) == [int(s.split("#")[1]) for s in hs["s_name"]]
    assert np.allclose(t.steps["dur"].to_numpy() * 1e6, hs["dur"].to_numpy(), atol=2.0)
    # kernels: count, total duration, per-iteration counts (HTA links GPU events to iterations by correlation)
    hk = ref[ref["s_cat"] == "kernel"]
    ok = t.kernels[t.kernels["cat"] == "kernel"]
    assert len(ok) == len(hk)
    assert ok["dur"].sum() * 1e6 == pytest.approx(hk["dur"].sum(), abs=len(hk) * 2.0)
    assert ok[ok["step"] >= 0].groupby("step").size().to_dict() == \
        hk[hk["iteration"] >= 0].groupby("iteration").size().to_dict()
    # GPU memcpy / memset too
    for cat in ("gpu_memcpy", "gpu_memset"):
        assert (t.kernels["cat"] == cat).sum() == (ref["s_cat"] == cat).sum()
    # collective kernels: one collective per NCCL kernel, same durations
    hc = hk[hk["s_name"].str.contains("nccl", case=False)].sort_values("ts")
    assert len(t.collectives) == len(hc)
    assert np.allclose(np.sort(t.collectives["dur"].to_numpy() * 1e6), np.sort(hc["dur"].to_numpy()), atol=2.0)
    assert t.collectives["timing"].eq("gpu").all()
    # CPU ops and runtime calls
    for cat in ("cpu_op", "user_annotation", "cuda_runtime"):
        assert (t.cpu_ops["cat"] == cat).sum() == (ref["s_cat"] == cat).sum(), cat


def test_known_facts(copies):
    """What the README of the real traces says, seen through the parser."""
    t = load_trace(copies / "a100_cnn_ddp_rank0_of2.json.gz")
    c = t.collectives
    assert t.rank_ids == [0] and t.world_size == 2 and t.device(0) == "NVIDIA A100-PG509-200"
    assert c["size_bytes"].notna().all() and set(c["kind"]) == {"all_reduce", "broadcast"}
    assert (c["group_ranks"] == (0, 1)).all()
    # sizes: In msg nelems x dtype
    first = c[c["kind"] == "all_reduce"].iloc[0]
    assert first["size_bytes"] == first["in_nelems"] * 4
    r = load_trace(copies / "a100_recsys_rank3_of8.json.gz")
    assert r.rank_ids == [3] and r.world_size == 8
    assert set(r.collectives["kind"]) == {"all_to_all", "all_reduce"}
    # no size args there, but the nccl:<op> annotations carry Input Dims
    ar = r.collectives[r.collectives["kind"] == "all_reduce"]
    assert ar["in_nelems"].notna().all() and (ar["size_bytes"] == ar["in_nelems"] * 4).all()
    v = load_trace(copies / "v100_ddp_rank1_of2.json.gz")      # recorded without shapes: sizes unknown
    assert len(v.collectives) == 2020 and v.collectives["size_bytes"].isna().all()

"""Benchmark: 16,384 identical rank ETs on a 3-D switch network through ``clustersim chakra run``.

Writes a transformer-like step per rank (compute nodes with FLOPs and bytes, data-parallel all-reduces over
all three dimensions, tensor-parallel all-reduces on dimension 0, an all-to-all on dimension 1) as
16,384 files, then runs the command in this process and prints wall time and peak resident memory.
Acceptance: under 5 s and 1 GB. Usage: python benchmarks/chakra_scale.py [--ranks-per-dim 16 32 32]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clustersim.cli import main  # noqa: E402
from traces.chakra import schema as S  # noqa: E402
from traces.chakra.wire import delimited, encode  # noqa: E402


def workload_bytes(layers: int = 32) -> bytes:
    """One rank's ET: per layer forward compute, TP all-reduce (dim 0), MoE all-to-all (dim 1); then
    backward per layer and a gradient all-reduce over all dimensions."""
    out = [delimited(encode({"version": "0.0.4"}, S.SCHEMA, "GlobalMetadata"))]
    nid, prev = 0, None

    def node(name, ntype, attrs, deps):
        nonlocal nid
        nid += 1
        msg = {"id": nid, "name": name, "type": ntype, "data_deps": deps,
               "attr": [S.make_attr(k, v) for k, v in attrs.items()]}
        out.append(delimited(encode(msg, S.SCHEMA, "Node")))
        return nid

    for i in range(layers):
        c = node(f"fwd{i}", S.COMP_NODE, {"is_cpu_op": False, "num_ops": 4 * 10**12, "tensor_size": 2 * 10**9},
                 [prev] if prev else [])
        t = node(f"tp_ar{i}", S.COMM_COLL_NODE, {"comm_type": S.ALL_REDUCE, "comm_size": 32 * 2**20,
                                                 "involved_dim": [True, False, False]}, [c])
        prev = node(f"a2a{i}", S.COMM_COLL_NODE, {"comm_type": S.ALL_TO_ALL, "comm_size": 16 * 2**20,
                                                  "involved_dim": [False, True, False]}, [t])
    for i in reversed(range(layers)):
        prev = node(f"bwd{i}", S.COMP_NODE, {"is_cpu_op": False, "num_ops": 8 * 10**12, "tensor_size": 4 * 10**9},
                    [prev])
        node(f"grad_ar{i}", S.COMM_COLL_NODE, {"comm_type": S.ALL_REDUCE, "comm_size": 64 * 2**20,
                                               "involved_dim": [True, True, True]}, [prev])
    return b"".join(out)


def main_bench(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks-per-dim", type=int, nargs=3, default=[16, 32, 32])
    args = ap.parse_args(argv)
    dims = args.ranks_per_dim
    world = dims[0] * dims[1] * dims[2]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        data = workload_bytes()
        t0 = time.perf_counter()
        for r in range(world):
            (d / f"w.{r}.et").write_bytes(data)
        t_write = time.perf_counter() - t0
        (d / "net.yml").write_text(f"topology: [ Switch, Switch, Switch ]\nnpus_count: [ {dims[0]}, {dims[1]}, {dims[2]} ]\n"
                                   "bandwidth: [ 400.0, 100.0, 50.0 ]\nlatency: [ 500.0, 1000.0, 2000.0 ]\n")
        (d / "sys.json").write_text(json.dumps({
            "scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
            "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring", "ring", "ring"],
            "all-to-all-implementation": ["ring", "ring", "ring"], "collective-optimization": "localBWAware",
            "local-mem-bw": 3350, "roofline-enabled": 1, "peak-perf": 989}))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            rc = main(["chakra", "run", str(d / "w"), "--network", str(d / "net.yml"), "--system", str(d / "sys.json"),
                       "--json"])
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
        if rc != 0:
            print(buf.getvalue())
            return rc
        res = json.loads(buf.getvalue())
    print(f"ranks {world} ({dims[0]}x{dims[1]}x{dims[2]} switch), {len(data):,} bytes per rank ET "
          f"(files written in {t_write:.2f} s)")
    print(f"clustersim chakra run: wall {wall:.2f} s, peak RSS {rss:,.0f} MiB (before run {rss0 / 1024:,.0f} MiB), "
          f"mode {res['mode']}, classes {res['classes']}, ops simulated {res['events_simulated']:,} "
          f"(represent {res['represented_ops']:,}), step {res['step_time_s']:.6f} s, "
          f"exposed comm {res['exposed_comm_fraction']:.1%}")
    ok = wall < 5 and rss < 1024
    print("PASS" if ok else "FAIL", "(< 5 s and < 1 GB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main_bench())

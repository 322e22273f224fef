"""Hostile and large inputs (issue 19): each case runs ``clustersim`` once in a fresh process and reports its
exit code, wall time, peak resident memory and the acceptance bound (2 x the input's decompressed size +
200 MB). A bomb must be rejected (exit 2, one line) or processed within the bound, in linear time; the
realistic trace must replay.

    python benchmarks/input_bombs.py                     # every case, default sizes (a few minutes of CPU)
    python benchmarks/input_bombs.py --case gzip-string --string-gib 2
    python benchmarks/input_bombs.py --case realistic --trace-mb 1000

Inputs are generated in a temporary folder (``--keep DIR`` keeps them). The realistic trace replicates the
steps of a real A100 rank (``/work/shared/traces/real-gpu/a100_cnn_ddp_rank0_of2.json.gz``, HTA test data) with
shifted times and renumbered steps / correlation ids until it reaches ``--trace-mb`` of JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = Path("/work/shared/traces/real-gpu/a100_cnn_ddp_rank0_of2.json.gz")
MB = 1e6


# ---------------------------------------------------------------------------------------------- generators
def _gzip_stream(path: Path, parts) -> int:
    """Write the byte strings of ``parts`` gzip-compressed (level 1); returns the decompressed size."""
    n = 0
    with gzip.open(path, "wb", compresslevel=1) as f:
        for p in parts:
            f.write(p)
            n += len(p)
    return n


def gen_gzip_string(d: Path, gib: float) -> tuple[list, int]:
    """One JSON string of ``gib`` GiB inside a small gzip (the 2 MB / 2 GiB probe)."""
    p = d / "string.json.gz"
    chunk = b"a" * (1 << 24)
    n = int(gib * (1 << 30)) // len(chunk)
    size = _gzip_stream(p, [b'{"traceEvents":[{"name":"', *([chunk] * n), b'"}]}'])
    return ["replay", p], size


def gen_tiny_events(d: Path, millions: float) -> tuple[list, int]:
    """``millions`` M tiny complete events (the 3.6 MB / 14 M events probe)."""
    p = d / "tiny.json.gz"
    ev = b'{"ph":"X","cat":"cpu_op","ts":1},'
    block = ev * 100_000
    n = int(millions * 10)
    size = _gzip_stream(p, [b'{"traceEvents":[', *([block] * n),
                            b'{"ph":"X","cat":"cpu_op","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":9}]}'])
    return ["replay", p], size


def gen_deep(d: Path) -> tuple[list, int]:
    p = d / "deep.json"
    p.write_text('{"traceEvents":[' + "[" * 1_000_000 + "]" * 1_000_000 + "]}")
    return ["replay", p], p.stat().st_size


def gen_alias_bomb(d: Path) -> tuple[list, int]:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("model: *a9")
    p = d / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    return ["simulate", "-c", p], p.stat().st_size


def gen_dup_keys(d: Path) -> tuple[list, int]:
    p = d / "dup.json"
    p.write_text("{" + ",".join(f'"k{i}": {i}' for i in range(60_000)) + ', "k7": 0}')
    return ["simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--global-batch", "8",
            "--calibration", p], p.stat().st_size


def gen_realistic(d: Path, mb: float) -> tuple[list, int]:
    """A one-rank trace of ``mb`` MB of JSON built from a real A100 rank's steps."""
    data = json.loads(gzip.decompress(REAL.read_bytes()))
    events = data.pop("traceEvents")
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000.0
    steps = [int(e["name"].split("#")[1]) for e in xs if str(e.get("name", "")).startswith("ProfilerStep#")]
    nsteps = max(steps) - min(steps) + 1 if steps else 1
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    id_span = 1 + max([int(e.get("args", {}).get(k, 0)) for e in body for k in ("correlation", "External id")
                       if isinstance(e.get("args", {}).get(k), int)] or [0])
    one = len(json.dumps(body).encode())
    copies = max(1, int(mb * MB / one))
    p = d / "realistic.json.gz"

    def parts():
        head = json.dumps(data)[:-1].encode() + b', "traceEvents": ['
        yield head + json.dumps(meta)[1:-1].encode()
        for k in range(copies):
            out = []
            for e in body:
                e = dict(e)
                if "ts" in e:
                    e["ts"] = e["ts"] + k * span
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * nsteps}"
                a = e.get("args")
                if isinstance(a, dict):
                    a = dict(a)
                    for key in ("correlation", "External id"):
                        if isinstance(a.get(key), int):
                            a[key] += k * id_span
                    e["args"] = a
                out.append(json.dumps(e))
            yield b"," + ",".join(out).encode()
        yield b"]}"
    size = _gzip_stream(p, parts())
    return ["replay", p], size


# ---------------------------------------------------------------------------------------------- runner
def run_one(args: list) -> dict:
    """Run ``clustersim ARGS`` in this process; report exit code, seconds, peak RSS, first stderr line."""
    import contextlib
    import io
    sys.path.insert(0, str(ROOT))
    from clustersim.cli import main
    err, out = io.StringIO(), io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main([str(a) for a in args])
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    return {"rc": rc, "wall_s": wall, "peak_rss_bytes": peak,
            "message": (err.getvalue().strip().splitlines() or [""])[0][:160],
            "tracebacks": err.getvalue().count("Traceback")}


CASES = ("gzip-string", "tiny-events", "deep-json", "yaml-alias-bomb", "dev-zero", "dev-urandom",
         "global-batch", "dup-keys", "realistic")


def build(case: str, d: Path, a) -> tuple[list, int]:
    if case == "gzip-string":
        return gen_gzip_string(d, a.string_gib)
    if case == "tiny-events":
        return gen_tiny_events(d, a.tiny_millions)
    if case == "deep-json":
        return gen_deep(d)
    if case == "yaml-alias-bomb":
        return gen_alias_bomb(d)
    if case == "dev-zero":
        return ["simulate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--calibration", "/dev/zero"], 0
    if case == "dev-urandom":
        return ["simulate", "-c", "/dev/urandom"], 0
    if case == "global-batch":
        return ["simulate", "--model", "llama3-8b", "--gpus", "16", "--tp", "8", "--global-batch", "1000000000"], 0
    if case == "dup-keys":
        return gen_dup_keys(d)
    if case == "realistic":
        return gen_realistic(d, a.trace_mb)
    raise SystemExit(f"unknown case {case}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", choices=CASES, help="run only these cases")
    ap.add_argument("--string-gib", type=float, default=2.0)
    ap.add_argument("--tiny-millions", type=float, default=14.0)
    ap.add_argument("--trace-mb", type=float, default=200.0)
    ap.add_argument("--keep", type=Path, help="generate the inputs here and keep them")
    ap.add_argument("--one", help=argparse.SUPPRESS)       # internal: run one prepared command (JSON argv)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(json.loads(a.one))))
        return 0
    d = a.keep or Path(tempfile.mkdtemp(prefix="clustersim-bombs-"))
    d.mkdir(parents=True, exist_ok=True)
    print(f"{'case':<16} {'input MB':>9} {'rc':>3} {'wall s':>7} {'peak MB':>8} {'bound MB':>9}  verdict / message")
    bad = 0
    for case in a.case or CASES:
        t = time.perf_counter()
        args, size = build(case, d, a)
        gen_s = time.perf_counter() - t
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps([str(x) for x in args])],
                              capture_output=True, text=True, cwd=d, timeout=1800)
        try:
            r = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            r = {"rc": proc.returncode, "wall_s": float("nan"), "peak_rss_bytes": float("nan"),
                 "message": proc.stderr.strip()[-160:], "tracebacks": proc.stderr.count("Traceback")}
        bound = 2 * size + 200 * MB
        ok = r["rc"] in (0, 2) and r["tracebacks"] == 0 and r["peak_rss_bytes"] <= bound
        bad += not ok
        print(f"{case:<16} {size / MB:>9.1f} {r['rc']:>3} {r['wall_s']:>7.1f} {r['peak_rss_bytes'] / MB:>8.0f} "
              f"{bound / MB:>9.0f}  {'ok' if ok else 'FAIL'}: {r['message'][:90]} (inputs {gen_s:.0f} s)",
              flush=True)
        if not a.keep:
            for f in d.iterdir():
                f.unlink()
    if not a.keep:
        os.rmdir(d)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

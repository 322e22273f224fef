"""``clustersim collect``: launch the trace collector (traces.collect) under torchrun on a free local port.

Does not import torch: torchrun runs as a subprocess (``python -m torch.distributed.run``), so the rest of
clustersim works without torch and this command says clearly when torch is missing.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import click

from simulator.errors import ClusterSimError, ConfigError

STRATEGIES = ("ddp", "zero1", "fsdp", "tp", "pp", "ep")     # as traces.strategies.STRATEGIES (no torch here)
SAY = "collect| "     # traces.collect prefixes the lines meant for the user with this

# glibc malloc returns every block above its mmap threshold (128 KiB at first) to the kernel on free, so each
# new activation of that size page-faults again; on a virtual machine a first touch costs microseconds per
# 4 KiB page, which made a 1.4 MB elementwise op 10-30x slower than its memory traffic and the step noisy
# (measured: FSDP 266 -> 135 ms, DDP 135..189 -> 120 ms on 2 cores). PyTorch's CPU performance tuning guide
# recommends an allocator that reuses memory (jemalloc / TCMalloc); these mallopt(3) settings do that with
# glibc itself. Applied only where the caller's environment does not set them; recorded in the manifest.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


class CollectError(ClusterSimError):
    """The collector run failed (torch missing, a rank crashed, timeout)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, collect_args: list[str], port: int | None = None) -> list[str]:
    """The torchrun command line running ``traces.collect`` with ``collect_args`` on ``nproc`` local ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(port or free_port()),
            "-m", "traces.collect", *collect_args]


def launch(nproc: int, collect_args: list[str], timeout_s: float = 900.0, quiet: bool = False,
           cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run the collector under torchrun; raise CollectError (with the failing rank's last lines) on failure.

    ``cwd`` defaults to the directory holding the ``traces`` package, so ``-m traces.collect`` resolves
    whether or not clustersim is installed."""
    if importlib.util.find_spec("torch") is None:
        raise CollectError("clustersim collect needs PyTorch, which is not installed in this Python "
                           f"({sys.executable}); install it with `pip install 'clustersim[collect]'` "
                           "(or `pip install torch`)")
    if nproc < 1:
        raise ConfigError(f"--nproc-per-node must be >= 1, got {nproc}")
    root = Path(cwd) if cwd else Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in MALLOC_ENV.items():
        env.setdefault(k, v)
    cmd = torchrun_command(nproc, collect_args)
    if "--out" in collect_args:     # a log of an earlier failed run would mislead
        Path(collect_args[collect_args.index("--out") + 1], "collect.log").unlink(missing_ok=True)
    proc = subprocess.Popen(cmd, cwd=root, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    timer = threading.Timer(timeout_s, _kill_group, (proc,))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(SAY) and not quiet:
                click.echo(line[len(SAY):].rstrip("\n"))
        proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode != 0
        timer.cancel()
    output = "".join(lines)
    if proc.returncode != 0:
        log = _save_log(collect_args, f"command: {' '.join(cmd)}\n" + output)
        if timed_out:
            raise CollectError(f"the collector did not finish within {timeout_s:.0f} s (a hung collective?); "
                               f"full output in {log}")
        raise CollectError(f"the collector failed (exit {proc.returncode}): {_reason(output)} "
                           f"(command and full output in {log})")
    return subprocess.CompletedProcess(cmd, proc.returncode, output, "")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill torchrun and its workers: the process group (session) we started for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _save_log(collect_args: list[str], output: str) -> Path:
    """Write a failed run's output to OUT/collect.log (or a temporary file) and return its path."""
    out = Path(collect_args[collect_args.index("--out") + 1]) if "--out" in collect_args else None
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "collect.log"
    except (OSError, AttributeError):
        fd, name = tempfile.mkstemp(prefix="clustersim-collect-", suffix=".log")
        os.close(fd)
        path = Path(name)
    path.write_text(output)
    return path


def _reason(output: str) -> str:
    """The most telling line of a failed run: the collector's own error, else the last exception line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("traces.collect: error:") or "collect.py: error:" in ln:
            return ln
    for ln in reversed(lines):
        if "Error" in ln or "error:" in ln or "terminate called" in ln:
            return ln
    return lines[-1] if lines else "no output"


@click.command("collect")
@click.option("--strategy", type=click.Choice(STRATEGIES), default="ddp", show_default=True,
              help="parallel strategy to train with")
@click.option("--nproc-per-node", "nproc", type=int, default=2, show_default=True, help="ranks (processes)")
@click.option("--steps", type=int, default=5, show_default=True, help="training steps (the last ones profiled)")
@click.option("--active", type=int, default=0, help="profiled steps (0: min(3, steps - 2))")
@click.option("--layers", type=int, default=4, show_default=True)
@click.option("--hidden", type=int, default=128, show_default=True)
@click.option("--heads", type=int, default=4, show_default=True)
@click.option("--seq", type=int, default=64, show_default=True)
@click.option("--batch", type=int, default=8, show_default=True, help="samples per data-parallel rank per step")
@click.option("--vocab", type=int, default=512, show_default=True)
@click.option("--ffn", type=int, default=0, help="SwiGLU width (0: 8/3 hidden)")
@click.option("--bucket-cap-mb", type=float, default=25.0, show_default=True, help="DDP/ZeRO-1 bucket (MiB)")
@click.option("--microbatches", type=int, default=4, show_default=True, help="pipeline micro-batches (pp)")
@click.option("--experts", type=int, default=0, help="experts per layer (ep; 0: 2 x ranks)")
@click.option("--top-k", type=int, default=1, show_default=True, help="experts per token (ep)")
@click.option("--capacity-factor", type=float, default=1.0, show_default=True, help="expert capacity factor (ep)")
@click.option("--dtype", type=click.Choice(("auto", "float32", "bfloat16")), default="auto", show_default=True)
@click.option("--backend", type=click.Choice(("auto", "gloo", "nccl")), default="auto", show_default=True,
              help="auto: nccl with GPUs, gloo on CPU")
@click.option("--bench", type=click.Choice(("collectives", "layers")), default=None,
              help="instead of training: the collective benchmark, or one block's forward / backward times "
                   "at a grid of shapes (the model shape, its TP shards, micro-batches up to --batch)")
@click.option("--max-bytes", type=int, default=0, help="benchmark: largest size in bytes (0: automatic)")
@click.option("--size-factor", type=int, default=2, show_default=True, help="benchmark: ratio of successive sizes")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True,
              help="seconds before the run is killed")
@click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="output directory")
def collect(strategy, nproc, steps, active, layers, hidden, heads, seq, batch, vocab, ffn, bucket_cap_mb,
            microbatches, experts, top_k, capacity_factor, dtype, backend, bench, max_bytes, size_factor, timeout_s, out):
    """Train a small Llama-style model with STRATEGY under torch.profiler (or benchmark collectives or
    layers) on NPROC local ranks; write per-rank Kineto traces and manifest.json to OUT."""
    args = ["--strategy", strategy, "--steps", str(steps), "--active", str(active), "--layers", str(layers),
            "--hidden", str(hidden), "--heads", str(heads), "--seq", str(seq), "--batch", str(batch),
            "--vocab", str(vocab), "--ffn", str(ffn), "--bucket-cap-mb", str(bucket_cap_mb),
            "--microbatches", str(microbatches), "--experts", str(experts), "--top-k", str(top_k),
            "--capacity-factor", str(capacity_factor), "--dtype", dtype,
            "--backend", backend, "--max-bytes", str(max_bytes), "--size-factor", str(size_factor), "--out", str(Path(out).resolve())]
    if bench:
        args += ["--bench", bench]
    launch(nproc, args, timeout_s=timeout_s)

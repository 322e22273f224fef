"""Launch the trace collector (``traces.collect``) under torchrun on a free local port.

Does not import torch: torchrun runs as a subprocess (``python -m torch.distributed.run``), so the rest of
clustersim works without torch and the launcher says clearly when torch is missing. Used by
``clustersim collect``, ``traces.capture`` and ``benchmarks/closed_loop.py``.
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


def schedule_problem(steps: int, active: int) -> str | None:
    """Why ``--steps`` / ``--active`` cannot make a profiler schedule (None when they can): the collector
    waits one step, warms up one and records ``active`` (0: min(3, steps - 2)). Torch-free, so that
    ``clustersim collect`` refuses them before launching torchrun."""
    if steps < 3:
        return f"--steps must be >= 3 (one to wait, one to warm up, one to record), got {steps}"
    active = active or min(3, steps - 2)
    if not 1 <= active <= steps - 2:
        return f"--active must be in 1..steps-2 = {steps - 2}, got {active}"
    return None


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
    if "--out" in collect_args:     # files of an earlier run (a log, traces of more ranks) would mislead
        clear_previous_run(Path(collect_args[collect_args.index("--out") + 1]))
    from traces.lifetime import die_with_parent
    # torchrun and its ranks run in their own process group (a Ctrl-C in the terminal reaches clustersim
    # only), which clustersim kills on every way out: normal return, error, Ctrl-C, SIGTERM / SIGHUP (turned
    # into an exception below); SIGKILL of clustersim kills torchrun by PR_SET_PDEATHSIG, and each rank
    # dies with torchrun the same way (traces.collect.main)
    proc = subprocess.Popen(cmd, cwd=root, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    lines: list[str] = []
    timer = threading.Timer(timeout_s, _kill_group, (proc,))
    timer.start()
    old = _raise_on_signals()
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(SAY) and not quiet:
                print(line[len(SAY):].rstrip("\n"), flush=True)
        proc.wait()
    finally:
        timed_out = not timer.is_alive() and proc.returncode != 0
        timer.cancel()
        _kill_group(proc)               # stragglers of a finished run, or everything on an interrupt
        _restore_signals(old)
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
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Interrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP while the collector runs (handled like Ctrl-C: the collector is stopped)."""


def _raise_on_signals() -> dict:
    """Turn SIGTERM and SIGHUP into an exception while the collector runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)
    return {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}


def _restore_signals(old: dict) -> None:
    for s, h in old.items():
        signal.signal(s, h)


def clear_previous_run(out: Path) -> list[Path]:
    """Remove what an earlier collector run left in ``out`` (manifest.json, rankN trace files, collect.log,
    hidden temporary traces) so that a run with fewer ranks does not leave the others' traces behind;
    other files are left alone. Returns the removed paths."""
    import re
    pat = re.compile(r"^(manifest\.json|collect\.log|rank\d+\.json(\.gz)?|\.rank\d+\.json(\.gz)?\.tmp.*)$")
    removed = []
    if not out.is_dir():
        return removed
    for p in out.iterdir():
        if pat.match(p.name) and (p.is_file() or p.is_symlink()):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


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
    from simulator.atomic import write_text
    return write_text(path, output)


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

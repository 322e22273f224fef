"""What every mode of the collector shares (imports torch): user messages, device identity and the run
manifest. ``traces.collect`` (training) and ``traces.bench_collectives`` / ``traces.bench_layers`` (benchmarks)
import it; it imports neither."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

MANIFEST_FORMAT = "clustersim-trace-manifest"
MANIFEST_VERSION = 1
TRACE_SUFFIX = ".json.gz"   # per-rank traces are rank{r}.json.gz (torch.profiler gzips on this suffix)
SAY = "collect| "       # prefix of the lines meant for the user (clustersim collect echoes only those)


class UsageError(Exception):
    """Arguments or a model / plan that cannot run; reported by rank 0 as one line."""


def say(message: str) -> None:
    print(SAY + message, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine())


def nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a torch built without NCCL
        return None
    if v is None:
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def rank_info(device: torch.device) -> dict:
    info = {"rank": dist.get_rank(), "hostname": socket.gethostname(), "device": device_name(device),
            "device_type": device.type, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(memory_bytes=props.total_memory, sm_count=props.multi_processor_count,
                    compute_capability=f"{props.major}.{props.minor}")
    else:
        info.update(threads=torch.get_num_threads(), cpu_count=os.cpu_count())
    return info


def base_manifest(args, backend: str, device: torch.device, infos: list[dict]) -> dict:
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": dist.get_world_size(), "backend": backend, "device_type": device.type,
        "devices": [i["device"] for i in infos], "hostnames": [i["hostname"] for i in infos],
        "scope": "intra" if len({i["hostname"] for i in infos}) == 1 else "inter",
        "ranks": infos,
        "torch_version": torch.__version__, "nccl_version": nccl_version() if backend == "nccl" else None,
        "cuda_version": torch.version.cuda, "python_version": platform.python_version(),
        "argv": sys.argv[1:],
        # settings that change host-side timing (threads, glibc malloc behaviour), as the ranks ran with them
        "environment": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_",
                                                   "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD") if k in os.environ},
        # runnable processes per core on rank 0's host (1, 5, 15 min) when the manifest was written: timings
        # taken while other work shared the cores are slower than the machine is
        "load_average": [round(x / (os.cpu_count() or 1), 2) for x in os.getloadavg()]
        if hasattr(os, "getloadavg") else None,
    }


def write_bench_manifest(args, backend: str, device: torch.device, out: Path, fields: dict) -> Path | None:
    """Collective step: gather every rank's info; rank 0 writes DIR/manifest.json (base manifest + ``fields``,
    which set ``bench``, ``method`` and ``results``) and returns its path; other ranks return None."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rank_info(device))
    if dist.get_rank() != 0:
        return None
    manifest = base_manifest(args, backend, device, gathered)
    manifest.update({"mode": "bench", "strategy": None, **fields})
    write_json(out / "manifest.json", manifest)
    return out / "manifest.json"


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)

"""``clustersim validate collectives``: published collective measurements against the cost model.

    clustersim validate collectives [--data DIR] [--rows] [--plot FILE] [--json]


``collective_rows`` reads ../shared/validation/collectives.csv (nccl-tests / all_reduce_bench busbw per
size), ``moe_rows`` moe_alltoall.csv (DeepEP dispatch/combine); each row is mapped onto a bundled preset
(``express``) or listed with the reason it cannot be. Predictions come from the cluster cost model with no
calibration (NCCL's model, topologies.nccl, in the tuning model of the NCCL release the row states; the
newest where it states none), errors are (predicted - published) / published busbw. A row runs as its source
ran it: the algorithm it forced (``forced_algorithm``), the NCCL environment of its platform profile
(``A3_MEGA_TCPXO_PROFILE``), the latency its network plugin reports (``net_latency_us``), and the benchmark's
host launches (``harness``) or a framework's per-call host time (``host_overhead_s``; topologies.nccl.harness_time_s).

Mapping of platforms onto presets, each from the platform's published specification:
- Azure ND H100 v5 / ND H200 v5 / ND A100 v4, DGX and "8x" nodes: dgx-h100 / dgx-h200 / dgx-a100.
- GCP A3 Mega: 8x H100 with 8 NICs of 200 Gb/s (GPUDirect-TCPXO, Ethernet; cloud.google.com A3 Mega
  machine type: 1,800 Gb/s per VM of which 8 x 200 Gb/s for GPUs) -> dgx-h100, nic 25 GB/s, Ethernet.
- AWS p5en (H200): EFA 3,200 Gb/s per 8 GPUs = 400 Gb/s per GPU (AWS instance page) -> dgx-h200, Ethernet.
- AWS p6-b200: 8x B200, EFA v4 8 x 400 Gb/s (row notes) -> dgx-b200, Ethernet.
- GB200 NVL72 (CoreWeave): gb200-nvl72, one rack of 72.
- DeepEP H800: dgx-h100 with the H800's NVLink of 400 GB/s bidirectional (200 GB/s per direction; H800
  datasheet) and CX7 400 Gb/s.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import click

from clustersim.paths import NonEmptyPath
from simulator.errors import ConfigError
from topologies import nccl_constants as NCCL_C

DATA_FILES = ("collectives.csv", "moe_alltoall.csv")
# H800: the H100 die with 8 NVLinks = 400 GB/s bidirectional -> 200 GB/s per direction (NVIDIA H800 SXM
# datasheet; DeepEP's "~160 GB/s NVLink max" is the achievable figure); CX7 400 Gb/s per GPU.
H800_SCALE_UP_BYTES_PER_S = 200e9
# DeepEP FP8 dispatch: 1 byte per element plus one fp32 scale per 128 channels (DeepEP README: FP8 with
# per-128-channel scales); BF16 combine: 2 bytes per element.
FP8_SCALE_GROUP = 128

# The GCP A3 Mega run (create-a3mega-ztan-fork@02dd8f45: startup_script.sh installs the GPUDirect-TCPXO plugin
# image nccl-plugin-gpudirecttcpx-dev:v1.0.3, README runs nccl-tests after `source nccl-env-profile.sh`) ran
# with that release's NCCL profile, as GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo/
# README.md lists it (release of Jun 27, 2024, v1.0.3): NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple,
# NCCL_NVLS_ENABLE=0, with NCCL 2.21.5 (the image's libnccl.so.2.21.5; the script also builds 2.22.3, the
# same tuning model here).
A3_MEGA_TCPXO_PROFILE = {"env": {"algorithms": ("ring", "tree"), "protocols": ("simple",)},
                         "nccl_version": "2.21.5"}

BANDS = (("< 64 KiB", 0, 64 * 1024), ("64 KiB - 1 MiB", 64 * 1024, 1024**2), (">= 1 MiB", 1024**2, math.inf))


@dataclass
class Row:
    """One published row and its prediction (busbw GB/s; time s)."""

    source: str
    hardware: str
    collective: str
    size_bytes: float
    ranks: int
    published_busbw: float | None
    published_time_s: float | None
    preset: str | None = None
    reason: str | None = None
    gpus: int = 0
    group: tuple = ()
    overrides: dict = field(default_factory=dict)
    algorithm: str | None = None      # forced NCCL algorithm the row states
    nccl_version: str | None = None   # NCCL release the row states (its tuner picks the algorithm)
    net_plugin: str | None = None     # third-party network plugin the multi-node run went through
    env: dict = field(default_factory=dict)   # NCCL_ALGO / NCCL_PROTO sets the run's environment fixed
    net_latency_us: float = 0.0       # latency the run's network plugin reports to NCCL
    gpus_per_thread: int = 1          # GPUs one host thread drove (nccl-tests -g N)
    blocking: bool = False            # each call timed on its own, synchronised (nccl-tests -z, torch bench)
    host_s: float | None = None       # a framework's host seconds per call (torch.distributed), else launches
    label: str = ""                   # hardware label for grouping
    predicted_busbw: float | None = None
    predicted_time_s: float | None = None
    chosen: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def error(self) -> float | None:
        if self.predicted_busbw is None or not self.published_busbw:
            return None
        return (self.predicted_busbw - self.published_busbw) / self.published_busbw

    @property
    def time_ratio(self) -> float | None:
        """Predicted over published time (published: the row's time, else size x bus factor / busbw)."""
        if self.predicted_time_s is None or self.collective.startswith("moe_"):
            return None
        t = self.published_time_s
        if not t and self.published_busbw:
            from simulator.calibration import bus_factor
            t = self.size_bytes * bus_factor(self.collective, self.ranks) / (self.published_busbw * 1e9)
        return self.predicted_time_s / t if t else None

    @property
    def band(self) -> str:
        if self.collective.startswith("moe_"):
            return "MoE (DeepEP normal)"
        for name, lo, hi in BANDS:
            if lo <= self.size_bytes < hi:
                return name
        return BANDS[-1][0]


COLUMNS = {
    "collectives.csv": ("source", "hardware", "platform", "collective", "size_bytes", "nodes", "gpus_per_node",
                        "total_gpus", "busbw_GBps", "time_s", "placement", "algorithm", "nccl_version"),
    "moe_alltoall.csv": ("source", "hardware", "op", "ep_size", "bottleneck_bandwidth_GBps", "latency_s",
                         "kernel_mode", "library_version", "tokens_per_batch", "hidden", "dispatch_dtype",
                         "combine_dtype", "link"),
}


def _read(path: Path) -> list[dict]:
    from simulator.inputs import load_csv
    return load_csv(path, "published data file", required=COLUMNS.get(path.name, ()))


def _rows(path: Path, make) -> list[Row]:
    """``make(row)`` for every row of ``path``; a value that does not parse is an error naming the row."""
    from simulator.inputs import brief
    out = []
    for i, r in enumerate(_read(path), 1):
        try:
            out.append(make(r))
        except (ValueError, TypeError, AttributeError, OverflowError, ZeroDivisionError) as e:
            raise ConfigError(f"{path}: data row {i}: cannot read it ({brief(str(e), 100)})") from None
    return out


def _num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def express(r: dict) -> dict:
    """Preset, GPUs, overrides, label of a collectives.csv row, or {"reason": ...}."""
    hw, plat = r["hardware"], r["platform"]
    nodes = int(re.match(r"\d+", r["nodes"]).group(0))
    gpn = int(r["gpus_per_node"])
    total = int(r["total_gpus"])
    text = f"{hw} {plat}"
    out: dict = {"overrides": {}}
    if "GB200" in text:
        out.update(preset="gb200-nvl72", gpus=72, label="GB200 NVL72", group=tuple(range(72)))
        return out if total == 72 else {"reason": "GB200 row not a full NVL72 rack"}
    if "B200" in text:
        out.update(preset="dgx-b200", label="B200")
        if nodes > 1:
            out["overrides"] = {"fabric_link": "ethernet"}
    elif "H200" in text:
        out.update(preset="dgx-h200", label="H200")
        if nodes > 1:
            out["overrides"] = {"fabric_link": "ethernet"}
    elif "H100" in text:
        out.update(preset="dgx-h100", label="H100")
        if "A3 Mega" in plat:
            out["overrides"] = {"nic_bandwidth": 25e9, "fabric_link": "ethernet"}
            out["label"] = "H100 (A3 Mega, 2 nodes)"
            out.update(A3_MEGA_TCPXO_PROFILE)
    elif "A100" in text:
        out.update(preset="dgx-a100", label="A100")
    else:
        return {"reason": f"no preset for {hw}"}
    if nodes > 1 and gpn != 8:
        return {"reason": f"{nodes} nodes of {gpn} GPUs: presets place 8 GPUs per node"}
    out["gpus"] = max(8, nodes * 8)
    if nodes == 1 and gpn != 8:
        out["label"] += f" ({gpn} GPUs)"
    # a node's first gpn GPUs per node
    out["group"] = tuple(n * 8 + i for n in range(nodes) for i in range(gpn))
    if nodes > 1 and "label" in out and "A3" not in out["label"]:
        out["label"] += f" ({nodes} nodes)"
    forced = forced_algorithm(r)
    if forced:
        out["algorithm"] = forced
    if nodes > 1 and re.search(r"p5en|p6-b200", plat):
        out["net_latency_us"] = NCCL_C.NET_PLUGIN_LATENCY_US["aws-ofi-nccl p5en/p6-b200"]
    return out


def net_plugin(r: dict) -> str | None:
    """The third-party NCCL network plugin of a multi-node row, None for one node: GCP A3 Mega runs NCCL over
    GPUDirect-TCPXO (the FasTrak plugin: create-a3mega-ztan-fork README, NCCL_NET=FasTrak), AWS p5en / p6 over
    EFA through aws-ofi-nccl (with its tuner plugin, per the rows). NCCL's tuning model has InfiniBand-class
    NET latencies; these transports are not what it describes."""
    plat = r["platform"]
    if not re.match(r"\d+", r["nodes"]) or int(re.match(r"\d+", r["nodes"]).group(0)) < 2:
        return None
    if "A3 Mega" in plat:
        return "GPUDirect-TCPXO (FasTrak)"
    if "AWS" in plat or "EFA" in r["hardware"]:
        return "AWS EFA (aws-ofi-nccl)"
    return None


def forced_algorithm(r: dict) -> str | None:
    """The NCCL algorithm a row's source says it ran with, where it forced one (NCCL_ALGO, NCCL_NVLS_ENABLE=0,
    or a benchmark that sets NCCL_ALGO itself); None where NCCL's tuner chose.

    Azure's runner (AI-benchmarking-guide@8fd0c6e1 Benchmarks/NCCLBandwidth.py) runs
    ``NCCL_ALGO=<Tree|Ring|NVLS|NVLSTree> all_reduce_perf -g 8`` and its H100 / H200 pages publish the NVLS run
    ("NCCL AllReduce (NVLS algorithm)"): NVLS is forced at every size, also where the tuner would pick ring/LL.
    The A100 page repeats that sentence, but NCCL cannot run NVLS on Ampere (with NCCL_ALGO=NVLS alone NCCL
    2.18 stops with "no algorithm/protocol available", enqueue.cc getAlgoInfo), so the A100 table is another of
    the runner's columns: left to the tuner. A row that names the algorithm NCCL ran ("Ring" for the 16 GiB
    all-gather / reduce-scatter) is forced to it, as "NCCL default choice" rows are left to the tuner."""
    alg, text = r["algorithm"].lower(), f"{r['hardware']} {r['platform']}"
    if "nvls_enable=0" in alg or "nccl_algo=allreduce:ring" in alg:
        return "ring"
    if "nvlstree" in alg and "forced" in alg:
        return "nvls_tree"
    if alg.startswith("nvls (as stated in source text)") and "Azure" in text and "A100" not in text:
        return "nvls"
    if alg == "ring":
        return "ring"
    return None


def harness(r: dict) -> tuple[int, bool]:
    """(GPUs one host thread drove, blocking) of a row's benchmark, read from its command line:
    nccl-tests ``-g N`` (default 1: one GPU per process under mpirun) and ``-z 1`` (blocking); ml-engineering's
    all_reduce_bench.py times each call between CUDA events after a barrier and synchronises (blocking, one GPU
    per process). A tool the row does not name adds nothing (1, False)."""
    tool = r.get("benchmark_tool") or ""
    m = re.search(r"-g\s*(\d+)", tool)
    g = int(m.group(1)) if m else 1
    blocking = "all_reduce_bench" in tool or bool(re.search(r"-z\s*1", tool))
    return g, blocking


def host_overhead_s(r: dict) -> float | None:
    """Host seconds per call a row's benchmark spends outside NCCL's launches: PyTorch's per-call overhead for
    ml-engineering's all_reduce_bench.py (torch.distributed, one call timed between CUDA events after a barrier:
    ``NCCL_C.TORCH_CALL_OVERHEAD_S``); None for nccl-tests, which calls NCCL's C API (its launches count)."""
    return NCCL_C.TORCH_CALL_OVERHEAD_S if "all_reduce_bench" in (r.get("benchmark_tool") or "") else None


def collective_rows(path: Path) -> list[Row]:
    return _rows(path, _collective_row)


def _size(x) -> float:
    """A message size: a finite number of bytes >= 0 (ValueError otherwise, named by the row reader)."""
    v = float(x)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"size_bytes must be a finite number >= 0, got {x!r}")
    return v


def _collective_row(r: dict) -> Row:
    mapped = express(r)
    row = Row(source=r["source"], hardware=r["hardware"], collective=r["collective"],
              size_bytes=_size(r["size_bytes"]), ranks=int(r["total_gpus"]),
              published_busbw=_num(r["busbw_GBps"]), published_time_s=_num(r["time_s"]))
    if "reason" in mapped:
        row.reason = mapped["reason"]
    else:
        row.preset, row.gpus, row.group = mapped["preset"], mapped["gpus"], mapped["group"]
        row.overrides, row.label = mapped["overrides"], mapped["label"]
        row.algorithm = mapped.get("algorithm")
        row.nccl_version = r["nccl_version"] or mapped.get("nccl_version") or None
        row.env = mapped.get("env", {})
        row.net_latency_us = mapped.get("net_latency_us", 0.0)
        row.gpus_per_thread, row.blocking = harness(r)
        row.host_s = host_overhead_s(r)
        row.net_plugin = net_plugin(r)
        row.extra = {"platform": r["platform"], "placement": r["placement"], "algorithm": r["algorithm"]}
    return row


def predict(rows: list[Row]) -> list[Row]:
    """Fill predicted busbw / time / chosen algorithm of every expressible row (no calibration)."""
    import topologies
    from simulator.calibration import bus_factor
    from simulator.costs import CommRequest
    from topologies import nccl
    from topologies.cost import ClusterCostModel

    models: dict = {}
    for row in rows:
        if row.preset is None:
            continue
        if nccl.parse_version(row.nccl_version) < nccl.C.OLDEST_RELEASE:
            row.nccl_version = None            # a release before the oldest tuning model here: the newest
        algorithm, protocol, plugin_time = row.algorithm, None, 0.0
        if row.env or row.net_latency_us:
            # NCCL_ALGO / NCCL_PROTO sets: that release's tuner picks in them; a plugin's reported latency
            # enters NCCL's model (tuning.cc latencyInter), which the cost model's communicator does not hold
            cluster = topologies.load_cluster(row.preset, row.gpus, **row.overrides)
            comm = replace(nccl.comm_of(cluster, row.group), version=nccl.parse_version(row.nccl_version),
                           net_latency_us=row.net_latency_us)
            pick = nccl.choose(comm, row.collective, row.size_bytes, row.env.get("algorithms", row.algorithm),
                               row.env.get("protocols"))
            if pick is not None:
                algorithm, protocol, plugin_time = pick.algorithm, pick.protocol, pick.time_s
        key = (row.preset, row.gpus, tuple(sorted(row.overrides.items())), algorithm, protocol, row.nccl_version)
        if key not in models:
            cluster = topologies.load_cluster(row.preset, row.gpus, **row.overrides)
            models[key] = ClusterCostModel(cluster, algorithm=algorithm, protocol=protocol,
                                           nccl_version=row.nccl_version)
        model = models[key]
        req = CommRequest(row.collective, row.group, row.size_bytes)
        # the model's time for that pick keeps the route-level bound at line rate
        t = nccl.harness_time_s(max(model.comm_time_s(req), plugin_time), row.gpus_per_thread, row.blocking,
                                row.host_s)
        row.predicted_time_s = t
        row.predicted_busbw = row.size_bytes / t / 1e9 * bus_factor(row.collective, len(row.group))
        row.chosen = model.algorithm_for(req)
    return rows


def summary(rows: list[Row]) -> list[dict]:
    """Median and max |busbw error| and median predicted / published time per hardware x collective x
    size band."""
    groups: dict = {}
    for r in rows:
        if r.error is None:
            continue
        groups.setdefault((r.label, r.collective, r.band), []).append(r)
    out = []
    for (label, coll, band), rs in sorted(groups.items()):
        a = sorted(abs(r.error) for r in rs)
        s = sorted(r.error for r in rs)
        ratios = sorted(r.time_ratio for r in rs if r.time_ratio is not None)
        out.append({"hardware": label, "collective": coll, "band": band, "rows": len(rs),
                    "median_abs_error": _median(a), "median_error": _median(s), "max_abs_error": a[-1],
                    "median_time_ratio": _median(ratios) if ratios else None})
    return out


def band_totals(rows: list[Row], without_plugins: bool = False) -> list[dict]:
    """The acceptance figures: over every compared collective row (all hardware), per size band, the median
    |busbw error| and the median predicted / published time; ``without_plugins`` leaves out the multi-node
    runs over third-party network plugins (``net_plugin``)."""
    out = []
    for name, _, _ in BANDS:
        rs = [r for r in rows if r.error is not None and not r.collective.startswith("moe_") and r.band == name
              and not (without_plugins and r.net_plugin)]
        if not rs:
            continue
        ratios = sorted(r.time_ratio for r in rs if r.time_ratio is not None)
        out.append({"band": name, "rows": len(rs), "median_abs_error": _median(sorted(abs(r.error) for r in rs)),
                    "median_time_ratio": _median(ratios) if ratios else None})
    return out


def _median(xs):
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


# ------------------------------------------------------------------------------------------ MoE (DeepEP)
def moe_rows(path: Path) -> list[Row]:
    """moe_alltoall.csv rows; DeepEP V1 normal kernels on H800 are expressed (dgx-h100 with the H800's
    NVLink), the others listed with the reason."""
    return _rows(path, _moe_row)


def _moe_row(r: dict) -> Row:
    ep = int(r["ep_size"])
    row = Row(source=r["source"], hardware=r["hardware"], collective=f"moe_{r['op']}", size_bytes=0.0,
              ranks=ep, published_busbw=_num(r["bottleneck_bandwidth_GBps"]),
              published_time_s=_num(r["latency_s"]))
    mode, lib = r["kernel_mode"].lower(), r["library_version"]
    if "V2" in lib:
        row.reason = "DeepEP V2 reports a 'logical bandwidth' that includes local-rank traffic, not a link rate"
    elif "low-latency" in mode:
        row.reason = ("low-latency kernels (per-token IBGDA messages, pure RDMA also inside a node): "
                      "no per-message RDMA model")
    elif "H800" not in r["hardware"]:
        row.reason = f"no preset for {r['hardware']}"
    else:
        tokens, hidden, topk = int(r["tokens_per_batch"]), int(r["hidden"]), 8
        dtype = r["dispatch_dtype"] if r["op"] == "dispatch" else r["combine_dtype"]
        token_bytes = hidden + hidden / FP8_SCALE_GROUP * 4 if dtype.upper() == "FP8" else 2 * hidden
        row.preset, row.gpus = "dgx-h100", max(8, ep)
        row.group = tuple(range(ep))
        row.overrides = {"scale_up_bandwidth": H800_SCALE_UP_BYTES_PER_S}
        row.label = "H800 (DeepEP)"
        row.size_bytes = tokens * token_bytes
        # DeepSeek-V3 routing: 256 routed experts, top-8 (DeepEP's benchmark setting)
        row.extra = {"tokens": tokens, "token_bytes": token_bytes, "topk": topk, "experts": 256,
                     "link": r["link"], "kernel_mode": r["kernel_mode"]}
    return row


def predict_moe(rows: list[Row]) -> list[Row]:
    """Predicted bottleneck bandwidth of the expressible MoE rows: bytes on the bottleneck link / time."""
    import topologies
    from topologies import nccl

    for row in rows:
        if row.preset is None or not row.collective.startswith("moe_"):
            continue
        cluster = topologies.load_cluster(row.preset, row.gpus, **row.overrides)
        comm = nccl.comm_of(cluster, row.group)
        e = row.extra
        t, nbytes = nccl.moe_time_s(comm, e["tokens"], e["token_bytes"], e["topk"], e["experts"],
                                    inter_node=e["link"] == "RDMA")
        row.predicted_time_s = t
        row.predicted_busbw = nbytes / t / 1e9
        row.chosen = "deepep-normal (" + ("RDMA" if e["link"] == "RDMA" else "NVLink") + ")"
    return rows


# ------------------------------------------------------------------------------------------ report
def find_data(data: str | None) -> Path:
    """The validation directory: --data, else shared/validation next to or inside the repository."""
    if data:
        p = Path(data)
    else:
        root = Path(__file__).resolve().parents[1]
        cands = [root / "shared" / "validation", root.parent / "shared" / "validation"]
        p = next((c for c in cands if (c / DATA_FILES[0]).exists()), cands[-1])
    missing = [f for f in DATA_FILES if not (p / f).exists()]
    if missing:
        raise ConfigError(f"validate collectives: {p} has no {', '.join(missing)}; pass --data DIR "
                          f"(the folder with the published collectives.csv and moe_alltoall.csv)")
    return p


def run(data_dir: Path) -> list[Row]:
    rows = predict(collective_rows(data_dir / "collectives.csv"))
    return rows + predict_moe(moe_rows(data_dir / "moe_alltoall.csv"))


def plot(rows: list[Row], path: Path, labels=None) -> None:
    """busbw against size per hardware: published points, predicted line (all_reduce sweeps)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps: dict = {}
    for r in rows:
        if r.predicted_busbw is None or r.collective != "all_reduce" or (labels and r.label not in labels):
            continue
        src = (r.extra.get("platform", ""), r.extra.get("algorithm", ""))
        sweeps.setdefault(r.label, {}).setdefault(src, []).append(r)
    # a source's sweep (>= 4 sizes): its published points and the prediction as it ran (forced algorithm,
    # stated NCCL release), in one colour
    sweeps = {k: {s: v for s, v in srcs.items() if len({r.size_bytes for r in v}) >= 4} for k, srcs in sweeps.items()}
    sweeps = {k: v for k, v in sweeps.items() if v}
    if not sweeps:
        raise ConfigError("--plot: no all_reduce size sweep among the expressible rows")
    n = len(sweeps)
    cols = min(n, 3)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(5.2 * cols, 3.8 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, (label, srcs) in zip(axes.flat, sorted(sweeps.items())):
        for i, (src, rs) in enumerate(sorted(srcs.items())):
            pts = sorted(rs, key=lambda r: r.size_bytes)
            color = f"C{i}"
            ax.scatter([r.size_bytes for r in pts], [r.published_busbw for r in pts], s=14, zorder=3, color=color,
                       label=f"published: {src[0][:30]}")
            line = sorted({r.size_bytes: r for r in pts}.values(), key=lambda r: r.size_bytes)
            forced = f", {line[0].algorithm} forced" if line[0].algorithm else ""
            ax.plot([r.size_bytes for r in line], [r.predicted_busbw for r in line], color=color, lw=1.5,
                    label=f"predicted (NCCL model{forced})")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{label}: all_reduce, {pts[0].ranks} GPUs", fontsize=10)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    from clustersim.plots import save
    save(fig, path, dpi=110, tight=False)
    plt.close(fig)


def _row_dict(r: Row) -> dict:
    return {"hardware": r.hardware, "label": r.label, "collective": r.collective, "ranks": r.ranks,
            "size_bytes": r.size_bytes, "band": r.band, "preset": r.preset, "overrides": r.overrides,
            "forced_algorithm": r.algorithm, "nccl_version": r.nccl_version, "net_plugin": r.net_plugin,
            "nccl_env": {k: list(v) for k, v in r.env.items()}, "net_latency_us": r.net_latency_us,
            "gpus_per_thread": r.gpus_per_thread, "blocking": r.blocking, "host_overhead_s": r.host_s,
            "chosen": r.chosen,
            "published_busbw_GBps": r.published_busbw, "predicted_busbw_GBps": r.predicted_busbw,
            "published_time_s": r.published_time_s, "predicted_time_s": r.predicted_time_s,
            "error": r.error, "time_ratio": r.time_ratio, "source": r.source}


@click.command("collectives")
@click.option("--data", default=None, type=NonEmptyPath(file_okay=False),
              help="Folder with collectives.csv and moe_alltoall.csv (default: shared/validation beside the repo).")
@click.option("--rows", "show_rows", is_flag=True, help="Also print every expressible row.")
@click.option("--plot", "plot_path", default=None, type=NonEmptyPath(dir_okay=False),
              help="Plot busbw vs size per hardware (published points, predicted line) to this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def collectives(data, show_rows, plot_path, as_json):
    """Published nccl-tests and DeepEP measurements against the default (NCCL) collective model."""
    rows = run(find_data(data))
    if plot_path:
        if Path(plot_path).suffix.lower() not in (".png", ".svg", ".pdf"):
            raise ConfigError(f"--plot: {plot_path}: use a .png, .svg or .pdf file name")
        plot(rows, Path(plot_path))
    done = [r for r in rows if r.error is not None]
    skipped = [r for r in rows if r.preset is None]
    summ = summary(rows)
    if as_json:
        click.echo(json.dumps({"summary": summ, "bands": band_totals(rows),
                               "bands_without_net_plugins": band_totals(rows, without_plugins=True),
                               "rows": [_row_dict(r) for r in done],
                               "not_expressed": [{"hardware": r.hardware, "collective": r.collective,
                                                  "size_bytes": r.size_bytes, "reason": r.reason,
                                                  "source": r.source} for r in skipped]}, indent=1))
        return
    if show_rows:
        click.echo(f"{'hardware':26s} {'collective':14s} {'size (B)':>12} {'published':>10} {'predicted':>10} "
                   f"{'error':>8}  {'time pub (us)':>13} {'time pred (us)':>14}  chosen")
        for r in done:
            tp = f"{r.published_time_s * 1e6:13.1f}" if r.published_time_s else f"{'-':>13}"
            click.echo(f"{r.label:26s} {r.collective:14s} {int(r.size_bytes):>12} {r.published_busbw:>10.2f} "
                       f"{r.predicted_busbw:>10.2f} {r.error * 100:>+7.1f}%  {tp} "
                       f"{r.predicted_time_s * 1e6:>14.1f}  {r.chosen}")
        click.echo("")
    click.echo(f"{len(done)} published rows compared (busbw GB/s; MoE: bottleneck bandwidth), "
               f"{len(skipped)} not expressible")
    click.echo(f"{'hardware':26s} {'collective':14s} {'size band':20s} {'rows':>5} {'median |err|':>13} "
               f"{'median err':>11} {'max |err|':>10} {'time pred/pub':>14}")
    for s in summ:
        ratio = f"{s['median_time_ratio']:>14.2f}" if s["median_time_ratio"] is not None else f"{'-':>14}"
        click.echo(f"{s['hardware']:26s} {s['collective']:14s} {s['band']:20s} {s['rows']:>5} "
                   f"{s['median_abs_error'] * 100:>12.1f}% {s['median_error'] * 100:>+10.1f}% "
                   f"{s['max_abs_error'] * 100:>9.1f}% {ratio}")
    for title, without in (("all collective rows, per size band (the acceptance figures)", False),
                           ("without the multi-node runs over third-party network plugins (TCPXO, EFA)", True)):
        click.echo(f"\n{title}:")
        for b in band_totals(rows, without_plugins=without):
            ratio = f"{b['median_time_ratio']:.2f}" if b["median_time_ratio"] is not None else "-"
            click.echo(f"  {b['band']:20s} {b['rows']:>4} rows   median |busbw err| "
                       f"{b['median_abs_error'] * 100:6.1f}%   median time pred/pub {ratio}")
    reasons: dict = {}
    for r in skipped:
        reasons.setdefault((r.hardware, r.reason), 0)
        reasons[(r.hardware, r.reason)] += 1
    if reasons:
        click.echo("\nnot expressible:")
        for (hw, why), k in sorted(reasons.items()):
            click.echo(f"  {k:3d} x {hw}: {why}")
    if plot_path:
        click.echo(f"\nplot written to {plot_path}")

"""``clustersim topology PRESET``: describe a cluster, draw a small one, print a collective bandwidth table.

    clustersim topology dgx-h100 --gpus 64
    clustersim topology dgx-h100 --gpus 64 --collective all_reduce --ranks 0-15 [--network flow] [--json]
    clustersim topology pcie-ethernet-lab --draw lab.png

The table follows nccl-tests: algbw = size / time, busbw = algbw · 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and all_to_all, 1 otherwise; sizes 1 KiB to 4 GiB (x2 steps by default).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import click

from clustersim.paths import ByteSize, NonEmptyPath
from simulator.calibration import CALIBRATION_SCOPES, Calibration, bus_factor, check_scope
from simulator.costs import CommRequest
from simulator.errors import ConfigError
from simulator.inputs import MAX_BYTES
from simulator.program import COLLECTIVE_KINDS

KIB, GIB = 1024, 1024**3
DRAW_LIMIT = 400   # nodes


def parse_ranks(text: str, world: int) -> tuple[int, ...]:
    """'0-7', '0,8,16', '0-63:8' (range with stride), or 'all'."""
    if not text.strip():
        raise ConfigError("--ranks is empty: give ranks (0-7, 0,8,16, 0-63:8) or all, or leave the option out")
    if text.strip() == "all":
        return tuple(range(world))
    out = []
    try:
        for part in text.split(","):
            part = part.strip()
            step = 1
            if ":" in part:
                part, s = part.split(":")
                step = int(s)
            if step < 1:
                raise ConfigError(f"--ranks {text!r}: the stride must be >= 1")
            if "-" in part:
                a, b = (int(x) for x in part.split("-"))
                if b < a:
                    raise ConfigError(f"--ranks {text!r}: range {a}-{b} is reversed; write {b}-{a}")
                if a < 0 or a + (b - a) // step * step >= world:    # before listing it (0-100000000: 10 GB)
                    raise ConfigError(f"--ranks {text!r}: range {a}-{b} leaves the world of {world} ranks "
                                      f"(0..{world - 1})")
                out.extend(range(a, b + 1, step))
            else:
                out.append(int(part))
    except ValueError:
        raise ConfigError(f"--ranks {text!r}: expected a list like 0-7, 0,8,16 or 0-63:8") from None
    if len(set(out)) != len(out):
        raise ConfigError(f"--ranks {text!r}: a rank appears twice")
    bad = [r for r in out if not 0 <= r < world]
    if bad:
        raise ConfigError(f"--ranks {text!r}: rank(s) {bad[:5]} outside the world of {world} ranks (0..{world - 1})")
    return tuple(out)


def parse_settings(settings) -> dict:
    """KEY=VALUE pairs (values parsed as YAML scalars, ``simulator.yamlio``: 5e10 is a number) -> overrides
    for topologies.load_cluster."""
    from simulator.yamlio import load_yaml_text
    out = {}
    for item in settings:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = load_yaml_text(v, f"--set {item!r}")
        except ConfigError:
            raise ConfigError(f"--set {item!r}: cannot read value {v!r}") from None
    return out


def tile_group(group: tuple[int, ...], world: int) -> tuple[tuple[int, ...], ...]:
    """Translated copies of ``group`` (shifted by s, disjoint from each other) that fit in the world:
    the other groups of the same shape that would run the same collective at the same time."""
    used = set(group)
    images = []
    for s in range(1, world):
        g = tuple(r + s for r in group)
        if g[-1] >= world or max(g) >= world:
            continue
        if used.isdisjoint(g):
            images.append(g)
            used.update(g)
    return tuple(images)




def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def bandwidth_table(model, kind: str, ranks: tuple[int, ...], size_list, network: str, concurrent: bool = False):
    """Rows {size_bytes, time_s, algbw_GBps, busbw_GBps, algorithm} in nccl-tests' convention."""
    n = len(ranks)
    world = model.cluster.world_size
    images = tile_group(ranks, world) if concurrent else ()
    req_kind = "p2p" if kind == "p2p" else kind
    rows = []
    for s in size_list:
        req = CommRequest(req_kind, ranks, float(s), images=images)
        if network == "flow":
            from topologies.flow import drive
            t = drive(model.network(), [(0.0, "x", req)])["x"]
        else:
            t = model.comm_time_s(req)
        alg = s / t / 1e9 if t > 0 else float("inf")
        bus = alg * (bus_factor(kind, n) if kind != "p2p" else 1.0)
        plain = CommRequest(req_kind, ranks, float(s))
        rows.append({"size_bytes": int(s), "time_s": t, "algbw_GBps": alg, "busbw_GBps": bus,
                     "algorithm": model.algorithm_for(plain), "protocol": model.protocol_for(plain)})
    return rows


def draw(cluster, path: Path) -> None:
    """Draw a small cluster graph to PNG (GPUs and switches coloured by kind, layered layout)."""
    if Path(path).suffix.lower() not in (".png", ".svg", ".pdf", ".jpg", ".jpeg"):
        raise ConfigError(f"--draw: {path}: use a .png, .svg, .pdf or .jpg file name")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = cluster.graph
    if g.number_of_nodes() > DRAW_LIMIT:
        raise ConfigError(f"--draw: {g.number_of_nodes()} nodes is too many to draw (limit {DRAW_LIMIT}); "
                          f"use fewer --gpus")
    colors = {"gpu": "#76b900", "nvswitch": "#1f77b4", "pcie": "#9467bd", "ub": "#d62728", "leaf": "#ff7f0e",
              "spine": "#8c564b", "core": "#e377c2", "host": "#7f7f7f"}
    if cluster.domain_spec.kind == "torus" and cluster.n_domains == 1:
        pos = {n: (d["coord"][-1] + 0.15 * d["coord"][0], d["coord"][-2] + 0.15 * d["coord"][0])
               for n, d in g.nodes(data=True)}
    else:
        layer = {"gpu": 1, "nvswitch": 0, "pcie": 0, "ub": 0, "host": 1, "leaf": 2, "spine": 3, "core": 4}
        for n, d in g.nodes(data=True):
            g.nodes[n]["_layer"] = layer.get(d.get("kind"), 5)
        pos = nx.multipartite_layout(g, subset_key="_layer", align="horizontal")
        for n in g.nodes:
            del g.nodes[n]["_layer"]
    fig, ax = plt.subplots(figsize=(min(24, 4 + g.number_of_nodes() / 6), 7))
    wrap = [(u, v) for u, v in g.edges if "coord" in g.nodes[u] and "coord" in g.nodes[v]
            and sum(abs(a - b) for a, b in zip(g.nodes[u]["coord"], g.nodes[v]["coord"])) > 1]
    plain = [e for e in g.edges if e not in set(wrap)]
    nx.draw_networkx_edges(g, pos, edgelist=plain, ax=ax, width=0.5, alpha=0.5)
    if wrap:   # torus wrap-around links as arcs
        nx.draw_networkx_edges(g, pos, edgelist=wrap, ax=ax, width=0.5, alpha=0.35, style="dashed", arrows=True,
                               arrowstyle="-", connectionstyle="arc3,rad=0.25")
    for kind, col in colors.items():
        nodes = [n for n, d in g.nodes(data=True) if d.get("kind") == kind]
        if nodes:
            nx.draw_networkx_nodes(g, pos, nodelist=nodes, node_color=col, node_size=80 if kind == "gpu" else 160,
                                   ax=ax, label=kind)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{cluster.name}: {cluster.n_gpus} x {cluster.accelerator.name}")
    ax.axis("off")
    fig.tight_layout()
    from simulator.atomic import write_with
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format=Path(path).suffix.lstrip(".").lower() or None))
    plt.close(fig)


def _fmt_bw(x: float) -> str:
    return f"{x / 1e9:,.1f} GB/s"


def _describe_text(d: dict) -> str:
    lines = [f"{d['name']}: {d['description']}" if d.get("description") else d["name"],
             f"  devices       {d['devices']} x {d['accelerator']} ({d['nodes']} nodes of {d['gpus_per_node']})",
             f"  scale-up      {d['domain']['count']} {d['domain']['kind']} domain(s) of {d['domain']['size']}, "
             f"{_fmt_bw(d['domain']['bytes_per_s_per_device'])} per device per direction"
             + (", in-switch reduction" if d["domain"]["in_switch_reduction"] else "")
             + (f", dims {d['domain']['dims']}" if d["domain"].get("dims") else "")]
    if "fabric" in d:
        f = d["fabric"]
        lines.append(f"  scale-out     {f['tiers']}-tier {f['link']} fat tree, "
                     f"{'rail-optimised' if f['rail_optimised'] else 'not rail-optimised'}, "
                     f"{f['oversubscription']:g}:1, NIC {_fmt_bw(f['nic_bytes_per_s'])}, "
                     f"{f['leaves']} leaves, {f['pods']} pod(s)")
    sw = ", ".join(f"{v} {k}" for k, v in d["switches"].items()) or "none"
    lt = ", ".join(f"{v} {k}" for k, v in d["link_types"].items())
    lines += [f"  switches      {sw}", f"  links         {d['links']} ({lt})",
              f"  bisection     {_fmt_bw(d['bisection_bytes_per_s'])}",
              f"  peak bf16     {d['peak_bf16_flops_total'] / 1e15:,.1f} PFLOP/s, HBM {d['hbm_bytes_total'] / 1e12:,.1f} TB"]
    return "\n".join(lines)


@click.command("topology")
@click.argument("preset", required=False)
@click.option("--list", "list_only", is_flag=True, help="List the bundled presets and exit.")
@click.option("--gpus", type=int, default=None, help="Number of GPUs (default: the preset's).")
@click.option("--collective", "kind", type=click.Choice(list(COLLECTIVE_KINDS) + ["p2p"]), default=None,
              help="Print a bandwidth table for this collective.")
@click.option("--ranks", default=None, help="Group: 0-7, 0,8,16, 0-63:8 or all (default: all ranks).")
@click.option("--network", type=click.Choice(["analytical", "flow"]), default="analytical", show_default=True)
@click.option("--concurrent", is_flag=True,
              help="Also run every translated copy of the group at the same time (e.g. all rails); flow mode.")
@click.option("--algorithm", default=None, help="Force a collective algorithm, as NCCL_ALGO does: ring, tree, nvls, "
                                                 "nvls_tree, pat, collnet_direct, collnet_chain (NCCL's model); "
                                                 "hierarchical, rings, direct, torus (route-level model).")
@click.option("--protocol", default=None, type=click.Choice(["ll", "ll128", "simple"], case_sensitive=False),
              help="Force NCCL's protocol, as NCCL_PROTO does (default: NCCL's choice per size).")
@click.option("--nccl-version", default=None, metavar="X.Y.Z",
              help="NCCL release whose tuner picks algorithm and protocol (2.18 on; default: the newest model).")
@click.option("--calibration", type=NonEmptyPath(dir_okay=False), default=None, help="Calibration JSON.")
@click.option("--calibration-scope", type=click.Choice(CALIBRATION_SCOPES), default="matching", show_default=True,
              help="with --calibration: 'any' applies fits measured on other hardware or another backend")
@click.option("--min-bytes", type=ByteSize(), default=KIB, show_default=True,
              help="Smallest size: bytes, or with a unit (1KB, 64KiB, 1e3).")
@click.option("--max-bytes", type=ByteSize(), default=4 * GIB, show_default=True,
              help="Largest size: bytes, or with a unit (4GiB, 1GB, 1e9).")
@click.option("--factor", type=int, default=2, show_default=True, help="Size step factor.")
@click.option("--draw", "draw_path", type=NonEmptyPath(dir_okay=False), default=None, help="Draw the graph to PNG.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a preset setting, e.g. --set oversubscription=2 --set rail_optimised=false.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def topology(preset, list_only, gpus, kind, ranks, network, concurrent, algorithm, protocol, nccl_version, calibration,
             calibration_scope,
             min_bytes, max_bytes, factor, draw_path, settings, as_json):
    """Describe cluster PRESET (or a cluster YAML file); optionally draw it and tabulate a collective."""
    import topologies
    from topologies.cost import ClusterCostModel

    if list_only or preset is None:
        if preset is None and not list_only:
            raise ConfigError("say which cluster: clustersim topology PRESET (see --list)")
        if draw_path:
            raise ConfigError("--list lists the presets and draws nothing: give a PRESET with --draw, or drop it")
        rows = []
        for name in topologies.list_presets():
            from topologies.presets import preset_config
            cfg = preset_config(name)
            rows.append({"name": name, "description": cfg.get("description", ""), "gpus": cfg.get("gpus")})
        if as_json:
            click.echo(json.dumps(rows, indent=1))
        else:
            for r in rows:
                g = r["gpus"]
                rule = f"{g.get('min')}-{g.get('max')} GPUs (x{g.get('multiple_of')})" if isinstance(g, dict) else ""
                click.echo(f"{r['name']:20s} {rule:26s} {r['description']}")
        return
    overrides = parse_settings(settings)
    for key, instead in (("gpus", "--gpus N"), ("preset", "the preset as the argument (clustersim topology PRESET)")):
        if key in overrides:
            raise ConfigError(f"--set {key}=...: give {instead}")
    if preset.endswith((".yaml", ".yml")):
        if overrides:
            raise ConfigError("--set works with bundled presets; edit the YAML file instead")
        cluster = topologies.load_cluster_file(preset, gpus=gpus)
    else:
        cluster = topologies.load_cluster(preset, gpus, **overrides)
    if kind is None:
        ctx = click.get_current_context()
        given = [p.opts[0] for p in ctx.command.params
                 if p.name in ("ranks", "network", "concurrent", "algorithm", "protocol", "nccl_version",
                               "calibration", "calibration_scope", "min_bytes", "max_bytes", "factor")
                 and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise ConfigError(f"{', '.join(given)} price(s) a collective: add --collective KIND (e.g. all_reduce)")
    elif concurrent and network != "flow":
        raise ConfigError("--concurrent shares links between copies of the group under --network flow; the "
                          "analytical model prices one group alone: add --network flow")

    if draw_path:
        draw(cluster, Path(draw_path))
    if kind is None:
        d = cluster.describe()
        click.echo(json.dumps(d, indent=1) if as_json else _describe_text(d))
        if draw_path and not as_json:
            click.echo(f"  drawn to      {draw_path}")
        return
    if kind == "barrier":       # no payload: one row (NCCL runs it as a 1-byte all-reduce)
        ctx = click.get_current_context()
        if any(ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE
               for n in ("min_bytes", "max_bytes", "factor")):
            raise ConfigError("--collective barrier carries no payload: drop --min-bytes / --max-bytes / --factor")
    if not (0 < min_bytes <= max_bytes) or factor < 2:
        raise ConfigError("--min-bytes must be positive and <= --max-bytes, --factor >= 2")
    if max_bytes > MAX_BYTES:
        raise ConfigError(f"--max-bytes {max_bytes:.3g} is beyond any collective's size; at most "
                          f"{MAX_BYTES:.0e} (1 PB)")
    size_list = [0] if kind == "barrier" else sizes(min_bytes, max_bytes, factor)
    group = parse_ranks(ranks, cluster.world_size) if ranks is not None else tuple(range(cluster.world_size))
    if kind == "p2p" and len(group) != 2:
        raise ConfigError(f"--collective p2p needs exactly two --ranks (source,destination), got {len(group)}")
    if kind == "p2p" and (algorithm or protocol):
        raise ConfigError(f"{'--algorithm' if algorithm else '--protocol'} picks a collective's algorithm and "
                          f"protocol; a point-to-point transfer has neither (it is priced as NCCL's send/recv, "
                          f"Simple protocol): drop it or choose a collective")
    if len(group) < 2:
        raise ConfigError("a collective needs at least two ranks")
    if concurrent and not tile_group(group, cluster.world_size):
        raise ConfigError(f"--concurrent runs copies of the --ranks group translated across the cluster; this group "
                          f"({len(group)} of {cluster.world_size} ranks) leaves no room for a copy: give a smaller "
                          f"--ranks group")
    if nccl_version is not None and not re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", nccl_version.strip()):
        raise ConfigError(f"--nccl-version {nccl_version!r}: expected a release number X.Y or X.Y.Z (e.g. 2.27.7)")
    check_scope(calibration_scope, calibration)
    cal = Calibration.load(calibration) if calibration else None
    model = ClusterCostModel(cluster, network=network, calibration=cal, algorithm=algorithm, protocol=protocol,
                             calibration_scope=calibration_scope,
                             nccl_version=nccl_version)
    rows = bandwidth_table(model, kind, group, size_list, network, concurrent)
    forced = model.forced_algorithm_note()      # a forced algorithm that cannot run this group
    from topologies.nccl import latency_setting_note
    # (a forced route-level algorithm that does not apply leaves the group to NCCL's model)
    unforced = None if model.forced_missed else algorithm
    notes = [n for n in (forced, latency_setting_note(cluster, unforced) if kind != "p2p" else None) if n]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        for note in notes:
            click.echo(f"note: {note}", err=True)
        return
    click.echo(_describe_text(cluster.describe()))
    shown = ",".join(map(str, group[:16])) + (",..." if len(group) > 16 else "")
    click.echo(f"\n{kind} over {len(group)} ranks [{shown}], network={network}"
               + (f", with {len(tile_group(group, cluster.world_size))} concurrent copies" if concurrent else ""))
    click.echo(f"{'size (B)':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  {'algorithm':<12} protocol")
    for r in rows:
        click.echo(f"{r['size_bytes']:>12} {r['time_s'] * 1e6:>12.2f} {r['algbw_GBps']:>13.2f} "
                   f"{r['busbw_GBps']:>13.2f}  {r['algorithm']:<12} {r['protocol']}")
    for note in notes:
        click.echo(f"note: {note}")

"""Pictures of simulated (or measured) steps: Gantt timelines, memory over time, time breakdowns.

- ``gantt(results)``: one panel per plan on one shared time axis, one lane per (rank, stream). Compute bars
  are coloured by phase (``PHASE_COLOURS``), communication by collective kind (``COMM_COLOURS``; send/recv
  as ``p2p``). A lane's consecutive ops of one micro-batch and phase are drawn as one bar (``blocks``), with
  the micro-batch number on it when it is wide enough. On each rank's compute lane the time when the rank
  computes nothing is split into *exposed communication* (some communication runs: a light red fill and a
  dark red strip along the lane's lower edge, ``EXPOSED_STYLE`` / ``EXPOSED_STRIP_STYLE``) and *bubble*
  (nothing runs: ``BUBBLE_STYLE``, hatched), so compute + exposed + bubble = the step time, as in
  ``simulator.metrics``.
- Large jobs show one representative rank per pipeline stage, labelled "stage s (rep. of N ranks)".
- ``memory_over_time(results)``: per rank, stacked parameters / gradients / optimizer / activations /
  buffers over the step, with the device's HBM capacity as a line.
- ``time_breakdown(result)`` / ``breakdown_bars(results)``: where each plan's step time goes.

Every function takes a ``SimResult`` or a ``{name: SimResult}`` dict; ``gantt`` also takes timeline
DataFrames (``simulator.timeline.COLUMNS``; at least rank, stream, kind, start_s, end_s), so measured
traces plot the same way. matplotlib runs on the Agg backend (no display). Units: seconds and bytes in,
milliseconds/seconds and GB (1e9 bytes) on the axes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from simulator.metrics import merge_intervals  # noqa: E402,F401  (re-exported for compare)

from simulator.errors import ConfigError  # noqa: E402
from simulator.program import MEMORY_CATEGORIES  # noqa: E402

# ---------------------------------------------------------------------------------------------- palette
#: compute bars by ``Op.phase`` ("other" for compute ops without a phase).
PHASE_COLOURS = {
    "forward": "#4C78A8",           # blue
    "backward_input": "#59A14F",    # green
    "backward_weight": "#B07AA1",   # purple
    "backward": "#2F7F6F",          # dark teal: input and weight gradients fused
    "optimizer": "#9C755F",         # brown
    "other": "#A0A0A0",             # grey
}
#: communication bars by collective kind; send/recv are ``p2p``.
COMM_COLOURS = {
    "all_reduce": "#E15759",        # red
    "all_gather": "#F28E2B",        # orange
    "reduce_scatter": "#EDC948",    # yellow
    "all_to_all": "#FF9DA7",        # pink
    "broadcast": "#8CD17D",         # light green
    "reduce": "#D37295",            # magenta
    "barrier": "#79706E",           # dark grey
    "p2p": "#76B7B2",               # teal
    "other_comm": "#BAB0AC",        # light grey-brown: kinds the engine does not model (gather, scatter)
}
#: idle spans on the compute lane: nothing runs (bubble) / only communication runs (exposed).
BUBBLE_STYLE = {"facecolor": "none", "edgecolor": "#8A8A8A", "hatch": "////", "linewidth": 0.0}
EXPOSED_STYLE = {"facecolor": "#F5C6C1", "edgecolor": "none", "linewidth": 0.0}
#: exposed communication is also marked by a strip along the lower edge of the compute lane, visible over
#: merged micro-batch blocks that contain blocking (e.g. tensor-parallel) communication.
EXPOSED_STRIP_STYLE = {"facecolor": "#C0392B", "edgecolor": "none", "linewidth": 0.0}
#: stacked memory categories (``simulator.program.MEMORY_CATEGORIES``).
MEMORY_COLOURS = {
    "parameters": "#4C78A8",
    "gradients": "#59A14F",
    "optimizer": "#9C755F",
    "activations": "#F28E2B",
    "buffers": "#B07AA1",
}
PHASE_LABELS = {"forward": "forward (F)", "backward_input": "backward-input (B)",
                "backward_weight": "backward-weight (W)", "backward": "backward (B+W)",
                "optimizer": "optimizer", "other": "other compute"}
BUBBLE_LABEL = "bubble (idle)"
EXPOSED_LABEL = "exposed communication"
DEFAULT_MAX_LANES = 48


def colour_key(kind: str, phase, collective) -> str:
    """The palette key of one op: its phase for compute, its collective kind (or ``p2p``) otherwise."""
    if kind == "compute":
        return phase if isinstance(phase, str) and phase in PHASE_COLOURS else "other"
    if kind in ("send", "recv"):
        return "p2p"
    if isinstance(collective, str) and collective in COMM_COLOURS:
        return collective
    return "other_comm"


def colour_of(key: str) -> str:
    return PHASE_COLOURS.get(key) or COMM_COLOURS[key]


def legend_label(key: str) -> str:
    """Legend text of a palette key: "forward (F)", "all-reduce", "send/recv (p2p)" ..."""
    special = {"p2p": "send/recv (p2p)", "other_comm": "other communication"}
    return PHASE_LABELS.get(key) or special.get(key) or key.replace("_", "-")


# ---------------------------------------------------------------------------------------------- lanes
@dataclass(frozen=True)
class Lane:
    """One horizontal lane of a Gantt panel."""

    rank: int
    stream: str
    label: str
    compute_lane: bool      # the rank's compute lane: bubble and exposed spans are drawn on it


def _is_result(x) -> bool:
    return hasattr(x, "programs") and hasattr(x, "start_s")


def _stages(result) -> dict[int, int] | None:
    """Every rank of the job -> its pipeline stage (index in its ``pp`` group); None without pp groups."""
    p = result.programs
    pp = [g for g in p.groups if g.family == "pp"]
    if not pp:
        return None
    stage = {}
    for g in pp:
        for i, r in enumerate(g.ranks):
            stage.setdefault(r, i)
    return stage


def _stage_members(result) -> tuple[dict[int, int] | None, dict[int, int]]:
    """(rank -> pipeline stage or None, stage -> how many ranks of the job it holds)."""
    stage = _stages(result)
    counts: dict[int, int] = {}
    if stage is not None:
        for r in range(result.programs.world_size):
            s = stage.get(r, -1)
            counts[s] = counts.get(s, 0) + 1
    return stage, counts


def rank_labels(result, ranks: list[int]) -> list[tuple[int, str]]:
    """(rank, label) for simulated ``ranks``: "stage s (rep. of N ranks)" when they are one rank per
    pipeline stage standing for more ranks than shown, else "rank r" (plus "(rep. of k ranks)" for a
    symmetric-mode representative)."""
    p = result.programs
    stage, counts = _stage_members(result)
    shown_stages = [stage.get(r, -1) for r in ranks] if stage is not None else []
    per_stage = (stage is not None and -1 not in shown_stages and len(set(shown_stages)) == len(ranks)
                 and sum(counts[s] for s in shown_stages) > len(ranks))
    out = []
    for r in ranks:
        if per_stage:
            n = counts[stage[r]]
            out.append((r, f"stage {stage[r]} (rep. of {n} rank{'s' if n != 1 else ''})" if n > 1
                        else f"stage {stage[r]} (rank {r})"))
        else:
            k = p.multiplicity(r)
            out.append((r, f"rank {r}" + (f" (rep. of {k} ranks)" if k > 1 else "")))
    return out


def representative_ranks(result, max_ranks: int) -> list[tuple[int, str]]:
    """(simulated rank, label) to show for ``result``: every simulated rank if there are at most
    ``max_ranks`` (and, in symmetric mode, not exactly one per stage), else one representative per
    pipeline stage ("stage s (rep. of N ranks)"), evenly thinned to ``max_ranks`` stages; without pipeline
    groups, the first ``max_ranks`` ranks."""
    p = result.programs
    sim = sorted(p.ops)
    stage = _stages(result)
    if stage is None or len(sim) <= max_ranks:
        return rank_labels(result, sim[:max_ranks])
    per_stage: dict[int, list[int]] = {}
    for r in sim:
        per_stage.setdefault(stage.get(r, -1), []).append(r)
    stages = sorted(per_stage)
    if len(stages) > max_ranks:
        idx = np.unique(np.linspace(0, len(stages) - 1, max_ranks).round().astype(int))
        stages = [stages[i] for i in idx]
    return rank_labels(result, [per_stage[s][0] for s in stages])


def shown_ranks_note(result, picks) -> str:
    """"" when every simulated rank is shown, else which ones are ("showing 4 of 64 simulated ranks: ...")."""
    n = len(result.programs.ops)
    if len(picks) >= n:
        return ""
    return (f"showing {len(picks)} of {n} simulated ranks: {', '.join(label for _, label in picks)}"
            + (" (one per pipeline stage)" if _stages(result) is not None else ""))


P2P_LANE = "send/recv"


def _stream_kinds(prog) -> dict[str, set]:
    """stream -> the op kinds it holds, for one rank's program."""
    out: dict[str, set] = {}
    for op in prog:
        out.setdefault(op.stream, set()).add(op.kind)
    return out


def _stream_order(df: pd.DataFrame) -> list[str]:
    """Streams holding compute first, then the others in order of first appearance."""
    first = df.groupby("stream", sort=False)["start_s"].min()
    has_compute = set(df.loc[df["kind"] == "compute", "stream"])
    streams = list(dict.fromkeys(df["stream"]))
    return sorted(streams, key=lambda s: (s not in has_compute, streams.index(s), first.get(s, 0.0)))


def _lanes_for(df: pd.DataFrame, picks: list[tuple[int, str]]) -> list[Lane]:
    """Lanes of the picked (rank, label)s: one per stream of the rank, its compute lane first."""
    lanes = []
    for r, label in picks:
        sub = df[df["rank"] == r]
        if sub.empty:
            continue
        streams = _stream_order(sub)
        compute_streams = set(sub.loc[sub["kind"] == "compute", "stream"])
        for i, s in enumerate(streams):
            lanes.append(Lane(int(r), s, f"{label} · {s}", compute_lane=(i == 0 and s in compute_streams)))
    return lanes


@dataclass
class Panel:
    """What one Gantt panel shows: a timeline restricted to the shown ranks, its lanes, its step time."""

    name: str
    timeline: pd.DataFrame
    lanes: list[Lane]
    step_time_s: float
    note: str = ""


def panel_of(name: str, x, ranks=None, max_lanes: int = DEFAULT_MAX_LANES) -> Panel:
    """Choose the lanes of one plan's panel. ``x`` is a SimResult or a timeline DataFrame. When one lane
    per stream would leave pipeline stages out, a rank's send/recv streams share one lane (``P2P_LANE``)."""
    merge_p2p = False
    if _is_result(x):
        from simulator.timeline import build_timeline
        p = x.programs
        if ranks is not None:
            bad = [r for r in ranks if r not in p.ops]
            if bad:
                raise ConfigError(f"{name}: rank(s) {bad[:8]} are not simulated; simulated ranks: "
                                  f"{sorted(p.ops)[:16]}{' ...' if len(p.ops) > 16 else ''}")
            picks = rank_labels(x, list(dict.fromkeys(ranks)))
        else:
            stage = _stages(x)
            firsts: dict = {}
            for r in sorted(p.ops):                 # the first simulated rank of each stage stands for it
                firsts.setdefault(stage.get(r, -1) if stage is not None else r, r)
            sample = list(firsts.values())[:4 * max_lanes]
            per_rank = [_stream_kinds(p.ops[r]) for r in sample]
            streams_per_rank = max((len(k) for k in per_rank), default=1)
            p2p_streams = max((sum(1 for v in k.values() if v <= {"send", "recv"}) for k in per_rank), default=0)
            wanted = len(firsts)
            if max_lanes // max(1, streams_per_rank) < wanted and p2p_streams > 1:
                merge_p2p = True          # one send/recv lane per rank, so that every stage fits
                streams_per_rank -= p2p_streams - 1
            picks = representative_ranks(x, max(1, max_lanes // max(1, streams_per_rank)))
        df = build_timeline(x, ranks=[r for r, _ in picks])
        if merge_p2p:
            df.loc[df["kind"].isin(["send", "recv"]), "stream"] = P2P_LANE
        step = float(x.step_time_s)
        shown = sorted(p.ops)
        note = "" if len(picks) == len(shown) else f"showing {len(picks)} of {len(shown)} simulated ranks"
        if p.classes is not None or len(picks) != len(shown):
            note = f"{p.world_size} ranks" + (", symmetric mode" if p.classes is not None else "") + \
                (f"; {note}" if note else "")
        if merge_p2p:
            note += ("; " if note else "") + "send/recv streams share one lane"
    elif isinstance(x, pd.DataFrame):
        missing = {"rank", "stream", "kind", "start_s", "end_s"} - set(x.columns)
        if missing:
            raise ConfigError(f"{name}: timeline DataFrame lacks column(s) {sorted(missing)}")
        df = x
        all_ranks = sorted(int(r) for r in df["rank"].unique())
        if ranks is not None:
            all_ranks = [r for r in all_ranks if r in set(ranks)]
        n_streams = max(1, int(df.groupby("rank")["stream"].nunique().max())) if len(df) else 1
        keep = all_ranks[:max(1, max_lanes // n_streams)]
        picks = []
        for r in keep:
            k = int(df.loc[df["rank"] == r, "represents"].max()) if "represents" in df.columns else 1
            picks.append((r, f"rank {r}" + (f" (rep. of {k} ranks)" if k > 1 else "")))
        df = df[df["rank"].isin(keep)]
        step = float(x.attrs.get("step_time_s", x["end_s"].max() if len(x) else 0.0))
        note = "" if len(keep) == len(all_ranks) else f"showing {len(keep)} of {len(all_ranks)} ranks"
    else:
        raise ConfigError(f"{name}: cannot plot a {type(x).__name__}; give a SimResult or a timeline DataFrame")
    return Panel(name, df, _lanes_for(df, picks), step, note)


# ---------------------------------------------------------------------------------------------- intervals
# merge_intervals lives in simulator.metrics (imported above) so the plots and the metrics share one definition
def subtract_intervals(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of merged set ``a`` = (starts, ends) not covered by merged set ``b``."""
    out_s, out_e = [], []
    bs, be = b
    j = 0
    for s, e in zip(*a):
        cur = s
        while j < len(bs) and be[j] <= cur:
            j += 1
        k = j
        while k < len(bs) and bs[k] < e:
            if bs[k] > cur:
                out_s.append(cur)
                out_e.append(bs[k])
            cur = max(cur, be[k])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out_s.append(cur)
            out_e.append(e)
    return np.asarray(out_s, dtype=float), np.asarray(out_e, dtype=float)


def idle_spans(rank_df: pd.DataFrame, step_time_s: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One rank's ``bubble`` (nothing runs) and ``exposed`` (communication but no compute) spans in
    [0, step_time_s], from its timeline rows. Their lengths are the metrics' idle_s and exposed_comm_s."""
    comp = rank_df["kind"] == "compute"
    c = merge_intervals(rank_df.loc[comp, "start_s"], rank_df.loc[comp, "end_s"])
    m = merge_intervals(rank_df.loc[~comp, "start_s"], rank_df.loc[~comp, "end_s"])
    busy = merge_intervals(np.concatenate([c[0], m[0]]), np.concatenate([c[1], m[1]]))
    whole = (np.array([0.0]), np.array([step_time_s])) if step_time_s > 0 else (np.zeros(0), np.zeros(0))
    return {"bubble": subtract_intervals(whole, busy), "exposed": subtract_intervals(m, c)}


# ---------------------------------------------------------------------------------------------- gantt
def _time_unit(t_max: float) -> tuple[float, str]:
    if t_max < 1e-3:
        return 1e6, "µs"
    if t_max < 2.0:
        return 1e3, "ms"
    return 1.0, "s"


def _col(df: pd.DataFrame, name: str) -> list:
    """A column's values as a list (None where the frame has no such column): iterating a pandas column
    of strings element by element is slow."""
    return df[name].tolist() if name in df else [None] * len(df)


def _rects(y, starts, ends, scale, h) -> list:
    """Rectangles [start, end] x [y - h/2, y + h/2] (times scaled) as one (n, 4, 2) array in a list: callers
    add lists up and ``_polys`` joins them (matplotlib builds the paths of one array at once)."""
    y0, y1 = y - h / 2, y + h / 2
    x0 = np.asarray(starts, dtype=float) * scale
    x1 = np.asarray(ends, dtype=float) * scale
    if not len(x0):
        return []
    out = np.empty((len(x0), 4, 2))
    out[:, 0, 0] = out[:, 1, 0] = x0
    out[:, 2, 0] = out[:, 3, 0] = x1
    out[:, 0, 1] = out[:, 3, 1] = y0
    out[:, 1, 1] = out[:, 2, 1] = y1
    return [out]


def _polys(parts: list, **kw) -> PolyCollection:
    """One PolyCollection of the rectangles of ``_rects`` results added up."""
    return PolyCollection(np.concatenate(parts) if parts else np.zeros((0, 4, 2)), **kw)


def lane_positions(lanes: list[Lane]) -> tuple[np.ndarray, np.ndarray]:
    """(centre y, height) of each lane, top to bottom: compute lanes are 1 unit tall, the others 0.6."""
    h = np.array([1.0 if ln.compute_lane else 0.6 for ln in lanes])
    y = np.cumsum(h) - h / 2
    return y, h


def model_chunks(df: pd.DataFrame) -> pd.Series:
    """Model chunk of every row (interleaved pipelines): per rank, its layers fall into runs of consecutive
    layer numbers, numbered 0, 1, ... in layer order; a row without a layer takes the chunk of its
    neighbour of the same micro-batch and phase on its lane; ranks holding one run only get <NA>."""
    out = pd.Series(pd.NA, index=df.index, dtype="Int64")
    if "layer" not in df.columns:
        return out
    layer = pd.to_numeric(df["layer"], errors="coerce")
    for r, idx in df.groupby("rank", sort=False).groups.items():
        ls = np.unique(layer.loc[idx].dropna().to_numpy())
        if len(ls) < 2:
            continue
        run = np.concatenate([[0], np.cumsum(np.diff(ls) > 1)])
        if run[-1] == 0:
            continue
        lut = dict(zip(ls.tolist(), run.tolist()))
        out.loc[idx] = layer.loc[idx].map(lut).astype("Int64")
    if out.notna().any() and {"stream", "start_s", "microbatch", "phase"} <= set(df.columns):
        # ops without a layer (embedding, LM head) belong to the chunk of their neighbours in the same
        # micro-batch and phase on their lane: the one before them, else the one after
        order = df.sort_values(["rank", "stream", "start_s"], kind="stable").index
        keys = [df.loc[order, c].astype(str) for c in ("rank", "stream", "microbatch", "phase")]
        g = out.loc[order].groupby(keys, sort=False)
        out.loc[order] = g.ffill().fillna(out.loc[order].groupby(keys, sort=False).bfill()).astype("Int64")
    return out


def lighten(colour: str, amount: float) -> str:
    """``colour`` mixed with white (amount 0: unchanged, 1: white)."""
    r, g, b = matplotlib.colors.to_rgb(colour)
    return matplotlib.colors.to_hex((r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount))


def chunk_colour(key: str, chunk) -> str:
    """Bar colour of a block: the palette colour, lighter for later model chunks of an interleaved stage."""
    base = colour_of(key)
    if key in PHASE_COLOURS and not pd.isna(chunk) and int(chunk) > 0:
        return lighten(base, min(0.6, 0.38 * int(chunk)))
    return base


def blocks(df: pd.DataFrame, tol_s: float = 0.0) -> pd.DataFrame:
    """Merge each lane's consecutive ops of one micro-batch and phase (no gap longer than ``tol_s`` between
    them) into one block, as pipeline papers draw them: a forward of micro-batch 3 made of 32 layer kernels
    and their tensor-parallel all-reduces becomes one "F3" bar. Consecutive ops without a micro-batch merge
    when they have the same colour and no gap longer than ``tol_s`` (half a pixel when drawing).
    With a ``_chunk`` column (``model_chunks``) a block also stays within one model chunk.
    Columns: rank, stream, start_s, end_s, microbatch, _key (colour key: the phase of the block's compute
    ops, or the op's own key for communication-only blocks), compute (bool), ops (count), chunk (NaN if
    unknown)."""
    d = df.sort_values(["rank", "stream", "start_s"], kind="stable")
    mb = d["microbatch"] if "microbatch" in d.columns else pd.Series(pd.NA, index=d.index)
    ph = d["phase"].fillna("") if "phase" in d.columns else pd.Series("", index=d.index)
    lane = d["rank"].astype(str) + "\x00" + d["stream"].astype(str)
    same_lane = lane.eq(lane.shift())
    prev_end = d.groupby(lane, sort=False)["end_s"].cummax().shift()
    mb_num = pd.to_numeric(mb, errors="coerce")
    key = d["_key"]
    chunk = d["_chunk"] if "_chunk" in d.columns else pd.Series(pd.NA, index=d.index, dtype="Int64")
    ch = chunk.fillna(-1).astype(int)
    same_mb = mb_num.notna() & mb_num.eq(mb_num.shift()) & ph.eq(ph.shift()) & ch.eq(ch.shift())
    same_key_unlabelled = mb_num.isna() & mb_num.shift().isna() & key.eq(key.shift())
    join = same_lane & (same_mb | same_key_unlabelled) & (d["start_s"] - prev_end <= tol_s)
    bid = (~join).cumsum().to_numpy()
    is_comp = (d["kind"] == "compute").to_numpy()
    ckey = d["_key"].where(is_comp)
    g = pd.DataFrame({"rank": d["rank"].to_numpy(), "stream": d["stream"].to_numpy(), "start_s": d["start_s"].to_numpy(),
                      "end_s": d["end_s"].to_numpy(), "microbatch": mb_num.to_numpy(), "_key": d["_key"].to_numpy(),
                      "_ckey": ckey.to_numpy(), "compute": is_comp, "bid": bid,
                      "chunk": chunk.astype(float).to_numpy()})
    out = g.groupby("bid", sort=False).agg(rank=("rank", "first"), stream=("stream", "first"),
                                          start_s=("start_s", "min"), end_s=("end_s", "max"),
                                          microbatch=("microbatch", "first"), key=("_key", "first"),
                                          ckey=("_ckey", "first"), compute=("compute", "any"), ops=("bid", "size"),
                                          chunk=("chunk", "max"))
    out["_key"] = out["ckey"].where(out["ckey"].notna(), out["key"])
    return out.drop(columns=["key", "ckey"]).reset_index(drop=True)


def comm_axes(df: pd.DataFrame) -> dict[str, list[str]]:
    """Palette key of each communication kind in a timeline -> the parallel axes it serves there (from the
    ``group`` column's process-group families, simulator.metrics.AXIS_OF_FAMILY), in AXES order."""
    from simulator.metrics import AXES, AXIS_OF_FAMILY
    if "group" not in df.columns:
        return {}
    comm = df[df["kind"] != "compute"]
    out: dict[str, set] = {}
    for k, co, fam in zip(_col(comm, "kind"), _col(comm, "collective"), _col(comm, "group")):
        if isinstance(fam, str):
            out.setdefault(colour_key(k, None, co), set()).add(AXIS_OF_FAMILY.get(fam, "other"))
    return {k: [a for a in AXES if a in v] for k, v in out.items()}


def axis_label(axis: str) -> str:
    return "DP/FSDP" if axis == "dp" else axis.upper()


def _draw_panel(ax, panel: Panel, scale: float, x_max: float, fill: float = 0.8, label_budget: int = 4000,
                merge: bool = True):
    lanes = panel.lanes
    ys, hs = lane_positions(lanes)
    y_of = {(ln.rank, ln.stream): i for i, ln in enumerate(lanes)}
    df = panel.timeline
    df = df[(df["end_s"] > df["start_s"]) & df["start_s"].notna() & df["end_s"].notna()]
    keys = [colour_key(k, ph, co) for k, ph, co in zip(_col(df, "kind"), _col(df, "phase"), _col(df, "collective"))]
    df = df.assign(_key=keys, _chunk=model_chunks(df))
    fig_w_px = ax.figure.get_figwidth() * ax.figure.dpi * ax.get_position().width
    s_per_px = x_max / scale / max(fig_w_px, 1.0)
    bars = blocks(df, tol_s=0.5 * s_per_px) if merge else \
        df.assign(compute=df["kind"] == "compute", chunk=df["_chunk"].astype(float))
    bars = bars.assign(_c=np.where(bars["_key"].isin(list(PHASE_COLOURS)), bars["chunk"].fillna(0), 0).astype(int))
    used = []
    for (key, c), sub in bars.groupby(["_key", "_c"], sort=False):
        verts = []
        for (r, s), part in sub.groupby(["rank", "stream"], sort=False):
            i = y_of.get((int(r), s))
            if i is not None:
                verts += _rects(ys[i], part["start_s"].to_numpy(), part["end_s"].to_numpy(), scale, hs[i] * fill)
        if verts:
            pc = _polys(verts, facecolors=chunk_colour(key, c), edgecolors="white", linewidths=0.3,
                                label=key if c == 0 else f"{key} chunk {c}", zorder=2)
            ax.add_collection(pc)
            if (key, c) not in used:
                used.append((key, c))
    # communication that runs on a compute lane (TP all-reduces, EP all-to-alls inside a micro-batch block)
    # keeps its own colour: a band through the middle of the block
    if merge:
        inline: dict[str, list] = {}
        for i, ln in enumerate(lanes):
            if not ln.compute_lane:
                continue
            part = df[(df["rank"] == ln.rank) & (df["stream"] == ln.stream) & (df["kind"] != "compute")]
            for key, sub in part.groupby("_key", sort=False):
                inline.setdefault(key, []).extend(
                    _rects(ys[i], sub["start_s"].to_numpy(), sub["end_s"].to_numpy(), scale, hs[i] * fill * 0.45))
        for key, verts in inline.items():
            ax.add_collection(_polys(verts, facecolors=colour_of(key), edgecolors="none", label=f"{key} inline",
                                             zorder=2.4))
            if (key, 0) not in used:
                used.append((key, 0))
    # idle spans on each rank's compute lane (from the ops themselves, not the merged blocks)
    bub_verts, exp_fill, exp_strip = [], [], []
    for i, ln in enumerate(lanes):
        if not ln.compute_lane:
            continue
        spans = idle_spans(df[df["rank"] == ln.rank], panel.step_time_s)
        h = hs[i] * fill
        bub_verts += _rects(ys[i], *spans["bubble"], scale, h)
        exp_fill += _rects(ys[i], *spans["exposed"], scale, h)
        exp_strip += _rects(ys[i] + h * 0.36, *spans["exposed"], scale, h * 0.28)     # lower edge of the bar
    if exp_fill:
        ax.add_collection(_polys(exp_fill, label="exposed_fill", zorder=1,
                                         **EXPOSED_STYLE))
        ax.add_collection(_polys(exp_strip, label="exposed", zorder=2.6, **EXPOSED_STRIP_STYLE))
    if bub_verts:
        ax.add_collection(_polys(bub_verts, label="bubble", zorder=1, **BUBBLE_STYLE))
    # micro-batch numbers on bars wide enough to hold them
    if bars["microbatch"].notna().any():
        comp = bars[bars["compute"] & bars["microbatch"].notna()]
        n = 0
        for r, s, st, en, mb in zip(*(_col(comp, c) for c in ("rank", "stream", "start_s", "end_s", "microbatch"))):
            i = y_of.get((int(r), s))
            text = str(int(mb))
            if i is None or (en - st) / s_per_px < 6.0 * len(text) + 1.5:
                continue
            ax.text((st + en) / 2 * scale, ys[i] - hs[i] * fill * 0.08, text, ha="center", va="center",
                    fontsize=6.5, color="white", zorder=3, gid="microbatch")
            n += 1
            if n >= label_budget:
                break
    # rank separators and lane labels
    ax.set_ylim(float(hs.sum()), 0.0)
    ticks = [ln.label if i == 0 or ln.rank != lanes[i - 1].rank else ln.stream for i, ln in enumerate(lanes)]
    ax.set_yticks(ys, ticks, fontsize=7.5)
    for i in range(1, len(lanes)):
        if lanes[i].rank != lanes[i - 1].rank:
            ax.axhline(ys[i] - hs[i] / 2, color="#CCCCCC", linewidth=0.6, zorder=0)
    ax.axvline(panel.step_time_s * scale, color="#333333", linewidth=0.8, linestyle=":", zorder=4)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return used, bool(bub_verts), bool(exp_fill)


def _named(results) -> dict:
    if isinstance(results, dict):
        if not results:
            raise ConfigError("nothing to plot: no results given")
        return results
    return {"": results}


def gantt(results, path=None, ranks=None, max_lanes: int = DEFAULT_MAX_LANES, title: str | None = None,
          metrics: dict | None = None, merge_blocks: bool = True) -> Figure:
    """Gantt timelines of one or several plans on one shared time axis (one panel per plan).

    results    a SimResult, a timeline DataFrame, or {plan name: SimResult | DataFrame}
    path       write the figure there (format from the suffix: .png, .svg, .pdf) if given
    ranks      simulated ranks to show (default: all, or one representative per pipeline stage)
    max_lanes  lane budget per panel when choosing ranks
    metrics    optional {plan name: Metrics} for the panel titles (step time, bubble, exposed comm)
    merge_blocks  draw each lane's consecutive ops of one micro-batch and phase as one bar (``blocks``);
               False draws every op
    """
    named = _named(results)
    panels = [panel_of(n, x, ranks, max_lanes) for n, x in named.items()]
    t_max = max((pn.step_time_s for pn in panels), default=0.0) or 1.0
    scale, unit = _time_unit(t_max)
    heights = [max(0.8, 0.3 * float(lane_positions(pn.lanes)[1].sum())) for pn in panels]   # inches
    gap_in, top_in, bottom_in = 0.55, 0.75 + (0.3 if title else 0.0), 0.5
    fig_h = sum(heights) + gap_in * (len(panels) - 1) + top_in + bottom_in
    fig = plt.figure(figsize=(14, fig_h), dpi=110)
    gs = fig.add_gridspec(len(panels), 1, height_ratios=heights, hspace=gap_in / (sum(heights) / len(panels)),
                          left=0.2, right=0.98, top=1 - top_in / fig_h, bottom=bottom_in / fig_h)
    axes = []
    used_keys, any_bubble, any_exposed = [], False, False
    for i, pn in enumerate(panels):
        ax = fig.add_subplot(gs[i], sharex=axes[0] if axes else None)
        ax.set_xlim(0, t_max * scale * 1.01)
        used, b, e = _draw_panel(ax, pn, scale, t_max * scale * 1.01, merge=merge_blocks)
        used_keys += [k for k in used if k not in used_keys]
        any_bubble |= b
        any_exposed |= e
        head = pn.name
        m = (metrics or {}).get(pn.name)
        bits = [f"step {pn.step_time_s * scale:.4g} {unit}"]
        if m is not None:
            bits += [f"bubble {m.bubble_fraction:.1%}", f"exposed comm {m.exposed_comm_fraction:.1%}",
                     f"MFU {m.mfu:.1%}"]
        if pn.note:
            bits.append(pn.note)
        ax.set_title((f"{head} — " if head else "") + ", ".join(bits), fontsize=9.5, loc="left")
        if i < len(panels) - 1:
            ax.tick_params(axis="x", labelbottom=False)
        axes.append(ax)
    axes[-1].set_xlabel(f"time ({unit})")
    canon = list(PHASE_COLOURS) + list(COMM_COLOURS)
    used_keys.sort(key=lambda kc: (canon.index(kc[0]), kc[1]))
    axes_of: dict[str, list] = {}
    for pn in panels:
        for k, v in comm_axes(pn.timeline).items():
            axes_of[k] = axes_of.get(k, []) + [a for a in v if a not in axes_of.get(k, [])]
    # communication entries name the parallel axes they serve: "all-reduce (TP, DP/FSDP)"
    handles = [Patch(facecolor=chunk_colour(k, c), label=legend_label(k) + (f", model chunk {c + 1}" if c else "")
                     + (f" ({', '.join(axis_label(a) for a in axes_of[k])})" if axes_of.get(k) else ""))
               for k, c in used_keys]
    if any_exposed:
        handles.append(Patch(label=EXPOSED_LABEL, facecolor=EXPOSED_STYLE["facecolor"],
                             edgecolor=EXPOSED_STRIP_STYLE["facecolor"], linewidth=1.2))
    if any_bubble:
        handles.append(Patch(label=BUBBLE_LABEL, **{**BUBBLE_STYLE, "linewidth": 0.5}))
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 8), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1 - (0.35 if title else 0.02) / fig_h))
    if title:
        fig.suptitle(title, fontsize=11, y=1 - 0.08 / fig_h, va="top")
    if path is not None:
        save(fig, path)
    return fig


def save(fig: Figure, path, *, dpi: float | None = None, tight: bool = True) -> Path:
    """Write ``fig`` atomically (format from the suffix, PNG without one: the temporary file's name must not
    choose it) at ``dpi`` (default the figure's) and return the path."""
    from simulator.atomic import write_with
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return write_with(path, lambda tmp: fig.savefig(tmp, dpi=dpi or fig.dpi, bbox_inches="tight" if tight else None,
                                                    format=fmt))


# ---------------------------------------------------------------------------------------------- memory
def memory_curve(result, rank: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(times_s, {category: bytes resident from that time on}) of one simulated rank over [0, step]:
    static memory plus the running sum of its alloc/free events; categories in MEMORY_CATEGORIES order."""
    from simulator.metrics import memory_events
    static = result.programs.static_memory.get(rank, {})
    times, deltas, cats = memory_events(result, rank)
    cat_names = [c for c in MEMORY_CATEGORIES if c in static or c in cats]
    cat_names += sorted({c for c in list(static) + list(cats) if c not in cat_names})
    grid = np.unique(np.concatenate([[0.0], times, [float(result.step_time_s)]]))
    levels = {}
    for c in cat_names:
        sel = np.array([x == c for x in cats], dtype=bool)
        t_c, d_c = times[sel], deltas[sel]
        cum = np.cumsum(d_c)
        # level at each grid time = static + sum of deltas at times <= t (all events at t applied)
        idx = np.searchsorted(t_c, grid, side="right") - 1
        dyn = np.where(idx >= 0, cum[np.clip(idx, 0, None)] if len(cum) else 0.0, 0.0)
        levels[c] = static.get(c, 0.0) + dyn
    return grid, levels


def memory_over_time(results, path=None, ranks=None, max_ranks: int = 8) -> Figure:
    """Memory of each shown rank over the step, stacked by category, with the HBM capacity line.

    results    a SimResult or {plan name: SimResult}: one row of panels per plan, one panel per rank
    ranks      simulated ranks to show (default: all, or one representative per pipeline stage)
    """
    named = _named(results)
    rows = []
    for name, res in named.items():
        if not _is_result(res):
            raise ConfigError(f"{name}: memory over time needs a SimResult, got {type(res).__name__}")
        if ranks is not None:
            bad = [r for r in ranks if r not in res.programs.ops]
            if bad:
                raise ConfigError(f"{name}: rank(s) {bad[:8]} are not simulated")
            picks = rank_labels(res, list(dict.fromkeys(ranks)))
        else:
            picks = representative_ranks(res, max_ranks)
        rows.append((name, res, picks))
    ncols = max(len(p) for _, _, p in rows)
    t_max = max(float(res.step_time_s) for _, res, _ in rows) or 1.0
    scale, unit = _time_unit(t_max)
    W, H = max(6.0, 3.3 * ncols), 2.6 * len(rows) + 0.9        # inches; fixed margins (tight_layout is slow)
    fig, axes = plt.subplots(len(rows), ncols, figsize=(W, H), dpi=110, squeeze=False, sharex=True, sharey=True,
                             gridspec_kw=dict(left=0.75 / W, right=1 - 0.15 / W, top=1 - 0.85 / H, bottom=0.5 / H,
                                              wspace=0.12, hspace=0.65 / 1.9))
    used = []
    for i, (name, res, picks) in enumerate(rows):
        for j in range(ncols):
            ax = axes[i][j]
            if j >= len(picks):
                ax.set_visible(False)
                continue
            rank, label = picks[j]
            grid, levels = memory_curve(res, rank)
            cats = list(levels)
            if cats:
                ax.stackplot(grid * scale, [levels[c] / 1e9 for c in cats], step="post",
                             colors=[MEMORY_COLOURS.get(c, "#CCCCCC") for c in cats], labels=cats, linewidth=0)
            else:
                ax.text(0.5, 0.5, "no memory accounting\nin these programs", transform=ax.transAxes,
                        ha="center", va="center", fontsize=8, color="#666666")
            used += [c for c in cats if c not in used]
            cap = float(res.cost_model.memory_capacity_bytes(rank))
            ax.axhline(cap / 1e9, color="#C0392B", linestyle="--", linewidth=1.0, gid="hbm")
            total = sum(levels.values()) if levels else np.zeros(len(grid))
            k = int(np.argmax(total))
            peak = float(total[k])
            if cats:
                ax.plot([grid[k] * scale], [peak / 1e9], marker="v", color="#333333", markersize=4, gid="peak")
            ax.set_title(f"{name + ' — ' if name else ''}{label}\npeak {peak / 1e9:.3g} GB of {cap / 1e9:.3g} GB",
                         fontsize=8)
            ax.tick_params(labelsize=7)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
            if j == 0:
                ax.set_ylabel("memory (GB)", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel(f"time ({unit})", fontsize=8)
    handles = [Patch(facecolor=MEMORY_COLOURS.get(c, "#CCCCCC"), label=c) for c in used]
    handles.append(plt.Line2D([], [], color="#C0392B", linestyle="--", label="HBM capacity"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False)
    hidden = [shown_ranks_note(res, picks) for _, res, picks in rows]
    if any(hidden):
        fig.text(0.5, 0.005, "; ".join(h for h in hidden if h), ha="center", va="bottom", fontsize=7,
                 color="#666666", gid="ranks_note")
    if path is not None:
        save(fig, path)
    return fig


# ---------------------------------------------------------------------------------------------- breakdown
BREAKDOWN_ORDER = ("forward", "backward_input", "backward_weight", "backward", "optimizer", "other",
                   "exposed_comm", "bubble")


def time_breakdown(result, metrics=None) -> dict[str, float]:
    """Where the step time of an average rank goes (seconds; means over ranks weighted by the ranks each
    simulated one stands for): compute per phase, exposed communication, bubble. The parts sum to the
    step time. Exposed communication and bubble are the engine metrics' ``exposed_comm_s`` and ``idle_s``;
    compute is split by phase in proportion to the busy time of each phase's ops."""
    from simulator.metrics import compute_metrics
    m = metrics if metrics is not None and metrics.per_rank else compute_metrics(result)
    out = dict.fromkeys(BREAKDOWN_ORDER, 0.0)
    total_w = 0.0
    for rm in m.per_rank:
        prog = result.programs.ops[rm.rank]
        st, en = result.start_s[rm.rank], result.end_s[rm.rank]
        by_phase: dict[str, float] = {}
        for op, s, e in zip(prog, st, en):
            if op.kind == "compute" and e > s:
                k = colour_key("compute", op.phase, None)
                by_phase[k] = by_phase.get(k, 0.0) + (e - s)
        busy = sum(by_phase.values())
        w = rm.represents
        total_w += w
        for k, v in by_phase.items():
            out[k] += w * rm.compute_s * v / busy
        out["exposed_comm"] += w * rm.exposed_comm_s
        out["bubble"] += w * rm.idle_s
    return {k: v / total_w for k, v in out.items()} if total_w else out


#: one colour per parallel axis (simulator.metrics.AXES), shades of red so that exposed communication reads as one
#: family in the bars
AXIS_COLOURS = {"tp": "#7B1F1F", "cp": "#A93226", "ep": "#D35400", "pp": "#E74C3C", "dp": "#F1948A",
                "other": "#C0392B"}
def exposed_by_axis(result, metrics=None) -> dict[str, float]:
    """``time_breakdown``'s exposed communication split by parallel axis (seconds, mean over ranks): each
    rank's exposed time shared in proportion to each axis's own exposed time (axes can overlap one another;
    the split keeps the parts summing to the exposed communication)."""
    from simulator.metrics import compute_metrics
    m = metrics if metrics is not None and metrics.per_rank else compute_metrics(result)
    out: dict[str, float] = {}
    total_w = sum(rm.represents for rm in m.per_rank)
    for rm in m.per_rank:
        by_axis = {ax: e for ax, (_, e) in rm.comm_by_axis.items() if e > 0}
        axis_sum = sum(by_axis.values())
        for ax, e in (by_axis.items() if axis_sum > 0 else [("other", 1.0)]):
            share = e / axis_sum if axis_sum > 0 else 1.0
            out[ax] = out.get(ax, 0.0) + rm.represents * rm.exposed_comm_s * share / total_w
    return {ax: v for ax, v in out.items() if v > 0}


BREAKDOWN_COLOURS = {**{k: PHASE_COLOURS[k] for k in PHASE_COLOURS}, "exposed_comm": EXPOSED_STRIP_STYLE["facecolor"],
                     **{f"exposed_{a}": c for a, c in AXIS_COLOURS.items()}, "bubble": "#E8E8E8"}
BREAKDOWN_LABELS = {**PHASE_LABELS, "exposed_comm": EXPOSED_LABEL, "bubble": BUBBLE_LABEL,
                    **{f"exposed_{a}": f"exposed {a.upper() if a != 'dp' else 'DP/FSDP'} comm" for a in AXIS_COLOURS}}


def breakdown_bars(results, path=None, metrics: dict | None = None) -> Figure:
    """Stacked horizontal bars, one per plan: the step time split as ``time_breakdown``."""
    named = _named(results)
    parts = {n: time_breakdown(r, (metrics or {}).get(n)) for n, r in named.items()}
    t_max = max(sum(p.values()) for p in parts.values()) or 1.0
    scale, unit = _time_unit(t_max)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(parts) + 1.6), dpi=110)
    names = list(parts)
    y = np.arange(len(names))
    left = np.zeros(len(names))
    axes = {n: exposed_by_axis(r, (metrics or {}).get(n)) for n, r in named.items()}
    keys = [k for k in BREAKDOWN_ORDER if k != "exposed_comm"]
    keys[keys.index("bubble"):keys.index("bubble")] = [f"exposed_{a}" for a in AXIS_COLOURS]
    for k in keys:
        if k.startswith("exposed_"):
            vals = np.array([axes[n].get(k.removeprefix("exposed_"), 0.0) for n in names]) * scale
        else:
            vals = np.array([parts[n][k] for n in names]) * scale
        if not vals.any():
            continue
        style = {"hatch": "////", "edgecolor": "#8A8A8A"} if k == "bubble" else {"edgecolor": "white"}
        ax.barh(y, vals, left=left, color=BREAKDOWN_COLOURS[k], label=BREAKDOWN_LABELS[k], height=0.6,
                linewidth=0.5, gid=k, **style)
        left += vals
    for yi, total in zip(y, left):
        ax.text(total, yi, f"  {total:.4g} {unit}", va="center", fontsize=8)
    ax.set_yticks(y, [n or "run" for n in names], fontsize=9)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(0, t_max * scale * 1.15)
    ax.set_xlabel(f"time per step, mean over ranks ({unit})")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    if path is not None:
        save(fig, path)
    return fig


def close(fig: Figure) -> None:
    """Release a figure's memory (pyplot keeps figures alive until closed)."""
    plt.close(fig)


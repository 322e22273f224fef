"""A self-contained HTML report of a comparison: pictures embedded as PNG data URIs, the metrics table, each
plan's definition (its experiment options) and the names of the Perfetto files written beside it.

The page loads nothing else: no scripts, style sheets, fonts or images from files or the network.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import io
from pathlib import Path

import yaml

from clustersim.runs import formatted_table, metrics_table

#: how every report begins (compare recognises its own reports by it before writing over one)
REPORT_HEAD = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>"

CAPTIONS = {
    "gantt": ("Timelines", "One panel per plan on a shared time axis; one lane per rank and stream. Compute is "
              "coloured by phase, communication by collective kind; numbers are micro-batches. On each compute "
              "lane, hatched grey is bubble (nothing runs) and light red with a dark red strip along the lane's "
              "lower edge is exposed communication (communication runs, no compute)."),
    "breakdown": ("Where the step time goes", "Mean over ranks: compute by phase, exposed communication and "
                  "bubble; the parts add up to the step time."),
    "measured": ("Measured vs simulated", "One measured step of the trace (kernels or CPU ops per stream, "
                 "collectives on their own lanes) next to the simulated plans, on the same time axis."),
    "memory": ("Memory over time", "Per representative rank, stacked by category, with the device's HBM "
               "capacity dashed."),
}


def png_data_uri(fig_or_png, dpi: int | None = None) -> str:
    """A ``data:image/png;base64,...`` URI of a matplotlib Figure (or of PNG bytes)."""
    if isinstance(fig_or_png, (bytes, bytearray)):
        data = bytes(fig_or_png)
    else:
        buf = io.BytesIO()
        fig_or_png.savefig(buf, format="png", dpi=dpi or fig_or_png.dpi, bbox_inches="tight")
        data = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;max-width:1500px;
     color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.sub{color:#666;font-size:.9em}
table{border-collapse:collapse;font-size:.9em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.3em .7em;text-align:right} th{background:#f4f4f4}
td.name,th.name{text-align:left;font-weight:600}
img{max-width:100%;height:auto;border:1px solid #eee}
pre{background:#f8f8f8;padding:.6em;font-size:.85em;overflow-x:auto}
.plans{display:flex;flex-wrap:wrap;gap:1em} .plan{flex:1 1 320px}
.note{color:#8a6d00}
.scroll{overflow-x:auto;max-width:100%}
"""


def html_table(df, index_name: str = "plan") -> str:
    """An HTML table of a DataFrame (index first, every value escaped)."""
    cols = list(df.columns)
    head = f'<tr><th class="name">{html.escape(index_name)}</th>' + "".join(
        f"<th>{html.escape(str(c))}</th>" for c in cols) + "</tr>"
    body = []
    for name, row in df.iterrows():
        cells = "".join(f"<td>{html.escape(str(v))}</td>" for v in row)
        body.append(f'<tr><td class="name">{html.escape(str(name))}</td>{cells}</tr>')
    return f"<div class='scroll'><table>{head}{''.join(body)}</table></div>"      # wide tables scroll


def render_report(runs, figures: dict, title: str | None = None, perfetto_files: dict | None = None,
                  extra_sections: list[tuple[str, str]] | None = None, command: str | None = None) -> str:
    """The HTML text. ``runs``: PlanRuns; ``figures``: {key: Figure or PNG bytes} (keys of CAPTIONS are
    captioned); ``perfetto_files``: {plan name: file name}; ``extra_sections``: (heading, HTML) pairs;
    ``command``: the command line that made the report."""
    title = title or "clustersim comparison"
    perfetto_files = perfetto_files or {}
    parts = [f"{REPORT_HEAD}{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p class='sub'>{len(runs)} plan(s): {html.escape(', '.join(r.name for r in runs))} · generated "
             f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC by clustersim</p>",
             *([f"<p class='sub'>command: <code>{html.escape(command)}</code></p>"] if command else []),
             *(["<h2>Metrics</h2>", html_table(formatted_table(runs))] if runs else [])]
    for key, fig in figures.items():
        head, cap = CAPTIONS.get(key, (key, ""))
        parts.append(f"<h2>{html.escape(head)}</h2>")
        if cap:
            parts.append(f"<p class='sub'>{html.escape(cap)}</p>")
        parts.append(f"<img alt='{html.escape(head)}' src='{png_data_uri(fig)}'>")
    for head, body in extra_sections or []:
        parts.append(f"<h2>{html.escape(head)}</h2>{body}")
    if not runs:                      # a measured trace alone: no plan sections to show
        parts.append("</body></html>\n")
        return "\n".join(parts)
    parts.append("<h2>Plans</h2><div class='plans'>")
    first = runs[0]
    for r in runs:
        shown = r.definition if r is first else plan_difference(first.definition, r.definition)
        text = yaml.safe_dump(_plain(shown), sort_keys=False, default_flow_style=False).strip() \
            if shown else ("(hand-built programs)" if not r.definition else f"(same as {first.name})")
        if r is not first and shown:
            text = f"# as {first.name}, except:\n{text}"
        trace = perfetto_files.get(r.name)
        parts.append(f"<div class='plan'><h3>{html.escape(r.name)}</h3><pre>{html.escape(text)}</pre>")
        if trace:
            parts.append(f"<p>Perfetto trace: <code>{html.escape(trace)}</code> (open it in the Perfetto UI "
                         f"or Chrome's trace viewer)</p>")
        for n in r.notes:
            parts.append(f"<p class='note'>note: {html.escape(str(n))}</p>")
        parts.append("</div>")
    parts.append("</div>")
    raw = metrics_table(runs)
    parts.append("<h2>Raw metrics</h2><p class='sub'>SI units: seconds, bytes, fractions of the step time.</p>")
    parts.append(html_table(raw.map(lambda v: f"{v:.6g}" if isinstance(v, float) else v)))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def plan_difference(base: dict, other: dict) -> dict:
    """The entries of ``other`` that differ from ``base`` (nested mappings compared key by key; a key
    ``base`` has and ``other`` lacks shows as None)."""
    out = {}
    for k in list(other) + [k for k in base if k not in other]:
        a, b = base.get(k), other.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            d = plan_difference(a, b)
            if d:
                out[k] = d
        elif a != b:
            out[k] = b
    return out


def _plain(x):
    """YAML-safe copy (tuples to lists, numpy scalars to Python)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return x.item()
    return x


def write_report(path, runs, figures: dict, title: str | None = None, perfetto_files: dict | None = None,
                 extra_sections: list[tuple[str, str]] | None = None, command: str | None = None) -> Path:
    """Write the report (``render_report``) to ``path`` and return it."""
    from simulator.atomic import write_text
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, render_report(runs, figures, title, perfetto_files, extra_sections, command))

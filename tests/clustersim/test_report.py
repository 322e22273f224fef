"""The HTML report holds every plan, its pictures embedded, and loads nothing from outside itself."""
import base64
import re
from html.parser import HTMLParser

import matplotlib
import pytest

from clustersim import compare as cmp
from simulator.costs import SimpleCostModel
from simulator.engine import run
from clustersim.report import render_report, write_report
from tests.clustersim.test_plots import toy_1f1b
from tests.simulator.toy import toy_gpipe


class Refs(HTMLParser):
    """Every attribute that can make a browser fetch something, plus the images and table cells."""

    def __init__(self):
        super().__init__()
        self.refs, self.imgs, self.cells, self.tags = [], [], [], []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href", "srcset", "data", "poster", "action", "background"):
                self.refs.append((tag, k, v))
        if tag == "img":
            self.imgs.append(dict(attrs)["src"])
        self._in_cell = tag in ("td", "th")

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._in_cell = False


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    matplotlib.pyplot.close("all")


@pytest.fixture(scope="module")
def report_text(tmp_path_factory):
    cm = SimpleCostModel(flops_per_s=1e12, link_bytes_per_s=1e9, memory_bytes=40e9)
    runs = cmp.plan_runs({"gpipe <m=4>": run(toy_gpipe(4, 4), cm), "1f1b & m=8": run(toy_1f1b(4, 8), cm)},
                         {"1f1b & m=8": {"schedule": "1f1b", "pp": 4, "micro_batch": 1}})
    path = tmp_path_factory.mktemp("rep") / "report.html"
    files = cmp.write_outputs(runs, path.parent / "out", path, title="Schedules", svg=False)
    assert path in files
    return runs, path.read_text(encoding="utf-8")


def test_report_contains_every_plan_its_metrics_and_definition(report_text):
    runs, text = report_text
    p = Refs()
    p.feed(text)
    for r in runs:
        assert r.name in p.cells                       # metrics rows, names escaped and unescaped back
        assert f"{r.metrics.step_time_s:.4g}" in p.cells
        assert f"{r.metrics.bubble_fraction:.1%}" in p.cells
    assert "gpipe &lt;m=4&gt;" in text and "1f1b &amp; m=8" in text
    assert "schedule: 1f1b" in text and "micro_batch: 1" in text           # the plan definition
    assert "1f1b_m_8.perfetto.json" in text and "gpipe_m_4.perfetto.json" in text
    assert "<h1>Schedules</h1>" in text


def test_report_is_self_contained(report_text):
    _, text = report_text
    p = Refs()
    p.feed(text)
    assert len(p.imgs) == 3                                   # gantt, breakdown, memory
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(v.startswith("data:") for _, _, v in p.refs), p.refs
    assert not {"script", "link", "iframe", "object", "embed"} & set(p.tags)
    bare = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)
    assert not re.search(r"https?:|//[a-z]|url\(|@import", bare, re.I)


def test_render_accepts_png_bytes_and_extra_sections(tmp_path):
    cm = SimpleCostModel(flops_per_s=1e12)
    runs = cmp.plan_runs({"only": run(toy_gpipe(2, 2), cm)})
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    text = render_report(runs, {"custom": png}, extra_sections=[("Real vs simulated", "<p>x</p>")])
    assert "data:image/png;base64," + base64.b64encode(png).decode() in text
    assert "<h2>Real vs simulated</h2><p>x</p>" in text
    assert "(hand-built programs)" in text
    out = write_report(tmp_path / "sub" / "r.html", runs, {})
    assert out.read_text().startswith("<!DOCTYPE html>")

"""Issue 18 item 10 (report): wide tables scroll, a report without plans hides the plan sections, and plan
definitions after the first show only what differs from it."""
from clustersim import compare as cmp
from clustersim.report import plan_difference, render_report
from simulator.costs import SimpleCostModel
from simulator.engine import run
from tests.simulator.toy import toy_gpipe


def _runs():
    cm = SimpleCostModel()
    defs = {"a": {"cluster": "dgx-h100", "pp": 4, "schedule": "gpipe", "faults": {"seed": 1, "jitter": 0.1}},
            "b": {"cluster": "dgx-h100", "pp": 4, "schedule": "1f1b", "faults": {"seed": 1, "jitter": 0.2}}}
    return cmp.plan_runs({"a": run(toy_gpipe(4, 4), cm), "b": run(toy_gpipe(4, 4), cm)}, defs)


def test_tables_scroll_and_second_plan_shows_differences_only():
    text = render_report(_runs(), {})
    assert text.count("<div class='scroll'><table>") == 2 and ".scroll{overflow-x:auto" in text
    plans = text.split("<h2>Plans</h2>", 1)[1].split("<h2>Raw metrics</h2>", 1)[0]
    first, second = plans.split("<h3>b</h3>")
    assert "cluster: dgx-h100" in first and "schedule: gpipe" in first
    assert "# as a, except:" in second and "schedule: 1f1b" in second and "jitter: 0.2" in second
    assert "cluster:" not in second and "seed:" not in second and "pp:" not in second


def test_plan_difference():
    assert plan_difference({"x": 1, "y": {"z": 2, "w": 3}}, {"x": 1, "y": {"z": 2, "w": 4}}) == {"y": {"w": 4}}
    assert plan_difference({"x": 1, "k": 2}, {"x": 1}) == {"k": None}
    assert plan_difference({"x": 1}, {"x": 1}) == {}


def test_report_without_plans_hides_empty_sections():
    text = render_report([], {"measured": b"\x89PNG fake"}, extra_sections=[("Measured vs simulated: metrics", "<p>t</p>")])
    for head in ("<h2>Metrics</h2>", "<h2>Plans</h2>", "<h2>Raw metrics</h2>"):
        assert head not in text
    assert "Measured vs simulated: metrics" in text

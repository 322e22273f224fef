"""The example files a user copies from examples/ load and resolve to valid plans (no simulation)."""
from pathlib import Path

import pytest

from clustersim.compare import load_compare_file
from clustersim.experiment import experiment_from_dict, load_experiment, resolve_model, resolve_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _resolves(exp):
    model = resolve_model(exp)
    plan = resolve_plan(exp, model, exp.gpus)
    assert plan.world_size == exp.gpus
    return plan


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("compare-*.yaml")), ids=lambda p: p.name)
def test_compare_examples_resolve(path):
    base, variants, _ = load_compare_file(path)
    assert variants
    plans = {name: _resolves(experiment_from_dict({**base, **over}, where=f"{path.name}: {name}"))
             for name, over in variants}
    assert len(set(map(repr, plans.values()))) == len(plans)      # the variants differ


def test_experiment_example_resolves():
    _resolves(load_experiment(EXAMPLES / "experiment.yaml"))

"""The calibration's per-op framework overhead: added once to every compute op, validated on load."""
import pytest

from simulator.calibration import Calibration, ComputeFit
from simulator.errors import ConfigError
from simulator.program import compute


def test_op_overhead_adds_to_every_compute_op():
    import topologies
    from topologies.cost import ClusterCostModel
    cluster = topologies.load_cluster("dgx-h100", 8)
    device = cluster.device(0).name
    base = Calibration([ComputeFit(device, peak_flops_per_s=5e14, half_saturation_flops=0.0)])
    ovh = Calibration([ComputeFit(device, peak_flops_per_s=5e14, half_saturation_flops=0.0, op_overhead_s=2e-5)])
    a = ClusterCostModel(cluster, calibration=base, gpu_variation=0)
    b = ClusterCostModel(cluster, calibration=ovh, gpu_variation=0)
    for flops in (1e9, 1e12):
        op = compute("gemm", flops)
        assert a.compute_time_s(0, op) == pytest.approx(flops / 5e14)
        assert b.compute_time_s(0, op) == pytest.approx(flops / 5e14 + 2e-5)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_bad_op_overhead_is_rejected(bad):
    d = Calibration([ComputeFit("cpu", 1e11, op_overhead_s=0.0)]).to_dict()
    d["compute"][0]["op_overhead_s"] = bad
    with pytest.raises(ConfigError, match="op_overhead_s"):
        Calibration.from_dict(d)

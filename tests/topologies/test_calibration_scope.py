"""Issue 18 item 1: a calibration applies only to the device and backend it was measured on."""
import json
from pathlib import Path

import pytest

from simulator.calibration import Calibration, CollectiveFit, ComputeFit, LayerFit
from simulator.costs import CommRequest
from simulator.errors import ConfigError
from simulator.program import compute
from topologies import load_cluster
from topologies.cost import ClusterCostModel, collective_backend
from topologies.specs import accelerator_for_device, get_accelerator, same_device

H100_JSON = Path(__file__).resolve().parents[2] / "traces" / "data" / "h100.json"


def _cpu_gloo() -> Calibration:
    """What `calibrate` writes from the CPU / gloo samples: a CPU compute and layer fit, gloo collectives."""
    return Calibration(
        compute=[ComputeFit("CPU AMD EPYC", 8.8e10, 1.4e5)],
        layers=[LayerFit("CPU AMD EPYC", "forward", 7.5e10, 4e7), LayerFit("CPU AMD EPYC", "backward", 7.8e10, 7e7)],
        collectives=[CollectiveFit("all_reduce", 2, "intra", 3e-4, 1.5e9, backend="gloo")])


@pytest.mark.parametrize("name, preset", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("H100-SXM", "H100-SXM"), ("h100", "H100-SXM"),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None),
    ("NVIDIA A100 80GB PCIe", None), ("CPU AMD EPYC", None), ("cpu", None)])
def test_device_identity_maps_reported_names_to_presets(name, preset):
    got = accelerator_for_device(name)
    assert (got.name if got else None) == preset
    if preset:
        assert same_device(name, get_accelerator(preset))
    assert not same_device(name, get_accelerator("B200" if preset != "B200" else "H200"))


def test_shipped_h100_calibration_prices_dgx_h100_compute():
    """traces/data/h100.json names its device as CUDA reports it ("NVIDIA H100 80GB HBM3"): its compute fit
    must price the H100-SXM preset (on main it silently fell back to the default efficiency)."""
    cal = Calibration.load(H100_JSON)
    cluster = load_cluster("dgx-h100", 8)
    m = ClusterCostModel(cluster, calibration=cal, gpu_variation=0)
    fit = cal.compute[0]
    op = compute("gemm", flops=1e12)
    assert m.compute_time_s(0, op) == pytest.approx(1e12 / fit.achieved_flops_per_s(1e12), rel=1e-12)
    assert any("compute fit of 'NVIDIA H100 80GB HBM3' applied to H100-SXM" in n for n in m.calibration_notes)
    assert m.calibration_summary().startswith("compute of 'NVIDIA H100 80GB HBM3'")


def test_fits_of_other_devices_are_not_used_and_the_notes_say_so():
    """An H100 + H200 calibration on H100 uses the H100 fit and says the H200 one is not used; the H100-only
    shipped file is refused on an H200 cluster."""
    h100 = Calibration.load(H100_JSON)
    both = Calibration(compute=h100.compute + [ComputeFit("NVIDIA H200", 9e14, 1e9)], collectives=h100.collectives)
    m = ClusterCostModel(load_cluster("dgx-h100", 8), calibration=both)
    assert m._compute_fit.device == "NVIDIA H100 80GB HBM3"
    assert any("'NVIDIA H200' not used (cluster device H100-SXM)" in n for n in m.calibration_notes)
    with pytest.raises(ConfigError, match="not H200"):
        ClusterCostModel(load_cluster("dgx-h100", 8, accelerator="H200"), calibration=h100)


def test_cpu_gloo_calibration_is_refused_on_a_gpu_cluster():
    cluster = load_cluster("dgx-h100", 8)
    assert collective_backend(cluster.accelerator) == "nccl"
    with pytest.raises(ConfigError, match=r"'CPU AMD EPYC', not H100-SXM.*gloo, not nccl.*--calibration-scope any"):
        ClusterCostModel(cluster, calibration=_cpu_gloo())


def test_calibration_scope_any_applies_it_and_says_so():
    cluster = load_cluster("dgx-h100", 8)
    cal = _cpu_gloo()
    m = ClusterCostModel(cluster, calibration=cal, calibration_scope="any")
    t = m.comm_time_s(CommRequest("all_reduce", (0, 1), 1e6))
    assert t == pytest.approx(cal.collectives[0].time_s(1e6, 2))
    assert all("forced by --calibration-scope any" in n for n in m.calibration_notes)
    assert len(m.calibration_notes) == 3 and m.calibration_summary().endswith("[forced]")


def test_backend_of_the_cluster_is_preferred_and_other_backends_ignored():
    cluster = load_cluster("dgx-h100", 8)
    nccl = CollectiveFit("all_reduce", 2, "intra", 1e-5, 4e11, backend="nccl")
    gloo = CollectiveFit("all_reduce", 8, "intra", 3e-4, 1.5e9, backend="gloo")
    m = ClusterCostModel(cluster, calibration=Calibration(collectives=[gloo, nccl]))
    assert m.comm_time_s(CommRequest("all_reduce", tuple(range(8)), 1e6)) == pytest.approx(nccl.time_s(1e6, 8))


def test_simulate_refuses_then_forces_and_reports_the_calibration(tmp_path, capsys):
    from clustersim.cli import main
    from clustersim.experiment import Experiment, run_experiment
    p = tmp_path / "calib.json"
    _cpu_gloo().save(p)
    argv = ["simulate", "--cluster", "dgx-h100", "--gpus", "8", "--model", "tiny", "--tp", "2", "--calibration", str(p)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--calibration-scope any" in err and "Traceback" not in err
    assert main(argv + ["--calibration-scope", "any", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "[forced]" in out["calibration"] and any("forced" in n for n in out["notes"])
    ok = run_experiment(Experiment(cluster="dgx-h100", gpus=8, model="tiny", tp=2, calibration=str(H100_JSON)))
    assert ok.calibration.startswith("compute of 'NVIDIA H100 80GB HBM3'")
    assert any(n.startswith("calibration: compute fit") for n in ok.summary()["notes"])

"""Layer fits (the collector's layer benchmark): format, lookup, the cost model's use of them, and FLOPs
that agree with the programs' own per-layer ops."""
import json

import numpy as np
import pytest

from schedules.generate import build_programs
from schedules.models import custom_model
from schedules.plan import ParallelPlan
from simulator.calibration import Calibration, ComputeFit, LayerFit
from simulator.errors import ConfigError
from simulator.program import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, OPTIMIZER, Op


def _cal(device="H100"):
    return Calibration([ComputeFit(device, peak_flops_per_s=6e14, half_saturation_flops=0.0)],
                       layers=[LayerFit(device, "forward", 4e14, 2e9), LayerFit(device, "backward", 5e14, 3e9)])


def test_layers_round_trip_and_old_files_still_load(tmp_path):
    cal = _cal()
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert back.layers == cal.layers
    assert back.layer_fit("NVIDIA H100 80GB HBM3", "backward").peak_flops_per_s == 5e14   # substring match
    assert back.layer_fit("A100", "forward") is None
    plain = Calibration([ComputeFit("cpu", 1e11)]).to_dict()
    assert "layers" not in plain                       # files without layer fits are unchanged
    assert Calibration.from_dict(plain).layers == []


@pytest.mark.parametrize("field,value", [("phase", "recompute"), ("peak_flops_per_s", 0.0),
                                         ("half_saturation_flops", -1.0), ("half_saturation_flops", float("inf"))])
def test_bad_layer_fit_is_rejected(field, value):
    d = json.loads(json.dumps(_cal().to_dict()))
    d["layers"][0][field] = value
    with pytest.raises(ConfigError, match="layer fit"):
        Calibration.from_dict(d)


def test_two_fits_of_one_key_are_refused():
    """Lookups take the first fit of a key, so a file listing two (a slow one first) let its order decide: a
    24x longer step from a duplicated collective fit."""
    from simulator.calibration import CollectiveFit
    d = json.loads(json.dumps(_cal().to_dict()))
    d["layers"].append(dict(d["layers"][0], peak_flops_per_s=1e12))
    with pytest.raises(ConfigError, match=r"layer fits #0 and #2 have the same device and phase"):
        Calibration.from_dict(d)
    d = Calibration([ComputeFit("H100", 1e14), ComputeFit("h100", 5e14)]).to_dict()
    with pytest.raises(ConfigError, match=r"compute fits #0 and #1 have the same device \(h100\)"):
        Calibration.from_dict(d)
    fit = CollectiveFit("all_reduce", 8, "intra", 1e-5, 1e11)
    d = Calibration(collectives=[fit, CollectiveFit("all_reduce", 8, "intra", 1e-2, 1e11)]).to_dict()
    with pytest.raises(ConfigError, match=r"collective fits #0 and #1 .* \(all_reduce, 8, intra, nccl\)"):
        Calibration.from_dict(d)
    other = Calibration(collectives=[fit, CollectiveFit("all_reduce", 16, "intra", 1e-5, 1e11)]).to_dict()
    assert len(Calibration.from_dict(other).collectives) == 2      # another group size: another fit
    # a file without any fit calibrated nothing while simulate printed it and the evidence said "calibrated"
    with pytest.raises(ConfigError, match="holds no fit"):
        Calibration.from_dict(Calibration().to_dict())


def test_layer_fit_prices_layer_ops_by_phase_and_the_gemm_fit_the_rest():
    import topologies
    from topologies.cost import ClusterCostModel
    cluster = topologies.load_cluster("dgx-h100", 8)
    m = ClusterCostModel(cluster, calibration=_cal(cluster.device(0).name), gpu_variation=0)
    F = 1e12
    fwd, bwd = (F + 2e9) / 4e14, (F + 3e9) / 5e14                       # (F + F_half) / peak
    assert m.compute_time_s(0, Op("compute", "F L3", flops=F, layer=3, phase=FORWARD)) == pytest.approx(fwd)
    for phase in (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT):
        assert m.compute_time_s(0, Op("compute", "B L3", flops=F, layer=3, phase=phase)) == pytest.approx(bwd)
    # not a layer op (LM head, embedding) or not a forward/backward phase: the GEMM fit
    assert m.compute_time_s(0, Op("compute", "lm_head", flops=F, phase=FORWARD)) == pytest.approx(F / 6e14)
    assert m.compute_time_s(0, Op("compute", "x", flops=F, layer=0, phase=OPTIMIZER)) == pytest.approx(F / 6e14)
    # same FLOPs, different phase: not mixed up by the cost cache
    assert m.compute_time_s(0, Op("compute", "F L0", flops=F, layer=0, phase=FORWARD)) == pytest.approx(fwd)
    # memory time still bounds a layer op from below
    heavy = Op("compute", "F L0", flops=1e6, mem_bytes=1e12, layer=0, phase=FORWARD)
    assert m.compute_time_s(0, heavy) == pytest.approx(1e12 / m._mem_per_s)


@pytest.mark.parametrize("tp,micro_batch", [(1, 4), (2, 4), (2, 1), (4, 2)])
def test_layer_benchmark_flops_equal_the_programs_layer_ops(tp, micro_batch):
    """traces.calibrate.layer_samples computes a benchmark row's FLOPs exactly as the programs do."""
    pytest.importorskip("pandas")
    from traces.calibrate import layer_samples
    hidden, heads, ffn, seq = 256, 4, 688, 128
    manifest = {"devices": ["cpu"], "results": [{"hidden": hidden, "heads": heads, "ffn": ffn, "seq": seq,
                                                 "batch": micro_batch, "tp": tp, "forward_s": 1.0,
                                                 "backward_s": 2.0}]}
    s = layer_samples(manifest, "test").set_index("phase")["flops"]
    model = custom_model(layers=2, hidden=hidden, heads=heads, ffn=ffn, vocab=512, gated_mlp=True)
    plan = ParallelPlan(dp=1, tp=tp, micro_batch=micro_batch, global_batch=micro_batch, seq=seq)
    ops = build_programs(model, plan, tp, symmetric=False).ops[0]
    (f,) = [o.flops for o in ops if o.kind == "compute" and o.layer == 0 and o.phase == FORWARD]
    (b,) = [o.flops for o in ops if o.kind == "compute" and o.layer == 0 and o.phase == BACKWARD]
    assert s["forward"] == pytest.approx(f, rel=1e-12) and s["backward"] == pytest.approx(b, rel=1e-12)


def test_layer_fit_recovers_a_linear_time_model():
    from traces.calibrate import fit_layer
    flops = np.repeat(np.logspace(7, 10, 7), 3)
    t = (flops + 5e7) / 7e10
    f = fit_layer("cpu", "forward", flops, t)
    assert f.peak_flops_per_s == pytest.approx(7e10, rel=1e-9) and f.half_saturation_flops == pytest.approx(5e7)
    assert f.time_s(1e9) == pytest.approx((1e9 + 5e7) / 7e10)

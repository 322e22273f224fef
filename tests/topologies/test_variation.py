"""GPU speed variation: the slowest of N GPUs paces a synchronous job (topologies.variation)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import topologies
from simulator.errors import ConfigError
from simulator.kernels import GEMM, Kernel, KernelList
from simulator.program import Op
from topologies.cost import ClusterCostModel
from topologies.variation import (GPU_SPEED_SIGMA, NODE_GPUS, NODE_SPREAD, expected_max_std_normal,
                                  slowest_gpu_factor)


def test_expected_maximum_closed_forms():
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    # E[max of 3] = 3 / (2 sqrt(pi))
    assert expected_max_std_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_expected_maximum_matches_brute_force(n):
    rng = np.random.default_rng(0)
    samples = rng.standard_normal((40_000 if n <= 64 else 4_000, n)).max(axis=1)
    assert expected_max_std_normal(n) == pytest.approx(samples.mean(), abs=4 * samples.std() / math.sqrt(len(samples)))


def test_sigma_reproduces_the_measured_node_spread():
    """sigma is chosen so that 8 GPUs spread (max - min) by NODE_SPREAD on average, checked by sampling."""
    rng = np.random.default_rng(1)
    speeds = 1 + GPU_SPEED_SIGMA * rng.standard_normal((50_000, NODE_GPUS))
    assert (speeds.max(1) - speeds.min(1)).mean() == pytest.approx(NODE_SPREAD, rel=0.01)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20_000), sigma=st.floats(0.0, 0.1))
def test_factor_is_at_least_one_and_monotone(n, sigma):
    f = slowest_gpu_factor(n, sigma)
    assert f >= 1.0
    assert slowest_gpu_factor(n + 1, sigma) >= f
    assert slowest_gpu_factor(n, sigma + 0.01) >= f
    if n == 1 or sigma == 0:
        assert f == 1.0


def _op():
    g = Kernel("g", GEMM, 2.0 * 4096 ** 3, m=4096, n=4096, k=4096)
    return Op("compute", "x", flops=g.flops, kernels=KernelList("x", [g]))


def test_cost_model_scales_compute_by_the_slowest_gpu():
    cluster = topologies.load_cluster("dgx-h100", 64)
    op = _op()
    on, off = ClusterCostModel(cluster), ClusterCostModel(cluster, gpu_variation=0)
    assert on.slowest_gpu_factor == pytest.approx(1 / (1 - GPU_SPEED_SIGMA * expected_max_std_normal(64)))
    assert on.compute_time_s(0, op) == pytest.approx(off.compute_time_s(0, op) * on.slowest_gpu_factor)
    assert on.pricing()["gpu_variation"]["gpus"] == 64
    # a flat what-if efficiency is left as given
    assert ClusterCostModel(cluster, compute_efficiency=0.5).slowest_gpu_factor == 1.0
    # a failed-link copy keeps the setting
    assert ClusterCostModel(cluster, gpu_variation=0.03).with_cluster(cluster).gpu_variation == 0.03
    with pytest.raises(ConfigError, match="gpu_variation"):
        ClusterCostModel(cluster, gpu_variation=0.5)


def test_cpu_devices_are_not_given_gpu_variation():
    """The CPU closed loop (gloo) keeps its measured pace: the default applies to SM architectures only."""
    from topologies.cluster import Cluster, DomainSpec
    from topologies.specs import AcceleratorSpec
    acc = AcceleratorSpec(name="cpu", peak_bf16_flops=1e12, peak_fp8_flops=None, hbm_bytes=64e9,
                          hbm_bytes_per_s=2e10, scale_up_bytes_per_s=1e9, nic_bytes_per_s=1e9,
                          scale_up_link="pcie", vendor="cpu")
    cpu = Cluster("4x-cpu", acc, gpus=4, gpus_per_node=4, domain=DomainSpec("pcie", 4, 1e9))
    assert ClusterCostModel(cpu).slowest_gpu_factor == 1.0
    assert ClusterCostModel(topologies.load_cluster("dgx-h100", 8)).slowest_gpu_factor > 1.0

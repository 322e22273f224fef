import networkx as nx
import pytest

from simulator.errors import ConfigError, TopologyError, UnknownPresetError
from topologies import ACCELERATORS, get_accelerator, list_presets, load_cluster, load_cluster_file
from topologies.specs import AcceleratorSpec

REQUIRED = ["H100-SXM", "H200", "B200", "GB200", "B300", "GB300", "A100-80GB", "TPU-v5p", "Ascend-910C"]
PRESETS = ["cloudmatrix-384", "dgx-a100", "dgx-b200", "dgx-b300", "dgx-h100", "dgx-h200", "gb200-nvl72", "gb300-nvl72",
           "pcie-ethernet-lab", "tpu-v5p"]


def test_accelerators_present_and_sane():
    for name in REQUIRED:
        a = ACCELERATORS[name]
        assert a.peak_bf16_flops > 1e14 and a.hbm_bytes > 1e10 and a.hbm_bytes_per_s > 1e12
        assert a.scale_up_bytes_per_s > a.nic_bytes_per_s > 0
        assert a.source
        if a.peak_fp8_flops is not None:
            assert a.peak_fp8_flops == pytest.approx(2 * a.peak_bf16_flops, rel=0.01)
    assert ACCELERATORS["A100-80GB"].peak_fp8_flops is None
    assert ACCELERATORS["H100-SXM"].scale_up_bytes_per_s == 450e9
    assert get_accelerator("h100") is ACCELERATORS["H100-SXM"]


def test_device_memory_is_what_the_driver_reports():
    """NVIDIA's "40 GB" / "80 GB" are binary: CUDA's totalGlobalMem on an A100 40GB (../shared/traces/real-gpu
    a100_recsys_rank3_of8 deviceProperties: 42,505,273,344 B) already exceeds 40e9 B; the capacity is the
    total nvidia-smi reports, from which CUDA keeps back about 1%."""
    cuda_total_a100_40gb = 42_505_273_344
    a = ACCELERATORS["A100-40GB"]
    assert 40e9 < cuda_total_a100_40gb <= a.hbm_bytes <= cuda_total_a100_40gb * 1.011
    for name, nominal_gb in (("H100-SXM", 80), ("A100-80GB", 80), ("H200", 141), ("B200", 180), ("GB200", 186)):
        hbm = ACCELERATORS[name].hbm_bytes
        assert nominal_gb * 1e9 < hbm <= nominal_gb * 2**30, name
    # Blackwell Ultra's 288 GB stacks: nvidia-smi shows 275,040 MiB (B300) and 284,208 MiB (GB300), below 288 GiB
    for name, mib in (("B300", 275040), ("GB300", 284208)):
        assert ACCELERATORS[name].hbm_bytes == mib * 2**20 < 288 * 2**30


def test_blackwell_ultra_as_blackwell_with_an_800g_nic_and_its_own_gemm_points():
    from topologies.kernel_curves import gemm_curve
    from topologies.nccl import ARCH
    b300, gb300, b200 = (ACCELERATORS[n] for n in ("B300", "GB300", "B200"))
    assert (b300.peak_bf16_flops, gb300.peak_bf16_flops) == (b200.peak_bf16_flops, ACCELERATORS["GB200"].peak_bf16_flops)
    assert b300.nic_bytes_per_s == gb300.nic_bytes_per_s == 2 * b200.nic_bytes_per_s == 100e9
    assert ARCH["B300"] == ARCH["GB300"] == "blackwell"
    from topologies.specs import accelerator_for_device
    assert accelerator_for_device("NVIDIA B300 SXM6 AC") is b300 and accelerator_for_device("NVIDIA GB300") is gb300
    assert accelerator_for_device("NVIDIA GB200") is ACCELERATORS["GB200"] and get_accelerator("b300") is b300
    # B300's eta comes from its own MAMF point (1,769 TFLOP/s BF16 at 12288x18432x1024), capped there
    c = gemm_curve("B300", "bf16")
    assert "B300" in c.params.source
    assert 2 * 12288 * 18432 * 1024 / c.time_s(12288, 18432, 1024) <= 1769.0e12 * 1.0001


def test_unknown_accelerator_and_bad_spec():
    with pytest.raises(UnknownPresetError, match="H100-SXM"):
        get_accelerator("Z9000")
    with pytest.raises(ConfigError, match="hbm_bytes_per_s"):
        AcceleratorSpec("x", 1e12, None, 1e9, 0.0, 1e9, 1e9)


def test_presets_listed_and_load():
    assert list_presets() == PRESETS
    for p in PRESETS:
        c = load_cluster(p)
        d = c.describe()
        assert d["devices"] == c.world_size == c.n_gpus
        assert d["bisection_bytes_per_s"] > 0
        assert nx.is_connected(c.graph)
        for u, v, data in c.graph.edges(data=True):
            assert data["bandwidth"] > 0 and data["latency"] >= 0


def test_unknown_preset_lists_known():
    with pytest.raises(UnknownPresetError) as e:
        load_cluster("dgx-h900")
    for p in PRESETS:
        assert p in str(e.value)


@pytest.mark.parametrize("preset,gpus,msg", [
    ("dgx-h100", 12, "multiple of 8"), ("dgx-h100", 40000, "to 32768"), ("tpu-v5p", 100, "multiple of 64"),
    ("gb200-nvl72", 100, "multiple of 72"), ("cloudmatrix-384", 768, "to 384")])
def test_gpus_rule(preset, gpus, msg):
    with pytest.raises(ConfigError, match=msg):
        load_cluster(preset, gpus)


def test_dgx_h100_structure():
    c = load_cluster("dgx-h100", 64)
    assert (c.gpus_per_node, c.domain_size) == (8, 8)
    assert c.node_of(9) == 1 and c.domain_of(63) == 7
    # rail-optimised: NIC i of every node on a rail-i leaf
    ft = c.fat_tree
    assert ft.rail_optimised
    for gpu in range(64):
        assert ft.leaf_of[gpu] == ft.leaf_of[gpu % 8]
    assert c.device(5).name == "H100-SXM"


def test_dgx_a100_nvlink3_hdr():
    c = load_cluster("dgx-a100", 16)
    assert c.graph.edges[0, ("nvswitch", 0)]["bandwidth"] == 300e9
    assert c.graph.edges[0, ("leaf", c.fat_tree.leaf_of[0])]["bandwidth"] == 25e9
    assert not c.has_sharp(0)


def test_nvl72_and_torus_and_cloudmatrix_domains():
    c = load_cluster("gb200-nvl72", 144)
    assert c.domain_size == 72 and c.gpus_per_node == 4 and c.domain_of(71) == 0 and c.domain_of(72) == 1
    t = load_cluster("tpu-v5p", 64)
    assert t.domain_spec.dims == (4, 4, 4)
    assert all(deg == 6 for _, deg in t.graph.degree())
    assert load_cluster("tpu-v5p", 8960).domain_spec.dims == (16, 20, 28)
    cm = load_cluster("cloudmatrix-384")
    assert cm.domain_size == 384 and cm.n_domains == 1


def test_overrides_and_placement():
    c = load_cluster("dgx-h100", 32, oversubscription=2, rail_optimised=False, tiers=2)
    assert c.fat_tree.oversubscription == 2 and not c.fat_tree.rail_optimised
    with pytest.raises(ConfigError, match="unknown override"):
        load_cluster("dgx-h100", 16, bogus=1)
    c = load_cluster("dgx-h100", 16, placement=[8, 9, 0, 1])
    assert c.world_size == 4 and c.node_of(0) == 1 and c.node_of(2) == 0
    with pytest.raises(TopologyError, match="not placed"):
        c.node_of(4)
    with pytest.raises(TopologyError, match="two ranks"):
        load_cluster("dgx-h100", 16, placement=[1, 1])


def test_non_positive_bandwidth_rejected():
    with pytest.raises(TopologyError, match="positive"):
        load_cluster("dgx-h100", 16, nic_bandwidth=0)
    with pytest.raises(TopologyError, match="positive"):
        load_cluster("dgx-h100", 16, scale_up_bandwidth=-1.0)


def test_load_cluster_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("preset: dgx-h100\ngpus: 16\noversubscription: 2\n")
    c = load_cluster_file(f)
    assert c.n_gpus == 16 and c.fat_tree.oversubscription == 2
    g = tmp_path / "g.yaml"
    g.write_text("name: lab\naccelerator: L40S\ngpus: 8\ngpus_per_node: 4\ndomain: {kind: pcie, size: 4}\n")
    with pytest.raises(TopologyError, match="no scale-out fabric"):
        load_cluster_file(g)
    b = tmp_path / "b.yaml"
    b.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_cluster_file(b)
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster_file(tmp_path / "missing.yaml")
    # a YAML true is no GPU count (it ran 8 GPUs as 8 nodes of 1, or blamed a key the file never set)
    t = tmp_path / "t.yaml"
    t.write_text("accelerator: H100-SXM\ngpus: 8\ngpus_per_node: true\ndomain: {kind: nvswitch}\n")
    with pytest.raises(ConfigError, match="gpus_per_node must be a positive integer, got True"):
        load_cluster_file(t)


def test_disconnected_cluster_rejected():
    # OCS slices with no scale-out fabric: the slices cannot reach each other
    with pytest.raises(TopologyError, match="disconnected"):
        load_cluster("cloudmatrix-384", 128, slice_size=64)


def test_custom_cluster_file_2d_torus(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("name: my-torus\naccelerator: TPU-v5p\ngpus: 16\ngpus_per_node: 4\n"
                 "domain: {kind: torus, dims: [4, 4], bandwidth: 5.0e+10}\n")
    c = load_cluster_file(f)
    assert c.name == "my-torus" and c.domain_size == 16 and c.describe()["bisection_bytes_per_s"] == 8 * 5e10
    assert all(d == 4 for _, d in c.graph.degree())
    f.write_text("name: bad\naccelerator: TPU-v5p\ngpus: 16\ngpus_per_node: 4\n"
                 "domain: {kind: torus, dims: [4, 4], colour: red}\n")
    with pytest.raises(ConfigError, match="colour"):
        load_cluster_file(f)

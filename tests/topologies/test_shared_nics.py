"""Issue 18 item 10: custom clusters may have fewer NICs than GPUs per node (GPUs share a NIC)."""
import pytest

from simulator.costs import CommRequest
from simulator.errors import ConfigError
from topologies import load_cluster_file
from topologies.cluster import NIC_HOST_LINK_BYTES_PER_S
from topologies.cost import ClusterCostModel

YAML = """name: two-nic
accelerator: H100-SXM
gpus: 16
gpus_per_node: 8
domain: {{kind: nvswitch, size: 8}}
fabric: {{tiers: 2, leaf_down: 16, nics_per_node: {nics}, link: ib, rail_optimised: {rail}, bandwidth: 5.0e+10}}
"""


def _cluster(tmp_path, nics=2, rail="false"):
    p = tmp_path / "c.yaml"
    p.write_text(YAML.format(nics=nics, rail=rail))
    return load_cluster_file(p)


def test_gpus_share_their_nic_and_its_link(tmp_path):
    c = _cluster(tmp_path)
    up = {g: c.route(g, g + 8)[1] for g in range(8)}          # GPU -> its NIC, then NIC -> leaf
    assert len({up[g] for g in range(4)}) == 1 and len({up[g] for g in range(4, 8)}) == 1
    assert up[0] != up[4]
    first = c.route(0, 8)[0]
    assert c.link_type[first] == "pcie" and c.link_capacity[first] == NIC_HOST_LINK_BYTES_PER_S
    assert c.link_capacity[up[0]] == 5.0e10
    # a cross-node transfer is limited by the NIC (50 GB/s < 63 GB/s PCIe): closed form S / 50e9 + alpha
    # (the route-level model: NCCL's own p2p model adds its per-message protocol cost)
    m = ClusterCostModel(c, efficiency={"ib": 1.0, "pcie": 1.0, "nvlink": 1.0}, call_overhead_s=0.0,
                         comm_model="links")
    t = m.comm_time_s(CommRequest("p2p", (0, 8), 1e9))
    assert t == pytest.approx(1e9 / 5.0e10, rel=1e-3)


def test_nic_counts_that_do_not_divide_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="nics_per_node"):
        _cluster(tmp_path, nics=3)
    assert _cluster(tmp_path, nics=4, rail="true").world_size == 16

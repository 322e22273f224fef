"""topologies: accelerator specs, cluster graphs, routing, collective costs and the flow network.

Public entry points: ``load_cluster(preset, gpus, **overrides)``, ``list_presets()``,
``load_cluster_file(path)``, ``Cluster``, ``topologies.specs``, ``topologies.cost.ClusterCostModel``.
Never imports ``schedules`` or the engine.
"""
from topologies.cluster import Cluster
from topologies.presets import list_presets, load_cluster, load_cluster_file
from topologies.specs import ACCELERATORS, AcceleratorSpec, get_accelerator

__all__ = ["Cluster", "load_cluster", "load_cluster_file", "list_presets", "ACCELERATORS", "AcceleratorSpec",
           "get_accelerator"]

"""``Cluster``: scale-up domains + a scale-out fabric + the placement of ranks on devices, with routing.

Routing (``Cluster.route``) is structural and cached:
- inside a domain: through the domain's switch (NVSwitch, PCIe, UB), direct circuit (optical mesh), or
  dimension-ordered on a torus (shorter way round each ring, ties go the + way);
- across domains: device -> its NIC's leaf -> up/down the fat tree -> leaf -> device; on a rail-optimised
  fabric a transfer to another rail first crosses the scale-up domain to the source node's GPU on the
  destination's rail (NCCL's PXN, ``fabric.pxn``, default on) and so never leaves its rail. ECMP over the
  equal-cost spines (and cores) is modelled as ideal load balancing: the uplinks of a leaf (and of a
  pod) form one *trunk* link whose capacity is the sum of its members'. A single flow is still bounded by
  its own NIC link, so the per-path bottleneck is the minimum over the path's links.

The flow-level link table (``link_capacity``, ``link_latency``, ``link_type``; indexed by link id) holds
one directed link per direction of every non-fabric edge plus the fat tree's trunks.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import ConfigError, TopologyError
from topologies import builders
from topologies.builders import FatTreeInfo
from topologies.specs import AcceleratorSpec, get_accelerator

if TYPE_CHECKING:
    import networkx as nx

DOMAIN_KINDS = ("nvswitch", "nvl72", "pcie", "torus", "optical")
_STAR_KIND = {"nvswitch": "nvswitch", "nvl72": "nvswitch", "pcie": "pcie"}
_TRUNK_CODE = {"up": 4, "down": 5, "podup": 6, "poddown": 7}     # _link_codes' codes of the trunk links
# GPU to shared NIC over the host's PCIe (nodes with fewer NICs than GPUs): PCIe 5.0 x16, 32 GT/s per lane with
# 128b/130b encoding = 63 GB/s per direction (PCI-SIG PCIe 5.0 base specification), the link of Hopper /
# Blackwell SXM GPUs and ConnectX-7 NICs; a PCIe domain uses its own GPU link bandwidth instead.
NIC_HOST_LINK_BYTES_PER_S = 63e9


@dataclass(frozen=True)
class DomainSpec:
    """Scale-up domain: kind, devices per domain, per-device bandwidth (bytes/s per direction)."""

    kind: str
    size: int
    bandwidth: float
    sharp: bool = False
    dims: tuple[int, ...] | None = None     # torus
    wrap: bool = True                       # torus
    direct: bool = False                    # optical: full mesh of circuits instead of a switched fabric
    slice_size: int | None = None           # optical: OCS slices
    latency: float | None = None


@dataclass(frozen=True)
class FabricSpec:
    """Scale-out fat tree (see builders.fat_tree)."""

    tiers: int = 3
    leaf_down: int = 32
    oversubscription: float = 1.0
    rail_optimised: bool = True
    bandwidth: float = 50e9
    nics_per_node: int = 8
    link: str = "ib"
    latency: float | None = None
    pxn: bool = True        # rail-optimised: reach another rail over NVLink first (NCCL's PXN, default on)
    sharp: bool = False     # in-network reduction in the switches (InfiniBand SHARP: NCCL's CollNet)


class Cluster:
    """A built cluster.

    name, device (AcceleratorSpec), n_gpus, gpus_per_node, domain_size, graph (nx.Graph),
    placement (rank -> GPU index), world_size (placed ranks).
    """

    def __init__(self, name: str, device: AcceleratorSpec | str, gpus: int, gpus_per_node: int,
                 domain: DomainSpec, fabric: FabricSpec | None = None, placement=None, description: str = ""):
        self.name = name
        self.description = description
        self.accelerator = device if isinstance(device, AcceleratorSpec) else get_accelerator(device)
        self.n_gpus = int(gpus)
        self.gpus_per_node = int(gpus_per_node)
        self.domain_spec = domain
        self.fabric_spec = fabric
        if self.n_gpus < 1:
            raise ConfigError(f"cluster {name!r}: gpus must be >= 1, got {gpus}")
        if self.gpus_per_node < 1 or self.n_gpus % self.gpus_per_node:
            raise ConfigError(f"cluster {name!r}: {self.n_gpus} GPUs are not a whole number of "
                              f"{self.gpus_per_node}-GPU nodes")
        if domain.kind not in DOMAIN_KINDS:
            raise ConfigError(f"cluster {name!r}: unknown domain kind {domain.kind!r}; known: {', '.join(DOMAIN_KINDS)}")
        self.domain_size = min(int(domain.size), self.n_gpus)
        if self.domain_size < 1 or self.n_gpus % self.domain_size or self.domain_size % self.gpus_per_node:
            raise ConfigError(f"cluster {name!r}: {self.n_gpus} GPUs do not split into scale-up domains of "
                              f"{domain.size} GPUs made of {self.gpus_per_node}-GPU nodes")
        self.n_domains = self.n_gpus // self.domain_size
        if self.n_domains > 1 and fabric is None:
            raise TopologyError(f"cluster {name!r}: {self.n_domains} scale-up domains but no scale-out fabric; "
                                f"add a 'fabric' section or use at most {self.domain_size} GPUs")
        self._graph = None
        self._link_name = self._link_id = None
        if not (self.LAZY_GRAPH and self._build_table()):
            import networkx as nx      # (imported only where a graph is built: ~0.2 s)
            self.graph = nx.Graph(name=name)
            self._build()
            builders.validate_graph(self.graph, where=f"cluster {name!r}")
            self._build_links()
        self.set_placement(placement)
        self._routes: dict = {}

    # star domains with a fat tree of one NIC per GPU (or none) get their link table from the specs and
    # their networkx graph only when something asks for it (``graph``): set-up that does not grow with
    # the graph's Python objects (tests compare both ways)
    LAZY_GRAPH = True

    @property
    def graph(self) -> nx.Graph:
        """The cluster as a networkx graph (nodes: GPUs and switches; edges: bandwidth, latency, type)."""
        if self._graph is None:
            import networkx as nx
            self._graph = nx.Graph(name=self.name)
            keep = (self.fat_tree, self._endpoint_of_gpu, self._torus)
            self._build()
            self.fat_tree, self._endpoint_of_gpu, self._torus = keep
        return self._graph

    @graph.setter
    def graph(self, g) -> None:
        self._graph = g

    def _build_table(self) -> bool:
        """The link table (``_build_links``'s, in the same order) and fat-tree layout of star domains with
        a fat tree of one NIC per GPU or none, straight from the specs; False for other clusters."""
        d, f = self.domain_spec, self.fabric_spec
        if d.kind not in _STAR_KIND or (f is not None and f.nics_per_node != self.gpus_per_node):
            return False
        link = "pcie" if d.kind == "pcie" else "nvlink"
        bw = builders._check_bw(f"{_STAR_KIND[d.kind]} domain", d.bandwidth)
        lat = builders.HOP_LATENCY_S[link] if d.latency is None else d.latency
        ft = None
        if f is not None:
            ft, _ = builders.fat_tree_layout([(g, g % self.gpus_per_node) for g in range(self.n_gpus)],
                                             f.bandwidth, tiers=f.tiers, leaf_down=f.leaf_down,
                                             oversubscription=f.oversubscription, rail_optimised=f.rail_optimised,
                                             link_type=f.link, latency=f.latency)
            if not ft.latency >= 0:
                return False                    # the graph's validation names the bad link
        if not lat >= 0:
            return False
        self._torus = None
        self.fat_tree = ft
        self._endpoint_of_gpu = list(range(self.n_gpus))
        ds, nd = self.domain_size, self.n_domains
        if ft is None:
            cap, lats, typ = [bw] * (2 * ds * nd), [lat] * (2 * ds * nd), [link] * (2 * ds * nd)
        else:
            cap = ([bw] * (2 * ds) + [ft.bandwidth] * (2 * ds)) * nd
            lats = ([lat] * (2 * ds) + [ft.latency] * (2 * ds)) * nd
            typ = ([link] * (2 * ds) + [ft.link_type] * (2 * ds)) * nd
        if ft is not None and ft.uplinks:
            cap += [ft.uplinks * ft.bandwidth] * (2 * ft.n_leaves)
            lats += [ft.latency] * (2 * ft.n_leaves)
            typ += [ft.link_type] * (2 * ft.n_leaves)
            if ft.cores_per_plane:
                cap += [ft.uplinks * ft.cores_per_plane * ft.bandwidth] * (2 * ft.n_pods)
                lats += [ft.latency] * (2 * ft.n_pods)
                typ += [ft.link_type] * (2 * ft.n_pods)
        self.link_capacity, self.link_latency, self.link_type = cap, lats, typ
        # link_name and link_id (a tuple per link: ~35 ms at 16k GPUs) are built when asked for; routes
        # find link ids from the codes below (``_table_link``)
        self._link_name = self._link_id = None
        # _link_codes' table, in the same order: per domain (switch->GPU, GPU->switch) per GPU, then
        # (GPU->leaf, leaf->GPU) per GPU; then the leaf trunks (up, down) and the pod trunks
        gpu = np.arange(self.n_gpus, dtype=np.int64).reshape(self.n_domains, ds).repeat(2, axis=1)
        blocks_c = [np.tile(np.array([1, 0]), (self.n_domains, ds))]
        blocks_i = [gpu]
        if ft is not None:
            blocks_c.append(np.tile(np.array([2, 3]), (self.n_domains, ds)))
            blocks_i.append(gpu)
        code = [np.concatenate(blocks_c, axis=1).ravel()]
        index = [np.concatenate(blocks_i, axis=1).ravel()]
        sizes = [self.n_gpus] * 4 + [0] * 4
        if ft is not None:
            sizes[4:] = [ft.n_leaves] * 2 + [ft.n_pods] * 2
            if ft.uplinks:
                code.append(np.tile(np.array([4, 5]), ft.n_leaves))
                index.append(np.arange(ft.n_leaves, dtype=np.int64).repeat(2))
                if ft.cores_per_plane:
                    code.append(np.tile(np.array([6, 7]), ft.n_pods))
                    index.append(np.arange(ft.n_pods, dtype=np.int64).repeat(2))
        code, index = np.concatenate(code).astype(np.int64), np.concatenate(index)
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        inverse = np.full(int(offsets[-1]), -1, dtype=np.int64)
        inverse[offsets[code] + index] = np.arange(len(code))
        self._codes = (code, index, inverse, offsets)
        self._inverse, self._offsets = inverse.tolist(), offsets.tolist()      # for _table_link
        return True

    def _table_names(self) -> list:
        """``link_name`` of a cluster whose link table ``_build_table`` made: the graph's edge order (each
        domain switch's GPUs both ways, then theirs to their leaf both ways), then leaf and pod trunks."""
        ft, ds, kind = self.fat_tree, self.domain_size, _STAR_KIND[self.domain_spec.kind]
        names: list = []
        leaves = None if ft is None else [("leaf", ft.leaf_of[g]) for g in range(self.n_gpus)]
        for k in range(self.n_domains):
            sw = (kind, k)
            gpus = range(k * ds, (k + 1) * ds)
            names += [e for g in gpus for e in ((sw, g), (g, sw))]
            if leaves is not None:
                names += [e for g in gpus for e in ((g, leaves[g]), (leaves[g], g))]
        if ft is not None and ft.uplinks:
            for leaf in range(ft.n_leaves):
                names += [("up", leaf), ("down", leaf)]
            if ft.cores_per_plane:
                for pod in range(ft.n_pods):
                    names += [("podup", pod), ("poddown", pod)]
        return names

    def _table_link(self, a, b) -> int | None:
        """``link_id.get((a, b))`` of a ``_build_table`` cluster, from its codes (no dict of names)."""
        if isinstance(a, str) and a in _TRUNK_CODE and isinstance(b, int):
            c, k = _TRUNK_CODE[a], b
        else:
            if isinstance(a, int) and isinstance(b, tuple):
                k, node, towards = a, b, 0          # GPU -> its domain switch or leaf: codes 0, 2
            elif isinstance(b, int) and isinstance(a, tuple):
                k, node, towards = b, a, 1          # switch or leaf -> GPU: codes 1, 3
            else:
                return None
            if len(node) != 2 or not 0 <= k < self.n_gpus:
                return None
            ft = self.fat_tree
            if node == (_STAR_KIND[self.domain_spec.kind], k // self.domain_size):
                c = towards
            elif ft is not None and node == ("leaf", ft.leaf_of[k]):
                c = 2 + towards
            else:
                return None
        offsets = self._offsets
        if not 0 <= k < offsets[c + 1] - offsets[c]:
            return None
        i = self._inverse[offsets[c] + k]
        return None if i < 0 else i

    @property
    def link_id(self) -> dict:
        """(from, to) graph nodes (or a trunk's ("up", leaf) ...) -> directed link id."""
        ids = self._link_id
        if ids is None:
            ids = self._link_id = {nm: i for i, nm in enumerate(self.link_name)}
        return ids

    @link_id.setter
    def link_id(self, ids: dict) -> None:
        self._link_id = ids

    @property
    def link_name(self) -> list:
        """Directed link id -> its (from, to) graph nodes (or trunk key)."""
        names = self._link_name
        if names is None:
            names = self._link_name = self._table_names()
        return names

    @link_name.setter
    def link_name(self, names: list) -> None:
        self._link_name = names

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        g, d = self.graph, self.domain_spec
        self._torus = None
        for k in range(self.n_domains):
            first = k * self.domain_size
            if d.kind in ("nvswitch", "nvl72"):
                builders.nvswitch_node(self.domain_size, d.bandwidth, index=k, first_gpu=first, sharp=d.sharp,
                                       latency=d.latency, graph=g)
            elif d.kind == "pcie":
                builders.pcie_node(self.domain_size, d.bandwidth, index=k, first_gpu=first, latency=d.latency,
                                   graph=g)
            elif d.kind == "torus":
                dims = d.dims or (self.domain_size,)
                if math.prod(dims) != self.domain_size:
                    raise ConfigError(f"cluster {self.name!r}: torus dims {dims} hold {math.prod(dims)} chips, "
                                      f"not {self.domain_size}")
                builders.torus(dims, d.bandwidth, wrap=d.wrap, first_gpu=first, latency=d.latency, graph=g)
                self._torus = (tuple(dims), d.wrap)
            elif d.kind == "optical":
                builders.optical_mesh(self.domain_size, d.bandwidth, direct=d.direct, slice_size=d.slice_size,
                                      first_gpu=first, index=k * (self.domain_size // (d.slice_size or self.domain_size)),
                                      latency=d.latency, graph=g)
        self.fat_tree: FatTreeInfo | None = None
        self._endpoint_of_gpu: list = list(range(self.n_gpus))
        f = self.fabric_spec
        if f is None:
            return
        nodes = self.n_gpus // self.gpus_per_node
        if f.nics_per_node == self.gpus_per_node:
            eps = [(gpu, gpu % self.gpus_per_node) for gpu in range(self.n_gpus)]
        elif f.nics_per_node == 1 and d.kind in _STAR_KIND and self.domain_size == self.gpus_per_node:
            eps = [((_STAR_KIND[d.kind], n), 0) for n in range(nodes)]
            self._endpoint_of_gpu = [(_STAR_KIND[d.kind], gpu // self.gpus_per_node) for gpu in range(self.n_gpus)]
        elif (1 < f.nics_per_node < self.gpus_per_node and self.gpus_per_node % f.nics_per_node == 0
              and d.kind in _STAR_KIND and self.domain_size == self.gpus_per_node):
            eps = self._shared_nics(f.nics_per_node)
        else:
            raise ConfigError(f"cluster {self.name!r}: nics_per_node must equal gpus_per_node "
                              f"({self.gpus_per_node}), divide it (GPUs sharing a NIC) in a PCIe/NVSwitch box, "
                              f"or be 1; got {f.nics_per_node}")
        builders.fat_tree(eps, f.bandwidth, tiers=f.tiers, leaf_down=f.leaf_down, oversubscription=f.oversubscription,
                          rail_optimised=f.rail_optimised, link_type=f.link, latency=f.latency, graph=g)
        self.fat_tree = g.graph["fat_tree"]

    def _shared_nics(self, nics: int) -> list:
        """Fabric endpoints of nodes with ``nics`` NICs for more GPUs: NIC j of node n is graph node
        ("nic", n, j) on rail j, reached by GPUs j·share .. (j+1)·share-1 of the node over the host's PCIe."""
        g, gpn = self.graph, self.gpus_per_node
        share = gpn // nics
        host_bw = self.domain_spec.bandwidth if self.domain_spec.kind == "pcie" else NIC_HOST_LINK_BYTES_PER_S
        eps = []
        for n in range(self.n_gpus // gpn):
            for j in range(nics):
                g.add_node(("nic", n, j), kind="nic")
                eps.append((("nic", n, j), j))
        for gpu in range(self.n_gpus):
            n, local = divmod(gpu, gpn)
            nic = ("nic", n, local // share)
            g.add_edge(gpu, nic, bandwidth=host_bw, latency=builders.HOP_LATENCY_S["pcie"], type="pcie")
            self._endpoint_of_gpu[gpu] = nic
        return eps

    def _build_links(self) -> None:
        """Directed link table: both directions of every non-fabric-internal edge, plus fat-tree trunks."""
        cap, lat, typ = [], [], []
        ids: dict = {}
        fabric_kinds = {"leaf", "spine", "core"}
        nodes = self.graph.nodes
        for u, v, data in self.graph.edges(data=True):
            if nodes[u].get("kind") in fabric_kinds and nodes[v].get("kind") in fabric_kinds:
                continue
            for a, b in ((u, v), (v, u)):
                ids[(a, b)] = len(cap)
                cap.append(float(data["bandwidth"]))
                lat.append(float(data.get("latency", 0.0)))
                typ.append(data.get("type", "nvlink"))
        ft = self.fat_tree
        if ft is not None and ft.uplinks:
            for leaf in range(ft.n_leaves):
                for key in (("up", leaf), ("down", leaf)):
                    ids[key] = len(cap)
                    cap.append(ft.uplinks * ft.bandwidth)
                    lat.append(ft.latency)
                    typ.append(ft.link_type)
            if ft.cores_per_plane:
                for pod in range(ft.n_pods):
                    for key in (("podup", pod), ("poddown", pod)):
                        ids[key] = len(cap)
                        cap.append(ft.uplinks * ft.cores_per_plane * ft.bandwidth)
                        lat.append(ft.latency)
                        typ.append(ft.link_type)
        self.link_id = ids
        self.link_capacity = cap
        self.link_latency = lat
        self.link_type = typ
        self.link_name = [None] * len(cap)
        for k, i in ids.items():
            self.link_name[i] = k

    # ------------------------------------------------------------------ placement
    def set_placement(self, placement=None) -> None:
        """rank -> GPU index (default: rank r on GPU r, all GPUs). Must be injective and in range."""
        if placement is None:
            self.placement = tuple(range(self.n_gpus))
        else:
            try:
                pl = tuple(placement) if not isinstance(placement, (str, bytes, dict)) else None
            except TypeError:
                pl = None
            if pl is None or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in pl):
                raise TopologyError(f"cluster {self.name!r}: placement must be a list of GPU indices (rank i on "
                                    f"GPU placement[i]), got {str(placement)[:80]}")
            pl = tuple(int(x) for x in pl)
            bad = [g for g in pl if not 0 <= g < self.n_gpus]
            if bad:
                raise TopologyError(f"cluster {self.name!r}: placement names GPU(s) {bad[:5]} outside 0..{self.n_gpus - 1}")
            if len(set(pl)) != len(pl):
                raise TopologyError(f"cluster {self.name!r}: placement puts two ranks on one GPU")
            self.placement = pl
        self.world_size = len(self.placement)
        self._routes = {}

    def gpu_of(self, rank: int) -> int:
        """GPU index (graph node) of ``rank``; TopologyError for an unplaced rank."""
        try:
            if rank < 0:
                raise IndexError
            return self.placement[rank]
        except (IndexError, TypeError):
            raise TopologyError(f"rank {rank!r} is not placed on cluster {self.name!r} "
                                f"(world size {self.world_size}: ranks 0..{self.world_size - 1})") from None

    def device(self, rank: int) -> AcceleratorSpec:
        self.gpu_of(rank)
        return self.accelerator

    def node_of(self, rank: int) -> int:
        """Host index of ``rank``."""
        return self.gpu_of(rank) // self.gpus_per_node

    def domain_of(self, rank: int) -> int:
        """Scale-up domain index of ``rank`` (NVSwitch node, NVL72 rack, torus slice, supernode)."""
        return self.gpu_of(rank) // self.domain_size

    def domain_switch(self, domain: int):
        """The switch node of a star domain (None for torus / direct mesh)."""
        kind = self.domain_spec.kind
        if kind in _STAR_KIND:
            return (_STAR_KIND[kind], domain)
        if kind == "optical" and not self.domain_spec.direct and not self.domain_spec.slice_size:
            return ("ub", domain)
        return None

    def has_sharp(self, domain: int) -> bool:
        sw = self.domain_switch(domain)
        if sw is not None and self._graph is None and self.domain_spec.kind in _STAR_KIND:
            return self.domain_spec.kind != "pcie" and bool(self.domain_spec.sharp)     # as _build makes it
        return sw is not None and bool(self.graph.nodes[sw].get("sharp"))

    # ------------------------------------------------------------------ symmetry
    def comm_shape(self, gpus) -> tuple | None:
        """A key equal for two GPU tuples that an automorphism of this cluster maps onto each other (so any
        communication on them costs the same), or None where no such key is known.

        Known for a pristine fat tree of one-NIC-per-GPU star nodes (``builders.fat_tree``'s layout, checked
        once): each member becomes (its local index, and the order ranks, among the group's, of its node,
        its scalable unit / leaf and its pod). Renumbering nodes, units and pods in an order-preserving way
        maps routes to routes of the same links' kinds; rail-optimised, every rail has the same structure
        (a pod per rail, PXN within a node), so local indices are ranked too."""
        lay = self.__dict__.get("_shape_layout", False)
        if lay is False:
            lay = self._shape_layout = self._layout_for_shapes()
        if lay is None or getattr(self, "faults", None) is not None:
            return None
        gpn, rail_opt, leaf_of, pod_of = lay
        if len(gpus) == 2:                  # point-to-point: the common case, kept cheap
            a, b = gpus
            (na, la), (nb, lb) = divmod(a, gpn), divmod(b, gpn)
            return (_pair(na, nb), _pair(leaf_of[a], leaf_of[b]), _pair(pod_of[a], pod_of[b]),
                    _pair(la, lb) if rail_opt else (la, lb))
        memo = self.__dict__.setdefault("_shape_memo", {})     # groups are priced and mapped several times
        key = gpus if type(gpus) is tuple else tuple(gpus)
        hit = memo.get(key)
        if hit is None:
            if len(memo) > 100_000:
                memo.clear()
            hit = memo[key] = self._group_shape(key, lay)
        return hit

    @staticmethod
    def _group_shape(gpus: tuple, lay) -> tuple:
        gpn, rail_opt, leaf_of, pod_of = lay
        nodes, units, pods, locs = [], [], [], []
        for g in gpus:
            n, loc = divmod(g, gpn)
            nodes.append(n)
            units.append(leaf_of[g])
            pods.append(pod_of[g])
            locs.append(loc)
        cols = [_ranks(nodes), _ranks(units), _ranks(pods), _ranks(locs) if rail_opt else locs]
        return tuple(zip(*cols))

    def _layout_for_shapes(self):
        """(gpus per node, rail-optimised, unit of each GPU, pod of each GPU) when ``comm_shape`` applies,
        else None. Rail-optimised, a GPU's unit is its leaf's index within its rail (the leaves of a node's
        NICs are one unit) and its pod is the pod's index within its rail."""
        ft, f = self.fat_tree, self.fabric_spec
        gpn = self.gpus_per_node
        if (ft is None or f is None or self.domain_spec.kind not in _STAR_KIND or self.domain_size != gpn
                or f.nics_per_node != gpn or self._endpoint_of_gpu != list(range(self.n_gpus))):
            return None
        leaf, pod_of_leaf = ft.leaf_of, ft.pod_of_leaf
        if not ft.rail_optimised:
            return gpn, False, [leaf[g] for g in range(self.n_gpus)], [pod_of_leaf[leaf[g]] for g in range(self.n_gpus)]
        first_leaf = [leaf[r] for r in range(gpn)]
        first_pod = [pod_of_leaf[leaf[r]] for r in range(gpn)]
        units = [leaf[g] - first_leaf[g % gpn] for g in range(self.n_gpus)]
        pods = [pod_of_leaf[leaf[g]] - first_pod[g % gpn] for g in range(self.n_gpus)]
        for g in range(self.n_gpus):        # every rail alike: unit and pod depend on the node only
            if units[g] != units[g - g % gpn] or pods[g] != pods[g - g % gpn]:
                return None
        return gpn, True, units, pods

    # ------------------------------------------------------------------ link maps (symmetric images)
    def _link_codes(self):
        """(code, index, inverse, offsets) of every directed link where the cluster is star domains, with
        or without a fat tree of one NIC per GPU, else None. Codes: 0 GPU->its domain switch, 1 switch->GPU,
        2 GPU->leaf, 3 leaf->GPU (index: the GPU), 4/5 leaf trunk up/down (the leaf), 6/7 pod trunk up/down
        (the pod); ``inverse[offsets[code] + index]`` is the link id (-1 where none)."""
        t = self.__dict__.get("_codes", False)
        if t is not False:
            return t
        t = None
        kind = self.domain_spec.kind
        ft = self.fat_tree
        if kind in _STAR_KIND and self._endpoint_of_gpu == list(range(self.n_gpus)):
            n_leaves, n_pods = (ft.n_leaves, ft.n_pods) if ft is not None else (0, 0)
            sizes = [self.n_gpus] * 4 + [n_leaves] * 2 + [n_pods] * 2
            offsets = np.concatenate(([0], np.cumsum(sizes)))
            inverse = np.full(int(offsets[-1]), -1, dtype=np.int64)
            code = np.empty(len(self.link_name), dtype=np.int64)
            index = np.empty(len(self.link_name), dtype=np.int64)
            trunk = {"up": 4, "down": 5, "podup": 6, "poddown": 7}
            for i, (a, b) in enumerate(self.link_name):
                if isinstance(a, int) and isinstance(b, tuple):
                    c, k = (0 if b[0] == _STAR_KIND[kind] else 2 if b[0] == "leaf" else -1), a
                elif isinstance(b, int) and isinstance(a, tuple):
                    c, k = (1 if a[0] == _STAR_KIND[kind] else 3 if a[0] == "leaf" else -1), b
                else:
                    c, k = trunk.get(a, -1), b
                if c < 0:
                    break
                code[i], index[i] = c, k
                inverse[offsets[c] + k] = i
            else:
                t = (code, index, inverse, offsets)
        self._codes = t
        return t

    def _pristine(self) -> bool:
        return getattr(self, "faults", None) is None and type(self)._route is Cluster._route

    def translate_links(self, links, gpus, images):
        """The links ``images`` (an m x n array of GPU groups) use where group ``gpus`` uses ``links``, as an
        m x len(links) array, when each image is the group moved by an automorphism of the cluster that
        routes map onto routes: whole scale-up domains (a group inside one domain, moved to another of the
        same structure), or a swap of two rails on every node (a group on one rail of a rail-optimised fat
        tree, moved to another rail). None where neither applies (the caller prices the images itself)."""
        t = self._link_codes()
        if t is None or not self._pristine() or not len(links):
            return None
        code, index, inverse, offsets = t
        a = np.asarray(gpus, dtype=np.int64)
        B = np.asarray(images, dtype=np.int64)
        if B.ndim != 2 or B.shape[1] != len(a) or not len(B):
            return None
        links = np.asarray(links, dtype=np.int64)
        c, idx = code[links], index[links]
        ds, gpn = self.domain_size, self.gpus_per_node
        if (a // ds == a[0] // ds).all() and (c <= 1).all() and (idx // ds == a[0] // ds).all():
            shift = (B[:, 0] // ds - a[0] // ds) * ds            # whole domains
            if not (B - a == shift[:, None]).all():
                return None
            new = idx[None, :] + shift[:, None]
        else:
            lay = self.__dict__.get("_shape_layout", False)
            if lay is False:
                lay = self._shape_layout = self._layout_for_shapes()
            x = int(a[0] % gpn)
            if lay is None or not lay[1] or not self.fabric_spec.pxn or not (a % gpn == x).all():
                return None
            y = B[:, 0] % gpn                                     # rail x <-> rail y on every node
            if not (B - a == (y - x)[:, None]).all():
                return None
            leaf_gpu, leaf_of, pod_leaf, pod_of_leaf = self._fabric_arrays()

            def swap(g):
                r = g % gpn
                return g - r + np.where(r == x, y[:, None], np.where(r == y[:, None], x, r))

            new = np.empty((len(B), len(links)), dtype=np.int64)
            gpu_l, leaf_l, pod_l = c <= 3, (c == 4) | (c == 5), c >= 6
            new[:, gpu_l] = swap(idx[gpu_l][None, :])
            new[:, leaf_l] = leaf_of[swap(leaf_gpu[idx[leaf_l]][None, :])]
            new[:, pod_l] = pod_of_leaf[leaf_of[swap(leaf_gpu[pod_leaf[idx[pod_l]]][None, :])]]
        out = inverse[offsets[c][None, :] + new]
        return None if (out < 0).any() else out

    def map_links(self, links, gpus, image) -> np.ndarray | None:
        """The links GPU group ``image`` uses where group ``gpus`` uses ``links`` (an algorithm's, in its
        order), when ``comm_shape`` finds the two alike: the renumbering of nodes, local indices (rails),
        leaves and pods that takes each member of ``gpus`` to the one at its position in ``image`` maps routes
        onto routes, link for link. None where the shapes differ or a link's node, rail, leaf or pod is not
        one the members fix (the caller prices the image itself)."""
        t = self._link_codes()
        if t is None or not self._pristine() or len(gpus) != len(image) or self.fat_tree is None:
            return None
        shape = self.comm_shape(gpus)
        if shape is None or shape != self.comm_shape(image):
            return None
        code, index, inverse, offsets = t
        gpn = self.gpus_per_node
        leaf_of, pod_of_leaf = self.fat_tree.leaf_of, self.fat_tree.pod_of_leaf
        node_map: dict = {}
        loc_map: dict = {}
        for a, b in zip(gpus, image):
            if node_map.setdefault(a // gpn, b // gpn) != b // gpn or loc_map.setdefault(a % gpn, b % gpn) != b % gpn:
                return None
        links = np.asarray(links, dtype=np.int64)
        c, idx = code[links], index[links]
        new = idx.copy()
        on_gpu = c <= 3
        leaf_map: dict = {}
        pod_map: dict = {}
        moved = []
        for g in idx[on_gpu].tolist():
            n, loc = divmod(g, gpn)
            if n not in node_map or loc not in loc_map:
                return None
            h = node_map[n] * gpn + loc_map[loc]
            la, lb = leaf_of[g], leaf_of[h]
            if leaf_map.setdefault(la, lb) != lb or pod_map.setdefault(pod_of_leaf[la], pod_of_leaf[lb]) != pod_of_leaf[lb]:
                return None
            moved.append(h)
        new[on_gpu] = moved
        for lo, hi, table in ((4, 5, leaf_map), (6, 7, pod_map)):
            on = (c >= lo) & (c <= hi)
            if on.any():
                try:
                    new[on] = [table[k] for k in idx[on].tolist()]
                except KeyError:
                    return None
        out = inverse[offsets[c] + new]
        return None if (out < 0).any() else out

    def _fabric_arrays(self):
        """(a GPU on each leaf, leaf of each GPU, a leaf of each pod, pod of each leaf) as arrays."""
        arr = self.__dict__.get("_fab_arrays")
        if arr is None:
            ft = self.fat_tree
            leaf_of = np.array([ft.leaf_of[g] for g in range(self.n_gpus)], dtype=np.int64)
            pod_of_leaf = np.array(ft.pod_of_leaf, dtype=np.int64)
            leaf_gpu = np.zeros(ft.n_leaves, dtype=np.int64)
            leaf_gpu[leaf_of[::-1]] = np.arange(self.n_gpus - 1, -1, -1)
            pod_leaf = np.zeros(max(ft.n_pods, 1), dtype=np.int64)
            pod_leaf[pod_of_leaf[::-1]] = np.arange(len(pod_of_leaf) - 1, -1, -1)
            arr = self._fab_arrays = (leaf_gpu, leaf_of, pod_leaf, pod_of_leaf)
        return arr

    def route_many(self, src, dst) -> np.ndarray | None:
        """The links of the routes from GPUs ``src[i]`` to ``dst[i]``, all together (a multiset: each
        route's links once, in no particular order), as ``route`` finds them; None where this cluster has no
        vectorised router (then call ``route`` per pair)."""
        t = self._link_codes()
        if t is None or not self._pristine():
            return None
        _, _, inverse, offsets = t
        s = np.asarray(src, dtype=np.int64)
        d = np.asarray(dst, dtype=np.int64)
        ds, gpn = self.domain_size, self.gpus_per_node
        link = lambda code, i: inverse[offsets[code] + i]      # noqa: E731
        keep = s != d
        s, d = s[keep], d[keep]
        inside = s // ds == d // ds
        parts = [link(0, s[inside]), link(1, d[inside])]
        s, d = s[~inside], d[~inside]
        if len(s):
            ft = self.fat_tree
            if ft.rail_optimised and self.fabric_spec.pxn:        # PXN: over NVLink to dst's rail first
                rs, rd = s % gpn, d % gpn
                px = rs != rd
                proxy = s - rs + rd
                parts += [link(0, s[px]), link(1, proxy[px])]
                s = np.where(px, proxy, s)
            _, leaf_of, _, pod_of_leaf = self._fabric_arrays()
            la, lb = leaf_of[s], leaf_of[d]
            up = la != lb
            pa, pb = pod_of_leaf[la], pod_of_leaf[lb]
            core = up & (pa != pb)
            parts += [link(2, s), link(4, la[up]), link(6, pa[core]), link(7, pb[core]), link(5, lb[up]),
                      link(3, d)]
        out = np.concatenate(parts)
        return None if (out < 0).any() else out

    # ------------------------------------------------------------------ routing
    def route(self, src, dst) -> tuple[int, ...]:
        """Directed link ids from graph node ``src`` to ``dst`` (GPU indices or a domain switch). Cached."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = tuple(self._route(src, dst))
        return r

    def route_ranks(self, src_rank: int, dst_rank: int) -> tuple[int, ...]:
        return self.route(self.gpu_of(src_rank), self.gpu_of(dst_rank))

    def path_latency_s(self, links) -> float:
        lat = self.link_latency
        return sum(lat[i] for i in links)

    def _l(self, a, b) -> int:
        ids = self._link_id
        i = self._table_link(a, b) if ids is None else ids.get((a, b))
        if i is None:
            raise TopologyError(f"cluster {self.name!r}: no link {a}->{b}")
        return i

    def _route(self, src, dst) -> list[int]:
        if src == dst:
            return []
        if not isinstance(src, int):           # from a switch (in-switch reduction): star domain only
            return [self._l(src, dst)]
        if not isinstance(dst, int):
            return [self._l(src, dst)]
        ds, dd = src // self.domain_size, dst // self.domain_size
        if ds == dd:
            return self._route_in_domain(src, dst)
        return self._route_fabric(src, dst)

    def _route_in_domain(self, src: int, dst: int) -> list[int]:
        kind = self.domain_spec.kind
        if kind == "torus":
            return self._route_torus(src, dst)
        if kind == "optical":
            if self.domain_spec.direct:
                return [self._l(src, dst)]
            size = self.domain_spec.slice_size or self.domain_size
            if src // size != dst // size:
                raise TopologyError(f"GPUs {src} and {dst} sit in different OCS slices of {size} chips and "
                                    f"share no circuit")
            sw = ("ub", src // size)
            return [self._l(src, sw), self._l(sw, dst)]
        sw = (_STAR_KIND[kind], src // self.domain_size)
        return [self._l(src, sw), self._l(sw, dst)]

    def _route_torus(self, src: int, dst: int) -> list[int]:
        dims, wrap = self._torus
        base = (src // self.domain_size) * self.domain_size
        cs = list(self.graph.nodes[src]["coord"])
        cd = self.graph.nodes[dst]["coord"]
        strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
        out, cur = [], src
        for k, d in enumerate(dims):
            fwd = (cd[k] - cs[k]) % d
            if fwd == 0:
                continue
            if wrap and d > 2:
                step, n = (1, fwd) if fwd <= d - fwd else (-1, d - fwd)
            else:
                step, n = (1, cd[k] - cs[k]) if cd[k] > cs[k] else (-1, cs[k] - cd[k])
            for _ in range(n):
                c = (cs[k] + step) % d
                nxt = cur + (c - cs[k]) * strides[k]
                out.append(self._l(cur, nxt))
                cur, cs[k] = nxt, c
        assert cur == dst, (src, dst, base)
        return out

    def _route_fabric(self, src: int, dst: int) -> list[int]:
        ft = self.fat_tree
        if ft.rail_optimised and self.fabric_spec.pxn and self._endpoint_of_gpu[src] == src:
            gpn = self.gpus_per_node
            rs, rd = src % gpn, dst % gpn
            if rs != rd:     # PXN: hand the data over NVLink to the src node's GPU on dst's rail
                proxy = src - rs + rd
                return self._route_in_domain(src, proxy) + self._route_fabric(proxy, dst)
        ea, eb = self._endpoint_of_gpu[src], self._endpoint_of_gpu[dst]
        out = []
        if ea != src:
            out.append(self._l(src, ea))
        la, lb = ft.leaf_of[ea], ft.leaf_of[eb]
        out.append(self._l(ea, ("leaf", la)))
        if la != lb:
            out.append(self._l("up", la))
            pa, pb = ft.pod_of_leaf[la], ft.pod_of_leaf[lb]
            if pa != pb:
                out.append(self._l("podup", pa))
                out.append(self._l("poddown", pb))
            out.append(self._l("down", lb))
        out.append(self._l(("leaf", lb), eb))
        if eb != dst:
            out.append(self._l(eb, dst))
        return out

    def hops(self, src_rank: int, dst_rank: int) -> int:
        """Switch hops between two ranks (links on the route minus one; trunks count as one hop each)."""
        return max(0, len(self.route_ranks(src_rank, dst_rank)) - 1)

    def bottleneck_bytes_per_s(self, src_rank: int, dst_rank: int) -> float:
        """Per-path bottleneck: the smallest link capacity on the route."""
        links = self.route_ranks(src_rank, dst_rank)
        return min((self.link_capacity[i] for i in links), default=math.inf)

    # ------------------------------------------------------------------ description
    def bisection_bytes_per_s(self) -> float:
        """Bandwidth across the worst balanced cut of the devices (bytes/s, one direction).

        Fabric (several domains): half the smallest per-tier total (NIC links, leaf uplinks, pod uplinks).
        One domain: star n/2 links; torus: cut across its largest dimension (x2 with wrap-around);
        direct mesh: (n/2)^2 circuits."""
        d = self.domain_spec
        if self.n_domains > 1:
            ft = self.fat_tree
            eps = len(ft.endpoints)
            tiers = [eps * ft.bandwidth]
            if ft.uplinks:
                tiers.append(ft.n_leaves * ft.uplinks * ft.bandwidth)
            if ft.cores_per_plane:
                tiers.append(ft.n_pods * ft.uplinks * ft.cores_per_plane * ft.bandwidth)
            return min(tiers) / 2
        n = self.domain_size
        if d.kind == "torus":
            dims = d.dims or (n,)
            big = max(dims)
            crossing = n // big * (2 if d.wrap and big > 2 else 1)
            return crossing * d.bandwidth
        if d.kind == "optical" and d.direct:
            size = d.slice_size or n
            return (size // 2) * (size - size // 2) * d.bandwidth / max(size - 1, 1)
        return (n // 2) * d.bandwidth

    def describe(self) -> dict:
        kinds: dict[str, int] = {}
        for _, data in self.graph.nodes(data=True):
            k = data.get("kind", "?")
            kinds[k] = kinds.get(k, 0) + 1
        link_types: dict[str, int] = {}
        for _, _, data in self.graph.edges(data=True):
            t = data.get("type", "?")
            link_types[t] = link_types.get(t, 0) + 1
        a = self.accelerator
        out = {
            "name": self.name,
            "description": self.description,
            "accelerator": a.name,
            "devices": self.n_gpus,
            "world_size": self.world_size,
            "nodes": self.n_gpus // self.gpus_per_node,
            "gpus_per_node": self.gpus_per_node,
            "domain": {"kind": self.domain_spec.kind, "size": self.domain_size, "count": self.n_domains,
                       "bytes_per_s_per_device": self.domain_spec.bandwidth,
                       "in_switch_reduction": bool(self.domain_spec.sharp)},
            "switches": {k: v for k, v in sorted(kinds.items()) if k != "gpu"},
            "links": self.graph.number_of_edges(),
            "link_types": link_types,
            "bisection_bytes_per_s": self.bisection_bytes_per_s(),
            "peak_bf16_flops_total": a.peak_bf16_flops * self.n_gpus,
            "hbm_bytes_total": a.hbm_bytes * self.n_gpus,
        }
        if self.domain_spec.kind == "torus":
            out["domain"]["dims"] = list(self.domain_spec.dims or ())
        ft = self.fat_tree
        if ft is not None:
            out["fabric"] = {"kind": "fat_tree", "tiers": 3 if ft.cores_per_plane else (2 if ft.uplinks else 1),
                             "rail_optimised": ft.rail_optimised, "oversubscription": ft.oversubscription,
                             "nic_bytes_per_s": ft.bandwidth, "leaves": ft.n_leaves, "pods": ft.n_pods,
                             "link": ft.link_type, "pxn": bool(ft.rail_optimised and self.fabric_spec.pxn)}
        return out

    def __repr__(self) -> str:
        return f"<Cluster {self.name} {self.n_gpus}x{self.accelerator.name}>"


def _ranks(values: list) -> list:
    """Each value's rank among the distinct values (order-preserving renumbering)."""
    order = {v: i for i, v in enumerate(sorted(set(values)))}
    return [order[v] for v in values]


def _pair(a, b) -> tuple[int, int]:
    """_ranks of two values."""
    return (0, 0) if a == b else ((0, 1) if a < b else (1, 0))

"""NCCL's published tuning constants, read from NVIDIA/nccl (master at commit 5067397c, 2026) — no code copied.

Sources (all in https://github.com/NVIDIA/nccl):
- src/graph/tuning.cc: ``ncclTunerConstantsDefaults`` (base latencies, hardware latencies per protocol,
  LL / LL128 / tree / NVLS-tree per-channel bandwidth caps), ``nvlsEfficiency``, the protocol and algorithm
  factors of ``ncclTopoTuneModel`` (LL 0.5, LL128 0.92, tree 0.92, PAT 0.75, CollNet 0.85 ...) and
  ``treeCorrectionFactor``.
- src/graph/topo.h: per-link NVLink bandwidth as NCCL's topology sees it (SM80 20.0, SM90 20.6,
  SM100 40.1 GB/s), PCI_BW 12 GB/s for a PCIe Gen3 x16 link.
- src/graph/search.cc: the per-channel speeds its graph search tries (speedArrayIntra / Inter, sm90 and
  sm100 variants) and ``ncclTopoDupChannels``.
- src/include/comm.h, src/include/device.h: thread thresholds per protocol (LL 8, LL128 8, Simple 64
  bytes per thread), maximum threads per protocol (Simple 512, LL 512, LL128 640), MAXCHANNELS 64.
- src/transport/nvls.cc: NVLS channel counts (16 on Hopper, 24 on Blackwell NVL, 32 multi-node Blackwell).
- src/enqueue.cc: NCCL_P2P_LL_THRESHOLD 16384 (point-to-point uses LL up to 16 KiB, Simple above).
- Older releases (tags v2.18.1-1 .. v2.27.7-1 of the same repository, src/graph/tuning.cc; tree Simple latencies
  read in every tag from v2.18.1-1 to v2.23.4-1):
  the ``LEGACY_*`` constants below, used for a communicator that says which NCCL it runs (``Comm.version``).
Units: latencies in microseconds, bandwidths in GB/s (1e9 B/s) as NCCL writes them; topologies.nccl
converts to seconds and bytes/s.
"""
from __future__ import annotations

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")      # NCCL's compute-capability index

# baseLatencies [algorithm][protocol] (us)
BASE_LAT_US = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0), "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0), "pat": (8.0, 8.0, 8.0),
}
# hwLatencies [hw][algorithm][protocol] (us); hw: nvlink, pci, net
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0.0, 0.0, 3.7),
               "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0),
               "pat": (0.0, 0.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0.0, 0.0, 3.7),
            "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0),
            "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0.0, 0.0, 31.0),
            "collnet_chain": (0.0, 0.0, 30.0), "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 20.9),
            "pat": (0.0, 0.0, 14.0)},
}
# llMaxBws [row][nodes index: 1 node, 2 nodes, >2 nodes]; single node: row = architecture; multi-node:
# row 0 for Intel CPUs, row 1 for AMD (tuning.cc)
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
             "blackwell": (282.0, 90.0, 70.0)}
LL_MAX_BW_CPU_ROW = {"intel": "volta", "arm": "volta", "amd": "ampere"}
PER_CH_MAX_RING_LL128_BW = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                            "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0)}
PER_CH_MAX_TREE_LL128_BW = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                            "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
PER_CH_MAX_TREE_BW = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                      "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
PER_CH_MAX_NVLS_TREE_BW = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                           "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0)}
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}

# ncclTopoTuneModel factors
LL_BW_FACTOR = 0.5               # ring LL: half the line (8-byte lines carry 4 bytes of data + flag)
LL128_BW_FACTOR = 0.92           # ring LL128: 120 of 128 bytes are data
TREE_BW_FACTOR = 0.92            # tree all-reduce
TREE_LL_BW_FACTOR = 1.0 / 3.8
TREE_LL128_FACTOR_1NODE = 7.0 / 9.0
TREE_LL128_FACTOR_MULTI = 120.0 / 128.0
PAT_BW_FACTOR = 0.75
COLLNET_HOPPER_FACTOR = 0.85
COLLNET_ARITY_LAT_US = 0.4       # CollNet direct: arity serialisation latency per local rank
RING_PLATEAU_LAT_FACTOR = 1.4    # multi-node ring Simple all-reduce, compute capability >= 80
PAT_LINEAR_LAT_US = 2.8          # PAT: per-rank latency term
PAT_LOG_LAT_DIVISOR = 3.5
# tuning.cc adds the latency the network plugin reports (ncclNetProperties.latency -> graph latencyInter, us)
# to every inter-node step, twice for Simple ("also add the flush extra latency"); NCCL's own IB transport
# reports 0 (topo.cc). Present in every release from v2.18.5-1 on.
NET_LATENCY_SIMPLE_FACTOR = 2.0
# network post overhead (us) by CPU vendor (getNetOverhead), x3 for Simple
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "arm": 1.0}
NET_OVERHEAD_SIMPLE_FACTOR = 3.0

# treeCorrectionFactor [protocol][log2(bytes / 64)], 64 B .. 256 MiB
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}

# topo.h: NVLink bandwidth per link as NCCL's topology records it (GB/s per direction)
NVLINK_BW_PER_LINK = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
# raw per-link NVLink rate per direction (NVIDIA NVLink generations: NVLink 3 and 4 = 25 GB/s, NVLink 5 =
# 50 GB/s per link per direction); NCCL's figure over it converts a datasheet bandwidth to NCCL's units
NVLINK_RAW_PER_LINK = {"volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}
# topo.h PCI_BW 12 GB/s for PCIe Gen3 x16 (15.75 GB/s raw): the same fraction for other PCIe links
PCI_FRACTION = 12.0 / 15.75

# search.cc speed arrays (GB/s per channel)
SPEEDS_INTRA = {"default": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
SPEEDS_INTER = {"default": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
                            2.4, 1.2, 0.24, 0.12),
                "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
                           0.24, 0.12),
                "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0,
                              6.0, 3.0, 2.4, 1.2, 0.24, 0.12)}
SEARCH_STEP_RATIO = 0.49         # search keeps lowering the speed while next / best > 0.49
MAX_RING_CHANNELS = 32           # init.cc: ringGraph maxChannels = MAXCHANNELS / 2
NVLS_MAX_ARITY = 32              # device.h NCCL_MAX_NVLS_ARITY
COLLNET_MAX_HEADS = 8            # device.h NCCL_MAX_DIRECT_ARITY + 1 (CollNet direct heads per node)
NVLS_CHANNELS = {"hopper": 16, "blackwell": 24}           # nvls.cc (Blackwell multi-node: 32)
NVLS_CHANNELS_BLACKWELL_MULTINODE = 32

# channel / thread tuning (enqueue.cc topoGetAlgoInfo)
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}   # bytes per thread before adding a channel
MAX_THREADS = {"ll": 512, "ll128": 640, "simple": 512}
P2P_LL_THRESHOLD_BYTES = 16384

# ------------------------------------------------------------------------------------------ older releases
# NCCL versions as integers: 2.18.5 -> 21805 (NCCL_VERSION_CODE); 0 = the newest (the tables above).
# Before 2.21 (v2.18.5-1, v2.20.5-1 tuning.cc): NVLS and NVLS-tree latency 23 us (2.18 in baseLat, 2.19-2.20 in
# hwLat NVLink); ring LL at 1/4 of the line for all-reduce / reduce or across nodes, else 1/3; Hopper's LL cap
# {87.7, 22.5, 19.0} (the Ampere row); ring LL128 at 0.7 with one rank per node (until 2.23).
LEGACY_NVLS_LAT_US_BEFORE_2_21 = 23.0
LEGACY_RING_LL_FACTOR_BEFORE_2_21 = (1.0 / 4.0, 1.0 / 3.0)    # (all-reduce, reduce or > 1 node; others)
LEGACY_LL_MAX_BW_HOPPER_BEFORE_2_21 = (87.7, 22.5, 19.0)
LEGACY_RING_LL128_PPN1_FACTOR_BEFORE_2_23 = 0.7
# Before 2.28 (v2.21.5-1 .. v2.27.7-1): NVLS per channel min(bwIntra, bwInter) (all-reduce; all-gather /
# reduce-scatter min(bwIntra (ppn-1)/ppn, 0.9 bwInter)), NVLS-tree min(bwIntra, bwInter, or bwInter/2 beyond
# 2 nodes); all-reduce bus -> algorithm bandwidth x 5/6 for both (no nvlsEfficiency, no 2x pipelining).
LEGACY_NVLS_RATIO_BEFORE_2_28 = 5.0 / 6.0
OLDEST_RELEASE = 21800                 # the oldest tuning model written here (v2.18.x)
VERSION_NVLS_EFFICIENCY = 22800        # first release with nvlsEfficiency (v2.28.3-1)
VERSION_LL_HALF = 22100                # first release with ring LL at 1/2 and Hopper's own LL cap (v2.21.5-1)
VERSION_LL128_PPN1 = 22300             # ring LL128 0.92 also with one rank per node from v2.23.4-1
VERSION_NVLS_AG_RS = 21900             # NVLS all-gather / reduce-scatter exist from 2.19 (2.18: ring only)
LEGACY_NET_NVLS_TREE_LAT_US_BEFORE_2_28 = 14.0   # hwLat NET NVLSTree in v2.20.5-1 .. v2.27.7-1 (20.9 after)
# Tree Simple latency before 2.23 (tuning.cc baseLat[Tree][Simple], hwLat[NVLink, PCI, NET][Tree][Simple], us), by
# the first release that no longer has it: v2.18.1-1 (0; 28, 28, 28), v2.18.3-1 .. v2.18.6-1 (0; 4, 6, 14),
# v2.19.1-1 .. v2.22.3-1 (0; 28, 28, 28); from v2.23.4-1 on the newest (8.4; 4.0, 4.0, 14).
LEGACY_TREE_SIMPLE_LAT_US = ((21803, 0.0, {"nvlink": 28.0, "pci": 28.0, "net": 28.0}),
                             (21900, 0.0, {"nvlink": 4.0, "pci": 6.0, "net": 14.0}),
                             (22300, 0.0, {"nvlink": 28.0, "pci": 28.0, "net": 28.0}))
# Blackwell's per-channel caps in v2.25.1-1 .. v2.27.7-1 (tuning.cc: twice Hopper's rows, "2*36.7" ...); from
# v2.28.3-1 the tables above (ring LL128 40.0, tree LL128 55.6 / 31.67 / 20.0, tree 70.0 / 42.8 / 24.0).
LEGACY_BLACKWELL_CAPS_BEFORE_2_28 = {"ring_ll128": (2 * 36.7, 2 * 36.7, 2 * 36.7),
                                     "tree_ll128": (2 * 36.7, 2 * 36.7, 2 * 29.0),
                                     "tree": (2 * 38.7, 2 * 41.4, 2 * 36.0)}
# From v2.23.4-1 a ring with one rank per node takes the tree's NET latency (interLat = ppn == 1 ?
# hwLat[NET][Tree] : hwLat[NET][algo]); before, every algorithm its own.
VERSION_PPN1_TREE_NET_LAT = 22300

# ------------------------------------------------------------------------------------------ benchmark harness
# What a benchmark adds to the collective it times (topologies.nccl.harness_time_s). nccl-tests
# (NVIDIA/nccl-tests src/common.cu, startColl / BenchTime) runs -g N GPUs from one thread: each iteration
# enqueues the N ranks' collectives in one ncclGroupStart/End, so the thread launches N kernels one after the
# other, and it reports the wall time of `iters` back-to-back iterations divided by iters (-z 1: it syncs the
# streams after every iteration instead). Host seconds per GPU launched that way: the published sweep of
# NVIDIA/nccl-tests issue #123 (DGX-A100, NCCL_ALGO=Ring NCCL_MAX_NCHANNELS=1, all_reduce_perf -g 2..8, 8-128 B:
# 10.0, 13.76, 16.88, 20.8, 25.2, 29.5, 33.7 us) grows with the GPUs one thread drives, 4.2 us x N within 2% for
# N = 4..8, where NCCL's model of that ring (6.6 + 2 (N-1) x 0.6 us) is 8-15 us: the period is the thread's
# launches. 33.7 us / 8 GPUs.
HOST_LAUNCH_PER_GPU_S = 33.7e-6 / 8

# PyTorch's per-call host overhead of one torch.distributed collective timed on its own (CUDA events around one
# call after a barrier, then a synchronize): ml-engineering's all_reduce_bench.py before its queued-calls timing
# (the rows' version, stas00/ml-engineering@744d01e1 timed_allreduce), the later `--with-host-overhead` mode.
# Measured as the difference of the two modes on one 8x H200 node (torch 2.14.0+cu130, NCCL 2.30.7), median
# latency per call, stas00/ml-engineering network/benchmarks/README.md section "How the latency is measured"
# (stored version with torch-dist-bench.py, not a row of the validation set): with host overhead minus default
# = 36.6-15.2, 38.0-17.9, 39.1-18.8, 41.7-20.9, 43.5-21.4, 50.9-27.7 us at 8 B, 64 B, 1 KiB, 32 KiB, 256 KiB,
# 1 MiB = 21.4, 20.1, 20.3, 20.8, 22.1, 23.2 us; the median of the six, (20.8 + 21.4) / 2 = 21.1 us. It holds
# the call's Python / c10d work, NCCL's launch, and the ranks reaching the call at different times after the
# barrier (the README: "its median adds the ~20us of PyTorch's per-call overhead").
TORCH_CALL_OVERHEAD_S = 21.1e-6

# Latency (us) network plugins report to NCCL (ncclNetProperties.latency, added as above):
# - aws-ofi-nccl (AWS EFA): src/platform-aws.cpp sets 35.0 for the "p5en/p6-b200" platform (since commit
#   2496e7de, 2025-05-23, "Updating latency value for p5en and p6 based on empirical search"), 75.0 for p5/p5e.
# - GPUDirect-TCPXO (google/nccl-plugin-gpudirect-tcpxo, nccl_shim.cc GetProperties): 0.
NET_PLUGIN_LATENCY_US = {"aws-ofi-nccl p5en/p6-b200": 35.0, "aws-ofi-nccl p5/p5e": 75.0, "gpudirect-tcpxo": 0.0}

# ------------------------------------------------------------------------------------------ NVLS pipeline (one node)
# The time NCCL's tuning model leaves out: NVLS all-reduce on one node is a pipeline. src/device/all_reduce.h
# RunWorkColl<ncclFuncAllReduce, NVLS, SIMPLE> (v2.30.7-1; src/collectives/device/all_reduce.h RunWorkElement in
# v2.18.5-1), work->oneNode: each channel runs three warp groups at once, scatter (user buffer -> every head's
# unicast buffer), reduce (multimem ld_reduce / st on the multicast buffer: directRecvDirectSend) and gather (the
# heads' buffers -> user buffer); one iteration moves nHeads chunks per channel through the three in turn.
NVLS_PIPELINE_STAGES = 3
# src/enqueue.cc (the NVLS branch of the chunk computation, identical in v2.18.5-1 .. v2.30.7-1): chunk =
# NCCL_NVLS_CHUNKSIZE (128 KiB, transport/nvls.cc; the literal 131072 before 2.21), cut to 64 KiB when
# nBytes < 64 x concurrentOps x chunk, then 32 KiB when < 8 x, then 16 KiB when < 2 x, with concurrentOps =
# channels launched (comm->nvlsChannels) x nvls.nHeads.
NVLS_CHUNK_BYTES = 128 * 1024
NVLS_CHUNK_SHRINK = ((64, 65536), (8, 32768), (2, 16384))    # (factor, chunk bytes), applied in order

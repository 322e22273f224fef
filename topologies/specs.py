"""Accelerator specifications: datasheet figures, one frozen dataclass per device.

All figures are per device, dense (no structured sparsity), SI units: FLOP/s, bytes, bytes/s.
Scale-up and NIC bandwidths are per direction (the datasheets often quote bidirectional sums;
the conversion is noted next to each entry).
"""
from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ConfigError, UnknownPresetError

GB = 1e9
MIB = 2**20
TB = 1e12
TFLOPS = 1e12
GBIT = 1e9 / 8   # bytes/s in one Gb/s


@dataclass(frozen=True)
class AcceleratorSpec:
    """One accelerator.

    name                  identity used as the cost model's device key and for calibration lookup
    peak_bf16_flops       dense bf16 FLOP/s
    peak_fp8_flops        dense fp8 FLOP/s, None where the device has no fp8 tensor path
    hbm_bytes             device memory capacity (bytes). NVIDIA's "80 GB" is binary: the capacity is the
                          total nvidia-smi reports (MiB = 2**20 B), e.g. 81,559 MiB = 85.5e9 B on H100 SXM, not
                          80e9 B. CUDA's totalGlobalMem is ~1% below it (A100 40GB: 40,536 of 40,960 MiB in
                          ../shared/traces/real-gpu) and the CUDA context takes some more: plans above 95% of
                          it carry a headroom note (clustersim.experiment.headroom_note)
    hbm_bytes_per_s       device memory bandwidth
    scale_up_bytes_per_s  scale-up link bandwidth per device per direction (NVLink, ICI, UB, PCIe)
    nic_bytes_per_s       scale-out NIC bandwidth per device per direction
    scale_up_link         link type of the scale-up network ("nvlink", "ici", "ub", "pcie")
    vendor, source        provenance
    sm_count              streaming multiprocessors (GEMM wave quantisation; 0 = not an SM architecture)
    device_names          names the device reports (torch.cuda.get_device_name), so calibrations measured
                          on it apply to this spec
    """

    name: str
    peak_bf16_flops: float
    peak_fp8_flops: float | None
    hbm_bytes: float
    hbm_bytes_per_s: float
    scale_up_bytes_per_s: float
    nic_bytes_per_s: float
    scale_up_link: str = "nvlink"
    vendor: str = "NVIDIA"
    source: str = ""
    sm_count: int = 0
    device_names: tuple = ()

    def __post_init__(self):
        for field in ("peak_bf16_flops", "hbm_bytes", "hbm_bytes_per_s", "scale_up_bytes_per_s", "nic_bytes_per_s"):
            v = getattr(self, field)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"accelerator {self.name!r}: {field} must be a positive number, got {v!r}")


ACCELERATORS: dict[str, AcceleratorSpec] = {}


def _register(spec: AcceleratorSpec) -> AcceleratorSpec:
    if spec.name in ACCELERATORS:
        raise ValueError(f"accelerator {spec.name!r} registered twice")
    ACCELERATORS[spec.name] = spec
    return spec


# NVIDIA H100 Tensor Core GPU datasheet (SXM5 column): BF16 1,979 TFLOPS / FP8 3,958 TFLOPS *with sparsity*
# -> dense 989.4 / 1,978.9; 80 GB HBM3 (81,559 MiB in nvidia-smi) at 3.35 TB/s; NVLink 4 900 GB/s bidirectional -> 450 GB/s per
# direction; DGX H100 pairs each GPU with a ConnectX-7 400 Gb/s NIC (DGX H100 user guide).
H100_SXM = _register(AcceleratorSpec(
    "H100-SXM", 989.4 * TFLOPS, 1978.9 * TFLOPS, 81559 * MIB, 3.35 * TB, 450 * GB, 400 * GBIT,
    source="NVIDIA H100 datasheet (SXM5); DGX H100 user guide (8x ConnectX-7 400 Gb/s); 132 SMs: NVIDIA H100 "
    "Tensor Core GPU Architecture whitepaper", sm_count=132, device_names=("NVIDIA H100 80GB HBM3",)))

# NVIDIA H100 Tensor Core GPU datasheet (PCIe column): BF16 1,513 TFLOPS / FP8 3,026 TFLOPS *with sparsity*
# -> dense 756.5 / 1,513; 80 GB HBM2e (81,559 MiB in nvidia-smi) at 2.0 TB/s; no NVSwitch: PCIe Gen5 x16 128 GB/s bidirectional -> 64 GB/s
# per direction (the optional 2-GPU NVLink bridge is not modelled); 114 SMs (H100 architecture whitepaper).
# NIC: one 400 Gb/s ConnectX-7 per GPU assumed (as DGX H100; PCIe servers vary).
H100_PCIE = _register(AcceleratorSpec(
    "H100-PCIe", 756.5 * TFLOPS, 1513 * TFLOPS, 81559 * MIB, 2.0 * TB, 64 * GB, 400 * GBIT, scale_up_link="pcie",
    source="NVIDIA H100 datasheet (PCIe); H100 architecture whitepaper (114 SMs); NIC assumed 400 Gb/s",
    sm_count=114, device_names=("NVIDIA H100 PCIe",)))

# H100 SXM5 with 96 GB HBM2e at 2.4 TB/s, as Meta's Grand Teton hosts carry it (run at a 500 W power limit):
# torchtitan's benchmarks/llama3_h100_202412_torchtitan.md states the memory and its bandwidth, NVLink within a
# host and 400 Gb/s RDMA per GPU, and that the peak FLOPS lies "between SXM and NVL" without knowing it. The
# SXM5 peak here is therefore an upper bound; its GEMMs take the H100 SXM's rate sustained at 700 W
# (topologies.kernel_curves.SUSTAINED_SOURCES), also an upper bound: the further slowdown at 500 W is not measured.
# 96 GB = six 16 GiB HBM2e stacks; usable capacity in H100 SXM's proportion (81,559 of 81,920 MiB) -> 97,871 MiB.
H100_HBM2E = _register(AcceleratorSpec(
    "H100-HBM2e", 989.4 * TFLOPS, 1978.9 * TFLOPS, 97871 * MIB, 2.4 * TB, 450 * GB, 400 * GBIT,
    source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md (96GB HBM2e, 2.4 TB/s, 400 Gb/s RDMA per GPU, "
    "500 W limit: GEMMs at H100 SXM's 700 W sustained rate, an upper bound); compute and SMs of H100 SXM5 (an "
    "upper bound: the source puts its peak between "
    "SXM and NVL)", sm_count=132))

# NVIDIA H200 datasheet (SXM): same Hopper compute as H100 SXM; 141 GB HBM3e (143,771 MiB in nvidia-smi) at 4.8 TB/s; NVLink 900 GB/s
# bidirectional; DGX H200: 8x ConnectX-7 400 Gb/s.
H200 = _register(AcceleratorSpec(
    "H200", 989.4 * TFLOPS, 1978.9 * TFLOPS, 143771 * MIB, 4.8 * TB, 450 * GB, 400 * GBIT,
    source="NVIDIA H200 datasheet (SXM); DGX H200 datasheet; GH100 die with 132 SMs as H100 SXM",
    sm_count=132, device_names=("NVIDIA H200",)))

# NVIDIA DGX/HGX B200 datasheet: 8 GPUs = 72 PFLOPS FP8 and 36 PFLOPS BF16 *with sparsity* -> per GPU dense
# 4.5 PFLOPS FP8, 2.25 PFLOPS BF16; 1,440 GB HBM3e, 64 TB/s total -> 180 GB (183,359 MiB in nvidia-smi), 8 TB/s per GPU; NVLink 5
# 1.8 TB/s bidirectional -> 900 GB/s per direction; 8x ConnectX-7 400 Gb/s.
B200 = _register(AcceleratorSpec(
    "B200", 2250 * TFLOPS, 4500 * TFLOPS, 183359 * MIB, 8 * TB, 900 * GB, 400 * GBIT,
    source="NVIDIA DGX B200 datasheet; 148 SMs: the multi_processor_count CUDA reports for B200 (not on the datasheet)", sm_count=148,
    device_names=("NVIDIA B200",)))

# NVIDIA GB200 NVL72 datasheet: 72 GPUs = 720 PFLOPS FP8 and 360 PFLOPS BF16 *with sparsity* -> per GPU dense
# 5 PFLOPS FP8, 2.5 PFLOPS BF16; up to 13.4 TB HBM3e, 576 TB/s -> 186 GB (189,471 MiB in nvidia-smi), 8 TB/s per GPU; NVLink 5
# 130 TB/s per rack = 1.8 TB/s per GPU bidirectional -> 900 GB/s per direction; one 400 Gb/s ConnectX-7
# per GPU for the compute fabric.
GB200 = _register(AcceleratorSpec(
    "GB200", 2500 * TFLOPS, 5000 * TFLOPS, 189471 * MIB, 8 * TB, 900 * GB, 400 * GBIT,
    source="NVIDIA GB200 NVL72 datasheet; 148 SMs as B200", sm_count=148, device_names=("NVIDIA GB200",)))

# Blackwell Ultra (sm_103). NVIDIA's own system descriptions in ai-dynamo/aiconfigurator (systems/b300_sxm.yaml and
# gb300.yaml, citing the Blackwell Ultra datasheet): B300 (HGX / DGX B300) 2.25 PFLOPS BF16 and 4.5 PFLOPS FP8 dense
# (4.5 / 9 with sparsity), 7.75 TB/s HBM3e (62 TB/s over 8 GPUs), 275,040 MiB in nvidia-smi, NVLink 5 900 GB/s per
# direction, one ConnectX-8 800 Gb/s per GPU, 1,100 W; GB300 (NVL72) 2.5 / 5 PFLOPS dense, 8 TB/s, 284,208 MiB
# in nvidia-smi, NVLink 5 900 GB/s, one ConnectX-8 800 Gb/s per GPU, 1,400 W. ml-engineering's accelerator
# tables (compute/accelerator/README.md at 744d01e) give the same peaks (GB300 2,500 / 5,000, B300 2,250 / 4,500
# TFLOPS). SM count: 148 as B200 (not on the datasheets; the sm_103 device-properties fixtures seen in public test
# suites report 148).
B300 = _register(AcceleratorSpec(
    "B300", 2250 * TFLOPS, 4500 * TFLOPS, 275040 * MIB, 7.75 * TB, 900 * GB, 800 * GBIT,
    source="NVIDIA Blackwell Ultra datasheet via ai-dynamo/aiconfigurator systems/b300_sxm.yaml (275,040 MiB in "
           "nvidia-smi, 7.75 TB/s, CX-8 800 Gb/s); 148 SMs as B200", sm_count=148,
    device_names=("NVIDIA B300 SXM6 AC",)))
GB300 = _register(AcceleratorSpec(
    "GB300", 2500 * TFLOPS, 5000 * TFLOPS, 284208 * MIB, 8 * TB, 900 * GB, 800 * GBIT,
    source="NVIDIA Blackwell Ultra datasheet via ai-dynamo/aiconfigurator systems/gb300.yaml (284,208 MiB in "
           "nvidia-smi, 8 TB/s, CX-8 800 Gb/s); 148 SMs as B200", sm_count=148, device_names=("NVIDIA GB300",)))

# NVIDIA A100 datasheet (80GB SXM): BF16 312 TFLOPS dense (624 with sparsity), no FP8; 80 GB HBM2e (81,920 MiB) at
# 2,039 GB/s; NVLink 3 600 GB/s bidirectional -> 300 GB/s per direction; DGX A100: 8x ConnectX-6
# 200 Gb/s HDR InfiniBand for the compute fabric.
A100_80GB = _register(AcceleratorSpec(
    "A100-80GB", 312 * TFLOPS, None, 81920 * MIB, 2.039 * TB, 300 * GB, 200 * GBIT,
    source="NVIDIA A100 datasheet (80GB SXM); DGX A100 datasheet (8x HDR 200 Gb/s); 108 SMs: NVIDIA A100 "
    "Tensor Core GPU Architecture whitepaper", sm_count=108, device_names=("NVIDIA A100-SXM4-80GB",)))

# NVIDIA A100 datasheet (40GB SXM): BF16 312 TFLOPS dense, 40 GB HBM2 (40,960 MiB) at 1,555 GB/s; NVLink 3 as the 80GB
# part; DGX A100 (320GB) has 8x ConnectX-6 200 Gb/s HDR; 108 SMs.
A100_40GB = _register(AcceleratorSpec(
    "A100-40GB", 312 * TFLOPS, None, 40960 * MIB, 1.555 * TB, 300 * GB, 200 * GBIT,
    source="NVIDIA A100 datasheet (40GB SXM); DGX A100 datasheet; A100 architecture whitepaper (108 SMs)",
    sm_count=108, device_names=("NVIDIA A100-SXM4-40GB",)))

# Google Cloud TPU v5p documentation: 459 TFLOPS BF16 per chip (918 TOPS INT8, no FP8); 95 GB HBM at
# 2,765 GB/s; ICI 4,800 Gb/s per chip over 6 torus links -> 800 Gb/s = 100 GB/s per link per direction
# (we take the quoted figure as the per-direction sum). Scale-out (DCN) bandwidth per chip is not
# published: 200 Gb/s per chip is an assumption (4 chips per host); multi-slice runs should calibrate it.
TPU_V5P = _register(AcceleratorSpec(
    "TPU-v5p", 459 * TFLOPS, None, 95 * GB, 2.765 * TB, 600 * GB, 200 * GBIT, scale_up_link="ici",
    vendor="Google", source="cloud.google.com/tpu/docs/v5p (system architecture); DCN per chip assumed"))

# Huawei CloudMatrix384 paper (Zuo et al., "Serving Large Language Models on Huawei CloudMatrix384",
# arXiv 2506.12708, sec. 3): Ascend 910C = 2 dies, each 376 TFLOPS BF16 dense, 64 GB HBM at 1.6 TB/s,
# UB 196 GB/s per direction, RDMA 200 Gb/s -> per package 752 TFLOPS, 128 GB, 3.2 TB/s, UB 392 GB/s per
# direction, 400 Gb/s RDMA. No FP8 (INT8 only).
ASCEND_910C = _register(AcceleratorSpec(
    "Ascend-910C", 752 * TFLOPS, None, 128 * GB, 3.2 * TB, 392 * GB, 400 * GBIT, scale_up_link="ub",
    vendor="Huawei", source="arXiv 2506.12708 (CloudMatrix384), section 3"))

# NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity), FP8 733 dense (1,466 sparse);
# 48 GB GDDR6 (46,068 MiB in nvidia-smi: ECC on) at 864 GB/s; PCIe Gen4 x16 = 64 GB/s bidirectional -> 32 GB/s per direction; no NVLink.
# NIC: the commodity 100 GbE of the pcie-ethernet-lab preset (12.5 GB/s), shared by the box.
L40S = _register(AcceleratorSpec(
    "L40S", 362.05 * TFLOPS, 733 * TFLOPS, 46068 * MIB, 864 * GB, 32 * GB, 100 * GBIT, scale_up_link="pcie",
    source="NVIDIA L40S datasheet; 142 SMs: NVIDIA Ada Lovelace architecture whitepaper", sm_count=142,
    device_names=("NVIDIA L40S",)))

_ALIASES = {"h100": "H100-SXM", "h100-sxm": "H100-SXM", "h100-hbm2e": "H100-HBM2e", "h100-96gb": "H100-HBM2e",
            "h200": "H200", "b200": "B200", "gb200": "GB200", "b300": "B300", "gb300": "GB300",
            "a100": "A100-80GB", "a100-80gb": "A100-80GB",
            "a100-40gb": "A100-40GB", "h100-pcie": "H100-PCIe", "tpu-v5p": "TPU-v5p", "v5p": "TPU-v5p",
            "ascend-910c": "Ascend-910C", "910c": "Ascend-910C", "l40s": "L40S"}


def get_accelerator(name: str) -> AcceleratorSpec:
    """Look an accelerator up by name (case-insensitive, a few aliases); UnknownPresetError lists the known."""
    if name in ACCELERATORS:
        return ACCELERATORS[name]
    key = _ALIASES.get(str(name).lower())
    if key is None:
        for n in ACCELERATORS:
            if n.lower() == str(name).lower():
                key = n
    if key is None:
        raise UnknownPresetError("accelerator", str(name), ACCELERATORS)
    return ACCELERATORS[key]


# Device identity: the names CUDA / the collectors report (torch.cuda.get_device_name, nvidia-smi; these
# land in calibration files) mapped to the presets above. Each entry: preset, substrings the name must
# hold, substrings it must not hold, matched on the lower-cased name without spaces, "-" and "_".
# Names as reported: "NVIDIA H100 80GB HBM3" (SXM5; the PCIe and NVL cards report "H100 PCIe" / "H100 NVL",
# other boards and clocks), "NVIDIA H200" ("H200 NVL" is the PCIe card), "NVIDIA A100-SXM4-80GB"
# ("A100 80GB PCIe" differs in HBM bandwidth and has no NVSwitch), "NVIDIA B200", "NVIDIA GB200",
# "NVIDIA B300 SXM6 AC", "NVIDIA L40S"; TPU and Ascend chips by their model names.
_DEVICE_NAMES = (
    ("H100-SXM", ("h100",), ("pcie", "nvl")),
    ("H200", ("h200",), ("nvl",)),
    ("GB200", ("gb200",), ()),
    ("B200", ("b200",), ("gb200",)),
    ("GB300", ("gb300",), ()),
    ("B300", ("b300",), ("gb300",)),
    ("A100-80GB", ("a100", "80g"), ("pcie",)),
    ("L40S", ("l40s",), ()),
    ("TPU-v5p", ("v5p",), ()),
    ("Ascend-910C", ("910c",), ()),
)


def accelerator_for_device(name: str) -> AcceleratorSpec | None:
    """The preset a reported device name (calibration ``device``, trace device) stands for, or None."""
    if name in ACCELERATORS:
        return ACCELERATORS[name]
    key = str(name).lower()
    if key in _ALIASES:
        return ACCELERATORS[_ALIASES[key]]
    flat = "".join(ch for ch in key if ch not in " -_")
    for preset, must, must_not in _DEVICE_NAMES:
        if all(m in flat for m in must) and not any(m in flat for m in must_not):
            return ACCELERATORS[preset]
    return None


def same_device(name: str, spec: AcceleratorSpec) -> bool:
    """Whether a reported device name is the accelerator ``spec`` (its own name, an alias or a known report)."""
    if str(name).lower() == spec.name.lower():
        return True
    found = accelerator_for_device(name)
    return found is not None and found.name == spec.name

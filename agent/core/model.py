"""Typed data the probes produce and the checks judge. Every field a tool may omit is Optional:
None means "the tool did not say" (N/A, not supported, not captured), never zero."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class SourceLine:
    """A line of a tool's output that a value was read from (1-based), kept as evidence."""

    line: int
    text: str


@dataclass(frozen=True)
class EccErrors:
    """ECC error counters of one GPU. `*_uncorrectable_sram` sums parity and SEC-DED on R550+."""

    mode_enabled: bool | None = None
    volatile_dram_uncorrectable: int | None = None
    volatile_sram_uncorrectable: int | None = None
    aggregate_dram_uncorrectable: int | None = None
    aggregate_sram_uncorrectable: int | None = None
    volatile_dram_correctable: int | None = None
    aggregate_dram_correctable: int | None = None
    volatile_sram_correctable: int | None = None
    aggregate_sram_correctable: int | None = None
    sram_threshold_exceeded: bool | None = None
    # Pre-Ampere (Pascal/Volta) layout: double-bit (and single-bit) totals.
    volatile_double_bit_total: int | None = None
    aggregate_double_bit_total: int | None = None
    volatile_single_bit_total: int | None = None

    @property
    def volatile_correctable(self) -> int | None:
        """Correctable errors since the driver loaded: SRAM + DRAM (Ampere and later), else the
        single-bit total (before Ampere); None when the GPU reports neither."""
        parts = [v for v in (self.volatile_sram_correctable, self.volatile_dram_correctable) if v is not None]
        return sum(parts) if parts else self.volatile_single_bit_total


@dataclass(frozen=True)
class RetiredPages:
    """Page retirement (before Ampere). pending = "Pending Page Blacklist"/"Pending Page Retirement"."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class RemapHistogram:
    """The Bank Remap Availability Histogram: how many DRAM banks have all (max), most (high), some
    (partial), few (low) or no (none) spare rows left (NVML nvmlRowRemapperHistogramValues_t)."""

    max: int | None = None
    high: int | None = None
    partial: int | None = None
    low: int | None = None
    none: int | None = None

    @property
    def banks(self) -> int | None:
        values = (self.max, self.high, self.partial, self.low, self.none)
        return sum(v for v in values if v is not None) if any(v is not None for v in values) else None


@dataclass(frozen=True)
class RemappedRows:
    """Row remapping (Ampere and later)."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None
    histogram: RemapHistogram | None = None  # None: not reported


@dataclass(frozen=True)
class ClockEvents:
    """Active clock event (throttle) reasons. None = not reported."""

    hw_slowdown: bool | None = None
    hw_thermal_slowdown: bool | None = None
    hw_power_brake: bool | None = None
    sw_power_cap: bool | None = None
    sw_thermal_slowdown: bool | None = None
    idle: bool | None = None
    applications_clocks_setting: bool | None = None
    sync_boost: bool | None = None
    display_clock_setting: bool | None = None

    def active(self) -> tuple[str, ...] | None:
        """The names of the reasons active now; None when the reasons were not reported."""
        reasons = {
            "idle": self.idle,
            "applications clocks setting": self.applications_clocks_setting,
            "SW power cap": self.sw_power_cap,
            "HW slowdown": self.hw_slowdown,
            "HW thermal slowdown": self.hw_thermal_slowdown,
            "HW power brake": self.hw_power_brake,
            "sync boost": self.sync_boost,
            "SW thermal slowdown": self.sw_thermal_slowdown,
            "display clock setting": self.display_clock_setting,
        }
        if all(v is None for v in reasons.values()):
            return None
        return tuple(name for name, on in reasons.items() if on)


@dataclass(frozen=True)
class GpuThermal:
    """Temperatures in °C as nvidia-smi / NVML state them. Hopper and later print the GPU's limits
    relative to T.Limit ("GPU T.Limit Temp": the margin left; "GPU Slowdown T.Limit Temp": where
    slowdown starts, relative to T.Limit); older GPUs print absolute limits. None: not reported."""

    gpu_c: int | None = None
    gpu_slowdown_c: int | None = None  # absolute slowdown threshold
    gpu_tlimit_margin_c: int | None = None  # "GPU T.Limit Temp": degrees left to T.Limit
    gpu_slowdown_tlimit_c: int | None = None  # "GPU Slowdown T.Limit Temp" (e.g. -2)
    memory_c: int | None = None
    memory_max_c: int | None = None  # "Memory Max Operating Temp" (absolute; HBM throttles above it)

    @property
    def gpu_margin_c(self) -> int | None:
        """Degrees left before the GPU's thermal slowdown."""
        if self.gpu_tlimit_margin_c is not None and self.gpu_slowdown_tlimit_c is not None:
            return self.gpu_tlimit_margin_c - self.gpu_slowdown_tlimit_c
        if self.gpu_c is not None and self.gpu_slowdown_c is not None:
            return self.gpu_slowdown_c - self.gpu_c
        return None

    @property
    def memory_margin_c(self) -> int | None:
        """Degrees left before the memory's maximum operating temperature."""
        if self.memory_c is not None and self.memory_max_c is not None:
            return self.memory_max_c - self.memory_c
        return None


@dataclass(frozen=True)
class GpuClocks:
    """SM clock now, the application clock it should run at when busy, utilization (%)."""

    sm_mhz: int | None = None
    applications_mhz: int | None = None  # "Applications Clocks / Graphics" (else its default)
    max_sm_mhz: int | None = None
    utilization_percent: int | None = None  # "Utilization / Gpu"


@dataclass(frozen=True)
class PcieLink:
    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None
    replay_counter: int | None = None


@dataclass(frozen=True)
class Fabric:
    """NVSwitch fabric registration (Hopper+ HGX). state e.g. "Completed", status e.g. "Success"."""

    state: str | None = None
    status: str | None = None


@dataclass(frozen=True)
class GpuPower:
    """Performance state ("P0".."P12") and power limits in watts; None: not reported (N/A)."""

    performance_state: str | None = None
    enforced_limit_w: float | None = None  # the limit in force ("Current"/"Enforced Power Limit")
    default_limit_w: float | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    pci_bus_id: str  # normalised: 8-hex-digit domain, lower case: "00000000:53:00.0"
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    architecture: str | None = None  # "Hopper", "Ampere", ... (text output only; XML lacks it before v12)
    persistence_mode: bool | None = None
    mig_mode: bool | None = None  # current MIG mode
    ecc: EccErrors = field(default_factory=EccErrors)
    retired_pages: RetiredPages | None = None  # None: not applicable (N/A) on this GPU
    remapped_rows: RemappedRows | None = None  # None: not applicable (N/A) on this GPU
    clock_events: ClockEvents = field(default_factory=ClockEvents)
    pcie: PcieLink = field(default_factory=PcieLink)
    recovery_action: str | None = None  # "None", "Reset", "Reboot", "Drain P2P", "Drain and Reset"
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    fabric: Fabric | None = None  # None: no fabric section / N/A
    power: GpuPower = field(default_factory=GpuPower)
    thermal: GpuThermal = field(default_factory=GpuThermal)
    clocks: GpuClocks = field(default_factory=GpuClocks)
    # The lines each judged value was read from, by field ("remapped_rows.pending"), for evidence.
    where: dict[str, tuple[SourceLine, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        """How a GPU is named in messages and entities: "GPU 3 (0000:53:00.0)"."""
        return f"GPU {self.index} ({short_pci(self.pci_bus_id)})"

    @property
    def lasting_name(self) -> str:
        """The board's name across boots and slots: its serial, else its UUID, else its PCI address
        (a replaced board starts a new reboot history and new trends)."""
        return self.serial or self.uuid or normalize_pci(self.pci_bus_id)


@dataclass(frozen=True)
class LostGpu:
    """A GPU the driver lists but cannot talk to (GPU_IS_LOST, "Unable to determine the device handle")."""

    pci_bus_id: str | None
    message: str
    where: SourceLine | None = field(default=None, compare=False)  # its line in the tool's output


@dataclass(frozen=True)
class GpuInventory:
    """Everything NVML / nvidia-smi told us about the node's GPUs."""

    source: str  # "nvml", "nvidia-smi -q -x", "nvidia-smi -q"
    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None  # what the tool says is attached (may exceed len(gpus))
    gpus: tuple[Gpu, ...] = ()
    lost: tuple[LostGpu, ...] = ()


def normalize_pci(bus_id: str) -> str:
    """ "0000:53:00.0", "00000000:53:00.0", "53:00.0" → "00000000:53:00.0" (lower case)."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return text
    domain, bus, devfn = parts
    if "." not in devfn:
        devfn = devfn + ".0"
    dev, _, fn = devfn.partition(".")
    try:
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError:
        return text


def short_pci(bus_id: str) -> str:
    """ "00000000:53:00.0" → "0000:53:00.0" (the sysfs / lspci form people recognise)."""
    norm = normalize_pci(bus_id)
    domain, _, rest = norm.partition(":")
    if len(domain) == 8 and rest:
        return f"{domain[4:]}:{rest}"
    return norm


# --------------------------------------------------------------------------- topology / NVLink


@dataclass(frozen=True)
class TopoMatrix:
    """`nvidia-smi topo -m`. rows maps a device name ("GPU0", "NIC3") to its cells by column name."""

    columns: tuple[str, ...]  # device columns in header order: GPU0.., NIC0..
    rows: dict[str, dict[str, str]]
    nic_names: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_0" / "rdmap79s0"
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    row_lines: dict[str, SourceLine] = field(default_factory=dict, compare=False, repr=False)
    header_line: SourceLine | None = field(default=None, compare=False, repr=False)
    source: str = "nvidia-smi topo -m"

    @property
    def gpu_rows(self) -> tuple[str, ...]:
        return tuple(r for r in self.rows if r.startswith("GPU"))

    @property
    def nic_rows(self) -> tuple[str, ...]:
        return tuple(r for r in self.rows if r.startswith("NIC"))


@dataclass(frozen=True)
class NvlinkGpu:
    """`nvidia-smi nvlink -s` for one GPU. links maps link number → speed in GB/s, None if inactive."""

    index: int
    name: str | None
    uuid: str | None
    links: dict[int, float | None]
    all_inactive: bool = False  # "Unable to retrieve NVLink information as all links are inactive"
    unavailable: str | None = None  # why links could not be queried (MIG mode); not a link fault
    # Its header line and the lines that state a fault (<inactive> links, "all links are inactive").
    where: tuple[SourceLine, ...] = field(default=(), compare=False, repr=False)

    @property
    def active_links(self) -> int:
        return sum(1 for v in self.links.values() if v is not None)

    @property
    def inactive_links(self) -> int:
        return sum(1 for v in self.links.values() if v is None)


@dataclass(frozen=True)
class NvlinkReport:
    gpus: tuple[NvlinkGpu, ...] = ()
    # False: nvidia-smi says "Device does not have or support Nvlink"; None: the listing is empty
    # (GPUs without NVLink print nothing, and so does a capture that lost everything).
    supported: bool | None = True
    source: str = "nvidia-smi nvlink -s"


# --------------------------------------------------------------------------- kernel log


class KernelRecord(NamedTuple):
    """One kernel log line. `seq`/`ts_us` come from /dev/kmsg records when present. A NamedTuple,
    not a frozen dataclass: one is made per line read, and a storm is 40,000 lines a second."""

    message: str
    ts_us: int | None = None  # microseconds since boot (kmsg, dmesg) when known
    wallclock: str | None = (
        None  # ISO time when the format carries one (journalctl short-iso, dmesg --time-format iso)
    )
    seq: int | None = None
    priority: int | None = None


class XidEvent(NamedTuple):
    """An NVRM Xid (or SXid) line. pci is normalised. A NamedTuple for the same reason as KernelRecord."""

    code: int
    pci: str | None
    message: str  # the whole line text after "NVRM: "
    sxid: bool = False
    recovery_action: str | None = None  # Xid 154: text in the last parentheses, e.g. "GPU Reset Required"
    seq: int | None = None
    ts_us: int | None = None
    wallclock: str | None = None
    aer: bool = False  # a PCIe AER fatal/unrecovered line on `pci` (code 0), not an NVIDIA Xid
    wrapped: bool = False  # the second line of an Xid 154 wrapped onto two: its action, not a new line
    variant: str = ""  # "fatal" for an NVLink5 (144-150) line the driver marks Fatal or Link Fatal
    subcode: tuple[int, int] | None = None  # NVLink5 (144-150): the line's IntrInfo and ErrorStatus
    cause: int | None = None  # "... caused by previous Xid N": the Xid this one is a consequence of


@dataclass(frozen=True)
class KernelLog:
    """Records of the current boot only (a kmsg ring or a dmesg/journal capture of this boot)."""

    records: tuple[KernelRecord, ...]
    format: str  # "kmsg", "dmesg", "journalctl-short-iso", "syslog", "plain"


@dataclass(frozen=True)
class XidTally:
    """Every line of one (kind, code, device) this boot folded into one: a storm of 400,000 lines is
    one of these. `per_minute` is the rate over the last minute of log time (sliding window)."""

    first: XidEvent
    latest: XidEvent
    count: int
    per_minute: float
    burst: int = 0  # which burst of its device its latest line belongs to (a burst ends after BURST_QUIET_S)


@dataclass(frozen=True)
class KernelXids:
    """This boot's kernel log as the xid check judges it, read incrementally and bounded in size
    whatever the log's length: one tally per distinct (kind, code, device)."""

    tallies: tuple[XidTally, ...]  # in order of first appearance
    records: int  # kernel records read this boot
    format: str  # the most common line format seen ("kmsg", "dmesg", ...)
    lost: int = 0  # records the ring overwrote before we read them (EPIPE on /dev/kmsg)
    untallied: int = 0  # lines of distinct keys past the bound (counted, not kept)
    nvidia_devices: frozenset[str] = frozenset()  # PCI addresses the nvidia driver printed lines about


# --------------------------------------------------------------------------- RDMA (EFA / Mellanox)


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str | None  # "ACTIVE", "DOWN", "INIT", ... (text after "N: " in sysfs)
    phys_state: str | None  # "LinkUp", "Disabled", ...
    rate: str | None  # "100 Gb/sec (4X EDR)"
    link_layer: str | None  # "InfiniBand", "Ethernet", "Unspecified" (EFA)
    counters: dict[str, int] = field(default_factory=dict)  # hw_counters + counters


@dataclass(frozen=True)
class RdmaDevice:
    name: str  # "rdmap79s0", "mlx5_0", "efa_0"
    pci: str | None  # normalised PCI id of the backing function, None if unknown
    vendor: str | None  # "0x1d0f" (Amazon EFA), "0x15b3" (Mellanox)
    driver: str | None  # "efa", "mlx5_core"
    ports: tuple[RdmaPort, ...]

    @property
    def is_efa(self) -> bool:
        return (self.vendor or "").lower() == "0x1d0f" or (self.driver or "") == "efa"


@dataclass(frozen=True)
class RdmaSample:
    """One read of every RDMA device, with the monotonic time it was taken (for counter rates)."""

    devices: tuple[RdmaDevice, ...]
    taken_at: float  # seconds, monotonic or epoch: only differences are used


# --------------------------------------------------------------------------- Kubernetes Node


@dataclass(frozen=True)
class NodeObject:
    """What the checks need from the Node object."""

    name: str
    labels: dict[str, str]
    allocatable_gpus: int | None  # status.allocatable["nvidia.com/gpu"]; None if absent
    capacity_gpus: int | None
    boot_id: str | None = None  # status.nodeInfo.bootID
    annotations: dict[str, str] = field(default_factory=dict)
    taint_keys: tuple[str, ...] = ()  # spec.taints[].key (the validating taint: engine/validation.py)


# --------------------------------------------------------------------------- PCI bus (sysfs)

NVIDIA_VENDOR, AMAZON_VENDOR, MELLANOX_VENDOR = "0x10de", "0x1d0f", "0x15b3"


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as /sys/bus/pci/devices shows it. Link speeds in GT/s. `aer` maps
    "fatal"/"nonfatal"/"correctable" to that file's counters (TOTAL_ERR_* included); absent files
    (no AER capability, old kernel) leave the kind out."""

    address: str  # normalised, as normalize_pci
    vendor: str | None = None  # "0x10de"
    device: str | None = None  # "0x2330"
    pci_class: str | None = None  # "0x030200"
    driver: str | None = None  # "nvidia", "mlx5_core", "efa"; None: unbound (or unknown in a copy)
    upstream: str | None = None  # the bridge above (normalised); None: on a root bus, or unknown
    numa_node: int | None = None
    speed_current: float | None = None
    speed_max: float | None = None
    width_current: int | None = None
    width_max: int | None = None
    virtual_function: bool = False  # an SR-IOV VF (has a physfn link): its link is the PF's
    aer: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def kind(self) -> str | None:
        """ "gpu", "nvswitch", "efa", "connectx" for the devices the agent judges, else None."""
        vendor, cls, dev = self.vendor or "", self.pci_class or "", self.device or ""
        if vendor == NVIDIA_VENDOR and cls.startswith(("0x0300", "0x0302")):
            return "gpu"
        if vendor == NVIDIA_VENDOR and cls.startswith("0x0680"):
            return "nvswitch"
        if vendor == AMAZON_VENDOR and dev.startswith("0xefa"):
            return "efa"  # 0x1d0f is also the ENA Ethernet adapter (0xec20, ...): only 0xefa* is EFA
        if vendor == MELLANOX_VENDOR and cls.startswith("0x02"):
            return "connectx"
        return None

    @property
    def label(self) -> str:
        return f"{self.kind or 'device'} {short_pci(self.address)}"


@dataclass(frozen=True)
class PciSample:
    """Every PCI function on the bus, with the time it was read (for AER counter rates)."""

    devices: tuple[PciDevice, ...]
    taken_at: float

    def by_address(self) -> dict[str, PciDevice]:
        return {d.address: d for d in self.devices}


# --------------------------------------------------------------------------- host CPUs and NUMA


@dataclass(frozen=True)
class HostInfo:
    """/sys/devices/system/{cpu,node} lists, as sorted ids; None: the file was not there."""

    cpus_online: tuple[int, ...] | None = None
    cpus_present: tuple[int, ...] | None = None
    cpus_possible: tuple[int, ...] | None = None
    numa_online: tuple[int, ...] | None = None
    numa_with_cpu: tuple[int, ...] | None = None  # has_cpu: GH200's GPU memory nodes have none


# --------------------------------------------------------------------------- NVLink error counters


@dataclass(frozen=True)
class NvlinkErrorCounts:
    """One GPU's NVLink error counters: link → {"replay", "recovery", "crc_flit", "crc_data"} → count
    (only the counters the driver reports for that link)."""

    index: int
    pci_bus_id: str
    links: dict[int, dict[str, int]]


@dataclass(frozen=True)
class NvlinkErrorSample:
    """One read of every GPU's NVLink error counters, with the time it was taken (for rates)."""

    gpus: tuple[NvlinkErrorCounts, ...]
    taken_at: float

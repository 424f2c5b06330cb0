"""Typed data the probes produce and the checks judge. Every field a tool may omit is Optional:
None means "the tool did not say" (N/A, not supported, not captured), never zero."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    sram_threshold_exceeded: bool | None = None
    # Pre-Ampere (Pascal/Volta) layout: double-bit totals.
    volatile_double_bit_total: int | None = None
    aggregate_double_bit_total: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    """Page retirement (before Ampere). pending = "Pending Page Blacklist"/"Pending Page Retirement"."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class RemappedRows:
    """Row remapping (Ampere and later)."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass(frozen=True)
class ClockEvents:
    """Active clock event (throttle) reasons. None = not reported."""

    hw_slowdown: bool | None = None
    hw_thermal_slowdown: bool | None = None
    hw_power_brake: bool | None = None
    sw_power_cap: bool | None = None
    sw_thermal_slowdown: bool | None = None


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
    # The lines each judged value was read from, by field ("remapped_rows.pending"), for evidence.
    where: dict[str, tuple[SourceLine, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        """How a GPU is named in messages and entities: "GPU 3 (0000:53:00.0)"."""
        return f"GPU {self.index} ({short_pci(self.pci_bus_id)})"


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


@dataclass(frozen=True)
class KernelRecord:
    """One kernel log line. `seq`/`ts_us` come from /dev/kmsg records when present."""

    message: str
    ts_us: int | None = None  # microseconds since boot (kmsg, dmesg) when known
    wallclock: str | None = (
        None  # ISO time when the format carries one (journalctl short-iso, dmesg --time-format iso)
    )
    seq: int | None = None
    priority: int | None = None


@dataclass(frozen=True)
class XidEvent:
    """An NVRM Xid (or SXid) line. pci is normalised; gpu_index is filled when the PCI id maps to a GPU."""

    code: int
    pci: str | None
    message: str  # the whole line text after "NVRM: "
    sxid: bool = False
    recovery_action: str | None = None  # Xid 154: text in the last parentheses, e.g. "GPU Reset Required"
    seq: int | None = None
    ts_us: int | None = None
    wallclock: str | None = None


@dataclass(frozen=True)
class KernelLog:
    """Records of the current boot only (a kmsg ring or a dmesg/journal capture of this boot)."""

    records: tuple[KernelRecord, ...]
    format: str  # "kmsg", "dmesg", "journalctl-short-iso", "syslog", "plain"


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

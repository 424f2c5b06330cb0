"""What the GPU readers (nvidia-smi -q text, -q -x XML, NVML) produce and the GPU checks judge. Every field
a tool may omit is Optional: None means "the tool did not say" (N/A, not supported, not captured), never
zero."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.pci import normalize_pci, short_pci
from agent.core.probed import SourceLine


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
    """Performance state ("P0".."P12"), the power drawn and the power limits in watts; None: not
    reported (N/A)."""

    performance_state: str | None = None
    enforced_limit_w: float | None = None  # the limit in force ("Current"/"Enforced Power Limit")
    default_limit_w: float | None = None
    draw_w: float | None = None  # the board's draw: the 1 s average where the driver gives one


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
        """How a GPU is named in messages and entities: "GPU 3 (0000:86:00.0)"."""
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
class HungGpu:
    """A GPU whose NVML calls did not return within the read's bound (or still have not since an
    earlier read): nothing is known of it now, the other GPUs are read as usual. Its PCI address and
    UUID are those of its last read (None when it never answered)."""

    index: int
    pci_bus_id: str | None
    uuid: str | None
    message: str
    waited_s: float | None = field(default=None, compare=False)  # this read waited that long for it

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({short_pci(self.pci_bus_id)})" if self.pci_bus_id else f"GPU {self.index}"


@dataclass(frozen=True)
class GpuInventory:
    """Everything NVML / nvidia-smi told us about the node's GPUs."""

    source: str  # "nvml", "nvidia-smi -q -x", "nvidia-smi -q"
    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None  # what the tool says is attached (may exceed len(gpus))
    gpus: tuple[Gpu, ...] = ()
    lost: tuple[LostGpu, ...] = ()
    taken_at: float | None = field(default=None, compare=False)  # time.monotonic() of a live read
    hung: tuple[HungGpu, ...] = ()  # GPUs listed whose calls hang (NVML reads each GPU in its own bound)

    @property
    def visible(self) -> int:
        """The GPUs the driver lists: answering, lost or hung."""
        return len(self.gpus) + len(self.lost) + len(self.hung)

    @property
    def silent(self) -> tuple[str, ...]:
        """The normalised PCI addresses of the listed GPUs that do not answer (lost or hung), where known."""
        pcis = [x.pci_bus_id for x in self.lost] + [h.pci_bus_id for h in self.hung]
        return tuple(normalize_pci(p) for p in pcis if p)

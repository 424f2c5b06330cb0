"""Read the GPU inventory live through NVML (pynvml, PyPI nvidia-ml-py), into the same model the
nvidia-smi parsers produce.

The read runs on the NVML session kept open across reads (agent.probes.nvml_session). NVML calls
can block for minutes on a dying GPU, so the whole read runs in a daemon worker thread and the
caller waits at most `timeout_s`. A read that hangs is abandoned (its thread cannot be killed);
while it is still stuck, later reads fail fast with ProbeTimeout instead of piling up more stuck
threads inside the driver."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agent.core.gpu import (
    ClockEvents,
    EccErrors,
    Fabric,
    Gpu,
    GpuClocks,
    GpuInventory,
    GpuThermal,
    LostGpu,
    PcieLink,
    RemappedRows,
    RetiredPages,
)
from agent.core.pci import normalize_pci
from agent.probes.bounded import Bounded
from agent.probes.nvml_session import (
    GPU_IS_LOST,
    RESET_REQUIRED,
    UNKNOWN,
    Opened,
    bounded_read,
    check_session,
)
from agent.probes.nvml_session import code as _code
from agent.probes.nvml_session import describe as _describe
from agent.probes.nvml_session import text as _text
from agent.probes.nvsmi_errors import ToolReportedFailure
from agent.probes.nvsmi_power import nvml_power
from agent.probes.nvsmi_values import (
    fabric_or_none,
    histogram_or_none,
    remapped_rows_or_none,
    retired_pages_or_none,
)

SOURCE = "nvml"

# Clocks event (throttle) reason bits.
_GPU_IDLE = 0x1
_APPLICATIONS_CLOCKS = 0x2
_SYNC_BOOST = 0x10
_DISPLAY_CLOCKS = 0x100
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80

_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}
_AMPERE = 7
_RECOVERY_ACTIONS = {
    0: "None",
    1: "Reset",
    2: "Reboot",
    3: "Drain P2P",
    4: "Drain and Reset",
    5: "Recover IMEX Domain",
    6: "Bus Reset",
    7: "System Reboot",
}
_FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
_FABRIC_COMPLETED = 3

# Memory locations for nvmlDeviceGetMemoryErrorCounter.
_LOC_DRAM = 2
_LOC_SRAM = 7
_SRAM_PARTS = (0, 1, 3, 4, 5, 6)  # L1, L2, register file, texture memory, texture shm, CBU
_CORRECTED, _UNCORRECTED = 0, 1
_VOLATILE, _AGGREGATE = 0, 1

# Temperatures and clocks (nvmlTemperatureSensors_t, nvmlTemperatureThresholds_t, nvmlClockType_t).
_TEMPERATURE_GPU = 0
_THRESHOLD_SLOWDOWN, _THRESHOLD_MEM_MAX = 1, 2
_CLOCK_GRAPHICS, _CLOCK_SM = 0, 1

_WATCHDOG = Bounded()  # parks the workers abandoned after a timeout, still inside NVML


def read_nvml(timeout_s: float) -> GpuInventory:
    """Read every GPU through NVML within timeout_s, on the session kept open (nvml_session).

    Raises ProbeTimeout when NVML does not answer in time, ToolReportedFailure when NVML cannot
    start (driver not loaded, driver/library version mismatch), NvmlUnavailable when the library is
    missing. A GPU that NVML lists but cannot talk to (GPU_IS_LOST, RESET_REQUIRED, UNKNOWN on its
    handle) is a LostGpu; such a read, or one that finds a GPU asking for a reset, retires the
    session so that the next read attaches afresh.
    """
    return bounded_read(_WATCHDOG, SOURCE, _inventory, timeout_s, what="NVML read", thread="nvml-read")


class _Lost(Exception):
    """The GPU stopped answering in the middle of being read."""


def _inventory(opened: Opened) -> GpuInventory:
    nv = opened.nv
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        check_session(exc)
        opened.retire()
        raise ToolReportedFailure(f"NVML: cannot count GPUs ({_describe(exc)})") from None
    gpus: list[Gpu] = []
    lost: list[LostGpu] = []
    for index in range(count):
        got = _read_gpu(opened, index)
        if isinstance(got, LostGpu):
            lost.append(got)
        else:
            gpus.append(got)
    if lost or any(_wants_reset(g) for g in gpus):
        opened.retire()  # attach afresh next time, and hold no handle on a GPU awaiting a reset
    return GpuInventory(
        source=SOURCE,
        driver_version=opened.driver_version,
        cuda_version=_cuda_version(nv),
        attached_gpus=count,
        gpus=tuple(gpus),
        lost=tuple(lost),
    )


def _wants_reset(gpu: Gpu) -> bool:
    return bool(gpu.reset_required or gpu.drain_and_reset_recommended) or gpu.recovery_action not in (
        None,
        "None",
    )


def _optional(nv: ModuleType, fn: Callable[..., Any] | None, *args: Any, basic: bool = False) -> Any:
    """Call an NVML getter: its value, or None when not supported / not readable.

    GPU_IS_LOST and RESET_REQUIRED always mean the GPU is gone (raise _Lost); UNKNOWN does too on
    the basic identity queries, where nvidia-smi reports the same GPU as lost.
    """
    if fn is None:
        return None
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        check_session(exc)
        code = _code(exc)
        if code in (GPU_IS_LOST, RESET_REQUIRED) or (basic and code == UNKNOWN):
            raise _Lost(f"{getattr(fn, '__name__', 'NVML call')}: {_describe(exc)}") from None
        return None


def _cuda_version(nv: ModuleType) -> str | None:
    raw = _optional(nv, getattr(nv, "nvmlSystemGetCudaDriverVersion", None))
    if not isinstance(raw, int) or raw <= 0:
        return None
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _read_gpu(opened: Opened, index: int) -> Gpu | LostGpu:
    nv = opened.nv
    try:
        handle = opened.handle(index)
    except nv.NVMLError as exc:
        check_session(exc)
        return LostGpu(pci_bus_id=None, message=f"GPU {index}: nvmlDeviceGetHandleByIndex: {_describe(exc)}")
    pci: str | None = None
    try:
        info = _optional(nv, nv.nvmlDeviceGetPciInfo, handle, basic=True)
        bus = _text(getattr(info, "busId", None)) if info is not None else None
        pci = normalize_pci(bus) if bus else None
        name = _text(_optional(nv, nv.nvmlDeviceGetName, handle, basic=True))
        uuid = _text(_optional(nv, nv.nvmlDeviceGetUUID, handle, basic=True))
        if pci is None:
            raise _Lost("nvmlDeviceGetPciInfo: no PCI bus id")
        return _gpu_details(nv, handle, index, pci, name, uuid)
    except _Lost as lost:
        return LostGpu(pci_bus_id=pci, message=f"GPU {index}: {lost}")


def _gpu_details(nv: ModuleType, h: object, index: int, pci: str, name: str | None, uuid: str | None) -> Gpu:
    def call(fn_name: str, *args: Any) -> Any:
        return _optional(nv, getattr(nv, fn_name, None), h, *args)

    arch_code = call("nvmlDeviceGetArchitecture")
    mig = call("nvmlDeviceGetMigMode")
    persistence = call("nvmlDeviceGetPersistenceMode")
    recovery, reset_required, drain, memory_temp = _field_values(nv, h)
    return Gpu(
        index=index,
        pci_bus_id=pci,
        name=name,
        uuid=uuid,
        serial=_text(call("nvmlDeviceGetSerial")),
        architecture=_ARCHITECTURES.get(arch_code) if isinstance(arch_code, int) else None,
        persistence_mode=persistence == 1 if isinstance(persistence, int) else None,
        mig_mode=_first(mig) == 1 if _first(mig) is not None else None,
        ecc=_ecc(call, arch_code),
        retired_pages=_retired_pages(call),
        remapped_rows=_remapped_rows(call),
        clock_events=_clock_events(nv, h),
        pcie=PcieLink(
            gen_current=call("nvmlDeviceGetCurrPcieLinkGeneration"),
            gen_max=call("nvmlDeviceGetMaxPcieLinkGeneration"),
            width_current=call("nvmlDeviceGetCurrPcieLinkWidth"),
            width_max=call("nvmlDeviceGetMaxPcieLinkWidth"),
            replay_counter=call("nvmlDeviceGetPcieReplayCounter"),
        ),
        recovery_action=recovery,
        reset_required=reset_required,
        drain_and_reset_recommended=drain,
        fabric=_fabric(nv, h),
        power=nvml_power(call),
        thermal=GpuThermal(
            gpu_c=_int(call("nvmlDeviceGetTemperature", _TEMPERATURE_GPU)),
            gpu_slowdown_c=_int(call("nvmlDeviceGetTemperatureThreshold", _THRESHOLD_SLOWDOWN)),
            memory_c=memory_temp,
            memory_max_c=_int(call("nvmlDeviceGetTemperatureThreshold", _THRESHOLD_MEM_MAX)),
        ),
        clocks=_clocks(call),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _clocks(call: Callable[..., Any]) -> GpuClocks:
    app = _int(call("nvmlDeviceGetApplicationsClock", _CLOCK_GRAPHICS))
    util = call("nvmlDeviceGetUtilizationRates")
    busy = getattr(util, "gpu", None)
    return GpuClocks(
        sm_mhz=_int(call("nvmlDeviceGetClockInfo", _CLOCK_SM)),
        applications_mhz=app
        if app is not None
        else _int(call("nvmlDeviceGetDefaultApplicationsClock", _CLOCK_GRAPHICS)),
        max_sm_mhz=_int(call("nvmlDeviceGetMaxClockInfo", _CLOCK_SM)),
        utilization_percent=busy if isinstance(busy, int) and 0 <= busy <= 100 else None,
    )


def _first(pair: Any) -> int | None:
    """First element of an NVML (current, pending) pair."""
    try:
        value = pair[0]
    except (TypeError, IndexError, KeyError):
        return None
    return value if isinstance(value, int) else None


def _ecc(call: Callable[..., Any], arch_code: Any) -> EccErrors:
    mode = _first(call("nvmlDeviceGetEccMode"))

    def location(err: int, counter: int, loc: int) -> int | None:
        value = call("nvmlDeviceGetMemoryErrorCounter", err, counter, loc)
        return value if isinstance(value, int) else None

    def sram(counter: int, err: int = _UNCORRECTED) -> int | None:
        whole = location(err, counter, _LOC_SRAM)
        if whole is not None:
            return whole
        parts = [location(err, counter, loc) for loc in _SRAM_PARTS]
        present = [p for p in parts if p is not None]
        return sum(present) if present else None

    def total(counter: int, err: int = _UNCORRECTED) -> int | None:
        value = call("nvmlDeviceGetTotalEccErrors", err, counter)
        return value if isinstance(value, int) else None

    if isinstance(arch_code, int) and arch_code < _AMPERE:
        # Pascal/Volta/Turing: nvidia-smi shows double-bit totals, not DRAM/SRAM counters.
        return EccErrors(
            mode_enabled=mode == 1 if mode is not None else None,
            volatile_double_bit_total=total(_VOLATILE),
            aggregate_double_bit_total=total(_AGGREGATE),
            volatile_single_bit_total=total(_VOLATILE, _CORRECTED),
        )
    vol_dram = location(_UNCORRECTED, _VOLATILE, _LOC_DRAM)
    agg_dram = location(_UNCORRECTED, _AGGREGATE, _LOC_DRAM)
    no_locations = vol_dram is None and agg_dram is None
    return EccErrors(
        mode_enabled=mode == 1 if mode is not None else None,
        volatile_dram_uncorrectable=vol_dram,
        volatile_sram_uncorrectable=sram(_VOLATILE),
        aggregate_dram_uncorrectable=agg_dram,
        aggregate_sram_uncorrectable=sram(_AGGREGATE),
        volatile_dram_correctable=location(_CORRECTED, _VOLATILE, _LOC_DRAM),
        aggregate_dram_correctable=location(_CORRECTED, _AGGREGATE, _LOC_DRAM),
        volatile_sram_correctable=sram(_VOLATILE, _CORRECTED),
        aggregate_sram_correctable=sram(_AGGREGATE, _CORRECTED),
        volatile_double_bit_total=total(_VOLATILE) if no_locations else None,
        aggregate_double_bit_total=total(_AGGREGATE) if no_locations else None,
        volatile_single_bit_total=total(_VOLATILE, _CORRECTED) if no_locations else None,
    )


def _retired_pages(call: Callable[..., Any]) -> RetiredPages | None:
    single = call("nvmlDeviceGetRetiredPages", 0)
    double = call("nvmlDeviceGetRetiredPages", 1)
    pending = call("nvmlDeviceGetRetiredPagesPendingStatus")
    return retired_pages_or_none(
        len(single) if isinstance(single, list | tuple) else None,
        len(double) if isinstance(double, list | tuple) else None,
        pending == 1 if isinstance(pending, int) else None,
    )


def _remapped_rows(call: Callable[..., Any]) -> RemappedRows | None:
    rows = call("nvmlDeviceGetRemappedRows")
    if not isinstance(rows, list | tuple) or len(rows) < 4:
        return None
    corr, unc, pending, failure = rows[:4]
    hist = call("nvmlDeviceGetRowRemapperHistogram")

    def bucket(name: str) -> int | None:
        value = getattr(hist, name, None) if hist is not None else None
        return value if isinstance(value, int) else None

    return remapped_rows_or_none(
        int(corr),
        int(unc),
        bool(pending),
        bool(failure),
        histogram_or_none(bucket("max"), bucket("high"), bucket("partial"), bucket("low"), bucket("none")),
    )


def _clock_events(nv: ModuleType, h: object) -> ClockEvents:
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = _optional(nv, fn, h)
    if not isinstance(mask, int):
        return ClockEvents()
    return ClockEvents(
        hw_slowdown=bool(mask & _HW_SLOWDOWN),
        hw_thermal_slowdown=bool(mask & _HW_THERMAL),
        hw_power_brake=bool(mask & _HW_POWER_BRAKE),
        sw_power_cap=bool(mask & _SW_POWER_CAP),
        sw_thermal_slowdown=bool(mask & _SW_THERMAL),
        idle=bool(mask & _GPU_IDLE),
        applications_clocks_setting=bool(mask & _APPLICATIONS_CLOCKS),
        sync_boost=bool(mask & _SYNC_BOOST),
        display_clock_setting=bool(mask & _DISPLAY_CLOCKS),
    )


def _field_values(nv: ModuleType, h: object) -> tuple[str | None, bool | None, bool | None, int | None]:
    """Recovery action (field 230), the older reset / drain-and-reset status fields (226, 227) and
    the memory (HBM) temperature (field 82), in one call."""
    wanted = [
        ("recovery", getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)),
        ("reset", getattr(nv, "NVML_FI_DEV_RESET_STATUS", None)),
        ("drain", getattr(nv, "NVML_FI_DEV_DRAIN_AND_RESET_STATUS", None)),
        ("memory_temp", getattr(nv, "NVML_FI_DEV_MEMORY_TEMP", None)),
    ]
    ids = [(key, fid) for key, fid in wanted if isinstance(fid, int)]
    if not ids:
        return None, None, None, None
    values = _optional(nv, getattr(nv, "nvmlDeviceGetFieldValues", None), h, [fid for _, fid in ids])
    got: dict[str, int] = {}
    if values is not None:
        for (key, _), value in zip(ids, values, strict=False):
            if getattr(value, "nvmlReturn", 1) == 0:
                raw = getattr(getattr(value, "value", None), "uiVal", None)
                if isinstance(raw, int):
                    got[key] = raw
    recovery = got.get("recovery")
    return (
        _RECOVERY_ACTIONS.get(recovery, f"Unknown ({recovery})") if recovery is not None else None,
        bool(got["reset"]) if "reset" in got else None,
        bool(got["drain"]) if "drain" in got else None,
        _int(got.get("memory_temp")),
    )


def _fabric(nv: ModuleType, h: object) -> Fabric | None:
    """NVSwitch fabric registration; None where the GPU has no fabric (NOT_SUPPORTED)."""
    for struct_name, fn_name in (
        ("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV"),
        ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"),
    ):
        struct, fn = getattr(nv, struct_name, None), getattr(nv, fn_name, None)
        if struct is None or fn is None:
            continue
        info = struct()
        if _optional(nv, fn, h, ctypes.byref(info)) is None:
            return None
        state = int(getattr(info, "state", 0))
        if state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return None
        status_code = int(getattr(info, "status", -1))
        status: str | None = None
        if state == _FABRIC_COMPLETED:
            status = "Success" if status_code == 0 else _status_text(nv, status_code)
        return fabric_or_none(_FABRIC_STATES.get(state, f"Unknown ({state})"), status)
    return None


def _status_text(nv: ModuleType, code: int) -> str:
    try:
        return _describe(nv.NVMLError(code))
    except Exception:
        return f"NVML error {code}"

"""Live NVML probe (probes/nvml.py), tested against a fake `pynvml` module put in sys.modules (there
is no GPU here).

The fake has the real call surface (names and argument counts are checked against the installed
nvidia-ml-py) and the real error classes' shape: NVMLError with `.value`, NVMLError_<Name> subclasses.
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

from agent.core.gpu import (
    ClockEvents,
    EccErrors,
    Fabric,
    GpuClocks,
    GpuInventory,
    GpuThermal,
    LostGpu,
    PcieLink,
    RemapHistogram,
    RemappedRows,
    RetiredPages,
)
from agent.probes import nvml
from agent.probes.nvml import read_nvml
from agent.probes.nvsmi_errors import NvmlUnavailable, ProbeTimeout, ToolReportedFailure

# ----------------------------------------------------------------------------- the fake pynvml

_ERROR_NAMES = {
    1: ("Uninitialized", "Uninitialized"),
    3: ("NotSupported", "Not Supported"),
    9: ("DriverNotLoaded", "Driver Not Loaded"),
    12: ("LibraryNotFound", "NVML Shared Library Not Found"),
    15: ("GpuIsLost", "GPU is lost"),
    16: ("ResetRequired", "GPU requires reset"),
    18: ("LibRmVersionMismatch", "RM has detected an NVML/RM version mismatch."),
    999: ("Unknown", "Unknown Error"),
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, ("", f"NVML Error with code {self.value}"))[1]


ERR: dict[str, type[NVMLError]] = {
    name: type(f"NVMLError_{name}", (NVMLError,), {}) for name, _ in _ERROR_NAMES.values()
}


def err(name: str) -> NVMLError:
    code = next(c for c, (n, _) in _ERROR_NAMES.items() if n == name)
    return ERR[name](code)


class FabricInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("status", ctypes.c_uint), ("state", ctypes.c_uint)]


class Field(types.SimpleNamespace):
    pass


Spec = dict[str, Any]  # function name → value, or an NVMLError instance to raise; absent → NotSupported


def healthy_h100() -> Spec:
    return {
        "nvmlDeviceGetPciInfo": types.SimpleNamespace(busId="00000000:53:00.0"),
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": "GPU-566e6f65-c38e-b12f-4824-6944218668b9",
        "nvmlDeviceGetSerial": "1655022005478",
        "nvmlDeviceGetArchitecture": 9,
        "nvmlDeviceGetPersistenceMode": 1,
        "nvmlDeviceGetMigMode": [0, 0],
        "nvmlDeviceGetEccMode": [1, 1],
        # (error type, counter type, location) → count; location 2 = DRAM, 7 = SRAM
        "nvmlDeviceGetMemoryErrorCounter": {
            (1, 0, 2): 0,
            (1, 1, 2): 0,
            (0, 0, 2): 5,
            (0, 1, 2): 7,
            (1, 0, 7): 0,
            (1, 1, 7): 2,
        },
        "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetCurrentClocksEventReasons": 0x1 | 0x4 | 0x20,  # idle + SW power cap + SW thermal
        "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16,
        "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetPcieReplayCounter": 3,
        "fields": {230: 0, 226: 0, 227: 0},
        "fabric": (3, 0),  # state COMPLETED, status SUCCESS
    }


class FakeNvml:
    """State behind the fake module: one Spec per GPU, plus init/count behaviour and call records."""

    def __init__(self, gpus: list[Spec | NVMLError]) -> None:
        self.gpus = gpus
        self.init_error: NVMLError | None = None
        self.count_error: NVMLError | None = None
        self.block: threading.Event | None = None  # nvmlDeviceGetCount waits on it
        self.shutdowns = 0
        self.inits = 0

    def module(self) -> types.ModuleType:
        fake = types.ModuleType("pynvml")
        mod: Any = fake
        mod.NVMLError = NVMLError
        for name, cls in ERR.items():
            setattr(fake, f"NVMLError_{name}", cls)
        mod.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
        mod.NVML_FI_DEV_RESET_STATUS = 226
        mod.NVML_FI_DEV_DRAIN_AND_RESET_STATUS = 227
        mod.NVML_FI_DEV_MEMORY_TEMP = 82
        mod.c_nvmlGpuFabricInfoV_t = FabricInfo
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(fake, name, getattr(self, name))
        return fake

    # -- library
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        if self.block is not None:
            self.block.wait()
        if self.count_error is not None:
            raise self.count_error
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        spec = self.gpus[index]
        if isinstance(spec, NVMLError):
            raise spec
        return index

    # -- per device
    def _get(self, handle: int, name: str) -> Any:
        spec = self.gpus[handle]
        assert isinstance(spec, dict)
        value = spec.get(name, err("NotSupported"))
        if isinstance(value, NVMLError):
            raise value
        return value

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetPciInfo")

    def nvmlDeviceGetName(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetName")

    def nvmlDeviceGetUUID(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetUUID")

    def nvmlDeviceGetSerial(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetSerial")

    def nvmlDeviceGetArchitecture(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetArchitecture")

    def nvmlDeviceGetPersistenceMode(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetPersistenceMode")

    def nvmlDeviceGetMigMode(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetMigMode")

    def nvmlDeviceGetEccMode(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetEccMode")

    def nvmlDeviceGetMemoryErrorCounter(
        self, h: int, error_type: int, counter_type: int, location: int
    ) -> Any:
        table = self._get(h, "nvmlDeviceGetMemoryErrorCounter")
        if (error_type, counter_type, location) not in table:
            raise err("NotSupported")
        return table[(error_type, counter_type, location)]

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> Any:
        table = self._get(h, "nvmlDeviceGetTotalEccErrors")
        if (error_type, counter_type) not in table:
            raise err("NotSupported")
        return table[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> Any:
        return self._get(h, "nvmlDeviceGetRetiredPages")[cause]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetRetiredPagesPendingStatus")

    def nvmlDeviceGetRemappedRows(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetRemappedRows")

    def nvmlDeviceGetRowRemapperHistogram(self, device: int) -> Any:
        return self._get(device, "nvmlDeviceGetRowRemapperHistogram")

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> Any:
        return self._get(handle, "nvmlDeviceGetTemperature")[sensor]

    def nvmlDeviceGetTemperatureThreshold(self, handle: int, threshold: int) -> Any:
        return self._get(handle, "nvmlDeviceGetTemperatureThreshold")[threshold]

    def nvmlDeviceGetClockInfo(self, handle: int, type: int) -> Any:
        return self._get(handle, "nvmlDeviceGetClockInfo")[type]

    def nvmlDeviceGetApplicationsClock(self, handle: int, type: int) -> Any:
        return self._get(handle, "nvmlDeviceGetApplicationsClock")[type]

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: int, type: int) -> Any:
        return self._get(handle, "nvmlDeviceGetDefaultApplicationsClock")[type]

    def nvmlDeviceGetMaxClockInfo(self, handle: int, type: int) -> Any:
        return self._get(handle, "nvmlDeviceGetMaxClockInfo")[type]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return self._get(handle, "nvmlDeviceGetUtilizationRates")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetCurrentClocksEventReasons")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetCurrPcieLinkGeneration")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetMaxPcieLinkGeneration")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetCurrPcieLinkWidth")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetMaxPcieLinkWidth")

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> Any:
        return self._get(h, "nvmlDeviceGetPcieReplayCounter")

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[int]) -> Any:
        table = self._get(h, "fields")
        return [
            Field(fieldId=f, nvmlReturn=0, value=types.SimpleNamespace(uiVal=table[f]))
            if f in table
            else Field(fieldId=f, nvmlReturn=3, value=types.SimpleNamespace(uiVal=0))
            for f in field_ids
        ]

    def nvmlDeviceGetGpuFabricInfoV(self, h: int, ref: Any) -> int:
        state, status = self._get(h, "fabric")
        info = ref._obj  # what ctypes.byref() points at
        info.state, info.status = state, status
        return 0


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Put a FakeNvml behind `import pynvml`; release and reap any worker left blocked by a test."""
    fakes: list[FakeNvml] = []

    def put(fake: FakeNvml) -> FakeNvml:
        monkeypatch.setitem(sys.modules, "pynvml", fake.module())
        fakes.append(fake)
        return fake

    yield put
    for fake in fakes:
        if fake.block is not None:
            fake.block.set()
    for worker in nvml._WATCHDOG.parked(nvml.SOURCE):
        worker.join(timeout=10)


# ----------------------------------------------------------------------------- tests


def test_fake_matches_the_real_pynvml_call_surface() -> None:
    """Every NVML function the fake offers exists in the installed nvidia-ml-py with the same arity."""
    import pynvml as real

    fake = FakeNvml([])
    for name in dir(fake):
        if not name.startswith("nvml"):
            continue
        real_fn = getattr(real, name)
        fake_params = list(inspect.signature(getattr(fake, name)).parameters)
        assert len(inspect.signature(real_fn).parameters) == len(fake_params), name
    for name in ("NVMLError_GpuIsLost", "NVMLError_NotSupported", "NVMLError_DriverNotLoaded"):
        assert issubclass(getattr(real, name), real.NVMLError)
    assert real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230
    assert real.NVML_MEMORY_LOCATION_DEVICE_MEMORY == 2 and real.NVML_MEMORY_LOCATION_SRAM == 7
    assert real.NVML_ERROR_GPU_IS_LOST == 15 and real.NVML_GPU_FABRIC_STATE_COMPLETED == 3
    assert {f[0] for f in real.c_nvmlGpuFabricInfoV_t._fields_} >= {"state", "status"}


def test_two_gpus_one_healthy_one_lost(install: Any) -> None:
    lost_spec = healthy_h100()
    lost_spec["nvmlDeviceGetPciInfo"] = types.SimpleNamespace(busId="00000000:64:00.0")
    lost_spec["nvmlDeviceGetName"] = err("GpuIsLost")
    fake = install(FakeNvml([healthy_h100(), lost_spec]))

    inv = read_nvml(timeout_s=10)

    assert isinstance(inv, GpuInventory)
    assert inv.source == "nvml"
    assert inv.driver_version == "550.90.07"
    assert inv.cuda_version == "12.4"
    assert inv.attached_gpus == 2
    assert len(inv.gpus) == 1
    gpu = inv.gpus[0]
    assert gpu.index == 0
    assert gpu.pci_bus_id == "00000000:53:00.0"
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-566e6f65-c38e-b12f-4824-6944218668b9"
    assert gpu.serial == "1655022005478"
    assert gpu.architecture == "Hopper"
    assert gpu.persistence_mode is True
    assert gpu.mig_mode is False
    assert gpu.ecc == EccErrors(
        mode_enabled=True,
        volatile_dram_uncorrectable=0,
        volatile_sram_uncorrectable=0,
        aggregate_dram_uncorrectable=0,
        aggregate_sram_uncorrectable=2,
        volatile_dram_correctable=5,
        aggregate_dram_correctable=7,
    )
    assert gpu.retired_pages is None  # NotSupported on Hopper
    assert gpu.remapped_rows == RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)
    assert gpu.clock_events == ClockEvents(
        hw_slowdown=False,
        hw_thermal_slowdown=False,
        hw_power_brake=False,
        sw_power_cap=True,
        sw_thermal_slowdown=True,
        idle=True,
        applications_clocks_setting=False,
        sync_boost=False,
        display_clock_setting=False,
    )
    assert gpu.pcie == PcieLink(gen_current=5, gen_max=5, width_current=16, width_max=16, replay_counter=3)
    assert gpu.recovery_action == "None"
    assert gpu.reset_required is False and gpu.drain_and_reset_recommended is False
    assert gpu.fabric == Fabric(state="Completed", status="Success")

    assert inv.lost == (
        LostGpu(pci_bus_id="00000000:64:00.0", message="GPU 1: nvmlDeviceGetName: GPU is lost"),
    )
    assert fake.inits == 1 and fake.shutdowns == 1


def test_handle_lookup_failure_is_a_lost_gpu_without_pci(install: Any) -> None:
    install(FakeNvml([healthy_h100(), err("Unknown")]))
    inv = read_nvml(timeout_s=10)
    assert [g.index for g in inv.gpus] == [0]
    assert inv.lost == (LostGpu(pci_bus_id=None, message="GPU 1: nvmlDeviceGetHandleByIndex: Unknown Error"),)


def test_reset_required_in_the_middle_of_a_read_is_lost(install: Any) -> None:
    spec = healthy_h100()
    spec["nvmlDeviceGetCurrentClocksEventReasons"] = err("ResetRequired")
    install(FakeNvml([spec]))
    inv = read_nvml(timeout_s=10)
    assert inv.gpus == ()
    assert inv.lost[0].pci_bus_id == "00000000:53:00.0"
    assert "GPU requires reset" in inv.lost[0].message


def test_unknown_error_on_a_secondary_field_is_just_unread(install: Any) -> None:
    spec = healthy_h100()
    spec["nvmlDeviceGetPcieReplayCounter"] = err("Unknown")
    install(FakeNvml([spec]))
    gpu = read_nvml(timeout_s=10).gpus[0]
    assert gpu.pcie.replay_counter is None and gpu.pcie.width_current == 16


def test_sram_summed_over_locations_when_no_sram_location(install: Any) -> None:
    spec = healthy_h100()
    spec["nvmlDeviceGetArchitecture"] = 7  # Ampere
    spec["nvmlDeviceGetMemoryErrorCounter"] = {(1, 0, 2): 1, (1, 0, 0): 2, (1, 0, 1): 3, (1, 1, 2): 4}
    install(FakeNvml([spec]))
    ecc = read_nvml(timeout_s=10).gpus[0].ecc
    assert ecc.volatile_dram_uncorrectable == 1
    assert ecc.volatile_sram_uncorrectable == 5  # L1 2 + L2 3
    assert ecc.aggregate_dram_uncorrectable == 4
    assert ecc.aggregate_sram_uncorrectable is None  # no location answered
    assert ecc.volatile_dram_correctable is None


def test_volta_double_bit_totals_and_retired_pages(install: Any) -> None:
    spec = healthy_h100()
    spec["nvmlDeviceGetArchitecture"] = 5  # Volta
    spec["nvmlDeviceGetTotalEccErrors"] = {(1, 0): 1, (1, 1): 9, (0, 0): 4}
    spec["nvmlDeviceGetRetiredPages"] = {0: [0x1000, 0x2000], 1: [0x3000]}
    spec["nvmlDeviceGetRetiredPagesPendingStatus"] = 1
    del spec["nvmlDeviceGetRemappedRows"]
    del spec["fabric"]
    install(FakeNvml([spec]))
    gpu = read_nvml(timeout_s=10).gpus[0]
    assert gpu.architecture == "Volta"
    assert gpu.ecc.volatile_double_bit_total == 1 and gpu.ecc.aggregate_double_bit_total == 9
    assert gpu.ecc.volatile_single_bit_total == 4 and gpu.ecc.volatile_correctable == 4
    assert gpu.ecc.volatile_dram_uncorrectable is None
    assert gpu.retired_pages == RetiredPages(single_bit=2, double_bit=1, pending=True)
    assert gpu.remapped_rows is None
    assert gpu.fabric is None


def test_recovery_action_and_fabric_in_progress(install: Any) -> None:
    spec = healthy_h100()
    spec["fields"] = {230: 4}  # DRAIN_AND_RESET; 226/227 not answered
    spec["fabric"] = (2, 0)  # IN_PROGRESS
    spec["nvmlDeviceGetRemappedRows"] = (0, 1, 1, 0)
    install(FakeNvml([spec]))
    gpu = read_nvml(timeout_s=10).gpus[0]
    assert gpu.recovery_action == "Drain and Reset"
    assert gpu.reset_required is None and gpu.drain_and_reset_recommended is None
    assert gpu.fabric == Fabric(state="In Progress", status=None)
    assert gpu.remapped_rows == RemappedRows(correctable=0, uncorrectable=1, pending=True, failure=False)


def test_hw_slowdown_bits(install: Any) -> None:
    spec = healthy_h100()
    spec["nvmlDeviceGetCurrentClocksEventReasons"] = 0x8 | 0x40 | 0x80
    install(FakeNvml([spec]))
    assert read_nvml(timeout_s=10).gpus[0].clock_events == ClockEvents(
        True, True, True, False, False, False, False, False, False
    )


def test_remap_histogram_temperatures_and_clocks(install: Any) -> None:
    """What the trend warnings read: the bank remap histogram, SRAM correctable errors, GPU and
    memory temperatures with their thresholds, the SM and application clocks and utilization."""
    spec = healthy_h100()
    spec["nvmlDeviceGetRowRemapperHistogram"] = types.SimpleNamespace(
        max=2558, high=0, partial=0, low=1, none=1
    )
    spec["nvmlDeviceGetMemoryErrorCounter"] = {(0, 0, 2): 5, (0, 0, 7): 11}
    spec["nvmlDeviceGetTemperature"] = {0: 84}
    spec["nvmlDeviceGetTemperatureThreshold"] = {1: 87, 2: 95}
    spec["fields"] = {230: 0, 82: 61}
    spec["nvmlDeviceGetClockInfo"] = {1: 1200}
    spec["nvmlDeviceGetApplicationsClock"] = {0: 1980}
    spec["nvmlDeviceGetMaxClockInfo"] = {1: 1980}
    spec["nvmlDeviceGetUtilizationRates"] = types.SimpleNamespace(gpu=97, memory=40)
    install(FakeNvml([spec]))
    gpu = read_nvml(timeout_s=10).gpus[0]
    assert gpu.remapped_rows is not None and gpu.remapped_rows.histogram == RemapHistogram(2558, 0, 0, 1, 1)
    assert gpu.ecc.volatile_sram_correctable == 11 and gpu.ecc.volatile_correctable == 16
    assert gpu.thermal == GpuThermal(gpu_c=84, gpu_slowdown_c=87, memory_c=61, memory_max_c=95)
    assert gpu.thermal.gpu_margin_c == 3 and gpu.thermal.memory_margin_c == 34
    assert gpu.clocks == GpuClocks(
        sm_mhz=1200, applications_mhz=1980, max_sm_mhz=1980, utilization_percent=97
    )


def test_no_histogram_temperatures_or_clocks_when_unsupported(install: Any) -> None:
    install(FakeNvml([healthy_h100()]))
    gpu = read_nvml(timeout_s=10).gpus[0]
    assert gpu.remapped_rows is not None and gpu.remapped_rows.histogram is None
    assert gpu.thermal == GpuThermal() and gpu.clocks == GpuClocks()


def test_hung_nvml_is_a_timeout_and_later_reads_do_not_pile_up(install: Any) -> None:
    fake = install(FakeNvml([healthy_h100()]))
    fake.block = threading.Event()
    with pytest.raises(ProbeTimeout, match="did not answer"):
        read_nvml(timeout_s=0.2)
    with pytest.raises(ProbeTimeout, match="still hung"):
        read_nvml(timeout_s=0.2)
    # Once the driver answers again, reads work again.
    fake.block.set()
    for worker in nvml._WATCHDOG.parked(nvml.SOURCE):
        worker.join(timeout=10)
    fake.block = None
    assert len(read_nvml(timeout_s=10).gpus) == 1
    # The hung read's session was dropped (never shut down under the stuck call); the released read
    # shut it down on its way out, and the new read runs on a session of its own, kept open.
    assert fake.inits == 2 and fake.shutdowns == 1


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("DriverNotLoaded", "driver is not loaded"),
        ("LibRmVersionMismatch", "version mismatch"),
        ("Uninitialized", "not initialised"),
        ("Unknown", "initialisation failed"),
    ],
)
def test_init_failures_are_tool_failures(install: Any, error: str, words: str) -> None:
    fake = FakeNvml([healthy_h100()])
    fake.init_error = err(error)
    install(fake)
    with pytest.raises(ToolReportedFailure, match=words):
        read_nvml(timeout_s=10)
    assert fake.shutdowns == 0  # never initialised, never shut down


def test_missing_library_is_unavailable_not_a_driver_fault(install: Any) -> None:
    fake = FakeNvml([])
    fake.init_error = err("LibraryNotFound")
    install(fake)
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so"):
        read_nvml(timeout_s=10)


def test_missing_pynvml_module_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match="pynvml"):
        read_nvml(timeout_s=10)


def test_device_count_failure_is_a_tool_failure_and_shuts_down(install: Any) -> None:
    fake = FakeNvml([])
    fake.count_error = err("Unknown")
    install(fake)
    with pytest.raises(ToolReportedFailure, match="cannot count GPUs"):
        read_nvml(timeout_s=10)
    assert fake.shutdowns == 1


def test_nvml_reads_feed_the_trend_warnings(install: Any) -> None:
    """Live through NVML (no lines to point at): the histogram's Low and None banks warn, and the
    evidence states the values read."""
    from agent.checks.registry import RULE_BOOK
    from agent.checks.trends import check_memory
    from agent.config import parse_config
    from agent.core import trend_history
    from agent.core.facts import NodeFacts
    from agent.probes.source import with_read

    spec = healthy_h100()
    spec["nvmlDeviceGetRowRemapperHistogram"] = types.SimpleNamespace(
        max=2558, high=0, partial=0, low=1, none=1
    )
    install(FakeNvml([spec]))
    facts = with_read(
        NodeFacts(gpus=read_nvml(timeout_s=10), boot_id="b"), trend_history.TrendHistory(), 1e9, 900, 12, 80
    )
    (f,) = check_memory(facts, parse_config({}, rules=RULE_BOOK)).findings
    assert f.rule == "trend.memory.remap-headroom" and "1 DRAM bank(s) at Low and 1 at None" in f.message
    assert [(e.source, e.line, e.text) for e in f.evidence] == [
        ("nvml", None, "bank remap histogram: max 2558, high 0, partial 0, low 1, none 1")
    ]

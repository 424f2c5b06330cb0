"""How NVML reads a GPU field: the NVML column of the field table (agent.probes.gpu_fields).

Each entry is a function of a `Device`, the GPU's getters during one read. A getter is called at
most once per read however many fields come from it (the remapped-rows tuple, the clock event mask,
one field-values call for every `field()` of the table), so the table costs the calls the reader
made before it. The getters' failures are mapped in agent.probes.nvml_session (`optional`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agent.probes.nvml_session import status_text

Read = Callable[["Device"], Any]

# nvmlDeviceGetMemoryErrorCounter's arguments: error type, counter type, memory location.
CORRECTED, UNCORRECTED = 0, 1
VOLATILE, AGGREGATE = 0, 1
DRAM, SRAM = 2, 7
_SRAM_PARTS = (0, 1, 3, 4, 5, 6)  # L1, L2, register file, texture memory, texture shm, CBU
_AMPERE = 7  # nvmlDeviceArchitecture_t: before it, nvidia-smi shows double-bit totals, not locations
_ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere"}
_ARCHITECTURES |= {8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}
_RECOVERY_ACTIONS = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset"}
_RECOVERY_ACTIONS |= {5: "Recover IMEX Domain", 6: "Bus Reset", 7: "System Reboot"}
_FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
_FABRIC_COMPLETED = 3
_CLOCK_REASONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_FIELD_IDS: list[str] = []  # every field() of the table, read in one nvmlDeviceGetFieldValues call


class Device:
    """One GPU's getters during one read. `call(fn_name, *args, basic=...)` runs a getter on the
    GPU's handle: its value, or None where NVML does not answer (nvml_session.optional); `nv` is
    pynvml (None: only plain getters, as in a unit test of one column)."""

    def __init__(self, call: Callable[..., Any], nv: ModuleType | None = None) -> None:
        self._call = call
        self.nv = nv
        self._memo: dict[Any, Any] = {}

    def get(self, fn: str, *args: Any, basic: bool = False) -> Any:
        key = (fn, args)
        if key not in self._memo:
            self._memo[key] = self._call(fn, *args, basic=basic)
        return self._memo[key]

    def raw(self, fn: str, *args: Any) -> Any:
        """A getter called as it is, for the callers that keep its answer themselves (`once`)."""
        return self._call(fn, *args, basic=False)

    def first(self, fns: tuple[str, ...]) -> Any:
        """The first of these getters that pynvml has (a renamed call: new name first)."""
        have = [fn for fn in fns if self.nv is None or hasattr(self.nv, fn)]
        return self.get(have[0]) if have else None

    def once(self, key: str, compute: Callable[[Device], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = compute(self)
        return self._memo[key]


def same(value: Any) -> Any:
    return value


def get(fn: str, *args: Any, then: Callable[[Any], Any] = same, basic: bool = False) -> Read:
    """A getter's answer, converted; `basic`: an identity query (UNKNOWN there means the GPU is lost)."""
    return lambda d: then(d.get(fn, *args, basic=basic))


def positive(value: Any) -> int | None:
    """Temperatures and clocks: NVML's 0 means "not read"."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def counter(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def is_one(value: Any) -> bool | None:
    return value == 1 if isinstance(value, int) else None


def current_is_one(pair: Any) -> bool | None:
    """First element of an NVML (current, pending) pair == 1 (enabled)."""
    try:
        value = pair[0]
    except (TypeError, IndexError, KeyError):
        return None
    return value == 1 if isinstance(value, int) else None


def architecture(code: Any) -> str | None:
    return _ARCHITECTURES.get(code) if isinstance(code, int) else None


def count_of(value: Any) -> int | None:
    """nvmlDeviceGetRetiredPages answers the page addresses: their number."""
    return len(value) if isinstance(value, list | tuple) else None


def milliwatts(value: Any) -> float | None:
    return value / 1000.0 if isinstance(value, int) and value > 0 else None


def pstate(value: Any) -> str | None:
    return f"P{value}" if isinstance(value, int) and 0 <= value <= 15 else None


def percent(value: Any) -> int | None:
    busy = getattr(value, "gpu", None)
    return busy if isinstance(busy, int) and 0 <= busy <= 100 else None


def clock_reason(bit: int) -> Read:
    """One bit of the clock event (throttle) reason mask."""

    def read(d: Device) -> bool | None:
        mask = d.first(_CLOCK_REASONS)
        return bool(mask & bit) if isinstance(mask, int) else None

    return read


def remapped(position: int, then: Callable[[Any], Any]) -> Read:
    """One of nvmlDeviceGetRemappedRows' (correctable, uncorrectable, pending, failure)."""

    def read(d: Device) -> Any:
        rows = d.get("nvmlDeviceGetRemappedRows")
        return then(rows[position]) if isinstance(rows, list | tuple) and len(rows) >= 4 else None

    return read


def histogram(bucket: str) -> Read:
    """A bucket of the bank remap histogram, asked only where the GPU remaps rows."""

    def read(d: Device) -> int | None:
        if remapped(0, same)(d) is None:
            return None
        value = getattr(d.get("nvmlDeviceGetRowRemapperHistogram"), bucket, None)
        return value if isinstance(value, int) else None

    return read


def _pre_ampere(d: Device) -> bool:
    code = d.get("nvmlDeviceGetArchitecture")
    return isinstance(code, int) and code < _AMPERE


def ecc_location(err: int, counter_type: int, location: int) -> Read:
    """An ECC counter of one memory location (Ampere and later)."""

    def read(d: Device) -> int | None:
        if _pre_ampere(d):
            return None
        return counter(d.get("nvmlDeviceGetMemoryErrorCounter", err, counter_type, location))

    return read


def ecc_sram(err: int, counter_type: int) -> Read:
    """SRAM as one location, else the sum of the SRAM parts that answer (as nvidia-smi adds them)."""

    def read(d: Device) -> int | None:
        whole: int | None = ecc_location(err, counter_type, SRAM)(d)
        if whole is not None or _pre_ampere(d):
            return whole
        parts = [ecc_location(err, counter_type, loc)(d) for loc in _SRAM_PARTS]
        present = [p for p in parts if p is not None]
        return sum(present) if present else None

    return read


def ecc_total(err: int, counter_type: int) -> Read:
    """A total over all locations: before Ampere (double-bit / single-bit), and on a later GPU whose
    DRAM locations do not answer."""

    def read(d: Device) -> int | None:
        if not _pre_ampere(d):
            dram = [ecc_location(UNCORRECTED, c, DRAM)(d) for c in (VOLATILE, AGGREGATE)]
            if any(v is not None for v in dram):
                return None
        return counter(d.get("nvmlDeviceGetTotalEccErrors", err, counter_type))

    return read


def field(name: str, then: Callable[[Any], Any]) -> Read:
    """A field value (pynvml's NVML_FI_* constant `name`); all the table's come from one call."""
    _FIELD_IDS.append(name)

    def read(d: Device) -> Any:
        raw = d.once("field values", _field_values).get(name)
        return then(raw) if raw is not None else None

    return read


def _field_values(d: Device) -> dict[str, int]:
    ids = [(name, fid) for name in _FIELD_IDS if isinstance(fid := getattr(d.nv, name, None), int)]
    if not ids:
        return {}
    values = d.raw("nvmlDeviceGetFieldValues", [fid for _, fid in ids])
    got: dict[str, int] = {}
    for (name, _), value in zip(ids, values or (), strict=False):
        if getattr(value, "nvmlReturn", 1) == 0:
            raw = getattr(getattr(value, "value", None), "uiVal", None)
            if isinstance(raw, int):
                got[name] = raw
    return got


def recovery_action(code: int) -> str:
    return _RECOVERY_ACTIONS.get(code, f"Unknown ({code})")


def fabric(part: int) -> Read:
    """NVSwitch fabric registration: (state, status); None where the GPU has no fabric."""
    return lambda d: (d.once("fabric", _fabric) or (None, None))[part]


def _fabric(d: Device) -> tuple[str, str | None] | None:
    nv = d.nv
    if nv is None:
        return None
    for struct_name, fn_name in (
        ("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV"),
        ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"),
    ):
        struct = getattr(nv, struct_name, None)
        if struct is None or getattr(nv, fn_name, None) is None:
            continue
        info = struct()
        if d.raw(fn_name, ctypes.byref(info)) is None:
            return None
        state = int(getattr(info, "state", 0))
        if state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return None
        code = int(getattr(info, "status", -1))
        status: str | None = None
        if state == _FABRIC_COMPLETED:
            status = "Success" if code == 0 else status_text(nv, code)
        return _FABRIC_STATES.get(state, f"Unknown ({state})"), status
    return None


def applications_clock(d: Device) -> int | None:
    """The graphics application clock, else its default (as nvidia-smi's two sections)."""
    app = positive(d.get("nvmlDeviceGetApplicationsClock", 0))
    return app if app is not None else positive(d.get("nvmlDeviceGetDefaultApplicationsClock", 0))

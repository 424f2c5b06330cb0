"""NVLink through NVML field values: each GPU's link states and speeds (the model `nvidia-smi
nvlink -s` gives, for the nvlink and nvlink-speed checks) and its link error counters, each in one
nvmlDeviceGetFieldValues call per GPU (fields scoped by link number) instead of a call per link.

Where NVML does not answer the question (no field-value call, a link whose state comes back with
an error other than "no such link", an active link without a speed) the reader raises NotAnswered
and the caller falls back to `nvidia-smi nvlink -s`, the snapshot format.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from agent.core.nvlink import NvlinkGpu, NvlinkReport
from agent.probes.bounded import Bounded
from agent.probes.nvml_session import NOT_SUPPORTED, Opened, bounded_read, check_session, describe, text
from agent.probes.nvsmi_errors import NvmlUnavailable

SOURCE = "nvml nvlink"
MAX_LINKS = 18  # NVLink4 (H100/H200) and NVLink5 (B200) GPUs have 18
SUCCESS = 0
INVALID_ARGUMENT = 2

# nvmlFieldId_t (nvml.h). Scoped by link (scopeId = link number):
FI_STATE = 165  # NVML_FI_DEV_NVLINK_GET_STATE: 1 active, 0 inactive
FI_SPEED = 164  # NVML_FI_DEV_NVLINK_GET_SPEED: MB/s
FI_REPLAY, FI_RECOVERY, FI_CRC = 161, 162, 163  # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC
# Not scoped:
FI_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
FI_SPEED_COMMON = 90  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
# NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0..L11 (links 12+ have no data-CRC field)
CRC_DATA = {n: (39 + n if n < 6 else 96 + n) for n in range(12)}

MIG_MESSAGE = "NVLink cannot be queried while the GPU is in MIG mode"  # the text parser's words


class NotAnswered(NvmlUnavailable):
    """NVML cannot answer this here: the caller reads the nvidia-smi text instead."""


@dataclass
class Links:
    """One GPU's links as NVML states them: present link → active, and what else was asked."""

    active: dict[int, bool]
    speed_mbps: dict[int, float] = field(default_factory=dict)
    counters: dict[int, dict[str, int]] = field(default_factory=dict)


_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value (a union)
_FIELD_VALUE = struct.Struct("=IIqqII8s")
_UNION = {0: "=d", 1: "=I", 2: "=Q", 3: "=Q", 4: "=q", 5: "=i", 6: "=H"}  # by nvmlValueType_t
_UNION_READ = {k: struct.Struct(f).unpack_from for k, f in _UNION.items()}


def _value(fv: Any) -> float | int | None:
    """The value of an nvmlFieldValue_t by its valueType (nvmlValueType_t)."""
    got = getattr(fv.value, _MEMBERS.get(int(fv.valueType), "ullVal"), None)
    return got if isinstance(got, int | float) else None


def _decoded(values: Any) -> list[tuple[int, Any]] | None:
    """The ctypes array nvidia-ml-py returns, read in one pass over its bytes (reading each
    structure's attributes through nvidia-ml-py costs ten times more); None when it is not the
    array of 40-byte structures NVML's header lays out."""
    try:
        raw = bytes(values)
    except TypeError:
        return None
    if len(raw) != _FIELD_VALUE.size * len(values):
        return None
    out: list[tuple[int, Any]] = []
    for _, _, _, _, kind, ret, union in _FIELD_VALUE.iter_unpack(raw):
        read = _UNION_READ.get(kind)
        out.append((ret, read(union)[0] if ret == SUCCESS and read is not None else None))
    return out


_TEMPLATES: dict[tuple[tuple[int, int], ...], bytes] = {}


def _direct(nv: ModuleType, handle: Any, ids: list[tuple[int, int]]) -> Any:
    """nvmlDeviceGetFieldValues through nvidia-ml-py's own function pointer, the request array made
    in one copy from bytes kept per list of fields (nvidia-ml-py's wrapper sets each id through
    Python, 0.15 ms for the 85 fields of a counter read); None where this nvidia-ml-py lacks what
    that needs (its wrapper is used then). Raises the NVMLError of the call."""
    struct_type = getattr(nv, "c_nvmlFieldValue_t", None)
    pointer = getattr(nv, "_nvmlGetFunctionPointer", None)
    if struct_type is None or pointer is None or ctypes.sizeof(struct_type) != _FIELD_VALUE.size:
        return None
    key = tuple(ids)
    template = _TEMPLATES.get(key)
    if template is None:
        template = b"".join(_FIELD_VALUE.pack(f, scope, 0, 0, 0, 0, b"") for f, scope in ids)
        _TEMPLATES[key] = template
    values = (struct_type * len(ids)).from_buffer_copy(template)
    ret = pointer("nvmlDeviceGetFieldValues")(handle, ctypes.c_int32(len(ids)), ctypes.byref(values))
    if ret != SUCCESS:
        raise nv.NVMLError(ret)
    return values


def field_values(nv: ModuleType, handle: Any, ids: list[tuple[int, int]]) -> list[tuple[int, Any]]:
    """(nvmlReturn, value) for each (field id, scope id), in one call; NotAnswered where the call
    itself fails."""
    fn = getattr(nv, "nvmlDeviceGetFieldValues", None)
    if fn is None:
        raise NotAnswered("NVML: this nvidia-ml-py has no nvmlDeviceGetFieldValues")
    try:
        values = _direct(nv, handle, ids)
        if values is None:
            values = fn(handle, ids)
    except nv.NVMLError as exc:
        check_session(exc)
        raise NotAnswered(f"NVML: nvmlDeviceGetFieldValues: {describe(exc)}") from None
    except (TypeError, ValueError, AttributeError) as exc:  # an nvidia-ml-py without scoped fields
        raise NotAnswered(f"NVML: this nvidia-ml-py cannot ask fields by link ({exc})") from None
    fast = _decoded(values)
    if fast is not None:
        return fast
    out: list[tuple[int, Any]] = []
    for fv in values:
        ret = int(fv.nvmlReturn)
        out.append((ret, _value(fv) if ret == SUCCESS else None))
    return out


def read_links(nv: ModuleType, handle: Any, *, speeds: bool = False, counters: bool = False) -> Links | None:
    """The GPU's links in one field-value call; None when it has no NVLink (no link exists)."""
    scoped = (
        [FI_STATE] + ([FI_SPEED] if speeds else []) + ([FI_REPLAY, FI_RECOVERY, FI_CRC] if counters else [])
    )
    ids = [(f, n) for n in range(MAX_LINKS) for f in scoped] + [(FI_LINK_COUNT, 0)]
    if speeds:
        ids.append((FI_SPEED_COMMON, 0))
    if counters:
        ids += [(CRC_DATA[n], 0) for n in sorted(CRC_DATA)]
    got = dict(zip(ids, field_values(nv, handle, ids), strict=True))
    count_ret, count = got[(FI_LINK_COUNT, 0)]
    present = range(int(count)) if count_ret == SUCCESS and isinstance(count, int) else None
    active: dict[int, bool] = {}
    for n in range(MAX_LINKS):
        ret, state = got[(FI_STATE, n)]
        if present is not None and n not in present:
            continue
        if ret == SUCCESS:
            active[n] = state == 1
        elif ret in (NOT_SUPPORTED, INVALID_ARGUMENT) and present is None:
            continue  # no such link
        else:
            raise NotAnswered(f"NVML: NVLink {n} state: NVML error {ret}")
    if not active:
        return None
    links = Links(active)
    for n in (n for n, up in active.items() if up):
        if speeds:
            ret, mbps = got[(FI_SPEED, n)]
            if ret != SUCCESS or not mbps:
                ret, mbps = got[(FI_SPEED_COMMON, 0)]
            if ret != SUCCESS or not mbps:
                raise NotAnswered(f"NVML: no speed for active NVLink {n}")
            links.speed_mbps[n] = float(mbps)
        if counters:
            pairs = [("replay", (FI_REPLAY, n)), ("recovery", (FI_RECOVERY, n)), ("crc_flit", (FI_CRC, n))]
            if n in CRC_DATA:
                pairs.append(("crc_data", (CRC_DATA[n], 0)))
            values = {name: got[key] for name, key in pairs}
            links.counters[n] = {k: int(v) for k, (r, v) in values.items() if r == SUCCESS and v is not None}
    return links


def _mig(nv: ModuleType, handle: Any) -> bool:
    try:
        mode = nv.nvmlDeviceGetMigMode(handle)
    except nv.NVMLError as exc:
        check_session(exc)
        return False
    return bool(mode) and mode[0] == 1


def _identity(opened: Opened, index: int, handle: Any) -> tuple[str | None, str | None]:
    """Name and UUID, as the listing's "GPU n: <name> (UUID: <uuid>)" header; fixed per driver load."""
    key = ("identity", index)
    if key not in opened.cache:
        nv = opened.nv
        got: list[str | None] = []
        for fn in (nv.nvmlDeviceGetName, nv.nvmlDeviceGetUUID):
            try:
                got.append(text(fn(handle)))
            except nv.NVMLError as exc:
                check_session(exc)
                got.append(None)
        opened.cache[key] = (got[0], got[1])
    name, uuid = opened.cache[key]
    return name, uuid


def nvlink_report(opened: Opened) -> NvlinkReport:
    """Every GPU's links, as `nvidia-smi nvlink -s` states them (speeds in GB/s with its 3 decimals)."""
    nv = opened.nv
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        check_session(exc)
        raise NotAnswered(f"NVML: cannot count GPUs ({describe(exc)})") from None
    gpus: list[NvlinkGpu] = []
    for index in range(count):
        try:
            handle = opened.handle(index)
        except nv.NVMLError as exc:
            check_session(exc)
            opened.retire()
            continue  # a lost GPU: the nvlink check sees the listing short of the inventory's count
        name, uuid = _identity(opened, index, handle)
        if _mig(nv, handle):
            gpus.append(NvlinkGpu(index, name, uuid, links={}, unavailable=MIG_MESSAGE))
            continue
        links = read_links(nv, handle, speeds=True)
        if links is None:
            gpus.append(NvlinkGpu(index, name, uuid, links={}))
        elif not any(links.active.values()):
            gpus.append(NvlinkGpu(index, name, uuid, links={}, all_inactive=True))
        else:
            speeds = {
                n: (round(links.speed_mbps[n] / 1000, 3) if up else None) for n, up in links.active.items()
            }
            gpus.append(NvlinkGpu(index, name, uuid, links=speeds))
    if not gpus:
        return NvlinkReport(gpus=(), supported=None, source=SOURCE)
    no_nvlink = all(not g.links and not g.all_inactive and g.unavailable is None for g in gpus)
    return NvlinkReport(gpus=tuple(gpus), supported=not no_nvlink, source=SOURCE)


_WATCHDOG = Bounded()


def read_nvlink_status(timeout_s: float) -> NvlinkReport:
    """Raises NotAnswered / NvmlUnavailable (read `nvidia-smi nvlink -s` instead), ProbeTimeout,
    ToolReportedFailure."""
    return bounded_read(_WATCHDOG, SOURCE, nvlink_report, timeout_s, what="NVLink read", thread="nvml-nvlink")

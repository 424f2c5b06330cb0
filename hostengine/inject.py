"""Fault injection into the node's DCGM host engine, for end-to-end tests of the alert path.

    python -m hostengine.inject <scenario> --gpu N [--xid N] [--clear] [--address H:P] --yes

Injected values land in the engine's cache and are seen by EVERY client (dcgm-exporter exports them,
health watches fire), and a future timestamp blocks live sampling of that field until then
(dcgm.md §0.9) — hence --yes. Calls the exported C function
`dcgmInjectEntityFieldValue(dcgmHandle_t, dcgm_field_entity_group_t, dcgm_field_eid_t,
                            dcgmInjectFieldValue_t*)`
of libdcgm.so.4 through ctypes (the internal Python module that wraps it is not shipped, dcgm.md §0.2).
dcgmInjectFieldValue_t == dcgmFieldValue_v1 (4120 bytes): version, fieldId, fieldType, status, ts (µs), value.
Field IDs are numeric (names changed in DCGM 4.6, ids did not).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DCGM_MAX_STR_LENGTH, DCGM_MAX_BLOB_LENGTH = 256, 4096
DCGM_FT_INT64, DCGM_FT_DOUBLE = ord("i"), ord("d")
DCGM_FE_GPU = 1


class FieldValueUnion(ctypes.Union):
    _fields_ = [
        ("i64", ctypes.c_int64),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * DCGM_MAX_STR_LENGTH),
        ("blob", ctypes.c_byte * DCGM_MAX_BLOB_LENGTH),
    ]


class FieldValueV1(ctypes.Structure):
    """dcgmFieldValue_v1 (dcgm_structs.h) == dcgmInjectFieldValue_v1 (dcgm_structs_internal.h)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_short),
        ("status", ctypes.c_int),
        ("ts", ctypes.c_int64),
        ("value", FieldValueUnion),
    ]


FIELD_VALUE_VERSION1 = ctypes.sizeof(FieldValueV1) | (1 << 24)  # MAKE_DCGM_VERSION(struct, 1)


@dataclass(frozen=True)
class Inject:
    field_id: int
    value: int
    baseline: bool = False  # a sample in the recent past (BASELINE_AGE_S ago), whatever --offset says


@dataclass(frozen=True)
class Scenario:
    """What to inject, how to clear it, and what DCGM 4.6's health watches then report (incident) and
    what the agent makes of it (finding, from config/dcgm-incidents.yaml)."""

    fault: tuple[Inject, ...]
    clear: tuple[Inject, ...]
    incident: str
    finding: str


# Rate-based watches (PCIe replays, thermal violation, NVLink errors) compare the first sample of the
# last 60 s with the latest (DcgmHealthWatch.cpp MonitorPcie, MonitorThermal, MonitorNVLink4Fields): a
# lone sample never fires, so these scenarios inject a baseline shortly before now. They fire until the
# baseline leaves that window, i.e. for about a minute. The others read the latest sample and fire until
# --clear (or, for an Xid, until the engine restarts: DCGM keeps its Xid history).
BASELINE_AGE_S = 5.0
DEVASTATING_XIDS = (48, 74, 79, 94, 95, 119, 120, 140)  # DcgmHealthWatch.cpp BuildXidMappings


# Field ids (dcgm_fields.py 4.6): 230 XID_ERROR, 311 ECC_DBE_VOL_TOTAL, 395 ROW_REMAP_FAILED,
# 393 ROW_REMAP_UNCORRECTABLE_TOTAL, 439 NVLINK_RECOVERY_ERROR_TOTAL, 241 THERMAL_VIOLATION (µs),
# 202 PCIE_REPLAY_TOTAL. Not 396 (ROW_REMAP_PENDING): no 4.6 health watch reads it (only the diag
# raises DCGM_FR_PENDING_ROW_REMAP), so injecting it produces no incident.
def scenarios(xid: int) -> dict[str, Scenario]:
    xid_incident = {
        79: "all: DCGM_FR_FALLEN_OFF_BUS (120), FAIL",
        95: "all: DCGM_FR_UNCONTAINED_ERROR (81), FAIL",
        94: "all: DCGM_FR_CONTAINED_ERROR (131), WARN",
    }.get(
        xid,
        "all: DCGM_FR_XID_ERROR (101), FAIL"
        if xid in DEVASTATING_XIDS
        else "none unless a watched subsystem lists it (e.g. 31/43 mem, 38/39/42 pcie, 60-62 thermal), WARN",
    )
    return {
        "xid": Scenario(
            (Inject(230, xid),),
            (Inject(230, 0),),
            f"Xid {xid}: {xid_incident}; stays until the engine restarts (--clear does not remove it)",
            "dcgm-health finding: 120 unlisted-fail (reset), 81 reset, 101 monitor, 131 unlisted-warn",
        ),
        "dbe": Scenario(
            (Inject(311, 2),),
            (Inject(311, 0),),
            "mem: DCGM_FR_VOLATILE_DBE_DETECTED (4), FAIL",
            "dcgm-health.mem.4 (reset): GPU tainted",
        ),
        "row-remap-failure": Scenario(
            (Inject(395, 1),),
            (Inject(395, 0),),
            "mem: DCGM_FR_ROW_REMAP_FAILURE (80), FAIL",
            "dcgm-health.mem.80 (isolate): GPU tainted",
        ),
        "row-remap-uncorrectable": Scenario(
            (Inject(393, 512),),
            (Inject(393, 0),),
            "mem: DCGM_FR_UNCORRECTABLE_ROW_REMAP (84), WARN (>= 512 uncorrectable remaps, Ampere+)",
            "dcgm-health.mem.84 (isolate): GPU tainted",
        ),
        "nvlink-errors": Scenario(
            (Inject(230, 74), Inject(439, 0, baseline=True), Inject(439, 3)),
            (Inject(230, 0), Inject(439, 3)),
            "all: DCGM_FR_XID_ERROR (101) for Xid 74, FAIL; nvlink: DCGM_FR_NVLINK_ERROR_CRITICAL (71), FAIL "
            "(recovery errors in the last minute; link state itself is no field)",
            "dcgm-health.nvlink.71 (reset) + a monitor finding for the Xid: GPU tainted",
        ),
        "thermal": Scenario(
            (Inject(241, 0, baseline=True), Inject(241, 10_000_000)),
            (Inject(241, 10_000_000),),
            "thermal: DCGM_FR_CLOCKS_EVENT_THERMAL (10), WARN (violation time grew in the last minute)",
            "dcgm-health.thermal.10 (monitor): status warn, no taint",
        ),
        "pcie-replay": Scenario(
            (Inject(202, 0, baseline=True), Inject(202, 100_000)),
            (Inject(202, 100_000),),
            "pcie: DCGM_FR_PCI_REPLAY_RATE (3), WARN (replays over the last 60 s above the expected rate)",
            "dcgm-health.pcie.3 (monitor): status warn, no taint",
        ),
    }


def make_value(field_id: int, value: int, ts_us: int) -> FieldValueV1:
    v = FieldValueV1()
    v.version = FIELD_VALUE_VERSION1
    v.fieldId = field_id
    v.fieldType = DCGM_FT_INT64
    v.status = 0
    v.ts = ts_us
    v.value.i64 = value
    return v


def as_handle(handle: Any) -> ctypes.c_void_p:
    """dcgmHandle_t from the bindings' DcgmHandle.handle: a ctypes.c_void_p in DCGM's own bindings
    (int() of it raises), a plain int in some wrappers."""
    if isinstance(handle, ctypes.c_void_p):
        return handle
    if isinstance(handle, int) and not isinstance(handle, bool):
        return ctypes.c_void_p(handle)
    raise RuntimeError(f"unexpected DCGM connection handle type {type(handle).__name__}")


def inject_values(
    fn: Callable[..., int], handle: Any, gpu: int, injects: Sequence[Inject], offset_s: float, now: float
) -> None:
    """Call dcgmInjectEntityFieldValue once per value (baselines at now - BASELINE_AGE_S, the rest at
    now + offset_s); raise RuntimeError on a non-zero DCGM status."""
    h = as_handle(handle)
    for inj in injects:
        at = now - BASELINE_AGE_S if inj.baseline else now + offset_s
        v = make_value(inj.field_id, inj.value, int(at * 1_000_000))
        rc = fn(h, ctypes.c_uint(DCGM_FE_GPU), ctypes.c_uint(gpu), ctypes.byref(v))
        if rc != 0:
            raise RuntimeError(f"dcgmInjectEntityFieldValue(field {inj.field_id}) returned DCGM status {rc}")


def inject_function(lib: Any) -> Callable[..., int]:
    fn = lib.dcgmInjectEntityFieldValue
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(FieldValueV1)]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hostengine.inject", description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=sorted(scenarios(0)))
    p.add_argument("--gpu", type=int, required=True, help="DCGM GPU id")
    p.add_argument("--xid", type=int, default=79, help="Xid code for the xid scenario")
    p.add_argument("--clear", action="store_true", help="inject healthy values, later than the fault")
    p.add_argument("--address", default=os.environ.get("HOSTENGINE_PROBE_ADDRESS", "127.0.0.1:5555"))
    p.add_argument("--timeout", type=float, default=5.0, help="connect timeout (s)")
    p.add_argument("--offset", type=float, default=60.0, help="seconds into the future (fault stays latest)")
    p.add_argument("--lib", default="libdcgm.so.4")
    p.add_argument("--yes", action="store_true", help="confirm: every client of the engine sees the values")
    a = p.parse_args(argv)
    sc = scenarios(a.xid)[a.scenario]
    if not a.yes:
        print(
            f"refusing: injecting {a.scenario!r} into the engine at {a.address} is seen by every client "
            "(dcgm-exporter, health watches, other agents). Re-run with --yes on a test node.",
            file=sys.stderr,
        )
        return 2
    from agent.probes.dcgm.client import DcgmClient, EngineUnavailable

    client = DcgmClient(a.address, a.timeout, grace_s=0.0)
    try:
        handle = client.handle()
        fn = inject_function(ctypes.CDLL(a.lib))  # by soname: the library the bindings already loaded
        # a clear must be later than the fault's future timestamp, or live sampling stays blocked
        offset = a.offset * (2 if a.clear else 1)
        inject_values(fn, handle.handle, a.gpu, sc.clear if a.clear else sc.fault, offset, time.time())
    except (EngineUnavailable, OSError, RuntimeError, AttributeError) as exc:  # AttributeError: no symbol
        print(f"inject failed: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if a.clear:
        print(f"{a.scenario} on GPU {a.gpu} cleared")
    else:
        print(f"{a.scenario} on GPU {a.gpu} injected; expect incident {sc.incident}; agent: {sc.finding}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

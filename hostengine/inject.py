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
    offset_s: float = 0.0  # added to the command's --offset


# Field ids (dcgm_fields.py): 230 XID_ERROR, 311 ECC_DBE_VOL_TOTAL, 396 ROW_REMAP_PENDING,
# 439 NVLINK_RECOVERY_ERROR_TOTAL, 241 THERMAL_VIOLATION (µs), 202 PCIE_REPLAY_TOTAL.
def scenarios(xid: int) -> dict[str, tuple[list[Inject], list[Inject], str]]:
    """name → (inject, clear, what the health watch should report)."""
    return {
        "xid": (
            [Inject(230, xid)],
            [Inject(230, 0)],
            f"Xid {xid} (devastating codes 48/74/79/95/119/120/140 FAIL)",
        ),
        "dbe": ([Inject(311, 2)], [Inject(311, 0)], "MEM: DCGM_FR_VOLATILE_DBE_DETECTED"),
        "row-remap-pending": ([Inject(396, 1)], [Inject(396, 0)], "MEM: DCGM_FR_PENDING_ROW_REMAP"),
        "nvlink-down": (
            [Inject(230, 74), Inject(439, 1)],
            [Inject(230, 0), Inject(439, 0)],
            "Xid 74 (NVLink critical) + NVLink recovery errors (link status itself is not a field)",
        ),
        "thermal": ([Inject(241, 10_000_000)], [Inject(241, 0)], "THERMAL: DCGM_FR_CLOCKS_EVENT_THERMAL"),
        "pcie-replay": (
            [Inject(202, 0, -110.0), Inject(202, 100_000)],
            [Inject(202, 0)],
            "PCIE: DCGM_FR_PCI_REPLAY_RATE (replays over the last 60 s)",
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
    """Call dcgmInjectEntityFieldValue once per value; raise RuntimeError on a non-zero DCGM status."""
    h = as_handle(handle)
    for inj in injects:
        v = make_value(inj.field_id, inj.value, int((now + offset_s + inj.offset_s) * 1_000_000))
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
    p.add_argument("--offset", type=float, default=60.0, help="seconds into the future (fault stays latest)")
    p.add_argument("--lib", default="libdcgm.so.4")
    p.add_argument("--yes", action="store_true", help="confirm: every client of the engine sees the values")
    a = p.parse_args(argv)
    fault, clear, expect = scenarios(a.xid)[a.scenario]
    if not a.yes:
        print(
            f"refusing: injecting {a.scenario!r} into the engine at {a.address} is seen by every client "
            "(dcgm-exporter, health watches, other agents). Re-run with --yes on a test node.",
            file=sys.stderr,
        )
        return 2
    from agent.probes.dcgm.client import DcgmClient, EngineUnavailable

    client = DcgmClient(a.address, 5.0, grace_s=0.0)
    try:
        handle = client.handle()
        fn = inject_function(ctypes.CDLL(a.lib))
        # a clear must be later than the fault's future timestamp, or live sampling stays blocked
        inject_values(
            fn,
            handle.handle,
            a.gpu,
            clear if a.clear else fault,
            a.offset * (2 if a.clear else 1),
            time.time(),
        )
    except (EngineUnavailable, OSError, RuntimeError, AttributeError) as exc:  # AttributeError: no symbol
        print(f"inject failed: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    what = "cleared" if a.clear else f"injected (expect {expect})"
    print(f"{a.scenario} on GPU {a.gpu} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

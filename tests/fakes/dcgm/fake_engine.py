"""The tests' handle on the fake engine inside our libdcgm.so.4 (libdcgm/fake_libdcgm.c): its fake_*
control functions, plus a diag response built from a `dcgmi diag -j` 4.x document into DCGM's own
c_dcgmDiagResponse_v12 layout (the engine answers it to dcgmActionValidate_v2).

The library is the one the bindings load (LD_LIBRARY_PATH, soname libdcgm.so.4), so there is one engine
per test process; tests/conftest.py resets it around every test."""

from __future__ import annotations

import ctypes
import json
from ctypes import byref, c_char_p, c_double, c_int, c_longlong, c_size_t, c_uint
from typing import Any

import dcgm_structs

DCGM_FE_NONE, DCGM_FE_GPU, DCGM_FE_SWITCH = 0, 1, 3
_RESULT = {"pass": 0, "skip": 1, "warn": 2, "fail": 3, "not run": 4, "": 7}


def lib() -> Any:
    dcgm_structs._LoadDcgmLibrary()
    handle = dcgm_structs.dcgmLib
    handle.fake_stat.restype = c_double
    handle.fake_text.restype = c_char_p
    handle.fake_sizeof.restype = c_size_t
    handle.fake_set_heartbeat_timeout_ms.argtypes = [c_longlong]
    handle.fake_set_request_timeout_ms.argtypes = [c_longlong]
    return handle


def reset() -> None:
    lib().fake_reset()


def set_up(up: bool) -> None:
    """Down: every connection breaks and connects are refused; up again: a restarted engine."""
    lib().fake_set_up(int(up))


def restart() -> None:
    lib().fake_restart()


def listen(kind: str, where: str) -> None:
    """Where the engine accepts connections: ("tcp", "5555") or ("unix", "/path/to/socket")."""
    lib().fake_listen(kind.encode(), where.encode())


def set_gpus(ids: list[int]) -> None:
    lib().fake_set_entities(DCGM_FE_GPU, (c_uint * max(1, len(ids)))(*ids), len(ids))


def set_gpu_pci(pcis: dict[int, str]) -> None:
    """The PCI address the engine names for each GPU id (dcgmGetDeviceAttributes; unset: "")."""
    for gid, pci in pcis.items():
        lib().fake_set_gpu_pci(gid, pci.encode())


def set_switches(ids: list[int]) -> None:
    lib().fake_set_entities(DCGM_FE_SWITCH, (c_uint * max(1, len(ids)))(*ids), len(ids))


def add_incident(
    system: int, health: int, code: int, msg: str, group: int = DCGM_FE_GPU, id: int = 0
) -> None:
    lib().fake_add_incident(group, id, system, health, code, msg.encode())


def fail(function: str, code: int) -> None:
    """Make one C API function answer `code` on a live connection (0: stop)."""
    lib().fake_fail(function.encode(), code)


def stat(name: str) -> float:
    value = lib().fake_stat(name.encode())
    assert value != -1, f"fake libdcgm has no stat {name!r}"
    return float(value)


def text(name: str) -> str:
    return str(lib().fake_text(name.encode()).decode())


def injected() -> list[dict[str, int]]:
    out, i = [], 0
    gpu, field, version = c_uint(), c_uint(), c_uint()
    value, ts, ftype = c_longlong(), c_longlong(), c_int()
    while (
        lib().fake_injected(
            i, byref(gpu), byref(field), byref(value), byref(ts), byref(version), byref(ftype)
        )
        == 0
    ):
        out.append(
            {"gpu": gpu.value, "field": field.value, "value": value.value, "ts": ts.value,
             "version": version.value, "type": ftype.value}
        )  # fmt: skip
        i += 1
    return out


def engine_process(path: str) -> None:
    """Every request is answered by the process on this Unix socket (engine_process.py); "": by the
    library itself again."""
    lib().fake_engine_process(path.encode())


def request_timeout(seconds: float) -> None:
    """How long a call waits for the engine's answer before DCGM_ST_TIMEOUT (the real client: 60 s)."""
    lib().fake_set_request_timeout_ms(int(seconds * 1000))


def block(function: str, on: bool = True, *, past_timeouts: bool = False) -> None:
    """Make one C API function wait for an answer that does not come (an engine stuck in it): until
    the call's own timeout, or `past_timeouts` (a call stuck in a wedged driver)."""
    lib().fake_block(function.encode(), 2 if on and past_timeouts else int(on))


def hold_diag(hold: bool) -> None:
    lib().fake_diag_hold(int(hold))


def heartbeat_timeout(seconds: float) -> None:
    lib().fake_set_heartbeat_timeout_ms(int(seconds * 1000))


def diag_error(code: int, msg: str = "") -> None:
    lib().fake_set_diag_error(code, msg.encode())


def set_diag_response(resp: Any) -> None:
    assert lib().fake_set_diag_response(byref(resp), ctypes.sizeof(resp)) == 0


def diag_response(doc: dict[str, Any], version: str = "4.6.0") -> Any:
    """c_dcgmDiagResponse_v12 from a `dcgmi diag -j` 4.x document (per-entity results, their warnings and
    info; test_summary warnings as errors of entity NONE). Status "" becomes an unknown result code (7)."""
    resp = dcgm_structs.c_dcgmDiagResponse_v12()
    cats = doc["DCGM Diagnostic"]["test_categories"]
    nt = ne = ni = nr = 0

    def error(ent: tuple[int, int], w: dict[str, Any], test: int) -> int:
        nonlocal ne
        e = resp.errors[ne]
        e.entity.entityGroupId, e.entity.entityId = ent
        e.code, e.category, e.severity = w["error_id"], w["error_category"], w["error_severity"]
        e.msg, e.testId = w["warning"].encode()[:511], test
        ne += 1
        return ne - 1

    for ci, cat in enumerate(cats):
        resp.categories[ci].value = cat["category"].encode()
        for t in cat["tests"]:
            test = resp.tests[nt]
            test.name, test.categoryIndex = t["name"].encode(), ci
            test.result = _RESULT[t.get("test_summary", {}).get("status", "pass").lower()]
            errors, infos, results = [], [], []
            for r in t.get("results", []):
                ent = (r["entity_group_id"], r["entity_id"])
                res = resp.results[nr]
                res.entity.entityGroupId, res.entity.entityId = ent
                res.result, res.testId = _RESULT[r["status"].lower()], nt
                results.append(nr)
                nr += 1
                errors += [error(ent, w, nt) for w in r.get("warnings", [])]
                for msg in r.get("info", []):
                    info = resp.info[ni]
                    info.entity.entityGroupId, info.entity.entityId = ent
                    info.msg, info.testId = msg.encode()[:511], nt
                    infos.append(ni)
                    ni += 1
            errors += [error((DCGM_FE_NONE, 0), w, nt) for w in t.get("test_summary", {}).get("warnings", [])]
            test.numResults, test.numErrors, test.numInfo = len(results), len(errors), len(infos)
            for k, v in enumerate(results):
                test.resultIndices[k] = v
            for k, v in enumerate(errors):
                test.errorIndices[k] = v
            for k, v in enumerate(infos):
                test.infoIndices[k] = v
            nt += 1
    resp.numTests, resp.numErrors, resp.numInfo, resp.numResults = nt, ne, ni, nr
    resp.numCategories = len(cats)
    resp.dcgmVersion = version.encode()
    return resp


def load_diag(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        text_ = fh.read()
    set_diag_response(diag_response(json.loads(text_[text_.find("{") :])))

"""State of the one fake nv-hostengine. Tests change it; the fake bindings read it."""

from __future__ import annotations

import ctypes
import json
import threading
from types import SimpleNamespace as NS
from typing import Any

up = True
generation = 1  # bumped by restart(): handles/groups of older generations are invalid
gpus: list[int] = [0, 1]
switches: list[int] = []
incidents: list[dict[str, Any]] = []
diag_doc: dict[str, Any] | None = None  # a dcgmi diag -j 4.x document
diag_error: int | None = None  # DCGM_ST_* raised by Execute
diag_hold = threading.Event()  # set = Execute blocks until released
diag_release = threading.Event()
heartbeats = 0
connects: list[dict[str, Any]] = []
health_sets: list[tuple[Any, ...]] = []
groups_created = 0
groups: dict[int, int] = {}  # the engine-wide group table: group id -> owning connection
MAX_GROUPS = 64  # DCGM_MAX_NUM_GROUPS, for all clients of the engine together
next_conn = 0
conns: dict[int, int] = {}  # open connection id -> engine generation it was made in
health_error: int | None = None  # DCGM_ST_* raised by health Check
diag_calls: list[dict[str, Any]] = []


def reset() -> None:
    global up, generation, gpus, switches, incidents, diag_doc, diag_error, heartbeats
    global connects, health_sets, groups_created, diag_calls, groups, health_error, conns
    up, generation, gpus, switches, incidents = True, 1, [0, 1], [], []
    diag_doc, diag_error, heartbeats, health_error = None, None, 0, None
    connects, health_sets, groups_created, diag_calls, groups, conns = [], [], 0, [], {}, {}
    diag_hold.clear()
    diag_release.clear()


def restart() -> None:
    global generation, groups
    generation += 1
    groups = {}


def group_create(conn: int) -> int:
    """dcgmGroupCreate: DCGM_ST_MAX_LIMIT (-6) once the engine holds 64 groups, whoever made them."""
    global groups_created
    import dcgm_structs

    if len(groups) >= MAX_GROUPS:
        raise dcgm_structs.DCGMError(-6)
    gid = max(groups, default=1) + 1  # 0 and 1 are the built-in all-GPU / all-NVSwitch groups
    groups[gid] = conn
    groups_created += 1
    return gid


def group_destroy(gid: int) -> None:
    import dcgm_structs

    if groups.pop(gid, None) is None:
        raise dcgm_structs.DCGMError(-5)


def connection_alive(handle: Any) -> bool:
    """A c_void_p handle of an open connection to the engine as it runs now."""
    conn = getattr(handle, "value", None)
    return up and conn is not None and conns.get(conn) == generation


def disconnect(conn: int) -> None:
    conns.pop(conn, None)
    for gid in [g for g, c in groups.items() if c == conn]:
        del groups[gid]


_RESULT = {"pass": 0, "skip": 1, "warn": 2, "fail": 3}


def diag_response() -> Any:
    """c_dcgmDiagResponse_v12-like object from the 4.x JSON document (dcgm.md §2.3 layout)."""
    assert diag_doc is not None
    cats = ((ctypes.c_char * 20) * 5)()  # char categories[5][20]: items are c_char arrays, not bytes
    resp = NS(tests=[], results=[], errors=[], info=[], categories=cats, dcgmVersion=b"4.1.1")
    for ci, cat in enumerate(diag_doc["DCGM Diagnostic"]["test_categories"]):
        cats[ci].value = cat["category"].encode()
        for t in cat["tests"]:
            test = NS(
                name=t["name"].encode(),
                categoryIndex=ci,
                resultIndices=[],
                errorIndices=[],
                infoIndices=[],
                numResults=0,
                numErrors=0,
                numInfo=0,
                result=_RESULT[t["test_summary"]["status"].lower()],
            )
            for r in t["results"]:
                ent = NS(entityGroupId=r["entity_group_id"], entityId=r["entity_id"])
                test.resultIndices.append(len(resp.results))
                resp.results.append(
                    NS(entity=ent, result=_RESULT[r["status"].lower()], testId=len(resp.tests))
                )
                for w in r.get("warnings", []):
                    test.errorIndices.append(len(resp.errors))
                    resp.errors.append(
                        NS(
                            entity=ent,
                            code=w["error_id"],
                            category=w["error_category"],
                            severity=w["error_severity"],
                            msg=w["warning"].encode(),
                        )
                    )
                for i in r.get("info", []):
                    test.infoIndices.append(len(resp.info))
                    resp.info.append(NS(entity=ent, msg=i.encode()))
            for w in t["test_summary"].get("warnings", []):
                test.errorIndices.append(len(resp.errors))
                resp.errors.append(
                    NS(
                        entity=NS(entityGroupId=0, entityId=0),
                        code=w["error_id"],
                        category=w["error_category"],
                        severity=w["error_severity"],
                        msg=w["warning"].encode(),
                    )
                )
            test.numResults, test.numErrors, test.numInfo = (
                len(test.resultIndices),
                len(test.errorIndices),
                len(test.infoIndices),
            )
            resp.tests.append(test)
    resp.numTests, resp.numResults, resp.numErrors = len(resp.tests), len(resp.results), len(resp.errors)
    return resp


def load_diag(path: str) -> None:
    global diag_doc
    with open(path, encoding="utf-8") as fh:
        diag_doc = json.load(fh)

"""Parser for `dcgmi diag -j` output (DCGM 3.x and 4.x shapes) as stored in a snapshot's dcgm-diag.json.

Why this is careful:
* dcgmi may print a non-JSON line first ("Successfully ran diagnostic...", "WARNING: ...") → read
  from the first "{"; text after the document is ignored.
* DCGM 4.x `-j` renders a WARN as "Fail" (dcgm.md §0.5). We downgrade a "Fail" to WARN when every
  error it carries has severity MONITOR(1) or CONFIG(5), or category SOFTWARE_CONFIG(3). A "Fail"
  without severity information stays FAIL (we cannot prove it is a warning). The original word is
  kept in DiagResult.reported and the downgrade is recorded in DiagReport.notes.
* A "Pass" that still carries errors (DCGM#284: memory PASS with DCGM_FR_MEMORY_ALLOC) becomes WARN.
* 4.x: a test whose test_summary fails while no entity fails holds errors not tied to a GPU
  (e.g. issue DCGM#253 pcie internal errors) → one result for gpu "node".
* 4.6 edge shapes (dcgmi/Diag.cpp): a runtime failure is {"DCGM Diagnostic": {"version", "runtime_error"}};
  `--iterations N` (N > 1) wraps one document per iteration in {"iterations": [...], "Overall Result",
  "warning"?} (a failed iteration ends the run: its error is in "warning"); a result code dcgmi cannot
  name prints status "" → DiagStatus.UNKNOWN (the check reports it as unknown unless its errors state
  a fault).
Anything that is not one of the documented shapes raises ParseError (never another exception).
"""

from __future__ import annotations

import json
from typing import Any

from agent.core.dcgm_report import DiagError, DiagReport, DiagResult, DiagStatus, effective_status
from agent.core.probed import ParseError

V4_KEY, V3_KEY = "DCGM Diagnostic", "DCGM GPU Diagnostic"
ITERATIONS_KEY, OVERALL_KEY = "iterations", "Overall Result"
_WORST = (
    DiagStatus.FAIL,
    DiagStatus.UNKNOWN,
    DiagStatus.WARN,
    DiagStatus.PASS,
    DiagStatus.SKIP,
    DiagStatus.NOT_RUN,
)
_STATUS = {
    "pass": DiagStatus.PASS,
    "passed": DiagStatus.PASS,
    "fail": DiagStatus.FAIL,
    "failed": DiagStatus.FAIL,
    "warn": DiagStatus.WARN,
    "warning": DiagStatus.WARN,
    "skip": DiagStatus.SKIP,
    "skipped": DiagStatus.SKIP,
    "not run": DiagStatus.NOT_RUN,
    "not_run": DiagStatus.NOT_RUN,
    "notrun": DiagStatus.NOT_RUN,
}


def parse_dcgm_diag_json(text: str) -> DiagReport:
    """`dcgmi diag -j` stdout → DiagReport; ParseError on anything else."""
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON object in dcgmi diag output")
    try:
        doc, _end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"dcgmi diag JSON is not valid: {str(exc)[:120]}") from None
    if not isinstance(doc, dict):
        raise ParseError("dcgmi diag JSON is not an object")
    notes: list[str] = []
    if text[:start].strip():
        notes.append(f"skipped a non-JSON prefix: {text[:start].strip().splitlines()[0][:80]!r}")
    if ITERATIONS_KEY in doc:
        return _iterations(doc, notes)
    if V4_KEY in doc:
        return _parse(doc[V4_KEY], "4.x", _version4(doc), notes)
    if V3_KEY in doc:
        body = doc[V3_KEY]
        version = body.get("version") if isinstance(body, dict) else None
        return _parse(body, "3.x", version if isinstance(version, str) else None, notes)
    raise ParseError(f"neither {V4_KEY!r} nor {V3_KEY!r} in the JSON (not dcgmi diag -j output)")


def _version4(doc: dict[str, Any]) -> str | None:
    """metadata.version; a runtime-error document carries it inside the diagnostic body instead."""
    meta, body = doc.get("metadata"), doc.get(V4_KEY)
    version = meta.get("version") if isinstance(meta, dict) else None
    if version is None and isinstance(body, dict):
        version = body.get("version")
    return version if isinstance(version, str) else None


def _iterations(doc: dict[str, Any], notes: list[str]) -> DiagReport:
    """`dcgmi diag --iterations N -j`: the worst result of each (test, entity) over all iterations."""
    runs = doc[ITERATIONS_KEY]
    if not isinstance(runs, list):
        raise ParseError("dcgmi diag: iterations is not a list")
    worst: dict[tuple[str, str], DiagResult] = {}
    version, errors = None, []
    for n, run in enumerate(runs, 1):
        if not isinstance(run, dict) or V4_KEY not in run:  # an iteration that ended before any output
            notes.append(f"iteration {n} printed no diagnostic document")
            continue
        rep = _parse(run[V4_KEY], "4.x", _version4(run), notes)
        version = version or rep.version
        if rep.runtime_error:
            errors.append(f"iteration {n}: {rep.runtime_error}")
        for r in rep.results:
            old = worst.get((r.test, r.gpu))
            if old is None or _WORST.index(r.status) < _WORST.index(old.status):
                worst[(r.test, r.gpu)] = r
    overall, warning = doc.get(OVERALL_KEY), doc.get("warning")
    if isinstance(warning, str) and warning.strip():  # the run stopped on a DCGM error
        errors.append(f"{OVERALL_KEY} {overall}: {warning.strip()}")
    elif isinstance(overall, str) and overall.strip().lower() != "pass" and not worst:
        errors.append(f"{OVERALL_KEY} {overall!r} without results")
    notes.append(
        f"{len(runs)} iteration(s), {OVERALL_KEY} {overall!r}; worst result per test and entity kept"
    )
    return DiagReport(
        results=tuple(worst.values()),
        source="dcgmi diag -j (4.x)",
        version=version,
        runtime_error="; ".join(errors) or None,
        notes=tuple(notes),
    )


def _parse(body: Any, shape: str, version: str | None, notes: list[str]) -> DiagReport:
    if not isinstance(body, dict):
        raise ParseError(f"dcgmi diag {shape}: the diagnostic body is a {type(body).__name__}, not an object")
    runtime_error = body.get("runtime_error")
    runtime_error = str(runtime_error) if runtime_error not in (None, "") else None
    cats = body.get("test_categories")
    if cats is None and runtime_error is not None:
        return DiagReport(
            source=f"dcgmi diag -j ({shape})",
            version=version,
            runtime_error=runtime_error,
            notes=tuple(notes),
        )
    if not isinstance(cats, list):
        raise ParseError(f"dcgmi diag {shape}: test_categories missing or not a list")
    results: list[DiagResult] = []
    for cat in cats:
        if cat is None:
            continue
        if not isinstance(cat, dict) or not isinstance(cat.get("tests"), list):
            raise ParseError(f"dcgmi diag {shape}: a test category without a tests list")
        category = str(cat.get("category", ""))
        for test in cat["tests"]:
            if test is None:  # 3.1 prints null between tests
                continue
            results.extend(_test(test, category, shape, notes))
    return DiagReport(
        results=tuple(results),
        source=f"dcgmi diag -j ({shape})",
        version=version,
        runtime_error=runtime_error,
        notes=tuple(notes),
    )


def _test(test: Any, category: str, shape: str, notes: list[str]) -> list[DiagResult]:
    if not isinstance(test, dict) or not isinstance(test.get("name"), str):
        raise ParseError(f"dcgmi diag {shape}: a test without a name")
    name = test["name"]
    entries = test.get("results", [])
    if not isinstance(entries, list):
        raise ParseError(f"dcgmi diag {shape}: results of {name!r} is not a list")
    out: list[DiagResult] = []
    for entry in entries:
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ParseError(f"dcgmi diag {shape}: a result of {name!r} is not an object")
        status = _status(entry.get("status"), name)
        errors = _errors(entry.get("warnings")) + _errors(entry.get("errors"))
        info = _info(entry.get("info"))
        final = _judge(status, errors, name, notes)
        for gpu in _entities(entry, name):
            out.append(
                DiagResult(name, gpu, final, category, errors, info, reported=str(entry.get("status")))
            )
    summary = test.get("test_summary")
    if isinstance(summary, dict) and "status" in summary:
        sstatus = _status(summary.get("status"), name)
        bad = (DiagStatus.FAIL, DiagStatus.WARN, DiagStatus.UNKNOWN)
        if sstatus in bad and not any(r.status in bad for r in out):
            errors = _errors(summary.get("warnings")) + _errors(summary.get("errors"))
            final = _judge(sstatus, errors, name, notes)
            out.append(
                DiagResult(
                    name, "node", final, category, errors, _info(summary.get("info")), str(summary["status"])
                )
            )
    if not out:
        notes.append(f"test {name!r} lists no results")
    return out


def _status(raw: Any, test: str) -> DiagStatus:
    if raw == "":  # dcgmi's word for a result code it cannot name
        return DiagStatus.UNKNOWN
    if not isinstance(raw, str) or raw.strip().lower() not in _STATUS:
        raise ParseError(f"dcgmi diag: test {test!r} has an unknown status {raw!r}")
    return _STATUS[raw.strip().lower()]


def _judge(status: DiagStatus, errors: tuple[DiagError, ...], test: str, notes: list[str]) -> DiagStatus:
    final = effective_status(status, errors)
    if final is not status:
        why = "all errors have monitor/config severity" if status is DiagStatus.FAIL else "it carries errors"
        notes.append(f"{test}: '{status.value}' read as {final.value} ({why})")
    return final


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _errors(raw: Any) -> tuple[DiagError, ...]:
    if raw is None or raw == "":
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        if isinstance(item, str):
            if item.strip():
                out.append(DiagError(item.strip()))
        elif isinstance(item, dict):
            msg = item.get("warning", item.get("error", item.get("message", "")))
            out.append(
                DiagError(
                    str(msg).strip(),
                    _int(item.get("error_id")),
                    _int(item.get("error_category")),
                    _int(item.get("error_severity")),
                )
            )
        elif item is not None:
            raise ParseError(f"dcgmi diag: a warning is a {type(item).__name__}")
    return tuple(out)


def _info(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    return tuple(str(i) for i in items if i is not None and str(i).strip())


def _entities(entry: dict[str, Any], test: str) -> list[str]:
    """4.x: entity_group/entity_id; 3.x: gpu_ids as "0,1" or 0, gpu_id; none → "all" GPUs."""
    if "entity_id" in entry:
        eid = _int(entry["entity_id"])
        if eid is None:
            raise ParseError(f"dcgmi diag: entity_id of {test!r} is not an integer")
        group = str(entry.get("entity_group", "GPU"))
        return [str(eid)] if group.upper() == "GPU" else [f"{group.lower()}:{eid}"]
    raw = entry.get("gpu_ids", entry.get("gpu_id"))
    if raw is None or raw == "":
        return ["all"]
    if _int(raw) is not None:
        return [str(raw)]
    if isinstance(raw, str):
        ids = [p.strip() for p in raw.split(",") if p.strip()]
        if ids and all(p.isdigit() for p in ids):
            return ids
    if isinstance(raw, list) and raw and all(_int(p) is not None for p in raw):
        return [str(p) for p in raw]
    raise ParseError(f"dcgmi diag: gpu_ids of {test!r} is not a GPU id list: {raw!r}")

"""What the DCGM tiers produce: a diagnostic report and a health report (pure data, no DCGM import).

Both the live API path (agent/dcgm/diag.py, health.py) and the snapshot path (`dcgmi diag -j` in
dcgm-diag.json) produce these, so the checks judge one shape.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from agent.core.probed import ProbeError

# dcgm_errors.py severities (dcgmErrorSeverity_t) and the one category we downgrade on.
DCGM_ERROR_NONE, DCGM_ERROR_MONITOR, DCGM_ERROR_ISOLATE, DCGM_ERROR_UNKNOWN = 0, 1, 2, 3
DCGM_ERROR_TRIAGE, DCGM_ERROR_CONFIG, DCGM_ERROR_RESET = 4, 5, 6
DCGM_FR_EC_SOFTWARE_CONFIG = 3


class DiagStatus(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"
    NOT_RUN = "not-run"
    UNKNOWN = "unknown"  # no status the tool could name (dcgmi prints "" for an unknown result code)


@dataclass(frozen=True)
class DiagError:
    """One error/warning of a test; code/category/severity: DCGM_FR_* / DCGM_FR_EC_* / DCGM_ERROR_*."""

    message: str
    code: int | None = None
    category: int | None = None
    severity: int | None = None


def is_warning(err: DiagError) -> bool:
    """An error that only asks for monitoring or a config change (dcgm.md §2.4)."""
    return err.severity in (DCGM_ERROR_MONITOR, DCGM_ERROR_CONFIG) or (
        err.severity is None and err.category == DCGM_FR_EC_SOFTWARE_CONFIG
    )


def effective_status(status: DiagStatus, errors: tuple[DiagError, ...]) -> DiagStatus:
    """FAIL with only warning-class errors → WARN (dcgmi -j prints WARN as Fail); PASS with errors → WARN
    (DCGM#284: memory PASS while reporting DCGM_FR_MEMORY_ALLOC)."""
    if status is DiagStatus.FAIL and errors and all(is_warning(e) for e in errors):
        return DiagStatus.WARN
    if status is DiagStatus.PASS and errors:
        return DiagStatus.WARN
    return status


@dataclass(frozen=True)
class DiagResult:
    """One test's verdict for one entity. gpu is the DCGM GPU id as text, or "all" (3.x results
    without gpu_ids, which cover every GPU) or "node" (errors not tied to a GPU).

    `reported` keeps what the tool said before any WARN downgrade ("Fail" for a -j WARN)."""

    test: str
    gpu: str
    status: DiagStatus
    category: str = ""
    errors: tuple[DiagError, ...] = ()
    info: tuple[str, ...] = ()
    reported: str = ""


@dataclass(frozen=True)
class DiagReport:
    """One diagnostic run. runtime_error: the run itself failed (then results may be empty).

    source: "dcgmi diag -j (3.x)", "dcgmi diag -j (4.x)" or "DCGM API"."""

    results: tuple[DiagResult, ...] = ()
    source: str = ""
    version: str | None = None
    level: int | None = None
    runtime_error: str | None = None
    finished_at: float | None = None  # wall clock (time.time()) of the end of the run, when known
    notes: tuple[str, ...] = ()  # how the parser read the document (downgrades, degraded input)
    # A diag since this one was aborted for work (in words, with when it runs again): not run, so
    # this report's verdict stays in force (kept_after_abort).
    aborted: str = ""
    completed: bool = True  # False: no diag completed yet, only `aborted` to say (check: skipped)

    def gpus(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.gpu for r in self.results if r.gpu not in ("all", "node")))


def kept_after_abort(latest: Any, why: str) -> Any:
    """The dcgm-diag input once a diag was aborted for work (a pod arrived): that diag did not run,
    so the last completed report stays in force, saying *why* (and when it runs again); with none
    completed yet, a report that holds only that. The result of a diag that could not run for
    another reason (a ProbeError: the engine lost, past its timeout) stays: we still could not look."""
    if isinstance(latest, DiagReport):
        return replace(latest, aborted=why)
    if isinstance(latest, ProbeError):
        return latest
    return DiagReport(source="DCGM API", aborted=why, completed=False)


@dataclass(frozen=True)
class HealthIncident:
    """One DCGM health incident: system bit (DCGM_HEALTH_WATCH_*), health 10 WARN / 20 FAIL,
    DCGM_FR_* code, entity (group id 1 = GPU, 3 = NVSwitch)."""

    system: int
    health: int
    code: int
    message: str
    entity_group: int = 1
    entity_id: int = 0


@dataclass(frozen=True)
class WatchedGpu:
    """A GPU the engine's health watches cover: its DCGM GPU id and, where the engine named it
    (dcgmGetDeviceAttributes), its PCI address. The id need not be the NVML index: an engine whose
    container sees a subset of the GPUs numbers that subset from 0."""

    id: int
    pci_bus_id: str = ""


@dataclass(frozen=True)
class HealthReport:
    """One dcgmHealthCheck answer (overall 0 PASS / 10 WARN / 20 FAIL) plus facts the table needs.

    gpus_watched: the GPUs our health group holds (the engine's supported GPUs when the watches were
    set); None where the report does not say (then its coverage is not judged)."""

    overall: int = 0
    incidents: tuple[HealthIncident, ...] = ()
    single_node_nvswitch: bool = False  # NVSwitch system without a multi-node NVLink domain (IMEX is noise)
    polled_at: float | None = None
    engine: str = ""  # the address we read it from
    engines_on_node: tuple[str, ...] | None = None  # DCGM engines seen in this node's pods; None = not looked
    gpus_watched: tuple[WatchedGpu, ...] | None = None

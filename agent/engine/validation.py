"""Validate before service (docs/guides/validate-before-service.md): a new node, a rebooted one, or one whose
latched fault an operator cleared takes no workload until it has passed. The startup taint
`<prefix>/validating:NoSchedule` (Keys.validating) says so; the kubelet's --register-with-taints,
Karpenter's NodePool startupTaints or this agent (node.validate.addTaint) puts it on, and only this
agent lifts it, after a complete pass since the last reset (the agent's start, a clear, a new boot, or
the taint back on the Node after it was lifted: Karpenter's registration, or an operator asking again):

- every scheduled tier (one with a check switched on) ran, and in one run every check of it was pass,
  warn or skipped (not applicable): a tier that could not look (unknown) has not passed;
- where a DCGM engine runs and dcgm-diag is on, a diag at node.validate.diagLevel or deeper finished
  after the reset and passed (its level unknown, or older than the reset, does not count);
- the verdict now is pass or warn, and our failure taint is not wanted (a failing node keeps both);
- on a node where NVIDIA's DRA driver is expected, it has published the GPUs (engine/driver_wait.py).

Pure: the engine hands in what each tier found and the verdict, and asks what the Marks say about the
taint (Marks.validating). Once validated nothing changes until the next reset, so a validated node in
steady state costs no write.

While the Node carries the taint and has not passed, the agent says since when and what it waits for
(the results annotation's `validating`, the metrics gpu_healthcheck_validating_seconds and
gpu_healthcheck_validating_waiting_for, alert GPUHealthcheckValidationStuck): since the Node's
creation on a Node never validated (its registration put the taint on), else since the agent first
saw it there; an agent restarted in the same boot takes the time back from the annotation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from agent.checks.registry import CHECKS
from agent.config import Config
from agent.core.dcgm_report import DiagReport
from agent.core.facts import Input
from agent.core.findings import CheckResult
from agent.core.marks import NodeEvent
from agent.core.node import NodeObject
from agent.core.node_keys import MODE_TAINT, VALIDATING_EFFECT, WARNING, EventReason, Keys
from agent.core.results_doc import VALIDATING_FIELD, now_iso
from agent.core.severity import Status
from agent.engine.driver_wait import DRA_DRIVER, DriverWait, Waiting, wait
from agent.engine.side_step import SideStep

log = logging.getLogger("gpu-healthcheck.engine")

DIAG_TIER = DIAG_CHECK = "dcgm-diag"
PASSING = (Status.PASS, Status.WARN, Status.SKIPPED)  # a tier run that found nothing wrong
# Why the last reset happened (the Events say "since the <why>").
START, CLEAR, REBOOT, BACK = "agent's start", "clear", "reboot", "taint's return"
A_PASS = "pass"  # what a node waits for once every tier ran: a passing verdict (no failure taint)
DRIVER_FIELD = "driver"  # the results annotation's validating.driver: the DRA driver wait, said
DRIVER_TIMEOUT_FIELD = "driverTimedOut"  # ... past its bound (its Event is out)


def tier_passed(results: Iterable[CheckResult]) -> bool:
    """One run of a tier found nothing wrong and could look: no fail, no unknown."""
    return all(r.status in PASSING for r in results)


def diag_passed(report: Any, results: Iterable[CheckResult], level: int, since: float) -> bool:
    """A diag at *level* or deeper that finished at or after *since* (wall seconds) and passed."""
    if not isinstance(report, DiagReport) or report.level is None or report.level < level:
        return False
    if report.finished_at is not None and report.finished_at < since:
        return False
    return any(r.name == DIAG_CHECK and r.status in (Status.PASS, Status.WARN) for r in results)


@dataclass
class Validation:
    """The progress of one validation (see the module docstring)."""

    reset_at: float = 0.0  # wall seconds of the last reset
    why: str = START
    needed: bool = True  # not validated in this boot: addTaint puts the taint on
    passed: set[str] = field(default_factory=set)  # tiers that passed since the reset
    diag_ok: bool = False  # the DCGM diag the pass needs, since the reset
    complete: bool = False
    record: dict[str, Any] | None = None  # {"bootId", "at"}: the last complete pass (results annotation)
    landed: bool = False  # the taint was on the Node since the reset (an add landed)
    announced: bool = False  # the ValidationStarted Event of this reset is out
    gone: bool = False  # validated, and the Node was seen without the taint since
    since: float | None = None  # wall seconds: the Node carries the taint, not yet passed, since then
    waiting: tuple[str, ...] = ()  # what the pass waits for meanwhile (tiers, dcgm-diag, dra-driver, A_PASS)
    driver: DriverWait = field(default_factory=DriverWait)  # NVIDIA's DRA driver's publication

    # ------------------------------------------------------------------ resets

    def restore(self, doc: Mapping[str, Any] | None, boot_id: str | None, field_name: str) -> None:
        """At start: validated in this boot already (an agent restart) needs no added taint."""
        kept = (doc or {}).get(field_name)
        self.record = dict(kept) if isinstance(kept, dict) else None
        self.needed = not (bool(boot_id) and self.record is not None and self.record.get("bootId") == boot_id)
        carried = (doc or {}).get(VALIDATING_FIELD)
        if isinstance(carried, Mapping) and boot_id and carried.get("bootId") == boot_id:
            self.since = wall_seconds(carried.get("since"))
            self.driver.announced = bool(carried.get(DRIVER_TIMEOUT_FIELD))  # its Event is out

    def document(self, boot_id: str | None) -> dict[str, Any] | None:
        """The results annotation's `validating` while the Node waits for its pass (None otherwise)."""
        if self.since is None:
            return None
        at = datetime.fromtimestamp(int(self.since), timezone.utc).isoformat().replace("+00:00", "Z")
        doc: dict[str, Any] = {"since": at, "bootId": boot_id, "waitingFor": list(self.waiting)}
        if self.driver.said:
            doc[DRIVER_FIELD] = self.driver.said
            if self.driver.timed_out:
                doc[DRIVER_TIMEOUT_FIELD] = True
        return doc

    def carried(self, on_node: bool, created: str | None, now: float) -> None:
        """Keep `since` and `waiting` in step with the Node: set at first sight of the taint (the Node's
        creation on a Node never validated: its registration put the taint on), cleared once passed
        or gone."""
        if not on_node or self.complete:
            self.since, self.waiting = None, ()
        elif self.since is None:
            born = wall_seconds(created) if self.record is None else None
            self.since = min(now, born) if born is not None else now

    def reset(self, now: float, why: str) -> None:
        """Start over: a clear, or a new boot seen while running."""
        self.reset_at, self.why = now, why
        self.needed, self.passed, self.diag_ok, self.complete = True, set(), False, False
        self.landed = self.announced = self.gone = False
        self.driver.reset()

    # ------------------------------------------------------------------ progress

    def ran(
        self, tier: str, results: list[CheckResult], inputs: Mapping[Input, Any], diag_level: int
    ) -> None:
        """One run of *tier* and what it found."""
        if tier_passed(results):
            self.passed.add(tier)
        if tier == DIAG_TIER and diag_passed(inputs.get(Input.DCGM_DIAG), results, diag_level, self.reset_at):
            self.diag_ok = True

    def missing(self, tiers: Collection[str], diag_needed: bool, driver: bool = False) -> list[str]:
        """What a complete pass still waits for: tiers, the diag, NVIDIA's DRA driver (*driver*)."""
        out = sorted(t for t in tiers if t not in self.passed)
        if diag_needed and not self.diag_ok and DIAG_TIER not in out:
            out.append(DIAG_TIER)
        if driver:
            out.append(DRA_DRIVER)
        return out

    def settle(
        self,
        tiers: Collection[str],
        diag_needed: bool,
        status: Status,
        failure_taint: bool,
        boot_id: str | None,
        stamp: str,
        driver: bool = False,
    ) -> bool:
        """After a verdict: True when this one completes the pass (first time since the reset)."""
        if self.complete:
            return False
        waits = self.missing(tiers, diag_needed, driver)
        if waits or status not in (Status.PASS, Status.WARN) or failure_taint:
            return False
        self.complete, self.needed = True, False
        if self.record is None or self.record.get("bootId") != boot_id or self.why != START:
            self.record = {"bootId": boot_id, "at": stamp}
        return True

    def wish(self, add_taint: bool, on_node: bool) -> bool | None:
        """Marks.validating: lift it once validated, put it on while needed (addTaint) until it has
        landed, else leave it as it is."""
        self.landed |= on_node
        self.gone |= self.complete and not on_node
        if self.complete:
            return False
        if add_taint and self.needed and not self.landed:
            return True
        return None


def wall_seconds(text: Any) -> float | None:
    """An RFC 3339 time as wall seconds (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)).timestamp()


class Engine(Protocol):
    """What step() reads of the engine (engine/engine.py)."""

    validation: Validation
    cfg: Config
    inputs: dict[Input, Any]
    extra_inputs: dict[Input, Callable[[], Any]]
    wall: Callable[[], float]

    @property
    def boot_id(self) -> str | None: ...

    def validate_again(self, why: str) -> None: ...


def step(engine: Engine, node: Any, status: Status, failure_taint: bool) -> SideStep:
    """One verdict's step (the engine's evaluate). *node*: the Node as the engine reads it (a
    NodeObject, or why not); *failure_taint*: our failure taint is wanted (failing or recovering).
    The diag is needed where the agent runs DCGM diags on an engine (the live DCGM tiers) or a
    diag report came; the taint back on the Node after it was lifted starts over."""
    v, cfg, inputs = engine.validation, engine.cfg, engine.inputs
    diag_wired = Input.DCGM_DIAG in engine.extra_inputs
    policy = cfg.node.validate
    key = Keys(cfg.prefix).validating
    on_node = isinstance(node, NodeObject) and key in node.taint_keys
    if on_node and v.complete and v.gone:
        engine.validate_again(BACK)
    tiers = {s.tier for s in CHECKS if cfg.enabled(s.name)}
    diag_needed = cfg.enabled(DIAG_CHECK) and (
        diag_wired or isinstance(inputs.get(Input.DCGM_DIAG), DiagReport)
    )
    add = policy.add_taint and cfg.node.mode == MODE_TAINT
    driver = Waiting()
    if not v.complete and (on_node or (add and v.needed)):
        gpus_dra = (inputs.get(Input.GPUS), inputs.get(Input.DRA))
        driver = wait(v.driver, policy, node, gpus_dra, engine.wall(), v.since, key)
    events: list[NodeEvent] = []
    if driver.announce:
        log.warning(driver.timeout)
        events.append(NodeEvent(EventReason.VALIDATION_DRIVER_TIMEOUT, driver.timeout, WARNING))
    passed = v.settle(tiers, diag_needed, status, failure_taint, engine.boot_id, now_iso(), driver.waiting)
    if passed and on_node:
        diag = f" and a DCGM diag at level {policy.diag_level}" if diag_needed else ""
        events.append(
            NodeEvent(
                EventReason.VALIDATION_PASSED,
                f"passed every tier ({', '.join(sorted(tiers))}){diag} since the {v.why}: "
                f"lifting the taint {key}",
            )
        )
    wish = v.wish(add, on_node)
    if wish and not v.announced:
        v.announced = True
        events.append(
            NodeEvent(
                EventReason.VALIDATION_STARTED,
                f"not validated since the {v.why}: adding the taint {key}:{VALIDATING_EFFECT} "
                "until every check has passed (node.validate.addTaint)",
            )
        )
    note = ""
    v.carried(on_node, node.created if isinstance(node, NodeObject) else None, engine.wall())
    if on_node and not v.complete:
        waits = v.missing(tiers, diag_needed, driver.waiting)
        v.waiting = tuple(waits) or (A_PASS,)
        said = [driver.note if w == DRA_DRIVER else w for w in waits]
        note = f"validating: waiting for {', '.join(said)}" if waits else "validating: waiting for a pass"
        if driver.timeout:
            note += f" (past node.validate.driverTimeoutSeconds {policy.driver_timeout_seconds:g} s)"
    else:
        v.driver.said = ""
    return SideStep(validating=wish, events=tuple(events), note=note)


__all__ = [
    "A_PASS",
    "BACK",
    "CLEAR",
    "REBOOT",
    "START",
    "Validation",
    "diag_passed",
    "step",
    "tier_passed",
    "wall_seconds",
]

"""What checks return (findings grouped into one result per check) and the node verdict over them."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from agent.core.actions import Action, Recommendation, recommend
from agent.core.kernel import LinePos
from agent.core.probed import SourceLine
from agent.core.severity import Severity, Status


@dataclass(frozen=True)
class Evidence:
    """What a finding rests on: the input (a tool: "nvidia-smi -q"), the line in its output (1-based;
    None when the tool's output has no lines to point at, e.g. NVML) and that line's text."""

    source: str
    line: int | None
    text: str

    @staticmethod
    def of(source: str, lines: tuple[SourceLine, ...]) -> tuple[Evidence, ...]:
        return tuple(Evidence(source, sl.line, sl.text) for sl in lines)


@dataclass(frozen=True)
class Finding:
    """One thing wrong. `rule` names the severity knob in config (e.g. "gpu.ecc.dram-uncorrectable").

    `key` identifies the finding across cycles (dedup and latching), e.g. "xid/79/0000:53:00.0".
    Latched findings (Xid, DCGM diag) stay until their cause is gone; others are re-judged each cycle.
    """

    check: str
    rule: str
    severity: Severity
    message: str
    entities: tuple[str, ...] = ()
    key: str = ""
    latched: bool = False
    # Where the input states it (`check --explain`); not part of the finding's identity.
    evidence: tuple[Evidence, ...] = field(default=(), compare=False)
    action: Action | None = None  # the step its check names (an Xid's NVIDIA bucket); None: by severity
    rate: str = field(default="", compare=False)  # a trend warning's rate ("1440/h", "+2 in 3.0 h")
    # What only new evidence changes (an Xid's count and line), where the message also carries
    # words that change without it (the GPU's label, known only while nvidia-smi answers): a finding
    # an operator cleared stays hidden while this is the same. "" = the message.
    evidence_key: str = field(default="", compare=False)
    # The newest kernel-log line its evidence rests on (an Xid's): what a persisted clear compares
    # (core/clear_cover.py). None: not kernel-log evidence.
    last_line: LinePos | None = field(default=None, compare=False)

    @property
    def seen(self) -> str:
        """The evidence a clear hides: evidence_key, else the message."""
        return self.evidence_key or self.message

    @property
    def recommendation(self) -> Recommendation:
        """What to do next, and after that (core/actions.py)."""
        return recommend(self.severity, self.action)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check. `unknown` means "we could not look", never "the GPU is broken".
    Immutable: its severity, status and message are worked out once (the engine reads them on every
    verdict, the metrics and the annotation again)."""

    name: str
    findings: tuple[Finding, ...] = ()
    unknown: str | None = None  # reason we could not look
    skipped: str | None = None  # reason the check does not apply / input not captured
    note: str = ""  # a short pass message ("8 GPUs, ECC clean")
    duration_ms: float = 0.0

    @cached_property
    def severity(self) -> Severity:
        return max((f.severity for f in self.findings), default=Severity.NONE)

    @cached_property
    def status(self) -> Status:
        """fail beats unknown beats warn: "could not look" must never hide behind a warning."""
        sev = self.severity
        if sev >= Severity.RESET:
            return Status.FAIL
        if self.unknown is not None:
            return Status.UNKNOWN
        if sev == Severity.MONITOR:
            return Status.WARN
        if self.skipped is not None and not self.findings:
            return Status.SKIPPED
        return Status.PASS

    @cached_property
    def message(self) -> str:
        if self.findings:
            shown = [f.message for f in self.findings if f.severity > Severity.NONE] or [
                f.message for f in self.findings
            ]
            extra = f" (+{len(shown) - 5} more)" if len(shown) > 5 else ""
            if self.unknown is not None and self.status is Status.UNKNOWN:
                # Warnings from the readable part of a capture: the reason it is unknown comes first.
                return f"{self.unknown}; {'; '.join(shown[:5])}{extra}"
            return "; ".join(shown[:5]) + extra
        if self.unknown is not None:
            return self.unknown
        if self.skipped is not None:
            return self.skipped
        return self.note or "ok"

    def all_entities(self) -> tuple[str, ...]:
        """The GPUs / devices named by the findings, in order, once each."""
        seen: dict[str, None] = {}
        for f in self.findings:
            seen.update(dict.fromkeys(f.entities))
        return tuple(seen)


@dataclass(frozen=True)
class Verdict:
    status: Status
    severity: Severity
    results: tuple[CheckResult, ...]

    @property
    def worst(self) -> Finding | None:
        findings = [f for r in self.results for f in r.findings]
        return max(findings, key=lambda f: f.severity, default=None)

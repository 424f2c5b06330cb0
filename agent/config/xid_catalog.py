"""The Xid catalog: code → severity, loaded from config/xid-catalog.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.severity import Severity


@dataclass(frozen=True)
class XidEntry:
    code: int
    name: str
    severity: Severity
    nvidia_action: str = ""  # NVIDIA's resolution bucket (RESTART_APP, RESET_GPU, ...)
    note: str = ""
    storm: Severity | None = None  # the severity once the code's rate reaches stormPerMinute on one GPU


@dataclass(frozen=True)
class XidCatalog:
    entries: dict[int, XidEntry] = field(default_factory=dict)
    unknown_severity: Severity = Severity.MONITOR
    storm_per_minute: float = 600.0

    def severity(self, code: int) -> Severity:
        entry = self.entries.get(code)
        return entry.severity if entry else self.unknown_severity

    def storm(self, code: int) -> Severity | None:
        entry = self.entries.get(code)
        return entry.storm if entry else None

    def name(self, code: int) -> str:
        entry = self.entries.get(code)
        return entry.name if entry else "UNKNOWN"


def parse_catalog(doc: Any, nvlink: Severity = Severity.RESET) -> XidCatalog:
    """Validate the catalog YAML. Entries whose severity is `nvlink` take the configured NVLink default."""
    if not isinstance(doc, Mapping):
        raise ValueError("xid-catalog: expected a mapping with 'codes'")
    unknown = set(doc) - {"version", "unknownSeverity", "stormPerMinute", "codes"}
    if unknown:
        raise ValueError(f"xid-catalog: unknown key(s) {sorted(unknown)}")
    codes = doc.get("codes")
    if not isinstance(codes, Mapping) or not codes:
        raise ValueError("xid-catalog: 'codes' must be a non-empty mapping of Xid code to entry")
    entries: dict[int, XidEntry] = {}
    for code, body in codes.items():
        where = f"xid-catalog: codes.{code}"
        if not isinstance(code, int) or isinstance(code, bool):
            raise ValueError(f"{where}: Xid codes are integers")
        if not isinstance(body, Mapping):
            raise ValueError(f"{where}: must be a mapping")
        extra = set(body) - {"name", "severity", "nvidia", "note", "storm"}
        if extra:
            raise ValueError(f"{where}: unknown key(s) {sorted(extra)}")
        sev_text = str(body.get("severity", ""))
        sev = nvlink if sev_text == "nvlink" else Severity.parse(sev_text)
        entries[code] = XidEntry(
            code=code,
            name=str(body.get("name", "")),
            severity=sev,
            nvidia_action=str(body.get("nvidia", "")),
            note=str(body.get("note", "")),
            storm=Severity.parse(str(body["storm"])) if "storm" in body else None,
        )
    storm = doc.get("stormPerMinute", 600)
    if isinstance(storm, bool) or not isinstance(storm, (int, float)) or storm <= 0:
        raise ValueError(f"xid-catalog: stormPerMinute must be a positive number, not {storm!r}")
    return XidCatalog(
        entries=entries,
        unknown_severity=Severity.parse(str(doc.get("unknownSeverity", "monitor"))),
        storm_per_minute=float(storm),
    )

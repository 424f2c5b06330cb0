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
class Nvlink5Row:
    """One row of NVIDIA's "Xid 144-150 Decode" sheet."""

    code: int
    mnemonic: str
    intr_v1: str  # IntrInfo bits, most significant first, "-" = any (drivers < R575)
    intr_v2: str  # the same for drivers >= R575
    error_status: tuple[int, ...]  # any of these; () = any
    bucket: str  # RESET_GPU, IGNORE, XID_154_EVAL
    nvidia_severity: str  # "Fatal", "Link Fatal", "Non-fatal", ...

    def matches(self, intr: int, status: int, v2: bool) -> bool:
        if self.error_status and status not in self.error_status:
            return False
        pattern = self.intr_v2 if v2 else self.intr_v1
        bits = format(intr & 0xFFFFFFFF, "032b")[-len(pattern) :]
        return all(p in ("-", b) for p, b in zip(pattern, bits, strict=True))


@dataclass(frozen=True)
class XidCatalog:
    entries: dict[int, XidEntry] = field(default_factory=dict)
    unknown_severity: Severity = Severity.MONITOR
    storm_per_minute: float = 600.0
    nvlink5: tuple[Nvlink5Row, ...] = ()

    def decode_nvlink5(
        self, code: int, intr: int, status: int, driver_major: int | None
    ) -> Nvlink5Row | None:
        """The sheet's row for an NVLink5 line: by the driver's table when its version is known,
        else V1 (NVIDIA's fallback too) and then V2."""
        tables = (driver_major >= 575,) if driver_major is not None else (False, True)
        for v2 in tables:
            for row in self.nvlink5:
                if row.code == code and row.matches(intr, status, v2):
                    return row
        return None

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
    unknown = set(doc) - {"version", "unknownSeverity", "stormPerMinute", "nvlink5Decode", "codes"}
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
        nvlink5=_nvlink5_rows(doc.get("nvlink5Decode") or []),
        entries=entries,
        unknown_severity=Severity.parse(str(doc.get("unknownSeverity", "monitor"))),
        storm_per_minute=float(storm),
    )


def _nvlink5_rows(rows: Any) -> tuple[Nvlink5Row, ...]:
    if not isinstance(rows, list):
        raise ValueError("xid-catalog: nvlink5Decode must be a list of rows")
    out = []
    for i, row in enumerate(rows):
        where = f"xid-catalog: nvlink5Decode[{i}]"
        if not isinstance(row, list) or len(row) != 7:
            raise ValueError(f"{where}: [code, mnemonic, V1 bits, V2 bits, ErrorStatus, bucket, severity]")
        code, mnemonic, v1, v2, status, bucket, severity = row
        if not isinstance(code, int) or not 144 <= code <= 150:
            raise ValueError(f"{where}: the code must be 144-150")
        for bits in (v1, v2):
            if not isinstance(bits, str) or not bits or set(bits) - set("01-") or len(bits) > 32:
                raise ValueError(f"{where}: IntrInfo patterns are up to 32 of 0, 1 and -")
        try:  # "0x00000002", "0x00000000/0xFFFFFFFF" (either), "" (any)
            error_status = tuple(int(h, 16) for h in str(status).split("/") if h.strip())
        except ValueError:
            raise ValueError(f"{where}: ErrorStatus must be hex or empty, not {status!r}") from None
        out.append(Nvlink5Row(code, str(mnemonic), v1, v2, error_status, str(bucket), str(severity)))
    return tuple(out)

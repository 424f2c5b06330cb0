"""The shipped, overridable DCGM health incident table (config/dcgm-incidents.yaml): system + code → severity.

Parsed by the config loader into Config.dcgm_incidents (validated and reloaded with the ConfigMap), so
the health check stays pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.severity import Severity

FILE = "dcgm-incidents.yaml"
SINGLE_NODE_NVSWITCH = "single-node-nvswitch"
# DCGM_HEALTH_WATCH_* bits (dcgm_structs.py); "all" = DCGM_HEALTH_WATCH_ALL.
SYSTEMS: dict[str, int] = {
    "pcie": 0x1,
    "nvlink": 0x2,
    "pmu": 0x4,
    "mcu": 0x8,
    "mem": 0x10,
    "sm": 0x20,
    "inforom": 0x40,
    "thermal": 0x80,
    "power": 0x100,
    "driver": 0x200,
    "nvswitch-nonfatal": 0x400,
    "nvswitch-fatal": 0x800,
    "connectx": 0x1000,
    "all": 0xFFFFFFFF,
}
SYSTEM_NAMES = {v: k for k, v in SYSTEMS.items()}


def system_name(bit: int) -> str:
    return SYSTEM_NAMES.get(bit, f"0x{bit:x}")


@dataclass(frozen=True)
class IncidentRule:
    system: str  # a SYSTEMS name or "*"
    code: int
    name: str
    severity: Severity
    ignore_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class IncidentTable:
    rules: dict[tuple[str, int], IncidentRule] = field(default_factory=dict)

    def lookup(self, system: int, code: int) -> IncidentRule | None:
        return self.rules.get((system_name(system), code)) or self.rules.get(("*", code))

    def with_overrides(self, overrides: Mapping[str, str]) -> IncidentTable:
        """Apply config.yaml dcgm.incidentOverrides {"<system>/<code>": severity}."""
        rules = dict(self.rules)
        for key, sev in overrides.items():
            system, _, code = str(key).partition("/")
            if not code.strip().isdigit() or (system not in SYSTEMS and system != "*"):
                raise ValueError(f"dcgm.incidentOverrides.{key}: expected '<system>/<code>' (e.g. pcie/3)")
            k = (system, int(code))
            old = rules.get(k)
            rules[k] = IncidentRule(
                system,
                int(code),
                old.name if old else f"DCGM_FR_{code}",
                Severity.parse(sev),
                old.ignore_on if old else (),
            )
        return IncidentTable(rules)


def parse_incident_table(doc: Any) -> IncidentTable:
    """Validate the YAML document; ValueError names the bad row."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("incidents"), list):
        raise ValueError(f"{FILE}: expected a mapping with an 'incidents' list")
    rules: dict[tuple[str, int], IncidentRule] = {}
    for i, row in enumerate(doc["incidents"]):
        where = f"{FILE}: incidents[{i}]"
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: expected a mapping")
        system, code = str(row.get("system", "")), row.get("code")
        if system not in SYSTEMS and system != "*":
            raise ValueError(f"{where}: unknown system {system!r} (one of {', '.join(SYSTEMS)}, *)")
        if not isinstance(code, int) or isinstance(code, bool) or code < 0:
            raise ValueError(f"{where}: code must be a DCGM_FR_* number")
        ignore = row.get("ignoreOn", ())
        ignore_on = (ignore,) if isinstance(ignore, str) else tuple(str(x) for x in ignore or ())
        unknown = [x for x in ignore_on if x != SINGLE_NODE_NVSWITCH]
        if unknown:
            raise ValueError(f"{where}: unknown ignoreOn {unknown} (allowed: {SINGLE_NODE_NVSWITCH})")
        rules[(system, code)] = IncidentRule(
            system,
            code,
            str(row.get("name", f"DCGM_FR_{code}")),
            Severity.parse(str(row.get("severity"))),
            ignore_on,
        )
    return IncidentTable(rules)

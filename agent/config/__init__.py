"""Configuration: defaults in config/config.yaml, validated strictly (unknown keys are errors).

A config directory holds the CONFIG_FILES (the ConfigMap mounted as a directory). A file it lacks
falls back to the shipped one, read as package data (agent/config/defaults links to config/), so an
installed package finds its tables without a source checkout. load_config_dir() returns a Config or
raises ConfigError saying what is wrong; checks read every table through the Config, no file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from agent.config import settings
from agent.config.dcgm_incidents import IncidentTable, parse_incident_table
from agent.config.profiles import parse_profiles
from agent.config.xid_catalog import XidCatalog, parse_catalog
from agent.core.contract import (
    DEFAULT_CONDITION_TYPE,
    DEFAULT_GPU_NODE_SELECTOR,
    DEFAULT_PREFIX,
    DEFAULT_TAINT_EFFECT,
)
from agent.core.profile import InstanceProfile
from agent.core.rules import Rule, RuleBook
from agent.core.severity import Severity

CONFIG_ENV = "GPU_HEALTHCHECK_CONFIG_DIR"
SHIPPED: Traversable = resources.files("agent.config") / "defaults"
CONFIG_YAML, PROFILES_YAML, XID_CATALOG_YAML, DCGM_INCIDENTS_YAML = (
    "config.yaml",
    "instance-profiles.yaml",
    "xid-catalog.yaml",
    "dcgm-incidents.yaml",
)
CONFIG_FILES = (CONFIG_YAML, PROFILES_YAML, XID_CATALOG_YAML, DCGM_INCIDENTS_YAML)


class ConfigError(ValueError):
    """An invalid config file; the message names the file and the key."""


@dataclass(frozen=True)
class Spec:
    """A leaf of the schema: type, default and range."""

    typ: type | tuple[type, ...]
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None


def _num(default: float, lo: float | None = None, hi: float | None = None) -> Spec:
    return Spec((int, float), default, lo, hi)


# The schema of config.yaml. Nested dicts are sections; Spec is a leaf; "*" maps free-form keys.
SCHEMA: dict[str, Any] = {
    "prefix": Spec(str, DEFAULT_PREFIX),
    "instanceType": Spec(str, ""),
    "intervals": {
        "gpu": _num(60, 1, 86400),
        "efa": _num(300, 1, 86400),
        "topology": _num(300, 1, 86400),
        "dcgmHealth": _num(60, 1, 86400),
        "dcgmDiag": _num(21600, 60, 7 * 86400),
    },
    "jitterFraction": _num(0.1, 0, 0.5),
    "timeouts": {
        "nvidiaSmi": _num(30, 1, 600),
        "nvml": _num(30, 1, 600),
        "check": _num(60, 1, 3600),
    },
    "checks": {"*": Spec(bool, True)},  # check name → on/off; every check is on unless switched off
    "severities": {"*": Spec(str, None, choices=tuple(s.label for s in Severity))},
    "thresholds": {
        "retiredPagesSingleBitMax": _num(60, 0, 10**6),
        "efaCounterRatePerSec": {
            "rx_drops": _num(10, 0),
            "retrans_timeout_events": _num(1, 0),
            "unresponsive_remote_events": _num(1, 0),
            "impaired_remote_conn_events": _num(1, 0),
        },
    },
    "node": {
        "recoverAfter": _num(3, 1, 1000),
        "taintEffect": Spec(
            str, DEFAULT_TAINT_EFFECT, choices=("NoSchedule", "PreferNoSchedule", "NoExecute")
        ),
        "conditionType": Spec(str, DEFAULT_CONDITION_TYPE),
        "maxTaintedFraction": _num(0.2, 0, 1),
        "maxTaintedNodes": _num(0, 0, 10**6),
        "gpuNodeSelector": Spec(str, DEFAULT_GPU_NODE_SELECTOR),
    },
    "metrics": {"port": _num(9402, 0, 65535)},
    "configPollSeconds": _num(2, 0.1, 300),
    "dcgm": {
        "address": Spec(str, "nvidia-dcgm.gpu-healthcheck.svc:5555"),
        "connectTimeout": _num(5, 0.1, 300),
        "graceSeconds": _num(120, 0, 86400),
        "diagLevel": Spec(int, 2, 1, 4),
        "diagTimeout": _num(900, 30, 86400),
        "heartbeatSeconds": _num(60, 1, 600),
        "incidentOverrides": {"*": Spec(str, None, choices=tuple(s.label for s in Severity))},
    },
    "xid": {
        "overrides": {"*": Spec(str, None, choices=tuple(s.label for s in Severity))},
        "nvlinkSeverity": Spec(str, "reset", choices=("monitor", "reset", "reboot", "isolate")),
    },
}


@dataclass(frozen=True)
class Config:
    raw: dict[str, Any]
    profiles: dict[str, InstanceProfile] = field(default_factory=dict)
    xid_catalog: XidCatalog = field(default_factory=XidCatalog)
    severity_overrides: dict[str, Severity] = field(default_factory=dict)
    dcgm_incidents: IncidentTable = field(default_factory=IncidentTable)  # with dcgm.incidentOverrides

    def severity(self, rule: Rule) -> Severity:
        """The configured severity of a rule (`severities:`), else its default."""
        return self.severity_overrides.get(rule.name, rule.severity)

    def enabled(self, check: str) -> bool:
        return bool(self.raw["checks"].get(check, True))

    def get(self, dotted: str) -> Any:
        """A raw value by its config.yaml path (for tests and tools; the agent reads the typed views)."""
        node: Any = self.raw
        for part in dotted.split("."):
            node = node[part]
        return node

    # Typed views of the sections (config/settings.py); computed once per Config.
    @functools.cached_property
    def intervals(self) -> settings.Intervals:
        return settings.intervals(self.raw)

    @functools.cached_property
    def timeouts(self) -> settings.Timeouts:
        return settings.timeouts(self.raw)

    @functools.cached_property
    def thresholds(self) -> settings.Thresholds:
        return settings.thresholds(self.raw)

    @functools.cached_property
    def node(self) -> settings.NodeSettings:
        return settings.node_settings(self.raw)

    @functools.cached_property
    def dcgm(self) -> settings.DcgmSettings:
        return settings.dcgm_settings(self.raw)

    @property
    def prefix(self) -> str:
        return str(self.raw["prefix"])

    @property
    def instance_type(self) -> str:
        """The configured override ("" = none)."""
        return str(self.raw["instanceType"] or "")

    @property
    def jitter_fraction(self) -> float:
        return float(self.raw["jitterFraction"])

    @property
    def config_poll_seconds(self) -> float:
        return float(self.raw["configPollSeconds"])

    @property
    def metrics_port(self) -> int:
        return int(self.raw["metrics"]["port"])

    def xid_overridden(self, code: int) -> bool:
        return str(code) in self.raw["xid"]["overrides"]

    def xid_severity(self, code: int) -> Severity:
        override = self.raw["xid"]["overrides"].get(str(code))
        if override is not None:
            return Severity.parse(override)
        return self.xid_catalog.severity(code)


def _validate(doc: Any, schema: Mapping[str, Any], where: str) -> dict[str, Any]:
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(doc).__name__}")
    out: dict[str, Any] = {}
    free = schema.get("*")
    for key in doc:
        if key not in schema and free is None:
            raise ConfigError(
                f"{where}{key}: unknown key (allowed: {', '.join(k for k in schema if k != '*')})"
            )
    for key, spec in schema.items():
        if key == "*":
            continue
        value = doc.get(key)
        out[key] = _leaf_or_section(value, spec, f"{where}{key}")
    if free is not None:
        for key in doc:
            if key not in schema:
                out[str(key)] = _leaf_or_section(doc[key], free, f"{where}{key}")
    return out


def _leaf_or_section(value: Any, spec: Any, path: str) -> Any:
    if isinstance(spec, Mapping):
        return _validate(value, spec, path + ".")
    assert isinstance(spec, Spec)
    if value is None:
        return spec.default
    typ = spec.typ
    if (
        isinstance(value, bool)
        and typ is not bool
        and bool not in (typ if isinstance(typ, tuple) else (typ,))
    ):
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if not isinstance(value, typ):
        name = "number" if typ == (int, float) else getattr(typ, "__name__", str(typ))
        raise ConfigError(f"{path}: expected {name}, got {value!r}")
    number = value if isinstance(value, (int, float)) else None
    if spec.minimum is not None and number is not None and number < spec.minimum:
        raise ConfigError(f"{path}: {value} is below the minimum {spec.minimum}")
    if spec.maximum is not None and number is not None and number > spec.maximum:
        raise ConfigError(f"{path}: {value} is above the maximum {spec.maximum}")
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(spec.choices)}")
    return value


def parse_config(
    doc: Any,
    profiles_doc: Any = None,
    catalog_doc: Any = None,
    incidents_doc: Any = None,
    *,
    rules: RuleBook | None = None,
) -> Config:
    """Validate parsed YAML documents into a Config (raises ConfigError). A table not given is empty.

    `rules` (the check registry's RuleBook) names the checks and rules `checks:` and `severities:`
    may name; every entry point of the agent passes it. Without it those names are not checked.
    """
    raw = _validate(doc, SCHEMA, "")
    if rules is not None:
        _check_names(raw, rules)
    for code in raw["xid"]["overrides"]:
        if not str(code).isdigit():
            raise ConfigError(f"xid.overrides.{code}: Xid codes are integers")
    raw["xid"]["overrides"] = {str(k): v for k, v in raw["xid"]["overrides"].items()}
    try:
        profiles = parse_profiles(profiles_doc) if profiles_doc is not None else {}
        catalog = (
            parse_catalog(catalog_doc, nvlink=Severity.parse(raw["xid"]["nvlinkSeverity"]))
            if catalog_doc is not None
            else XidCatalog()
        )
        incidents = (
            parse_incident_table(incidents_doc) if incidents_doc is not None else IncidentTable()
        ).with_overrides(raw["dcgm"]["incidentOverrides"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return Config(
        raw=raw,
        profiles=profiles,
        xid_catalog=catalog,
        severity_overrides={k: Severity.parse(v) for k, v in raw["severities"].items()},
        dcgm_incidents=incidents,
    )


def _check_names(raw: dict[str, Any], rules: RuleBook) -> None:
    unknown_checks = sorted(set(raw["checks"]) - set(rules.checks))
    if unknown_checks:
        raise ConfigError(f"checks: unknown check(s) {unknown_checks}; known: {', '.join(rules.checks)}")
    unknown_rules = sorted(set(raw["severities"]) - set(rules.rules))
    if unknown_rules:
        raise ConfigError(f"severities: unknown rule(s) {unknown_rules}; see `gpu-healthcheck rules`")


def _read_yaml(path: Path | Traversable) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path.name}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path.name}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from exc


def default_config_dir() -> Path | None:
    """$GPU_HEALTHCHECK_CONFIG_DIR when set, else None: the shipped defaults alone."""
    env = os.environ.get(CONFIG_ENV)
    return Path(env) if env else None


def load_config_dir(directory: Path | None = None, *, rules: RuleBook | None = None) -> Config:
    """Load the CONFIG_FILES from one directory (None: default_config_dir()).

    A missing config.yaml means the defaults; any other file it lacks is the shipped one, so that a
    ConfigMap holding only config.yaml still judges with the shipped profiles and tables.
    """
    directory = directory or default_config_dir()
    if directory is not None and not directory.is_dir():
        raise ConfigError(f"config directory {directory} does not exist")

    def read(name: str) -> Any:
        own = directory / name if directory is not None else None
        if own is not None and own.is_file():
            return _read_yaml(own)
        shipped = SHIPPED / name
        return _read_yaml(shipped) if shipped.is_file() else None

    where = str(directory) if directory is not None else "shipped config"
    try:
        return parse_config(
            read(CONFIG_YAML) or {},
            read(PROFILES_YAML),
            read(XID_CATALOG_YAML),
            read(DCGM_INCIDENTS_YAML),
            rules=rules,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc

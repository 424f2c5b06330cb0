"""Configuration: defaults in config/config.yaml, validated strictly (unknown keys are errors, but
for the keys of a config written for a newer schema: config/schema.py schema_version).

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

from agent.config import settings, yaml_safe
from agent.config.dcgm_incidents import IncidentTable, parse_incident_table
from agent.config.profiles import parse_profiles
from agent.config.schema import (
    REMEDIATION_ENTRY,
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    ConfigError,
    schema_version,
    validate,
)
from agent.config.xid_catalog import XidCatalog, parse_catalog
from agent.core import gpu_nodes
from agent.core.gpu_stall import StallPolicy
from agent.core.peers import PeerPolicy
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


@dataclass(frozen=True)
class Config:
    raw: dict[str, Any]
    profiles: dict[str, InstanceProfile] = field(default_factory=dict)
    xid_catalog: XidCatalog = field(default_factory=XidCatalog)
    severity_overrides: dict[str, Severity] = field(default_factory=dict)
    dcgm_incidents: IncidentTable = field(default_factory=IncidentTable)  # with dcgm.incidentOverrides
    # Where it was read (config/canary.py: main, canary, last-good, shipped) and its files' digest:
    # the results annotation says which config each node runs.
    source: str = ""
    digest: str = ""
    # config.yaml's schemaVersion (None: none named) and, when it is above SCHEMA_VERSION, the keys
    # (dotted) this agent does not know and left out: a newer release's, warned about, not refused.
    schema_version: int | None = None
    ignored: tuple[str, ...] = ()

    def severity(self, rule: Rule) -> Severity:
        """The configured severity of a rule (`severities:`), else its default; never above the
        rule's ceiling (a trend warning never taints)."""
        return min(self.severity_overrides.get(rule.name, rule.severity), rule.max_severity)

    def enabled(self, check: str) -> bool:
        return bool(self.raw["checks"].get(check, True))

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
    def trends(self) -> settings.TrendSettings:
        return settings.trend_settings(self.raw)

    @functools.cached_property
    def stall(self) -> StallPolicy:
        return settings.stall_policy(self.raw)

    @functools.cached_property
    def peers(self) -> PeerPolicy:
        return settings.peer_policy(self.raw)

    @functools.cached_property
    def sdc(self) -> settings.SdcSettings:
        return settings.sdc_settings(self.raw)

    @functools.cached_property
    def node(self) -> settings.NodeSettings:
        return settings.node_settings(self.raw)

    @functools.cached_property
    def dcgm(self) -> settings.DcgmSettings:
        return settings.dcgm_settings(self.raw)

    @functools.cached_property
    def gpu_node_selection(self) -> tuple[str, ...]:
        """Which Nodes are GPU nodes (core/gpu_nodes.py): the configured selectors, and the
        instance types of the profiles."""
        return gpu_nodes.selection(self.node.gpu_node_selectors, self.profiles)

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

    A config.yaml whose `schemaVersion` is above this agent's SCHEMA_VERSION was written for a newer
    release (an upgrade's ConfigMap applied before the DaemonSet rolled, or a rollback of the image
    under it): a key, check or rule name this agent does not know is that release's, so it is left
    out and listed in Config.ignored instead of rejecting the whole config fleet-wide. Without
    schemaVersion, or at this agent's version or below, an unknown name is a typo and refused.
    """
    written_for = schema_version(doc)
    ignored: list[str] | None = [] if written_for is not None and written_for > SCHEMA_VERSION else None
    if isinstance(doc, Mapping):
        doc = {k: v for k, v in doc.items() if k != SCHEMA_VERSION_KEY}
    raw = validate(doc, SCHEMA, "", ignored=ignored)
    if rules is not None:
        _check_names(raw, rules, ignored)
    if ignored is not None:
        _drop_unknown_entry_keys(raw, ignored)
    for code in raw["xid"]["overrides"]:
        if not str(code).isdigit():
            raise ConfigError(f"xid.overrides.{code}: Xid codes are integers")
    raw["xid"]["overrides"] = {str(k): v for k, v in raw["xid"]["overrides"].items()}
    settings.gpu_node_selectors(raw["node"]["gpuNodeSelector"])  # raises ConfigError
    settings.trend_settings(raw)  # raises ConfigError
    settings.stall_policy(raw)  # raises ConfigError
    settings.peer_policy(raw)  # raises ConfigError
    settings.node_settings(raw)  # the node section's entries and cross-key rules (raises ConfigError)
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
        schema_version=written_for,
        ignored=tuple(ignored or ()),
    )


def _check_names(raw: dict[str, Any], rules: RuleBook, ignored: list[str] | None = None) -> None:
    """Refuse a check or rule name the registry does not know; with *ignored* (a newer config), leave
    it out of *raw* and list it there (a newer release's check)."""
    unknown_checks = sorted(set(raw["checks"]) - set(rules.checks))
    unknown_rules = sorted(set(raw["severities"]) - set(rules.rules))
    if ignored is not None:
        for section, names in (("checks", unknown_checks), ("severities", unknown_rules)):
            for name in names:
                del raw[section][name]
                ignored.append(f"{section}.{name}")
        unknown_checks = unknown_rules = []
    if unknown_checks:
        raise ConfigError(f"checks: unknown check(s) {unknown_checks}; known: {', '.join(rules.checks)}")
    if unknown_rules:
        raise ConfigError(f"severities: unknown rule(s) {unknown_rules}; see `gpu-healthcheck rules`")
    for name, value in raw["severities"].items():
        ceiling = rules.rules[name].max_severity
        if Severity.parse(value) > ceiling:
            raise ConfigError(
                f"severities.{name}: {value} is above what this rule may be ({ceiling.label}): "
                "a warning before a fault never taints"
            )


def _drop_unknown_entry_keys(raw: dict[str, Any], ignored: list[str]) -> None:
    """A newer config's node.remediationConditions entries without the keys this agent does not know
    (settings.py validates the rest of each entry as strictly as ever)."""
    entries = []
    for i, entry in enumerate(raw["node"]["remediationConditions"]):
        if isinstance(entry, Mapping):
            where = f"node.remediationConditions[{i}]"
            ignored.extend(f"{where}.{k}" for k in entry if k not in REMEDIATION_ENTRY)
            entry = {k: v for k, v in entry.items() if k in REMEDIATION_ENTRY}
        entries.append(entry)
    raw["node"]["remediationConditions"] = entries  # a new list: the parsed document stays as it was


def _read_yaml(path: Path | Traversable) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path.name}: cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml_safe.load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path.name}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from exc


def default_config_dir() -> Path | None:
    """$GPU_HEALTHCHECK_CONFIG_DIR when set, else None: the shipped defaults alone."""
    env = os.environ.get(CONFIG_ENV)
    return Path(env) if env else None


def load_config_dir(
    directory: Path | None = None, *, rules: RuleBook | None = None, shipped_only: bool = False
) -> Config:
    """Load the CONFIG_FILES from one directory (None: default_config_dir(); shipped_only: neither).

    A missing config.yaml means the defaults; any other file it lacks is the shipped one, so that a
    ConfigMap holding only config.yaml still judges with the shipped profiles and tables. A table
    file that is there but empty is an error, never an empty table (Xid 79 would be `unknown`).
    """
    directory = None if shipped_only else directory or default_config_dir()
    if directory is not None and not directory.is_dir():
        raise ConfigError(f"config directory {directory} does not exist")

    def read(name: str) -> Any:
        own = directory / name if directory is not None else None
        if own is not None and own.is_file():
            doc = _read_yaml(own)
            if doc is None and name != CONFIG_YAML:
                raise ConfigError(f"{name}: empty (remove the file to use the shipped one)")
            return doc
        shipped = SHIPPED / name
        if not shipped.is_file():  # a broken install: never judge without the tables
            if name == CONFIG_YAML:
                return None
            raise ConfigError(f"{name}: the shipped copy is missing from the package ({shipped})")
        return _read_yaml(shipped)

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


__all__ = [
    "CONFIG_FILES",
    "Config",
    "default_config_dir",
    "load_config_dir",
    "parse_config",
]

"""Config validation: the shipped files are the defaults, and bad input says exactly what is wrong."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.checks import gpu, gpu_memory
from agent.checks.registry import CHECKS, RULE_BOOK, RULES
from agent.config import load_config_dir, parse_config, yaml_safe
from agent.config.schema import REMEDIATION_ENTRY, SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY, ConfigError
from agent.core.severity import Severity

CONFIG = Path(__file__).parent.parent / "config"


def test_shipped_config_yaml_equals_the_built_in_defaults() -> None:
    shipped = parse_config(yaml_safe.load((CONFIG / "config.yaml").read_text()))
    assert shipped.raw == parse_config({}).raw


def test_shipped_directory_loads_with_profiles_and_catalog() -> None:
    cfg = load_config_dir(CONFIG)
    assert "p5.48xlarge" in cfg.profiles and cfg.profiles["p5.48xlarge"].gpu_count == 8
    assert cfg.xid_severity(79) is Severity.REBOOT
    assert cfg.severity(gpu_memory.ECC_DRAM_UNCORRECTABLE) is Severity.RESET


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"intervalz": {}}, "intervalz: unknown key"),
        ({"intervals": {"gpu": "fast"}}, "intervals.gpu: expected number"),
        ({"intervals": {"gpu": 0}}, "intervals.gpu: 0 is below the minimum"),
        ({"intervals": {"gpu": True}}, "intervals.gpu: expected a number"),
        ({"checks": {"gpu.ecc": "yes"}}, "checks.gpu.ecc: expected bool"),
        ({"checks": {"gpu.nonsense": True}}, "checks: unknown check(s) ['gpu.nonsense']"),
        ({"severities": {"gpu.ecc.dram-uncorrectable": "panic"}}, "not one of"),
        ({"severities": {"no.such.rule": "reset"}}, "unknown rule"),
        ({"xid": {"overrides": {"abc": "reset"}}}, "Xid codes are integers"),
        (["a", "list"], "expected a mapping"),
    ],
)
def test_invalid_config_is_rejected_with_the_path(doc: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        parse_config(doc, rules=RULE_BOOK)
    assert needle in str(err.value)


def test_invalid_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: [1,\n")
    with pytest.raises(ConfigError) as err:
        load_config_dir(tmp_path)
    assert "config.yaml: not valid YAML at line" in str(err.value)


def test_a_configmap_with_only_config_yaml_uses_the_shipped_profiles(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("instanceType: dgx-h100\n")
    cfg = load_config_dir(tmp_path)
    assert cfg.instance_type == "dgx-h100" and "dgx-h100" in cfg.profiles


def test_invalid_profiles_are_rejected(tmp_path: Path) -> None:
    (tmp_path / "instance-profiles.yaml").write_text("profiles:\n  x1:\n    gpuCount: eight\n")
    with pytest.raises(ConfigError, match="gpuCount"):
        load_config_dir(tmp_path)


def test_every_rule_default_is_a_real_severity() -> None:
    assert all(isinstance(r.severity, Severity) and r.severity > Severity.NONE for r in RULES.values())


def test_every_rule_belongs_to_the_check_that_owns_it_and_is_named_once() -> None:
    names = [r.name for spec in CHECKS for r in spec.rules]
    assert len(names) == len(set(names)) == len(RULES)
    for spec in CHECKS:
        assert all(r.name.startswith(spec.name + ".") for r in spec.rules), spec.name


def test_every_registered_check_can_be_switched_in_config() -> None:
    for spec in CHECKS:
        cfg = parse_config({"checks": {spec.name: False}}, rules=RULE_BOOK)
        assert not cfg.enabled(spec.name)
        assert all(cfg.enabled(other.name) for other in CHECKS if other is not spec)


def test_a_check_missing_from_config_yaml_is_on() -> None:
    cfg = load_config_dir(CONFIG, rules=RULE_BOOK)
    assert cfg.raw["checks"] == {} and all(cfg.enabled(spec.name) for spec in CHECKS)


def test_severity_overrides_name_rules_the_checks_own() -> None:
    cfg = parse_config({"severities": {"gpu.pcie.width": "reset", "xid.sxid": "none"}}, rules=RULE_BOOK)
    assert cfg.severity(gpu.PCIE_WIDTH) is Severity.RESET
    assert cfg.severity(RULES["xid.sxid"]) is Severity.NONE
    assert cfg.severity(gpu_memory.ECC_DRAM_UNCORRECTABLE) is Severity.RESET  # not overridden: the default


# ------------------------------------------------ a newer release's config (schemaVersion)

NEWER = SCHEMA_VERSION + 1


def test_the_shipped_config_names_this_schema_version() -> None:
    """config/config.yaml (and so the generated ConfigMap and the chart's copy) says which schema it
    was written for: an older agent under it ignores this release's keys instead of refusing them."""
    doc = yaml_safe.load((CONFIG / "config.yaml").read_text())
    assert doc[SCHEMA_VERSION_KEY] == SCHEMA_VERSION
    assert load_config_dir(CONFIG).schema_version == SCHEMA_VERSION
    for copy in ("charts/gpu-healthcheck/files/config.yaml", "manifests/20-configmap.yaml"):
        assert f"{SCHEMA_VERSION_KEY}: {SCHEMA_VERSION}\n" in (CONFIG.parent / copy).read_text(), copy


def test_a_newer_configs_unknown_keys_are_ignored_and_listed() -> None:
    doc = {
        SCHEMA_VERSION_KEY: NEWER,
        "futureTopLevel": {"a": 1},
        "intervals": {"gpu": 30, "futureTier": 5},
        "checks": {"future.check": False, "gpu.ecc": False},
        "severities": {"future.rule": "reset"},
        "node": {
            "remediationConditions": [{"type": "GPUReady", "futureField": "x"}],
            "futureNodeKey": True,
        },
    }
    cfg = parse_config(doc, rules=RULE_BOOK)
    assert cfg.ignored == (
        "futureTopLevel",
        "intervals.futureTier",
        "node.futureNodeKey",
        "checks.future.check",
        "severities.future.rule",
        "node.remediationConditions[0].futureField",
    )
    assert cfg.schema_version == NEWER
    # what this agent knows still applies, and is still checked
    assert cfg.intervals.gpu == 30 and not cfg.enabled("gpu.ecc")
    assert [c.type for c in cfg.node.remediation_conditions] == ["GPUReady"]
    assert "future.check" not in cfg.raw["checks"] and "futureTier" not in cfg.raw["intervals"]
    assert doc["node"]["remediationConditions"][0]["futureField"] == "x"  # the document is not changed
    with pytest.raises(ConfigError, match=r"intervals\.gpu: 0 is below the minimum"):
        parse_config({SCHEMA_VERSION_KEY: NEWER, "intervals": {"gpu": 0}})  # a known key's value


@pytest.mark.parametrize("version", [SCHEMA_VERSION, SCHEMA_VERSION - 1, None])
def test_an_unknown_key_of_this_or_an_older_schema_is_a_typo(version: int | None) -> None:
    doc: dict[str, object] = {"intervals": {"gpuu": 30}}
    if version is not None:
        doc[SCHEMA_VERSION_KEY] = version
    with pytest.raises(ConfigError, match=r"intervals\.gpuu: unknown key"):
        parse_config(doc, rules=RULE_BOOK)
    with pytest.raises(ConfigError, match="unknown check"):
        parse_config({**doc, "intervals": {}, "checks": {"gpu.ecc.typo": False}}, rules=RULE_BOOK)
    assert parse_config({**doc, "intervals": {"gpu": 30}}).ignored == ()


@pytest.mark.parametrize("value", ["3", 0, -1, 2.5, True, [3]])
def test_a_schema_version_that_is_no_positive_integer_is_rejected(value: object) -> None:
    with pytest.raises(ConfigError, match=f"{SCHEMA_VERSION_KEY}: .* is not a schema version"):
        parse_config({SCHEMA_VERSION_KEY: value})


def schema_keys(schema: Mapping[str, Any], where: str = "") -> list[str]:
    out = []
    for key, spec in schema.items():
        out.append(f"{where}{key}")
        if isinstance(spec, Mapping):
            out += schema_keys(spec, f"{where}{key}.")
    return out


# The digest of the schema's keys at each SCHEMA_VERSION: a key added or renamed without a bump would
# let an agent of the same version refuse it as a typo in a newer release's config (or take one).
SCHEMA_KEYS_AT = {2: "217c44969947", 3: "afdb67aa759e"}


def test_a_new_key_comes_with_a_new_schema_version() -> None:
    keys = schema_keys(SCHEMA) + [f"node.remediationConditions[].{k}" for k in REMEDIATION_ENTRY]
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:12]
    assert SCHEMA_KEYS_AT.get(SCHEMA_VERSION) == digest, (
        f"config/schema.py's keys changed (digest {digest}): bump SCHEMA_VERSION, write it into "
        "config/config.yaml (then scripts/gen-configmap.py) and add the digest here"
    )


def test_the_readme_says_a_newer_config_is_taken_and_a_typo_is_not() -> None:
    from agent.reporters.metrics import Metrics
    from tests.readme import user_docs

    text = " ".join(user_docs().split())
    assert "A newer release's config is taken, not rejected." in text
    assert "an unknown key there is a typo and the config is rejected" in text
    metric = "gpu_healthcheck_config_ignored_keys"
    assert f"`{metric}`" in text
    assert Metrics().registry.get_sample_value(metric) == 0.0  # the metric the docs name exists

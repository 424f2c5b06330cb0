"""Every live key of the schema reaches the part that uses it, in the agent as cli/agent.py wires it
(against a real kube-apiserver: the Node writer, the brake, the repair budget and per-GPU isolation
exist only with one). The keys come from config/schema.py: each leaf but RESTART_ONLY, in turn,
is changed in the mounted config.yaml, the loop's reload step takes it (the watcher, the fence's
dry run, every LivePart), and the key's observer, a value read from the part that uses it, must
change, then come back when the key does. A key without an observer fails the test.

The changed value is derived from the key's Spec (another choice, the other bool, a number moved
within its range) and checked by parse_config; HAND holds the few a person has to choose (free
text, lists, free-form maps), each with its reason."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.checks.registry import RULE_BOOK
from agent.cli.agent import Wired, wire
from agent.cli.agent_parts import DcgmPart
from agent.cli.parser import build_parser
from agent.config import parse_config
from agent.config.schema import RESTART_ONLY, SCHEMA, ConfigError, Spec
from agent.core.severity import Severity
from agent.engine.loop import Agent
from agent.engine.scheduler import TIER_INPUTS
from agent.probes.live import LiveSource
from agent.reporters.brake import Brake
from agent.reporters.device_isolation import IsolatingWriter
from agent.reporters.node_writer import NodeWriter
from agent.reporters.repair_budget import RepairBudget

pytestmark = pytest.mark.kube

XID = 79  # the Xid code xid.overrides names below


def live_keys(schema: Mapping[str, Any] = SCHEMA, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, its Spec or free-form section) for every key a reload applies."""
    for key, spec in schema.items():
        path = prefix + key
        if isinstance(spec, Mapping) and "*" not in spec:
            yield from live_keys(spec, path + ".")
        elif path not in RESTART_ONLY:
            yield path, spec


# Values a person chooses: the schema cannot say which text, list entry or map key is valid.
HAND: dict[str, Any] = {
    "instanceType": "p4d.24xlarge",  # free text: an instance type name overriding the detected one
    "node.conditionType": "example.com/GPUReady",  # a qualified condition type (settings.condition_type)
    "node.remediationConditions": [{"type": "example.com/GPURemediate"}],  # an entry needs its type
    "node.repairBudget.perLabel": "topology.kubernetes.io/zone",  # a label key
    "node.gpuNodeSelector": ["test.example/pool=reload"],  # a label selector
    "node.activeChecks.maxConcurrent": 3,  # a count in place of the default percentage
    "stall.idlePowerWatts": {"H100": 71},  # GPU model -> watts
    "dcgm.address": "10.0.0.7:5555",  # host:port of another host engine
    "sdc.address": "http://127.0.0.1:7436",  # a URL: the node-local SDC probe server
    "checks": {RULE_BOOK.checks[0]: False},  # a map of check names: one switched off
    # a map of rule names: one whose severity is not monitor already, lowered (never above its ceiling)
    "severities": {
        next(r.name for r in RULE_BOOK.rules.values() if r.severity != Severity.MONITOR): "monitor"
    },
    "dcgm.incidentOverrides": {"pcie/3": "isolate"},  # "<system>/<code>" of dcgm-incidents.yaml
    "xid.overrides": {str(XID): "monitor"},  # an Xid code (the catalog says reset or worse)
}


def nested(key: str, value: Any) -> dict[str, Any]:
    *parents, leaf = key.split(".")
    doc: dict[str, Any] = {leaf: value}
    for p in reversed(parents):
        doc = {p: doc}
    return doc


def candidates(spec: Any) -> list[Any]:
    """Values of a Spec other than its default, the likeliest valid first."""
    if not isinstance(spec, Spec):
        return []
    if spec.choices is not None:
        return [c for c in spec.choices if c != spec.default]
    if spec.typ is bool:
        return [not spec.default]
    if isinstance(spec.default, (int, float)) and not isinstance(spec.default, bool):
        d = spec.default
        out = [d + 1, d * 2, d / 2, d - 1, spec.minimum, spec.maximum]
        if spec.typ is int:
            out = [int(v) for v in out if v is not None and v == int(v)]
        return [v for v in out if v is not None and v != d]
    return []


def changed_value(key: str, spec: Any) -> Any:
    """HAND's value, else the first candidate parse_config accepts; a key with neither fails."""
    if key in HAND:
        return HAND[key]
    for value in candidates(spec):
        try:
            parse_config(nested(key, value), rules=RULE_BOOK)
        except ConfigError:
            continue
        return value
    raise AssertionError(f"{key}: no changed value derives from its Spec; choose one in HAND and say why")


def part(agent: Agent, kind: type) -> Any:
    found = [p for p in agent.parts if isinstance(p, kind)]
    assert len(found) == 1, f"the wired agent has {len(found)} {kind.__name__} parts"
    return found[0]


def dcgm(agent: Agent) -> Any:
    tiers = part(agent, DcgmPart).dcgm
    assert tiers is not None, "no DCGM tiers wired"
    return tiers


Observer = Callable[[Agent], Any]


def engine_view(read: Callable[[Any], Any]) -> Observer:
    """A value the engine reads from its config when it runs a tier or builds the Marks."""
    return lambda a: read(a.engine.cfg)


# Which part uses each key, and what of it shows the value in force. A key is looked up whole, then
# by its section (a section whose typed view is read as one piece by its user).
OBSERVERS: dict[str, tuple[Observer, ...]] = {
    "instanceType": (engine_view(lambda c: c.instance_type),),
    "intervals": (lambda a: tuple(a.engine.schedule.interval(t) for t in TIER_INPUTS),),  # the scheduler
    "intervals.dcgmDiag": (  # the scheduler, and the cap on an aborted diag's retry
        lambda a: tuple(a.engine.schedule.interval(t) for t in TIER_INPUTS),
        lambda a: dcgm(a).window.retry_after(32),
    ),
    "jitterFraction": (lambda a: a.engine.schedule.cfg.jitter_fraction,),
    "timeouts.nvidiaSmi": (lambda a: part(a, LiveSource).timeout_s,),
    "timeouts.nvml": (lambda a: part(a, LiveSource).nvml_timeout_s,),
    "timeouts.check": (
        lambda a: part(a, LiveSource).check_timeout_s,
        engine_view(lambda c: c.timeouts.check),
    ),
    "checks": (engine_view(lambda c: {name: c.enabled(name) for name in RULE_BOOK.checks}),),
    "severities": (engine_view(lambda c: {r.name: c.severity(r) for r in RULE_BOOK.rules.values()}),),
    "thresholds": (engine_view(lambda c: c.thresholds),),
    "trends": (engine_view(lambda c: c.trends),),
    "stall": (engine_view(lambda c: c.stall),),
    "peers": (engine_view(lambda c: c.peers),),
    "node.mode": (engine_view(lambda c: c.node.mode), lambda a: dcgm(a).window.hold.mode()),
    "node.isolation": (lambda a: part(a, IsolatingWriter).isolation,),
    # the engine's scope (marks_builder) and the writer's episode (device_isolation) both count them
    "node.isolationNodeAtGpus": (
        engine_view(lambda c: c.node.isolation_node_at),
        lambda a: part(a, IsolatingWriter).node_at,
    ),
    "node.deviceTaintEffectBySeverity": (engine_view(lambda c: dict(c.node.device_effect_by_severity)),),
    "node.recoverAfter": (engine_view(lambda c: c.node.recover_after),),
    "node.confirmAfter": (engine_view(lambda c: c.node.confirm_after),),
    "node.escalateAfterReboots": (engine_view(lambda c: c.node.escalate_after_reboots),),
    "node.taintMinSeverity": (
        engine_view(lambda c: c.node.taint_min_severity),
        lambda a: part(a, Brake).min_severity,
    ),
    "node.taintEffect": (engine_view(lambda c: c.node.taint_effect),),
    "node.taintEffectBySeverity": (engine_view(lambda c: c.node.taint_effect_by_severity),),
    "node.conditionType": (lambda a: part(a, NodeWriter).condition_type,),
    "node.remediationConditions": (engine_view(lambda c: c.node.remediation_conditions),),
    "node.maxTaintedFraction": (lambda a: part(a, Brake).max_fraction,),
    "node.maxTaintedNodes": (lambda a: part(a, Brake).max_nodes,),
    "node.repairBudget": (lambda a: part(a, RepairBudget).budget,),
    "node.repairHistory": (engine_view(lambda c: c.node.repair_history),),
    "node.risk": (engine_view(lambda c: c.node.risk),),
    "node.waveHold": (lambda a: part(a, RepairBudget).wave,),
    "node.gpuNodeSelector": (lambda a: part(a, Brake).selectors,),
    "node.activeChecks.maxConcurrent": (lambda a: dcgm(a).window.slots.policy().max_concurrent,),
    "node.activeChecks.retrySeconds": (
        lambda a: dcgm(a).window.retry_s,
        lambda a: dcgm(a).window.retry_after(1),
    ),
    "node.validate.addTaint": (engine_view(lambda c: c.node.validate.add_taint),),
    "node.validate.diagLevel": (lambda a: dcgm(a).wanted_level(),),
    "node.validate.waitForDriver": (engine_view(lambda c: c.node.validate.wait_for_driver),),
    "node.validate.driverTimeoutSeconds": (engine_view(lambda c: c.node.validate.driver_timeout_seconds),),
    "node.validate.requireAllPublished": (engine_view(lambda c: c.node.validate.require_all_published),),
    "configPollSeconds": (lambda a: a.cfg.config_poll_seconds,),  # the loop's own wait
    "dcgm.address": (lambda a: dcgm(a).health.client.address,),
    # the SDC probe's tier exists only where sdc.address is set (the default "" runs none)
    "sdc.address": (lambda a: (part(a, DcgmPart).sdc or None) and part(a, DcgmPart).sdc.runner.address,),
    "sdc.timeoutSeconds": (engine_view(lambda c: c.sdc.timeout_s),),
    "dcgm.connectTimeout": (lambda a: dcgm(a).health.client.connect_timeout_s,),
    "dcgm.graceSeconds": (lambda a: dcgm(a).health.client.grace_s,),
    "dcgm.diagLevel": (lambda a: dcgm(a).level,),
    "dcgm.diagTimeout": (lambda a: dcgm(a).runner.timeout_s, lambda a: dcgm(a).window.slots.expire_s()),
    "dcgm.heartbeatSeconds": (lambda a: dcgm(a).runner.heartbeat_s,),
    "dcgm.callTimeout": (lambda a: dcgm(a).health.client.call_timeout_s,),
    "dcgm.incidentOverrides": (engine_view(lambda c: c.dcgm_incidents),),
    "xid.overrides": (engine_view(lambda c: c.xid_severity(XID)),),
    "xid.nvlinkSeverity": (engine_view(lambda c: c.xid_catalog),),
}


def observers(key: str) -> tuple[Observer, ...]:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = OBSERVERS.get(".".join(parts[:n]))
        if found:
            return found
    raise AssertionError(f"{key}: a live key with no observer (say which part uses it in OBSERVERS)")


def mount(config_dir: Path, doc: dict[str, Any]) -> None:
    """A new config.yaml, swapped in as the kubelet does (a new inode: the watcher's stamp changes)."""
    staged = config_dir / ".config.yaml.new"
    staged.write_text(yaml.safe_dump(doc), encoding="utf-8")
    os.replace(staged, config_dir / "config.yaml")


def reload(agent: Agent, config_dir: Path, doc: dict[str, Any], key: str) -> None:
    mount(config_dir, doc)
    assert agent._reload(), f"{key}: the reload was not seen"
    assert agent.config_problem == "", f"{key}: {agent.config_problem}"
    said = [e.message for e in agent.pending_events]
    assert not any("failed" in m for m in said), said
    agent.pending_events.clear()


def test_live_keys_are_derived_from_the_schema() -> None:
    """The list is the schema's (a new key is in it without an edit) and every key has an observer."""
    keys = [k for k, _ in live_keys()]
    assert "node.isolation" in keys and "node.repairBudget.perLabel" in keys and "severities" in keys
    assert not set(RESTART_ONLY) & set(keys)
    missing = []
    for key in keys:
        try:
            observers(key)
        except AssertionError as exc:
            missing.append(str(exc))
    assert not missing, missing
    unused = [k for k in OBSERVERS if not any(key == k or key.startswith(k + ".") for key in keys)]
    assert not unused, f"observers of keys the schema no longer has: {unused}"


@pytest.fixture
def wired(
    kube: Any, gpu_node: Callable[..., Any], kube_node_name: str, tmp_path: Path
) -> Iterator[tuple[Wired, Path]]:
    """The agent as main() builds it on a live (not snapshot-backed) node: LiveSource, the DCGM
    tiers and their active-check window; --once keeps the brake from reading ahead."""
    gpu_node()
    name = kube_node_name
    config_dir, state = tmp_path / "config", tmp_path / "state"
    config_dir.mkdir()
    state.mkdir()
    mount(config_dir, {})
    args = build_parser().parse_args(
        [
            "agent", "--node", name, "--kubeconfig", str(kube.kubeconfig), "--config-dir", str(config_dir),
            "--state-dir", str(state), "--metrics-port", "0", "--once",
        ]
    )  # fmt: skip
    built = wire(args)
    assert isinstance(built, Wired)
    try:
        yield built, config_dir
    finally:
        if built.fence is not None:
            built.fence.join(timeout=30)
        tiers = part(built.agent, DcgmPart).dcgm
        if tiers is not None:
            tiers.stop()


def test_every_live_key_reaches_the_part_that_uses_it(wired: tuple[Wired, Path]) -> None:
    built, config_dir = wired
    agent = built.agent
    agent._reload()  # the watcher's first look at the mounted config (the one in force)
    agent.pending_events.clear()
    seen: list[str] = []
    for key, spec in live_keys():
        look = observers(key)
        before = [o(agent) for o in look]
        value = changed_value(key, spec)
        reload(agent, config_dir, nested(key, value), key)
        after = [o(agent) for o in look]
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            assert a != b, f"{key} = {value!r}: observer {i} still sees {b!r}"
        reload(agent, config_dir, {}, key)
        assert [o(agent) for o in look] == before, f"{key}: not back after the reload that undid it"
        seen.append(key)
    assert seen == [k for k, _ in live_keys()]


def merged(doc: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    for k, v in more.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            merged(doc[k], v)
        else:
            doc[k] = v
    return doc


# At start every key is changed at once: an entry that must agree with another changed key.
TOGETHER: dict[str, Any] = {
    # taintMinSeverity is changed too (reset → reboot): a remediation entry may not ask below it
    "node.remediationConditions": [{"type": "example.com/GPURemediate", "minSeverity": "isolate"}],
}


def test_every_live_key_reaches_its_part_at_start(
    kube: Any, gpu_node: Callable[..., Any], kube_node_name: str, tmp_path: Path
) -> None:
    """The other road in: the agent started on a config whose every live key differs from the shipped
    default sees each value from its first moment, before any reload. A part that takes a setting
    through its constructor and ignores the config there (a user's value dropped until the first
    reload) fails it; the reload test above, which starts on the defaults, cannot see that."""
    gpu_node()
    doc: dict[str, Any] = {}
    for key, spec in live_keys():
        value = TOGETHER.get(key, changed_value(key, spec))
        merged(doc, nested(key, value))
    parse_config(doc, rules=RULE_BOOK)  # every changed value at once is a valid config

    def start(config: dict[str, Any], name: str) -> Wired:
        config_dir, state = tmp_path / name / "config", tmp_path / name / "state"
        config_dir.mkdir(parents=True)
        state.mkdir()
        mount(config_dir, config)
        args = build_parser().parse_args(
            [
                "agent", "--node", kube_node_name, "--kubeconfig", str(kube.kubeconfig),
                "--config-dir", str(config_dir), "--state-dir", str(state), "--metrics-port", "0", "--once",
            ]
        )  # fmt: skip
        built = wire(args)
        assert isinstance(built, Wired)
        return built

    shipped, changed = start({}, "shipped"), start(doc, "changed")
    try:
        same = []
        for key, _ in live_keys():
            for i, o in enumerate(observers(key)):
                if o(shipped.agent) == o(changed.agent):
                    same.append(f"{key} (observer {i}): {o(changed.agent)!r}")
        assert not same, f"started on a changed value, these parts still see the default: {same}"
    finally:
        for built in (shipped, changed):
            if built.fence is not None:
                built.fence.join(timeout=30)
            tiers = part(built.agent, DcgmPart).dcgm
            if tiers is not None:
                tiers.stop()

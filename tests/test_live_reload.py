"""A reloaded config reaches what the agent's wiring built once: the DCGM client and the probes'
timeouts (every live key of the schema, through the wired agent: test_reload_keys_kube.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.cli.agent_parts import DcgmPart
from agent.config import Config, load_config_dir, parse_config
from agent.config.schema import SCHEMA_VERSION, SCHEMA_VERSION_KEY
from agent.config.watch import ConfigWatcher
from agent.core.facts import Input
from agent.core.node_keys import EventReason
from agent.engine.loop import Agent
from agent.probes.live import LiveSource
from agent.reporters.metrics import Metrics
from tests.conftest import live_cfg

ROOT = Path(__file__).parent.parent


def wired(cfg: Config, source: LiveSource, part: DcgmPart) -> Agent:
    """The loop over *source* with the DCGM part's inputs, as cli/agent.py wires them."""
    inputs, progress = part.dcgm_inputs(cfg)
    return Agent(
        source,
        cfg,
        config_dir=None,
        writer=None,
        node_getter=None,
        kernel_path=None,
        kernel_is_device=False,
        extra_inputs=inputs,
        progress=progress,
        parts=(source, part),
    )


def test_dcgm_address_timeouts_and_tool_timeouts_are_live(tmp_path: Path) -> None:
    old = load_config_dir(ROOT / "config")
    source = LiveSource(old)
    part = DcgmPart(Metrics(), None, dcgm_wanted=True, loop=lambda: agent)
    agent = wired(old, source, part)
    first = part.dcgm
    assert first is not None and first.health.client.address == old.dcgm.address
    new = parse_config(
        {
            "dcgm": {"address": "10.0.0.7:5555", "connectTimeout": 2, "diagLevel": 3},
            "timeouts": {"nvidiaSmi": 7, "nvml": 9},
        }
    )
    agent.take_config(new)
    assert part.dcgm is not first and part.dcgm is not None
    assert part.dcgm.health.client.address == "10.0.0.7:5555"
    assert part.dcgm.health.client.connect_timeout_s == 2 and part.dcgm.runner.level == 3
    assert (
        agent.engine.extra_inputs[Input.DCGM_HEALTH] == part.dcgm.health.poll
    )  # the engine reads the new one
    assert (source.timeout_s, source.nvml_timeout_s) == (7, 9)


def test_a_dcgm_check_switched_on_by_a_reload_gets_a_client() -> None:
    off = parse_config({"checks": {"dcgm-health": False, "dcgm-diag": False}})
    source = LiveSource(live_cfg())
    part = DcgmPart(Metrics(), None, dcgm_wanted=True, loop=lambda: agent)
    agent = wired(off, source, part)
    assert agent.engine.extra_inputs == {} and part.dcgm is None
    agent.take_config(parse_config({}))
    assert part.dcgm is not None and Input.DCGM_HEALTH in agent.engine.extra_inputs


def test_the_api_inputs_survive_a_reload_that_rebuilds_the_dcgm_client() -> None:
    """The DRA driver's devices (read from the API) stay an input of the engine when a reload
    rebuilds the DCGM inputs, and without any DCGM check too."""
    off = parse_config({"checks": {"dcgm-health": False, "dcgm-diag": False}})
    source = LiveSource(live_cfg())

    def dra() -> object:
        return "the API's slices"

    part = DcgmPart(Metrics(), None, dcgm_wanted=True, loop=lambda: agent, api_inputs={Input.DRA: dra})
    agent = wired(off, source, part)
    assert agent.engine.extra_inputs == {Input.DRA: dra}
    agent.take_config(parse_config({}))
    assert part.dcgm is not None and agent.engine.extra_inputs[Input.DRA] is dra
    assert Input.DCGM_HEALTH in agent.engine.extra_inputs


def test_the_watcher_names_changed_keys_and_keeps_restart_only_ones(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("node:\n  taintEffect: NoSchedule\n")
    cfg = load_config_dir(tmp_path)
    watcher = ConfigWatcher(tmp_path, cfg)
    (tmp_path / "config.yaml").write_text(
        "prefix: other\nmetrics:\n  port: 9999\nnode:\n  taintEffect: NoExecute\n"
        "severities:\n  gpu.persistence.disabled: none\n"
    )
    outcome = watcher.poll()
    assert outcome is not None and outcome.config is not None
    assert outcome.changed == ("node.taintEffect", "severities")
    assert outcome.needs_restart == ("prefix: gpu-healthcheck → other", "metrics.port: 9402 → 9999")
    assert outcome.config.prefix == "gpu-healthcheck" and outcome.config.metrics_port == 9402
    assert outcome.config.node.taint_effect == "NoExecute"


def test_a_newer_releases_keys_are_a_warning_and_a_metric_not_a_rejection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade's ConfigMap (schemaVersion above this agent's) mounted under this agent: the keys
    it does not know are left out with a warning and gpu_healthcheck_config_ignored_keys, what it knows
    applies, and no ConfigRejected; a typo in a config of its own version is still rejected."""
    (tmp_path / "config.yaml").write_text(f"{SCHEMA_VERSION_KEY}: {SCHEMA_VERSION}\n")
    metrics = Metrics()
    source = LiveSource(live_cfg())
    part = DcgmPart(metrics, None, dcgm_wanted=False, loop=lambda: agent)
    agent = Agent(
        source,
        load_config_dir(tmp_path),
        config_dir=tmp_path,
        writer=None,
        node_getter=None,
        kernel_path=None,
        kernel_is_device=False,
        metrics=metrics,
        parts=(source, part),
    )

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(f"gpu_healthcheck_{name}", labels)

    assert sample("config_ignored_keys") == 0.0
    (tmp_path / "config.yaml").write_text(
        f"{SCHEMA_VERSION_KEY}: {SCHEMA_VERSION + 1}\nstall:\n  newKnob: 3\nintervals:\n  gpu: 7\n"
        "futureSection: {}\n"
    )
    with caplog.at_level(logging.WARNING):
        assert agent._reload()
    assert agent.cfg.intervals.gpu == 7 and agent.config_problem == ""
    assert sample("config_ignored_keys") == 2.0
    assert sample("config_reloads_total", result="applied") == 1.0
    assert sample("config_reloads_total", result="rejected") is None
    assert sample("config_rejected") == 0.0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"config written for schemaVersion {SCHEMA_VERSION + 1} (this agent: {SCHEMA_VERSION}): "
        "ignoring the keys it does not know: futureSection, stall.newKnob"
    ]
    (reloaded,) = [e for e in agent.pending_events if e.reason == EventReason.CONFIG_RELOADED]
    assert "ignored (a newer release's keys): futureSection, stall.newKnob" in reloaded.message
    assert not [e for e in agent.pending_events if e.reason == EventReason.CONFIG_REJECTED]

    # The same key in a config written for this agent's own schema: a typo, rejected.
    (tmp_path / "config.yaml").write_text(f"{SCHEMA_VERSION_KEY}: {SCHEMA_VERSION}\nstall:\n  newKnob: 3\n")
    assert agent._reload()
    assert "stall.newKnob: unknown key" in agent.config_problem
    assert sample("config_rejected") == 1.0 and agent.cfg.intervals.gpu == 7  # the last good stays
    assert sample("config_ignored_keys") == 2.0  # still the config in force

"""A reloaded config reaches what the agent's wiring built once: the DCGM client, the probes'
timeouts (the writer's and the brake's keys are tested against a real API server in
test_agent_kube.py and test_brake.py; the engine's in test_engine.py)."""

from __future__ import annotations

from pathlib import Path

from agent.cli.agent import LiveParts
from agent.config import load_config_dir, parse_config
from agent.config.watch import ConfigWatcher
from agent.core.facts import Input
from agent.engine.engine import Engine
from agent.probes.live import LiveSource
from agent.reporters.metrics import Metrics

ROOT = Path(__file__).parent.parent


def test_dcgm_address_timeouts_and_tool_timeouts_are_live(tmp_path: Path) -> None:
    old = load_config_dir(ROOT / "config")
    source = LiveSource(timeout_s=old.timeouts.nvidia_smi, nvml_timeout_s=old.timeouts.nvml)
    parts = LiveParts(source, None, None, Metrics(), None, dcgm_wanted=True)
    engine = Engine(source, old, extra_inputs=parts.dcgm_inputs(old)[0])
    first = parts.dcgm
    assert first is not None and first.health.client.address == old.dcgm.address
    new = parse_config(
        {
            "dcgm": {"address": "10.0.0.7:5555", "connectTimeout": 2, "diagLevel": 3},
            "timeouts": {"nvidiaSmi": 7, "nvml": 9},
        }
    )
    parts.reconfigure(engine, old, new)
    assert parts.dcgm is not first and parts.dcgm is not None
    assert parts.dcgm.health.client.address == "10.0.0.7:5555"
    assert parts.dcgm.health.client.connect_timeout_s == 2 and parts.dcgm.runner.level == 3
    assert engine.extra_inputs[Input.DCGM_HEALTH] == parts.dcgm.health.poll  # the engine reads the new one
    assert (source.timeout_s, source.nvml_timeout_s) == (7, 9)


def test_a_dcgm_check_switched_on_by_a_reload_gets_a_client() -> None:
    off = parse_config({"checks": {"dcgm-health": False, "dcgm-diag": False}})
    source = LiveSource()
    parts = LiveParts(source, None, None, Metrics(), None, dcgm_wanted=True)
    inputs, _ = parts.dcgm_inputs(off)
    engine = Engine(source, off, extra_inputs=inputs)
    assert inputs == {} and parts.dcgm is None
    on = parse_config({})
    parts.reconfigure(engine, off, on)
    assert parts.dcgm is not None and Input.DCGM_HEALTH in engine.extra_inputs


def test_the_api_inputs_survive_a_reload_that_rebuilds_the_dcgm_client() -> None:
    """The DRA driver's devices (read from the API) stay an input of the engine when a reload
    rebuilds the DCGM inputs, and without any DCGM check too."""
    off = parse_config({"checks": {"dcgm-health": False, "dcgm-diag": False}})
    source = LiveSource()
    parts = LiveParts(source, None, None, Metrics(), None, dcgm_wanted=True)

    def dra() -> object:
        return "the API's slices"

    parts.api_inputs[Input.DRA] = dra
    inputs, _ = parts.dcgm_inputs(off)
    engine = Engine(source, off, extra_inputs=inputs)
    assert inputs == {Input.DRA: dra}
    parts.reconfigure(engine, off, parse_config({}))
    assert parts.dcgm is not None and engine.extra_inputs[Input.DRA] is dra
    assert Input.DCGM_HEALTH in engine.extra_inputs


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

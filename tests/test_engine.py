"""The engine on a snapshot: a verdict's marks, config reload, the follower, metrics, a stuck probe,
modes and the taint's severity. What it remembers between cycles (latches, hysteresis): test_state.py."""

from __future__ import annotations

import json
import shutil
import threading
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config_dir, parse_config
from agent.config.watch import ConfigWatcher
from agent.core.facts import Input
from agent.core.node_keys import CONDITIONS
from agent.core.severity import Severity, Status
from agent.engine.engine import Engine
from agent.engine.write_policy import fingerprint
from agent.probes.kernel_follow import KernelFollower
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).parent.parent
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
XID_LINE = (
    "kern  :err   : 2025-01-21T03:12:44,118231+00:00 NVRM: Xid (PCI:0000:97:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus.\n"
)


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    return dest


def engine_for(snap: Path, extra_inputs: dict[Input, Any] | None = None, **cfg_doc: object) -> Engine:
    cfg = load_config_dir(ROOT / "config")
    if cfg_doc:
        base = parse_config(cfg_doc)
        cfg = type(cfg)(
            raw=base.raw,
            profiles=cfg.profiles,
            xid_catalog=cfg.xid_catalog,
            severity_overrides=base.severity_overrides,
        )
    return Engine(SnapshotSource(snap), cfg, extra_inputs=extra_inputs)


def run_all(engine: Engine) -> None:
    for tier in ("gpu", "xid", "efa", "topology"):
        engine.run_tier(tier)


def test_healthy_snapshot_passes_without_taint(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.PASS and not marks.taint
    assert (marks.condition_status, marks.condition_reason) == astuple(CONDITIONS[Status.PASS])
    assert json.loads(marks.results_json)["status"] == "pass"


def test_steady_state_marks_do_not_change(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)  # the first EFA read has no previous sample to compute counter rates from
    eng.evaluate()
    run_all(eng)
    _, first = eng.evaluate()
    run_all(eng)
    _, second = eng.evaluate()
    assert fingerprint(first) == fingerprint(second)


def test_unreadable_kernel_log_makes_the_node_unknown_not_failed(snap: Path) -> None:
    (snap / "kmsg.log").write_bytes(b"\x00" * 4096)
    eng = engine_for(snap)
    run_all(eng)
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.UNKNOWN and not marks.taint
    assert marks.condition_status == "Unknown" and "xid" in marks.condition_message


def test_a_shorter_interval_takes_effect_at_once(snap: Path) -> None:
    eng = engine_for(snap)
    run_all(eng)
    due_before = eng.schedule.next_due["gpu"]
    eng.cfg = engine_for(snap, intervals={"gpu": 5}).cfg
    eng.schedule.reschedule_all()
    assert eng.schedule.next_due["gpu"] <= eng.schedule.last_run["gpu"] + 5 < due_before


def test_config_watcher_accepts_good_and_rejects_bad_edits(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: 60\n")
    cfg = load_config_dir(tmp_path)
    watcher = ConfigWatcher(tmp_path, cfg)
    assert watcher.poll() is None
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: 10\n")
    outcome = watcher.poll()
    assert outcome is not None and outcome.config is not None and outcome.config.intervals.gpu == 10
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: ten\n")
    outcome = watcher.poll()
    assert outcome is not None and outcome.config is None and "intervals.gpu" in (outcome.error or "")
    assert watcher.current.intervals.gpu == 10  # the last good config stays


def test_the_follower_wakes_on_an_appended_xid_line(snap: Path) -> None:
    wake = threading.Event()
    follower = KernelFollower(SnapshotSource(snap).kernel_tail, wake.set)
    follower.start()
    try:
        assert wake.wait(10)  # the full read at start
        wake.clear()
        with (snap / "kmsg.log").open("a") as fh:
            fh.write("kern  :info  : 2025-01-21T03:12:40,0+00:00 eth0: link up\n")
        assert not wake.wait(0.3)
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        assert wake.wait(10)
    finally:
        follower.stop()
        follower.join(2)


def test_metrics_and_health_endpoints(snap: Path) -> None:
    import urllib.error
    import urllib.request

    from agent.engine.loop import Agent
    from agent.reporters.http import serve_http
    from agent.reporters.metrics import Metrics

    cfg = load_config_dir(ROOT / "config")
    metrics = Metrics()
    agent = Agent(
        SnapshotSource(snap),
        cfg,
        config_dir=None,
        writer=None,
        node_getter=None,
        kernel_path=None,
        kernel_is_device=False,
        metrics=metrics,
    )
    assert serve_http(0, metrics.registry, agent.healthy, agent.ready) is None  # port 0 means: no endpoint
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve_http(port, metrics.registry, agent.healthy, agent.ready)
    assert server is not None
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert err.value.code == 503  # no verdict yet
        agent.run(once=True)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "gpu_healthcheck_check_status{" not in text  # per-check series only for checks not fine
        assert 'gpu_healthcheck_checks{status="fail"} 0.0' in text
        assert 'gpu_healthcheck_node_status{status="pass"} 1.0' in text
        assert 'gpu_healthcheck_node_status{status="fail"}' not in text  # one series, the current status
        assert 'gpu_healthcheck_tier_duration_seconds_count{tier="gpu"} 1.0' in text
        assert "_created" not in text
        series = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert len(series) <= 60, len(series)
        records = float(text.split("\ngpu_healthcheck_kernel_log_records ")[1].split()[0])
        assert records > 1000  # the snapshot's whole boot, each record once
        assert "\ngpu_healthcheck_kernel_log_lost_records 0.0" in text
        assert "\ngpu_healthcheck_kernel_log_untallied_lines 0.0" in text
    finally:
        server.shutdown()


def test_a_probe_stuck_past_the_check_timeout_is_unknown_and_does_not_stall(snap: Path) -> None:
    release = threading.Event()
    never = {Input.RDMA: lambda: release.wait(60)}  # a sysfs read that never returns
    eng = engine_for(snap, extra_inputs=never, timeouts={"check": 1})
    try:
        results = eng.run_tier("efa")
        assert results[0].status is Status.UNKNOWN and "did not finish in 1 s" in results[0].message
        again = eng.run_tier("efa")  # not started a second time while the first is stuck
        assert "still stuck" in again[0].message
        eng.run_tier("gpu")
        verdict, marks = eng.evaluate()
        assert verdict.status is Status.UNKNOWN and not marks.taint
    finally:
        release.set()


def test_the_agent_rejects_an_edit_that_names_an_unknown_rule(snap: Path, tmp_path: Path) -> None:
    """The agent's own watcher knows the registry's rules: a typo is rejected, not silently ignored."""
    from agent.engine.loop import Agent

    (tmp_path / "config.yaml").write_text("severities:\n  gpu.pcie.width: reset\n")
    agent = Agent(
        SnapshotSource(snap),
        load_config_dir(tmp_path),
        config_dir=tmp_path,
        writer=None,
        node_getter=None,
        kernel_path=None,
        kernel_is_device=False,
    )
    assert agent.watcher is not None
    (tmp_path / "config.yaml").write_text("severities:\n  gpu.pcie.widht: reset\n")
    outcome = agent.watcher.poll()
    assert outcome is not None and outcome.config is None and "gpu.pcie.widht" in (outcome.error or "")


def _gpu_timeout(snap: Path) -> None:
    (snap / "errors.json").write_text(
        json.dumps({"nvidia-smi-q.txt": {"kind": "timeout", "message": "no answer after 30 s; killed"}})
    )


def test_observe_and_label_modes_never_ask_for_a_taint(snap: Path) -> None:
    for mode, label in (("observe", False), ("label", True)):
        eng = engine_for(snap, node={"mode": mode})
        _gpu_timeout(snap)
        run_all(eng)
        eng.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
        verdict, marks = eng.evaluate()
        assert verdict.status is Status.FAIL and not marks.taint
        assert marks.unhealthy_label is label and marks.taint_value == "reboot"
        (snap / "errors.json").unlink()


def test_the_lowest_severity_that_taints_and_the_effect_per_severity(snap: Path) -> None:
    _gpu_timeout(snap)  # a reboot failure
    high = engine_for(snap, node={"taintMinSeverity": "isolate"})
    run_all(high)
    high.run_tier("gpu")  # confirmed: a second failing cycle (node.confirmAfter 2)
    verdict, marks = high.evaluate()
    assert verdict.severity is Severity.REBOOT and not marks.taint, "reboot is below isolate"
    assert marks.condition_status == "False"  # still reported as failing

    eng = engine_for(
        snap, node={"taintMinSeverity": "reboot", "taintEffectBySeverity": {"reboot": "NoExecute"}}
    )
    run_all(eng)
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.taint and marks.taint_effect == "NoExecute"
    plain = engine_for(snap, node={"taintEffectBySeverity": {"isolate": "NoExecute"}})
    run_all(plain)
    plain.run_tier("gpu")
    _, marks = plain.evaluate()
    assert marks.taint and marks.taint_effect == "NoSchedule"


def test_an_effect_for_a_severity_that_never_taints_is_rejected() -> None:
    from agent.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"taintEffectBySeverity\.monitor"):
        parse_config({"node": {"taintEffectBySeverity": {"monitor": "NoExecute"}}})
    with pytest.raises(ConfigError, match=r"node\.mode"):
        parse_config({"node": {"mode": "shadow"}})


def test_a_tier_run_that_changes_nothing_logs_at_debug(snap: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Quiet logs (issue 18): the first run and a change say so at info; a repeat says nothing there."""
    import logging

    eng = engine_for(snap)
    with caplog.at_level(logging.INFO, logger="gpu-healthcheck.engine"):
        eng.run_tier("xid")
        assert [r.levelno for r in caplog.records if "tier xid" in r.message] == [logging.INFO]
        caplog.clear()
        eng.run_tier("xid")
        assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
        with (snap / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        eng.run_tier("xid")
        (line,) = [r for r in caplog.records if r.levelno >= logging.INFO]
        assert line.message.endswith("changed: xid")

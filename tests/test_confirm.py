"""Issue 28: one slow read is not a broken GPU.

A GPU inventory read that timed out is tried once more in the same cycle (nvidia-smi); a finding a
transient can trip (Rule.confirm) fails the node only after node.confirmAfter consecutive runs of its
check, and is `unknown` until then; plain evidence (an Xid 79 line, a DBE count, a lost GPU handle)
fails in the first cycle. The tools are faked at the lowest layer: an nvidia-smi on PATH that hangs
(then answers), the fake pynvml of test_nvml, and snapshots whose errors.json records a
timeout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.checks.registry import RULES
from agent.cli.main import main
from agent.config import load_config_dir
from agent.config.watch import ConfigWatcher
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.core.telemetry import NoTelemetry
from agent.engine.confirm import Confirmations
from agent.engine.engine import Engine
from agent.probes import nvml
from agent.probes.live import LiveSource
from agent.probes.snapshot import SnapshotSource
from agent.reporters.metrics import Metrics
from tests.conftest import live_cfg
from tests.readme import page
from tests.test_nvml import FakeNvml, healthy_h100

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures" / "nvidia-smi-xml"
XML = FIX / "telegraf-a10g-515.105.01.xml"
DBE = FIX / "telegraf-a10g-515.105.01-DERIVED-volatile-dram-uncorrectable.xml"
MISSING = FIX / "telegraf-dual-rtx-a5000-590.44.01-v13-DERIVED-gpu1-missing.xml"
LOST = "Unable to determine the device handle for GPU0000:C1:00.0: GPU is lost.  Reboot the system"
HEALTHY = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XID79 = ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79"
TIMEOUT = {"nvidia-smi-q.txt": {"kind": "timeout", "message": "no answer after 30 s; killed"}}
HANG_S = 0.3  # the fake nvidia-smi's timeout in these tests


class Reads(NoTelemetry):
    """The tool reads a source reports (the agent's Metrics.record_tool_read)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str, float]] = []

    def record_tool_read(self, tool: str, outcome: str, seconds: float) -> None:
        self.reads.append((tool, outcome, seconds))


def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hangs: int, body: str) -> Path:
    """An nvidia-smi on PATH that hangs on its first *hangs* runs (-1: always), then runs *body*.
    Returns the file that counts its runs."""
    runs = tmp_path / "runs"
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{runs}" 2>/dev/null || echo 0); echo $((n + 1)) > "{runs}"\n'
        f'if [ {hangs} -lt 0 ] || [ "$n" -lt {hangs} ]; then sleep 300; fi\n'
        f"{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    return runs


def runs(counter: Path) -> int:
    return int(counter.read_text()) if counter.exists() else 0


def live(tmp_path: Path, **kw: Any) -> LiveSource:
    kw.setdefault("timeout_s", HANG_S)
    kw.setdefault("use_nvml", False)
    timeouts = {k: kw.pop(k) for k in ("timeout_s", "nvml_timeout_s", "check_timeout_s") if k in kw}
    return LiveSource(live_cfg(**timeouts), sys_root=tmp_path, kmsg_path=str(tmp_path / "kmsg"), **kw)


def responsive(eng: Engine) -> CheckResult:
    return eng.results["gpu.responsive"]


# ----------------------------------------------------------------------------- the second try


def test_a_read_that_hangs_once_is_tried_again_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = fake_nvidia_smi(tmp_path, monkeypatch, 1, f'cat "{XML}"')
    reads = Reads()
    inv = live(tmp_path, telemetry=reads).gpus()
    assert isinstance(inv, GpuInventory) and len(inv.gpus) == 1
    assert runs(counter) == 2
    assert [(tool, outcome) for tool, outcome, _ in reads.reads] == [
        ("nvidia-smi -q -x", "timeout"),
        ("nvidia-smi -q -x", "ok"),
    ]
    assert reads.reads[0][2] >= HANG_S  # a timed-out read is observed at its limit, not at zero


def test_a_read_that_always_hangs_is_a_timeout_after_its_second_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = fake_nvidia_smi(tmp_path, monkeypatch, -1, f'cat "{XML}"')
    got = live(tmp_path).gpus()
    assert isinstance(got, ProbeError) and got.kind is ProbeErrorKind.TIMEOUT
    assert "second try, nvidia-smi -q -x: no answer after" in got.message
    assert runs(counter) == 2


@pytest.mark.parametrize(("check_s", "tries"), [(2.5, 1), (9.0, 2)])
def test_the_second_try_fits_in_what_timeouts_check_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check_s: float, tries: int
) -> None:
    """0.3 s spent on the first try and 6 s kept free under the engine's bound (timeouts.check): no
    second try fits in 2.5 s; in 9 s one does (with room for a slow start of the first try: at load
    20 a 7 s bound left none)."""
    counter = fake_nvidia_smi(tmp_path, monkeypatch, -1, f'cat "{XML}"')
    got = live(tmp_path, check_timeout_s=check_s).gpus()
    assert isinstance(got, ProbeError) and got.kind is ProbeErrorKind.TIMEOUT
    assert runs(counter) == tries
    said = "second try, nvidia-smi -q -x" if tries == 2 else "no second try: timeouts.check leaves no time"
    assert said in got.message


@pytest.fixture
def fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """The fake pynvml of test_nvml, hung in the driver until the test ends."""
    fake = FakeNvml([healthy_h100()])
    fake.block = threading.Event()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    yield fake
    fake.block.set()
    for worker in nvml._WATCHDOG.parked(nvml.SOURCE):
        worker.join(timeout=10)


def test_a_hung_nvml_read_gets_nvidia_smi_as_its_second_opinion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pynvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """A hung NVML call cannot be retried while its thread is stuck: nvidia-smi, a process that can
    be killed, is the second try."""
    caplog.set_level(logging.WARNING, logger="gpu-healthcheck.probes")
    counter = fake_nvidia_smi(tmp_path, monkeypatch, 0, f'cat "{XML}"')
    reads = Reads()
    source = live(tmp_path, use_nvml=True, nvml_timeout_s=HANG_S, timeout_s=10, telemetry=reads)
    inv = source.gpus()
    assert isinstance(inv, GpuInventory) and inv.source.startswith("nvidia-smi")
    assert [(t, o) for t, o, _ in reads.reads] == [("nvml", "timeout"), ("nvidia-smi -q -x", "ok")]
    # Still stuck at the next cycle: NVML is not called again (no read, nothing observed).
    again = source.gpus()
    assert isinstance(again, GpuInventory) and runs(counter) == 2
    assert [(t, o) for t, o, _ in reads.reads[2:]] == [("nvidia-smi -q -x", "ok")]
    said = [r for r in caplog.records if "the second try, nvidia-smi -q -x, answered" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING], "said once while it lasts"


# ----------------------------------------------------------------------------- across cycles


def test_the_first_timeout_is_unknown_and_the_second_cycle_fails_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, -1, f'cat "{XML}"')
    eng = Engine(live(tmp_path), load_config_dir(ROOT / "config"))
    eng.run_tier("gpu")
    verdict, marks = eng.evaluate()
    first = responsive(eng)
    assert first.status is Status.UNKNOWN and not first.findings
    assert "failing run 1 of 2, confirming" in first.message and "no answer after" in first.message
    assert verdict.status is Status.UNKNOWN and not marks.taint and marks.taint_severity is None
    eng.run_tier("gpu")
    verdict, marks = eng.evaluate()
    assert [f.rule for f in responsive(eng).findings] == ["gpu.responsive.timeout"]
    assert verdict.status is Status.FAIL and verdict.severity is Severity.REBOOT
    assert marks.taint and marks.taint_value == "reboot"


@pytest.mark.parametrize("hangs", [1, 2])
def test_a_hang_that_does_not_last_never_fails_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hangs: int
) -> None:
    """Hung once: the second try answers in the same cycle. Hung twice: the first cycle is unknown,
    the next one answers."""
    fake_nvidia_smi(tmp_path, monkeypatch, hangs, f'cat "{XML}"')
    eng = Engine(live(tmp_path), load_config_dir(ROOT / "config"))
    seen = []
    for _ in range(3):
        eng.run_tier("gpu")
        verdict, marks = eng.evaluate()
        assert verdict.status is not Status.FAIL and not marks.taint
        seen.append(responsive(eng).status)
    assert seen == ([Status.PASS] * 3 if hangs == 1 else [Status.UNKNOWN, Status.PASS, Status.PASS])


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        (f'cat "{DBE}"', "gpu.ecc.dram-uncorrectable"),
        (f'cat "{MISSING}"; echo "{LOST}" >&2', "gpu.responsive.lost"),
    ],
)
def test_plain_evidence_fails_in_the_first_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, rule: str
) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, 0, body)
    eng = Engine(live(tmp_path, timeout_s=10), load_config_dir(ROOT / "config"))
    eng.run_tier("gpu")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and marks.taint
    assert rule in {f.rule for r in verdict.results for f in r.findings}


def test_an_xid_79_and_a_lost_gpu_fail_in_the_first_cycle(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(XID79, snap, symlinks=True)
    eng = Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"))
    for tier in ("gpu", "xid"):
        eng.run_tier(tier)
    verdict, marks = eng.evaluate()
    rules = {f.rule for r in verdict.results for f in r.findings}
    assert verdict.status is Status.FAIL and marks.taint
    assert "gpu.responsive.lost" in rules and any(
        k.startswith("xid/79") for k in (f.key for r in verdict.results for f in r.findings)
    )


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    dest = tmp_path / "snap"
    shutil.copytree(HEALTHY, dest, symlinks=True)
    return dest


def hang(snap: Path, on: bool = True) -> None:
    if on:
        (snap / "errors.json").write_text(json.dumps(TIMEOUT))
    else:
        (snap / "errors.json").unlink(missing_ok=True)


def test_confirm_after_is_live_and_a_confirmed_failure_survives_a_higher_value(
    snap: Path, tmp_path: Path
) -> None:
    cfg_dir = tmp_path / "config"
    cfg_dir.mkdir()
    (cfg_dir / "config.yaml").write_text("node:\n  confirmAfter: 3\n")
    watcher = ConfigWatcher(cfg_dir, load_config_dir(cfg_dir))
    eng = Engine(SnapshotSource(snap), watcher.current)

    def reload(text: str) -> None:
        (cfg_dir / "config.yaml").write_text(text)
        outcome = watcher.poll()
        assert outcome is not None and outcome.config is not None
        eng.cfg = outcome.config  # what the agent's loop does with a reload

    hang(snap)
    eng.run_tier("gpu")
    assert "failing run 1 of 3" in responsive(eng).message
    reload("node:\n  confirmAfter: 1\n")
    eng.run_tier("gpu")
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.FAIL and marks.taint  # 2 runs, and 1 is enough now
    reload("node:\n  confirmAfter: 5\n")
    eng.run_tier("gpu")
    verdict, _ = eng.evaluate()
    assert verdict.status is Status.FAIL, "a finding confirmed once stays confirmed while it lasts"
    hang(snap, False)
    eng.run_tier("gpu")
    hang(snap)
    eng.run_tier("gpu")  # a new streak, judged by the value now in force
    assert "failing run 1 of 5" in responsive(eng).message


def test_an_unconfirmed_cycle_never_clears_a_mark(snap: Path) -> None:
    eng = Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"))
    hang(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.taint and marks.taint_value == "reboot"
    hang(snap, False)
    eng.run_tier("gpu")  # pass 1 of recoverAfter 3
    _, marks = eng.evaluate()
    assert "recovering: 1/3" in marks.condition_message
    hang(snap)
    eng.run_tier("gpu")  # the streak started again: unconfirmed, unknown
    verdict, marks = eng.evaluate()
    assert verdict.status is Status.UNKNOWN
    assert marks.taint and marks.taint_value == "reboot", "an unconfirmed finding never clears a mark"
    assert "recovery paused at 1/3" in marks.condition_message
    hang(snap, False)
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert marks.taint and "recovering: 2/3" in marks.condition_message  # the unknown cycle did not count
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    assert not marks.taint


@pytest.mark.parametrize(("same_boot", "first"), [(True, Status.FAIL), (False, Status.UNKNOWN)])
def test_an_agent_restart_keeps_a_confirmed_failure_a_reboot_does_not(
    snap: Path, same_boot: bool, first: Status
) -> None:
    eng = Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"))
    hang(snap)
    eng.run_tier("gpu")
    eng.run_tier("gpu")
    _, marks = eng.evaluate()
    doc = json.loads(marks.results_json)
    if not same_boot:
        doc["bootId"] = "another-boot"
    restarted = Engine(SnapshotSource(snap), load_config_dir(ROOT / "config"))
    restarted.restore(doc)
    restarted.run_tier("gpu")
    verdict, marks = restarted.evaluate()
    assert verdict.status is first
    assert marks.taint, "either way the taint stays (restored from the annotation)"


# ----------------------------------------------------------------------------- the rules and their docs


def test_only_findings_of_confirm_rules_at_reset_or_above_are_held_back() -> None:
    def finding(rule: str, severity: Severity) -> Finding:
        return Finding("c", rule, severity, f"{rule} msg", key=rule)

    confirm = Confirmations()
    res = CheckResult(
        "c",
        findings=(
            finding("gpu.responsive.timeout", Severity.REBOOT),
            finding("gpu.pcie.width", Severity.MONITOR),  # a warning marks nothing: not held back
            finding("gpu.ecc.dram-uncorrectable", Severity.RESET),  # plain evidence
        ),
        unknown="could not read part of it",
    )
    (out,) = confirm.judge([res], 2, RULES)
    assert [f.rule for f in out.findings] == ["gpu.pcie.width", "gpu.ecc.dram-uncorrectable"]
    assert out.unknown is not None and out.unknown.startswith(
        "could not read part of it; gpu.responsive.timeout"
    )
    assert confirm.pending() == {"gpu.responsive.timeout": 1}
    (again,) = confirm.judge([res], 2, RULES)
    assert again == res and confirm.pending() == {}


def _readme_list(label: str) -> set[str]:
    text = page("checks.md")
    start = text.index("### What fails a node, what makes it unknown")
    section = text[start : text.index("\n### ", start + 10)]
    item = section[section.index(f"- **{label}") :]
    item = re.split(r"\n(?:- |\n)", item, maxsplit=1)[0]  # to the next item or a blank line
    return set(re.findall(r"`([a-z0-9-]+(?:\.[a-z0-9-]+)+)`", item))


def test_the_readme_names_exactly_the_rules_that_need_confirmation() -> None:
    assert _readme_list("Confirmed over") == {name for name, rule in RULES.items() if rule.confirm}
    immediate = _readme_list("Immediate")
    assert immediate and all(name in RULES and not RULES[name].confirm for name in immediate)


def test_plain_evidence_rules_never_need_confirmation() -> None:
    plain = (
        "gpu.responsive.lost",
        "gpu.ecc.dram-uncorrectable",
        "gpu.ecc.sram-uncorrectable",
        "gpu.row-remap.failure",
        "gpu.row-remap.pending",
        "gpu.retired-pages.double-bit",
        "gpu.retired-pages.pending",
        "gpu.recovery-action.reboot",
        "xid.pcie-aer",
        "pci.aer.fatal",
        "dcgm-diag.fail-isolate",
    )
    assert not [name for name in plain if RULES[name].confirm]


def test_rules_marks_the_rules_that_need_confirmation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    marked = {ln.split()[0] for ln in lines if "[confirmed over node.confirmAfter runs]" in ln}
    assert marked == {name for name, rule in RULES.items() if rule.confirm}


def test_the_tool_histogram_has_buckets_up_to_the_timeout() -> None:
    metrics = Metrics()
    metrics.record_tool_read("nvml", "ok", 0.05)
    metrics.record_tool_read("nvidia-smi -q -x", "timeout", 30.01)
    text = generate_latest(metrics.registry).decode()
    for le in ("0.1", "1.0", "5.0", "10.0", "20.0", "30.0"):
        assert f'gpu_healthcheck_tool_seconds_bucket{{le="{le}",outcome="ok",tool="nvml"}} 1.0' in text
    assert (
        'gpu_healthcheck_tool_seconds_bucket{le="30.0",outcome="timeout",tool="nvidia-smi -q -x"} 0.0' in text
    )
    assert 'gpu_healthcheck_tool_seconds_count{outcome="timeout",tool="nvidia-smi -q -x"} 1.0' in text


def test_the_read_budget_follows_timeouts_check_on_a_reload() -> None:
    from agent.config import parse_config

    old = load_config_dir(ROOT / "config")
    source = LiveSource(old)
    source.apply_config(old, parse_config({"timeouts": {"check": 45}}))
    assert source.check_timeout_s == 45

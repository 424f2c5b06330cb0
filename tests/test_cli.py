"""The `check` command end to end on snapshots: verdicts, exit codes, JSON schema, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.config.schema import SCHEMA_VERSION

ROOT = Path(__file__).parent.parent
SNAP = ROOT / "examples" / "snapshots"
HEALTHY, XID79 = SNAP / "p5.48xlarge-healthy", SNAP / "p5.48xlarge-xid79"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["check", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_healthy_p5_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, "--from-snapshot", str(HEALTHY))
    assert code == 0
    assert doc["status"] == "pass" and doc["severity"] == "none"
    assert {c["status"] for c in doc["checks"]} <= {"pass", "skipped"}


def test_xid79_p5_fails_with_reboot(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, "--from-snapshot", str(XID79))
    assert code == 1
    assert doc["status"] == "fail" and doc["severity"] == "reboot"
    by_name = {c["name"]: c for c in doc["checks"]}
    assert by_name["xid"]["severity"] == "reboot" and "Xid 79" in by_name["xid"]["message"]
    assert by_name["gpu.responsive"]["status"] == "fail"
    assert by_name["gpu.allocatable"]["severity"] == "monitor"
    assert any(item["check"] == "xid" and item["key"].startswith("xid/79/") for item in doc["latched"])


def test_results_json_follows_the_node_contract(capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = run_json(capsys, "--from-snapshot", str(XID79))
    assert set(doc) == {
        "version",
        "status",
        "severity",
        "checkedAt",
        "bootId",
        "instanceType",
        "agentVersion",
        "checks",
        "latched",
        "gpus",
        "trends",  # this check's read of the trend warnings' counters (core/trend_history.py)
    }
    assert doc["version"] == 1 and doc["instanceType"] == "p5.48xlarge"
    assert len(doc["trends"]["t"]) == 1 and len(doc["trends"]["g"]) == 7  # the lost GPU has no read
    assert doc["bootId"] == "3f0c1c56-2f4a-4b8e-9a7d-6c1e2b9d0a11"
    for c in doc["checks"]:
        base = {"name", "status", "severity", "message", "at", "durationMs", "entities"}
        assert set(c) == (base | {"action", "escalation"} if c["severity"] != "none" else base)
    for item in doc["latched"]:
        assert set(item) == {"check", "key", "severity", "since", "message", "action", "escalation"}
    xid = next(c for c in doc["checks"] if c["name"] == "xid")
    assert (xid["action"], xid["escalation"]) == ("reboot", ["service"])  # NVIDIA: RESTART_BM
    # GPU 4 fell off the bus: the driver lists it as lost (no index, no UUID), with both findings
    (gpu4,) = [g for g in doc["gpus"] if g["status"] == "fail"]
    assert gpu4["lost"] is True and gpu4["pci"] == "0000:97:00.0" and gpu4["severity"] == "reboot"
    assert "xid/79/0000:97:00.0" in gpu4["findings"] and gpu4["action"] == "reboot"
    healthy = [g for g in doc["gpus"] if not g.get("lost")]
    assert [g["index"] for g in healthy] == [0, 1, 2, 3, 5, 6, 7] and all(g["uuid"] for g in healthy)
    assert all(g["status"] == "pass" and "findings" not in g for g in healthy)
    assert len(json.dumps(doc, separators=(",", ":")).encode()) < 16 * 1024


def test_missing_files_are_skipped_never_pass_or_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "instance-type").write_text("p5.48xlarge\n")
    shutil.copy(HEALTHY / "kmsg.log", tmp_path / "kmsg.log")
    code, doc = run_json(capsys, "--from-snapshot", str(tmp_path))
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert statuses["xid"] == "pass"
    assert all(s == "skipped" for n, s in statuses.items() if n != "xid")
    assert code == 0 and doc["status"] == "pass"


def test_a_garbage_file_is_unknown_not_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nvidia-smi-q.xml").write_bytes(b"\x00\x01<gpu>not xml at all")
    code, doc = run_json(capsys, "--from-snapshot", str(tmp_path))
    assert code == 2 and doc["status"] == "unknown"
    responsive = next(c for c in doc["checks"] if c["name"] == "gpu.responsive")
    assert responsive["status"] == "unknown" and "could not read" in responsive["message"]


def test_one_recorded_timeout_is_confirming_as_the_agent_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check` applies node.confirmAfter as the agent does at its first run: one timeout is held back
    (unknown, "failing run 1 of 2, confirming"), never a failure the agent would not mark; with
    confirmAfter 1 the same read fails the node (reboot)."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "errors.json").write_text(
        json.dumps({"nvidia-smi-q.xml": {"kind": "timeout", "message": "no answer after 30 s; killed"}})
    )
    code, doc = run_json(capsys, "--from-snapshot", str(snap))
    assert code == 2 and doc["status"] == "unknown", doc
    responsive = next(c for c in doc["checks"] if c["name"] == "gpu.responsive")
    assert responsive["status"] == "unknown"
    assert "failing run 1 of 2, confirming before it counts: node.confirmAfter" in responsive["message"]
    assert main(["check", "--from-snapshot", str(snap)]) == 2
    assert "1 of 2, confirming" in capsys.readouterr().out

    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.yaml").write_text("node:\n  confirmAfter: 1\n")
    code, doc = run_json(capsys, "--from-snapshot", str(snap), "--config-dir", str(cfg))
    assert code == 1 and doc["status"] == "fail" and doc["severity"] == "reboot"


def test_only_and_instance_type(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run_json(capsys, "--from-snapshot", str(XID79), "--only", "gpu.ecc,topology")
    assert [c["name"] for c in doc["checks"]] == ["gpu.ecc", "topology"]
    assert code == 0
    _, doc = run_json(
        capsys, "--from-snapshot", str(HEALTHY), "--instance-type", "p4d.24xlarge", "--only", "gpu"
    )
    count = next(c for c in doc["checks"] if c["name"] == "gpu.count")
    assert count["status"] == "warn" and "expected A100" in count["message"]  # 8 H100s on a p4d


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--from-snapshot", str(XID79)]) == 1
    out = capsys.readouterr().out
    assert "status=fail severity=reboot" in out and "Xid 79" in out


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--from-snapshot", "/nonexistent/snapshot"],
        ["check", "--only", "gpu.nonsense"],
        ["check", "--bogus-flag"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_64_with_one_line_and_no_traceback(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 64
    assert "Traceback" not in proc.stderr and proc.stderr.strip()
    assert proc.stdout == ""


def test_invalid_config_dir_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("intervals:\n  gpu: -5\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "check",
            "--config-dir",
            str(tmp_path),
            "--from-snapshot",
            str(HEALTHY),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 64 and "intervals.gpu" in proc.stderr and "Traceback" not in proc.stderr


def test_demo_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "agent.cli.demo"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "status=pass" in proc.stdout and "status=fail severity=reboot" in proc.stdout


def test_inject_kmsg_needs_yes_and_writes_a_line_our_parser_reads(tmp_path: Path) -> None:
    from agent.probes.kernel_log import parse_kernel_log
    from agent.probes.xid_events import extract_xids

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    assert main(["inject", "kmsg", "--xid", "79", "--gpu", "0000:53:00.0", "--kmsg", str(kmsg)]) == 64
    assert kmsg.read_text() == ""
    assert main(["inject", "kmsg", "--xid", "79", "--gpu", "0000:53:00.0", "--kmsg", str(kmsg), "--yes"]) == 0
    events = extract_xids(parse_kernel_log(kmsg.read_text()))
    assert [(e.code, e.pci) for e in events] == [(79, "00000000:53:00.0")]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("checks:\n  gpu.nonsense: false\n", "gpu.nonsense"),
        ("severities:\n  no.such.rule: reset\n", "no.such"),
    ],
)
def test_a_config_naming_an_unknown_check_or_rule_is_a_usage_error(
    tmp_path: Path, text: str, needle: str
) -> None:
    (tmp_path / "config.yaml").write_text(text)
    assert main(["check", "--config-dir", str(tmp_path), "--from-snapshot", str(HEALTHY)]) == 64


def test_the_agent_starts_on_the_shipped_config_under_one_naming_an_unknown_rule(tmp_path: Path) -> None:
    """A bad (or newer) ConfigMap never stops the agent: it runs and says why."""
    (tmp_path / "config.yaml").write_text("severities:\n  gpu.pcie.widht: reset\n")
    argv = [
        "agent",
        "--node",
        "n1",
        "--no-kube",
        "--once",
        "--metrics-port",
        "0",
        "--config-dir",
        str(tmp_path),
        "--state-dir",
        str(tmp_path / "state"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", *argv, "--from-snapshot", str(HEALTHY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out
    assert "config rejected" in out and "unknown rule(s) ['gpu.pcie.widht']" in out
    assert "shipped default configuration" in out and "status=pass" in out


VALIDATE_CASES = {
    "valid": {"config.yaml": "intervals:\n  gpu: 30\n"},
    "only-tables": {"xid-catalog.yaml": None},  # None: the shipped file, copied
    "empty-dir": {},
    "bad-value": {"config.yaml": "intervals:\n  gpu: soon\n"},
    "newer-key": {"config.yaml": "node:\n  futureKnob: 1\n"},  # no schemaVersion: a typo
    "newer-schema": {"config.yaml": f"schemaVersion: {SCHEMA_VERSION + 1}\nnode:\n  futureKnob: 1\n"},
    "unknown-rule": {"config.yaml": "severities:\n  gpu.pcie.widht: reset\n"},
    "bad-yaml": {"config.yaml": "intervals: [\n"},
    "empty-catalog": {"xid-catalog.yaml": ""},
    "bad-profiles": {"instance-profiles.yaml": "p5.48xlarge: 8\n"},
}


@pytest.mark.parametrize("case", sorted(VALIDATE_CASES))
def test_config_validate_agrees_with_the_agent(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.checks.registry import RULE_BOOK
    from agent.config.last_good import load_at_start

    directory = tmp_path / case
    directory.mkdir()
    for name, text in VALIDATE_CASES[case].items():
        if text is None:
            shutil.copy(ROOT / "config" / name, directory / name)
        else:
            (directory / name).write_text(text)
    code = main(["config", "validate", str(directory)])
    out = capsys.readouterr()
    agent_problem = load_at_start(directory, None, RULE_BOOK).problem
    assert (code == 0) == (agent_problem == "")
    assert code in (0, 1) and "Traceback" not in out.err
    if code:
        assert agent_problem.endswith(": " + out.err.strip().split(": invalid: ", 1)[1])
    assert (code == 0) == (case in ("valid", "only-tables", "empty-dir", "newer-schema"))
    if case == "newer-schema":
        assert "ignored by this version: node.futureKnob" in out.out


def test_config_validate_usage() -> None:
    assert main(["config", "validate", "/nonexistent/dir"]) == 1
    with pytest.raises(SystemExit) as exc:
        main(["config"])
    assert exc.value.code == 64

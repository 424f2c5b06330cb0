"""The command runner: a hung tool is killed with its children and reaped; a missing tool is unavailable."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from agent.core.probed import ProbeError, ProbeErrorKind
from agent.probes.command import CommandOutput, run_command


def fake_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def zombies_of(pid: int) -> list[str]:
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == str(pid) and fields.get("State", "").startswith("Z"):
            out.append(fields.get("Name", "?").strip())
    return out


def test_a_hung_tool_and_its_children_are_killed_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "child.pid"
    fake_tool(tmp_path, "nvidia-smi", f"sleep 300 & echo $! > {marker}; wait")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    result = run_command(["nvidia-smi", "-q", "-x"], timeout_s=0.5)
    assert isinstance(result, ProbeError) and result.kind is ProbeErrorKind.TIMEOUT
    assert "0.5 s" in result.message
    child = int(marker.read_text())
    for _ in range(50):  # the kill is asynchronous for the grandchild; give the kernel a moment
        if not Path(f"/proc/{child}").exists() or "State:\tZ" in Path(f"/proc/{child}/status").read_text():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "State:\tZ" in Path(f"/proc/{child}/status").read_text()
    assert zombies_of(os.getpid()) == []


def test_output_and_exit_code_are_returned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed'; echo err >&2; exit 9")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    result = run_command(["nvidia-smi"], timeout_s=5)
    assert isinstance(result, CommandOutput)
    assert (
        result.returncode == 9 and "NVIDIA-SMI has failed" in result.stdout and result.stderr.strip() == "err"
    )


def test_a_missing_tool_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_command(["nvidia-smi"], timeout_s=5)
    assert isinstance(result, ProbeError) and result.kind is ProbeErrorKind.UNAVAILABLE

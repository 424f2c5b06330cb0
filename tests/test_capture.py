"""`gpu-healthcheck snapshot` against fake tools on PATH and a fake sysfs root, then replayed by `check`."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.probes.capture import capture

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures"
DEMO = ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy"
XML = FIX / "nvidia-smi-xml" / "telegraf-a10g-515.105.01.xml"
TOPO = FIX / "nvidia-smi-topo" / "nvgpuexp-h100-80gb-hbm3-590.48.01-topo-m.txt"


def fake_nvidia_smi(bin_dir: Path, *, hang: bool = False) -> None:
    """A stand-in nvidia-smi that prints real recordings for the arguments we call it with."""
    script = bin_dir / "nvidia-smi"
    hang_line = "sleep 300\n" if hang else ""
    script.write_text(
        "#!/bin/sh\n"
        + hang_line
        + 'case "$*" in\n'
        + f'  "-q -x") cat "{XML}" ;;\n'
        + f'  "-q") cat "{FIX / "nvidia-smi-q" / "gpud-a10x1-535.129.03.txt"}" ;;\n'
        + f'  "topo -m") cat "{TOPO}" ;;\n'
        + '  "nvlink -s") exit 0 ;;\n'
        + '  *) echo "unexpected args: $*" >&2; exit 2 ;;\n'
        + "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def fake_sys(root: Path) -> Path:
    """A /sys with the demo's EFA devices (device links into bus/pci/devices, as the kernel has them)."""
    shutil.copytree(DEMO / "sys", root / "sys", symlinks=True)
    return root / "sys"


def test_snapshot_captures_every_source_and_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,100,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03\n"
        "3,101,6000000,-;NVRM: Xid (PCI:0000:00:1e): 48, pid=1234, name=python, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.\n"
    )
    boot = tmp_path / "boot_id"
    boot.write_text("abc-123\n")
    out = tmp_path / "snap"
    problems = capture(
        out,
        timeout_s=5,
        sys_root=fake_sys(tmp_path),
        kmsg_path=str(kmsg),
        instance_type="g5.xlarge",
        boot_id_path=boot,
    )
    assert problems == {}
    names = {p.name for p in out.iterdir()}
    assert {
        "nvidia-smi-q.xml",
        "nvidia-smi-q.txt",
        "nvidia-smi-topo-m.txt",
        "nvidia-smi-nvlink-s.txt",
        "kmsg.log",
        "sys",
        "boot_id",
        "instance-type",
    } <= names
    assert (out / "nvidia-smi-q.xml").read_text() == XML.read_text()
    efa = out / "sys" / "class" / "infiniband" / "rdmap79s0"
    assert (efa / "ports" / "1" / "state").read_text().strip() == "4: ACTIVE"
    assert os.path.realpath(efa / "device").endswith("0000:4f:00.0")
    assert (
        out / "sys" / "bus" / "pci" / "devices" / "0000:4f:00.0" / "vendor"
    ).read_text().strip() == "0x1d0f"

    code = main(["check", "--from-snapshot", str(out), "--json", "--only", "gpu,xid,efa"])
    assert code == 1  # the Xid 48 in the captured kernel log


def test_snapshot_replay_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1000,-;Linux version 6.1.0\n")
    capture(
        tmp_path / "snap",
        timeout_s=5,
        sys_root=tmp_path / "nosys",
        kmsg_path=str(kmsg),
        instance_type="g5.xlarge",
    )
    capsys.readouterr()
    assert main(["check", "--from-snapshot", str(tmp_path / "snap"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {c["name"]: c for c in doc["checks"]}
    assert doc["instanceType"] == "g5.xlarge" and by["gpu.count"]["status"] == "pass"
    assert by["xid"]["status"] == "pass" and by["efa"]["status"] == "skipped"


def test_a_hung_nvidia_smi_is_recorded_as_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir, hang=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = tmp_path / "snap"
    problems = capture(out, timeout_s=0.5, sys_root=tmp_path / "nosys", kmsg_path=str(tmp_path / "missing"))
    assert "nvidia-smi-q.xml" in problems and "kmsg.log" in problems
    errors = json.loads((out / "errors.json").read_text())
    assert errors["nvidia-smi-q.xml"]["kind"] == "timeout"
    capsys.readouterr()
    # `check` confirms as the agent does: one recorded timeout is "1 of 2, confirming" (unknown) ...
    assert main(["check", "--from-snapshot", str(out), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    by = {c["name"]: c for c in doc["checks"]}
    responsive = by["gpu.responsive"]
    assert responsive["status"] == "unknown" and "1 of 2, confirming" in responsive["message"]
    assert by["xid"]["status"] == "unknown"  # the kernel log could not be read: not a pass
    # ... and with node.confirmAfter 1 the same hang fails the node for a reboot.
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "config.yaml").write_text("node:\n  confirmAfter: 1\n")
    assert main(["check", "--from-snapshot", str(out), "--config-dir", str(cfg_dir), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    by = {c["name"]: c for c in doc["checks"]}
    assert by["gpu.responsive"]["status"] == "fail" and by["gpu.responsive"]["severity"] == "reboot"
    assert by["xid"]["status"] == "unknown"  # the kernel log could not be read: not a pass

"""Each tool output is named once (agent/probes/tool_outputs.py): the commands the live source runs
are those capture runs, each file capture writes is one the snapshot source parses through the
table, a replay parses to what the live read parsed, and no source nor capture spells a tool's file
or command itself."""

from __future__ import annotations

import ast
import dataclasses
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.core.facts import Input
from agent.core.topo import TopoMatrix
from agent.probes.capture import capture
from agent.probes.inputs import SPEC, SPECS, source_readers
from agent.probes.live import LiveSource
from agent.probes.snapshot import BOOT_ID, ERRORS, ITYPE, KMSG, SnapshotSource
from agent.probes.tool_outputs import COMMANDS, GPU_TEXT, OUTPUTS, SNAPSHOT_FILES, source_of
from tests.conftest import live_cfg

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
# One H100 VM's outputs, recorded the same day (their .source.txt files say so).
PRINTS = {
    "-q -x": FIX / "h100-vm-capture" / "nvidia-smi-q.xml",
    "-q": FIX / "h100-vm-capture" / "nvidia-smi-q.txt",
    "topo -m": FIX / "nvidia-smi-topo" / "h100-capture-580.159.04-topo-m.txt",
    "nvlink -s": FIX / "nvlink" / "h100-capture-580.159.04-nvlink-s-empty.txt",
}
OWN_READERS = {KMSG, BOOT_ID, ITYPE, ERRORS, "sys"}  # read by readers of their own, not the table
# The modules that run, write or read the tool outputs: none may spell one.
READERS = ("agent/probes/live.py", "agent/probes/snapshot.py", "agent/probes/capture.py")
SCANNED = (
    *READERS,
    "agent/probes/source.py",
    "agent/probes/inputs.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "agent" / "cli").glob("*.py")),
)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in nvidia-smi on PATH that prints the recordings and logs the arguments it was run
    with; NVML cannot be loaded (the NVML readers are tested in test_nvml*)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "ran.log"
    bin_dir.mkdir()
    cases = "".join(f'  "{args}") cat "{path}" ;;\n' for args, path in PRINTS.items())
    script = bin_dir / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\necho "nvidia-smi $*" >> "{log}"\ncase "$*" in\n{cases}'
        '  *) echo "unexpected args: $*" >&2; exit 2 ;;\nesac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    return log


def ran(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return lines


class AskedSnapshot(SnapshotSource):
    """The snapshot source, noting each file it asks for."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: list[str] = []

    def text(self, name: str) -> Any:
        self.asked.append(name)
        return super().text(name)


def _snapshot(tmp_path: Path) -> Path:
    x = tmp_path / "absent"
    out = tmp_path / "snap"
    assert capture(out, timeout_s=10, sys_root=tmp_path / "nosys", kmsg_path=str(x), boot_id_path=x) == {
        "sys/bus/pci/devices": f"{tmp_path / 'nosys' / 'bus' / 'pci' / 'devices'} not present",
        KMSG: f"{x}: No such file or directory",
        BOOT_ID: "No such file or directory",
    }
    return out


def test_capture_runs_the_tables_commands_into_its_files_and_the_snapshot_reads_each(
    tools: Path, tmp_path: Path
) -> None:
    out = _snapshot(tmp_path)
    assert ran(tools) == [" ".join(o.argv) for o in COMMANDS]
    written = {p.name for p in out.iterdir()} - OWN_READERS
    assert written == {o.file for o in COMMANDS}
    assert all((out / o.file).read_bytes() == PRINTS[" ".join(o.argv[1:])].read_bytes() for o in COMMANDS)
    snap = AskedSnapshot(out)
    for read in source_readers(snap).values():
        read()
    assert written <= set(snap.asked)  # every file capture wrote is read
    assert {o.file for o in OUTPUTS} <= set(snap.asked)  # and every file of the table
    for spec in SPECS:  # an input that names its output is read from that output's file
        if spec.output is not None:
            snap.asked.clear()
            source_readers(snap)[spec.input]()
            assert spec.output.file in snap.asked, spec.input


def test_the_live_source_runs_the_commands_capture_runs_and_a_replay_parses_the_same(
    tools: Path, tmp_path: Path
) -> None:
    live = LiveSource(live_cfg(timeout_s=10), tmp_path / "nosys", str(tmp_path / "nokmsg"), use_nvml=False)
    now = {name: read() for name, read in source_readers(live).items()}
    # The text view is captured for the snapshot's sake (lost GPUs); live reads the XML.
    assert ran(tools) == [" ".join(o.argv) for o in COMMANDS if o is not GPU_TEXT]
    replay = source_readers(SnapshotSource(_snapshot(tmp_path)))
    for name in (Input.GPUS, Input.TOPO, Input.NVLINK):
        then = replay[name]()
        got = dataclasses.replace(now[name], taken_at=None) if name is Input.GPUS else now[name]
        assert then == got, name
    assert now[Input.GPUS].gpus and now[Input.TOPO].columns  # real reads, not two equal failures


def test_an_input_named_by_its_output_alone_is_read_by_both_sources(tools: Path, tmp_path: Path) -> None:
    """A new input from a tool's output: its row in the table and a spec naming it, no reader of its
    own in either source (topo without its NVML tier stands in for one)."""
    spec = dataclasses.replace(SPEC[Input.TOPO], live=None, snapshot=None)
    live = LiveSource(live_cfg(timeout_s=10), tmp_path / "nosys", str(tmp_path / "nokmsg"))
    read_live = spec.live_reader(live)
    assert read_live is not None and spec.output is not None
    now = read_live()
    assert ran(tools) == [" ".join(spec.output.argv)]  # no NVML tried: the command alone
    read_snapshot = spec.snapshot_reader(SnapshotSource(_snapshot(tmp_path)))
    assert read_snapshot is not None
    assert isinstance(now, TopoMatrix) and now.columns and read_snapshot() == now


def test_a_failed_command_is_named_alike_live_and_in_a_replay(tmp_path: Path, tools: Path) -> None:
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    live = source_readers(LiveSource(live_cfg(timeout_s=10), sys_root=tmp_path, use_nvml=False))
    got = live[Input.TOPO]()
    assert str(got) == "nvidia-smi topo -m: tool-failed: NVIDIA-SMI has failed"
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / ERRORS).write_text('{"nvidia-smi-topo-m.txt": {"kind": "timeout", "message": "m"}}')
    assert (
        str(source_readers(SnapshotSource(tmp_path / "snap"))[Input.TOPO]())
        == "nvidia-smi topo -m: timeout: m"
    )
    assert (
        source_of("nvidia-smi-topo-m.txt") == "nvidia-smi topo -m"
        and source_of(GPU_TEXT.file) == GPU_TEXT.file
    )
    assert SNAPSHOT_FILES["nvidia-smi -q"] == GPU_TEXT.file  # --explain names the file of each tool


def spelled(source: str, names: set[str]) -> list[str]:
    """The tool outputs' files and commands a module spells in its code (docstrings aside)."""
    tree = ast.parse(source)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        {
            name
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            for name in names
            if name in node.value
        }
    )


NAMES = {o.file for o in OUTPUTS} | {o.argv[0] for o in COMMANDS}


def test_no_source_nor_capture_spells_a_tool_output() -> None:
    found = {path: spelled((ROOT / path).read_text(), NAMES) for path in SCANNED}
    assert {path: names for path, names in found.items() if names} == {}


def test_a_spelled_file_or_command_is_found() -> None:
    source = 'X = "nvidia-smi-topo-m.txt"\nrun(["nvidia-smi", "-q"])\ndef f():\n    """node.json"""\n'
    assert spelled(source, NAMES) == ["nvidia-smi", "nvidia-smi-topo-m.txt"]

"""The topology tier through NVML (agent.probes.nvml_topo, nvml_links) against the nvidia-smi text of
the same machine: the real pynvml over the fake libnvidia-ml.so.1, configured from that machine's
recordings (tests/fakes/nvml/fake_nvml.py), must give the model the text parsers give (only the
source's name differs) and the topology, nvlink and nvlink-speed checks the same verdicts.

Machines with `nvidia-smi -q`, `nvlink -s` and `topo -m` recorded together: the nvidia_gpu_exporter
H100 and H200 (18 NVLinks each to NVSwitches, one GPU in the VM) and L40S (no NVLink), and the
project's own H100 VM capture (nvlink -s printed nothing). GPU-to-NIC cells come from sysfs: the real
`lspci -vvv` of an 8x H100 HGX node (tests/pci_sysfs_tree.py) gives, through sysfs, the cells that a
real `topo -m` of another 8x H100 HGX node prints (issue-sglang-30401), NVLink pairs included.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checks.nvlink import check_nvlink
from agent.checks.nvlink_speed import check_nvlink_speed
from agent.checks.topology import check_topology
from agent.core.facts import NodeFacts
from agent.core.nvlink import NvlinkReport
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.topo import TopoMatrix
from agent.probes.live import LiveSource
from agent.probes.nvlink import parse_nvlink
from agent.probes.topo import parse_topo
from tests.conftest import cfg, live_cfg
from tests.fakes.nvml.fake_nvml import Machine, add_nvlink, add_topology, from_recordings
from tests.pci_sysfs_tree import build_from_lspci, build_rdma_class

FIX = Path(__file__).parent / "fixtures"
CFG = cfg()

MACHINES = {
    "h100-590": ("nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt", "nvgpuexp-h100-80gb-hbm3-590.48.01"),
    "h200-590": ("nvgpuexp-h200-590.48.01-q-idle.txt", "nvgpuexp-h200-590.48.01"),
    "l40s-595": ("nvgpuexp-l40s-595.80-q-idle.txt", "nvgpuexp-l40s-595.80"),
    "h100-vm-580": ("h100-capture-580.159.04-q.txt", "h100-capture-580.159.04"),
}
NVLINK_FILE = {"h100-vm-580": "h100-capture-580.159.04-nvlink-s-empty.txt"}


def recordings(name: str) -> tuple[Path, Path, Path]:
    q, stem = MACHINES[name]
    nvlink = FIX / "nvlink" / NVLINK_FILE.get(name, f"{stem}-nvlink-s.txt")
    return FIX / "nvidia-smi-q" / q, nvlink, FIX / "nvidia-smi-topo" / f"{stem}-topo-m.txt"


def put_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvlink: Path, topo: Path) -> None:
    """nvidia-smi on PATH printing the machine's recordings: the fallback where NVML does not answer."""
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(
        f'#!/bin/sh\ncase "$1" in topo) cat "{topo}";; nvlink) cat "{nvlink}";; *) exit 9;; esac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")


def verdicts(facts: NodeFacts) -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for check in (check_topology, check_nvlink, check_nvlink_speed):
        result = check(facts, CFG)
        out.append((result.status.value, tuple(sorted(f.rule for f in result.findings))))
    return out


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_nvml_and_the_text_give_the_same_model_and_verdicts(
    name: str, fake_nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, nvlink_file, topo_file = recordings(name)
    text_nvlink = parse_nvlink(nvlink_file.read_text(encoding="utf-8"))
    text_topo = parse_topo(topo_file.read_text(encoding="utf-8"))
    fake_nvml.write(from_recordings(q, text_nvlink, text_topo))
    put_nvidia_smi(tmp_path, monkeypatch, nvlink_file, topo_file)
    live = LiveSource(live_cfg(timeout_s=10), sys_root=tmp_path / "sys")

    topo, nvlink = live.topo(), live.nvlink()

    assert isinstance(topo, TopoMatrix) and topo.source == "nvml topology"
    assert replace(topo, source=text_topo.source) == text_topo
    assert isinstance(nvlink, NvlinkReport)
    if name == "h100-vm-580":
        # nvidia-smi printed nothing; the fake's NVML knows 18 links but not their state: not
        # answered, so the tier reads nvidia-smi, as before.
        assert nvlink.source == "nvidia-smi nvlink -s"
    else:
        assert nvlink.source == "nvml nvlink"
    assert replace(nvlink, source=text_nvlink.source) == text_nvlink
    gpus = live.gpus()
    for profile in (None, CFG.profiles["p5.48xlarge"]):
        text_facts = NodeFacts(topo=text_topo, nvlink=text_nvlink, gpus=gpus, profile=profile)
        nvml_facts = NodeFacts(topo=topo, nvlink=nvlink, gpus=gpus, profile=profile)
        assert verdicts(nvml_facts) == verdicts(text_facts)
    assert fake_nvml.counts()["inits"] == 1


HGX_GPUS = ["19", "3b", "4c", "5d", "9b", "bb", "cb", "db"]  # the lspci recording's H100s
HGX_NICS = ["1a", "3c", "4d", "5e", "9c", "bc", "cc", "dc"]  # and its ConnectX-7s
SGLANG = FIX / "nvidia-smi-topo" / "issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full.txt"


def hgx_machine() -> Machine:
    """Eight H100s at the lspci recording's addresses, each with 18 active NVLinks to NVSwitches
    and the affinities of the sglang node's topo -m; their PCIe common ancestors (which topo -m hides
    behind NV18) as the lspci tree has them: each GPU on its own host bridge, GPUs 0-3 on NUMA node
    0 and 4-7 on node 1 (NODE within a node, SYS across)."""
    text = parse_topo(SGLANG.read_text(encoding="utf-8"))
    specs = [{"pci": f"00000000:{bus.upper()}:00.0", "name": "NVIDIA H100 80GB HBM3"} for bus in HGX_GPUS]
    for a, spec in enumerate(specs):
        for b in range(8):
            if a != b:
                spec[f"topo.{b}"] = "40" if a // 4 == b // 4 else "50"
    links = NvlinkReport(gpus=tuple(_all_links(i) for i in range(8)))
    add_nvlink(specs, links)
    add_topology(specs, text)
    return Machine(driver="535.183.01", gpus=specs)


def _all_links(index: int) -> Any:
    from agent.core.nvlink import NvlinkGpu

    return NvlinkGpu(index, "NVIDIA H100 80GB HBM3", None, {n: 26.562 for n in range(18)})


def test_hgx_h100_from_nvml_and_sysfs_equals_a_real_hgx_topo_m(fake_nvml: Any, tmp_path: Path) -> None:
    build_from_lspci(tmp_path)
    build_rdma_class(tmp_path, {f"mlx5_{i}": f"0000:{bus}:00.0" for i, bus in enumerate(HGX_NICS)})
    fake_nvml.write(hgx_machine())
    got = LiveSource(live_cfg(timeout_s=10), sys_root=tmp_path).topo()
    text = parse_topo(SGLANG.read_text(encoding="utf-8"))
    assert isinstance(got, TopoMatrix) and replace(got, source=text.source) == text
    facts = NodeFacts(topo=got, profile=CFG.profiles["p5.48xlarge"])
    assert check_topology(facts, CFG).status.value == "pass"


def test_a_gpu_pair_with_its_nvlinks_down_reads_as_pcie(fake_nvml: Any, tmp_path: Path) -> None:
    """GPU 3's links all inactive: topo -m would print its PCIe path to the others; the NVLink rule
    of the topology check then fails the node, as it does on the text."""
    machine = hgx_machine()
    for n in range(18):
        machine.gpus[3][f"field.165.{n}"] = "0"
    for other in range(8):
        machine.gpus[3][f"topo.{other}"] = "40" if other < 4 else "50"
        machine.gpus[other]["topo.3"] = "40" if other < 4 else "50"
    fake_nvml.write(machine)
    got = LiveSource(live_cfg(timeout_s=10), sys_root=tmp_path).topo()
    assert isinstance(got, TopoMatrix)
    assert got.rows["GPU3"]["GPU0"] == "NODE" and got.rows["GPU3"]["GPU7"] == "SYS"
    assert got.rows["GPU0"]["GPU1"] == "NV18"
    result = check_topology(NodeFacts(topo=got, profile=CFG.profiles["p5.48xlarge"]), CFG)
    assert {f.rule for f in result.findings} == {"topology.not-nv-connected"}


def test_where_nvml_does_not_answer_the_link_fields_the_tier_reads_nvidia_smi(
    fake_nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q, nvlink_file, topo_file = recordings("h100-590")
    machine = from_recordings(q, parse_nvlink(nvlink_file.read_text(encoding="utf-8")))
    machine.gpus[0]["field_values_error"] = "3"  # an older driver: no field values at all
    fake_nvml.write(machine)
    put_nvidia_smi(tmp_path, monkeypatch, nvlink_file, topo_file)
    got = LiveSource(live_cfg(timeout_s=10), sys_root=tmp_path).nvlink()
    assert (
        isinstance(got, NvlinkReport)
        and got.source == "nvidia-smi nvlink -s"
        and len(got.gpus[0].links) == 18
    )


def test_a_hung_nvml_is_a_timeout_not_a_fallback(
    fake_nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml.write(hgx_machine())
    put_nvidia_smi(tmp_path, monkeypatch, tmp_path / "none", tmp_path / "none")
    live = LiveSource(live_cfg(timeout_s=10, nvml_timeout_s=0.3), sys_root=tmp_path)
    assert isinstance(live.topo(), TopoMatrix)
    fake_nvml.hold(True)
    got = live.topo()
    assert isinstance(got, ProbeError) and got.kind is ProbeErrorKind.TIMEOUT
    fake_nvml.hold(False)


def test_an_nvidia_ml_py_without_fields_by_link_falls_back(
    fake_nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binding whose nvmlFieldValue_t is laid out otherwise (no scopeId, no latencyUsec: 32
    bytes, so the agent's own call cannot be used) and whose wrapper sets `fieldId = (field, link)`:
    a TypeError, not an NVMLError. Not answered: the tier reads nvidia-smi."""
    import ctypes

    import pynvml

    class OldFieldValue(ctypes.Structure):
        _fields_ = [
            ("fieldId", ctypes.c_uint32),
            ("timestamp", ctypes.c_int64),
            ("valueType", ctypes.c_uint),
            ("nvmlReturn", ctypes.c_uint),
            ("value", ctypes.c_uint64),
        ]

    def old_field_values(handle: Any, field_ids: list[Any]) -> Any:
        values = (OldFieldValue * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id  # a tuple here raises TypeError, as the old binding did
        return values

    q, nvlink_file, topo_file = recordings("h100-590")
    fake_nvml.write(from_recordings(q, parse_nvlink(nvlink_file.read_text(encoding="utf-8"))))
    put_nvidia_smi(tmp_path, monkeypatch, nvlink_file, topo_file)
    monkeypatch.setattr(pynvml, "c_nvmlFieldValue_t", OldFieldValue)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", old_field_values)
    got = LiveSource(live_cfg(timeout_s=10), sys_root=tmp_path).nvlink()
    assert isinstance(got, NvlinkReport) and got.source == "nvidia-smi nvlink -s"


def test_nvlink_counters_come_from_one_field_call_per_gpu(fake_nvml: Any) -> None:
    """Replay, recovery and CRC by link (fields 161-163 scoped by link), the data CRC counter of
    links 0-11 (NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L<n>); no call per link and counter."""
    from agent.probes.nvlink_errors import read_nvlink_errors

    q, nvlink_file, _ = recordings("h100-590")
    machine = from_recordings(q, parse_nvlink(nvlink_file.read_text(encoding="utf-8")))
    gpu = machine.gpus[0]
    for n in range(18):
        gpu[f"field.161.{n}"], gpu[f"field.162.{n}"], gpu[f"field.163.{n}"] = "3", "0", str(n)
        gpu[f"nvlink_err.{n}.0"] = "!999"  # the per-link call must not be what is read
    gpu["field.44"] = "7"  # CRC data, link 5
    gpu["field.165.4"] = "0"  # link 4 inactive: no counters kept for it
    fake_nvml.write(machine)
    sample = read_nvlink_errors(10)
    calls = fake_nvml.counts()["calls"]
    sample = read_nvlink_errors(10)
    links = sample.gpus[0].links
    assert sorted(links) == [n for n in range(18) if n != 4]
    assert links[5] == {"replay": 3, "recovery": 0, "crc_flit": 5, "crc_data": 7}
    assert links[17] == {"replay": 3, "recovery": 0, "crc_flit": 17}  # no data-CRC field past link 11
    # A read: the driver version check, the count, the PCI info, one field-value call.
    assert fake_nvml.counts()["calls"] - calls == 4

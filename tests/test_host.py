"""host.cpus, host.numa and host.power-cap on the real H100 VM capture (tests/fixtures/h100-vm-capture:
its /sys/devices/system/{cpu,node} files and nvidia-smi output) and real nvidia-smi recordings of
other GPUs; each fault is a change to one of them, named in the test."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agent.checks.host import check_cpus, check_numa, check_power
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.gpu import GpuInventory, GpuPower
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.gpu_fields import model_parts, read_nvml
from agent.probes.gpu_fields_nvml import Device
from agent.probes.host import parse_cpulist
from agent.probes.live import LiveSource
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.snapshot import SnapshotSource
from tests.conftest import cfg, live_cfg

FIX = Path(__file__).parent / "fixtures"
VM = FIX / "h100-vm-capture"
ROOT = Path(__file__).parent.parent


def config(numa_nodes: int) -> Config:
    """The shipped config plus an `h100-vm` profile (the VM's one H100) with *numa_nodes*."""
    return cfg(profiles={"h100-vm": {"gpuCount": 1, "gpuModel": "H100", "numaNodes": numa_nodes}})


CFG = cfg()


def system_tree(root: Path, **changed: str) -> Path:
    """root/devices/system/{cpu,node} from the VM's real files; `cpu_online="0-13"` changes one."""
    for name in ("online", "possible", "present", "offline"):
        text = changed.get(f"cpu_{name}", (VM / "sys" / f"cpu-{name}").read_text(encoding="utf-8"))
        (root / "devices" / "system" / "cpu").mkdir(parents=True, exist_ok=True)
        (root / "devices" / "system" / "cpu" / name).write_text(text, encoding="utf-8")
    for name in ("online", "possible", "has_cpu"):
        text = changed.get(f"node_{name}", (VM / "sys" / f"node-{name}").read_text(encoding="utf-8"))
        (root / "devices" / "system" / "node").mkdir(parents=True, exist_ok=True)
        (root / "devices" / "system" / "node" / name).write_text(text, encoding="utf-8")
    return root


def host_facts(root: Path, cfg: Config = CFG, itype: str | None = None) -> NodeFacts:
    return NodeFacts(
        instance_type=itype,
        profile=cfg.profiles[itype] if itype else None,
        host=LiveSource(live_cfg(), sys_root=root).host(),
    )


def test_cpulist_parses_the_kernel_format() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("\n") == ()


def test_real_h100_vm_all_cpus_online(tmp_path: Path) -> None:
    result = check_cpus(host_facts(system_tree(tmp_path)), CFG)
    assert result.status == Status.PASS, result.message
    assert result.note == "16 of 16 present CPU(s) online"


def test_a_present_cpu_offline_is_reported(tmp_path: Path) -> None:
    # DERIVED: CPUs 14 and 15 taken offline (echo 0 > cpu14/online): online "0-13", offline "14-15".
    root = system_tree(tmp_path, cpu_online="0-13\n", cpu_offline="14-15\n")
    result = check_cpus(host_facts(root), CFG)
    (f,) = result.findings
    assert f.rule == "host.cpus.offline" and f.severity == Severity.MONITOR
    assert f.message == "2 present CPU(s) offline: 14-15"


def test_possible_hotplug_slots_are_noted_not_judged(tmp_path: Path) -> None:
    # DERIVED: a VM whose firmware table allows 256 CPUs (cpu/kernel_max on this VM is 255).
    root = system_tree(tmp_path, cpu_possible="0-255\n", cpu_offline="16-255\n")
    result = check_cpus(host_facts(root), CFG)
    assert result.status == Status.PASS
    assert "240 possible CPU slot(s) not present (not judged)" in result.note


def test_a_garbled_cpu_list_is_unknown_and_no_sysfs_is_unavailable(tmp_path: Path) -> None:
    root = system_tree(tmp_path / "a", cpu_online="0-1x\n")
    assert check_cpus(host_facts(root), CFG).status == Status.UNKNOWN
    missing = LiveSource(live_cfg(), sys_root=tmp_path / "none").host()
    assert isinstance(missing, ProbeError) and missing.kind is ProbeErrorKind.UNAVAILABLE


def test_numa_count_against_the_profile(tmp_path: Path) -> None:
    root = system_tree(tmp_path)
    assert "no NUMA node count in the profile" in check_numa(host_facts(root), CFG).note
    one = config(numa_nodes=1)
    assert check_numa(host_facts(root, one, "h100-vm"), one).status == Status.PASS
    two = config(numa_nodes=2)  # the real VM has one NUMA node; a profile that says two
    result = check_numa(host_facts(root, two, "h100-vm"), two)
    (f,) = result.findings
    assert f.rule == "host.numa.count" and f.severity == Severity.ISOLATE
    assert f.message == "1 NUMA node(s) with CPUs, h100-vm has 2"


def test_gpu_memory_numa_nodes_without_cpus_do_not_count(tmp_path: Path) -> None:
    # DERIVED: a Grace Hopper-like layout: nodes 0-1 online with CPUs on 0 only, GPU memory on 1.
    two = config(numa_nodes=1)
    root = system_tree(tmp_path, node_online="0-1\n", node_possible="0-9\n", node_has_cpu="0\n")
    assert check_numa(host_facts(root, two, "h100-vm"), two).status == Status.PASS


def test_snapshot_carries_the_cpu_and_node_lists(tmp_path: Path) -> None:
    from agent.probes.capture import capture

    sys_root = system_tree(tmp_path / "sys", cpu_online="0-13\n")
    (sys_root / "bus" / "pci" / "devices").mkdir(parents=True)
    out = tmp_path / "snap"
    capture(out, timeout_s=2, sys_root=sys_root, kmsg_path=str(tmp_path / "x"), boot_id_path=tmp_path / "x")
    assert SnapshotSource(out).host() == LiveSource(live_cfg(), sys_root=sys_root).host()
    assert isinstance(SnapshotSource(out).pci(), NotCaptured)  # an empty bus copies no pci* folder
    (tmp_path / "older").mkdir()
    assert isinstance(SnapshotSource(tmp_path / "older").host(), NotCaptured)


# --------------------------------------------------------------------------- power


def test_power_limits_parsed_from_every_view() -> None:
    xml = parse_nvsmi_xml((VM / "nvidia-smi-q.xml").read_text(encoding="utf-8"))
    text = parse_nvsmi_text((VM / "nvidia-smi-q.txt").read_text(encoding="utf-8"))
    old = parse_nvsmi_xml(
        (FIX / "nvidia-smi-xml" / "telegraf-tesla-t4-515.105.01.xml").read_text(encoding="utf-8")
    )
    assert isinstance(xml, GpuInventory) and isinstance(text, GpuInventory) and isinstance(old, GpuInventory)
    # The two views were recorded moments apart: the limits agree, the draw moved (71.78 / 71.75 W).
    assert xml.gpus[0].power == GpuPower("P0", 700.0, 700.0, 71.78)
    assert text.gpus[0].power == GpuPower("P0", 700.0, 700.0, 71.75)
    old_power = old.gpus[0].power  # pre-v12 <power_readings>/<enforced_power_limit>
    assert old_power is not None and replace(old_power, draw_w=None) == GpuPower("P0", 70.0, 70.0)
    values = {"nvmlDeviceGetPerformanceState": 8, "nvmlDeviceGetEnforcedPowerLimit": 500000}
    nvml = Device(lambda fn, *args, basic=False: values.get(fn))  # NVML's getters answering `values`
    assert model_parts(read_nvml(nvml))["power"] == GpuPower("P8", 500.0, None)


def test_power_passes_on_the_real_h100_and_h100x8() -> None:
    for inv in (
        parse_nvsmi_xml((VM / "nvidia-smi-q.xml").read_text(encoding="utf-8")),
        parse_nvsmi_text((FIX / "nvidia-smi-q" / "gpud-h100x8-535.183.01.txt").read_text(encoding="utf-8")),
    ):
        result = check_power(NodeFacts(gpus=inv), CFG)
        assert result.status == Status.PASS, result.message


@pytest.mark.parametrize("view", ["nvidia-smi-q.xml", "nvidia-smi-q.txt"])
def test_a_capped_gpu_is_reported(view: str) -> None:
    # DERIVED: the real H100 output after `nvidia-smi -pl 500`: the current limit reads 500 W.
    raw = (VM / view).read_text(encoding="utf-8")
    if view.endswith(".xml"):
        raw = raw.replace("<current_power_limit>700.00 W", "<current_power_limit>500.00 W", 1)
        inv = parse_nvsmi_xml(raw)
    else:
        raw = raw.replace(
            "Current Power Limit                            : 700.00 W",
            "Current Power Limit                            : 500.00 W",
            1,
        )
        inv = parse_nvsmi_text(raw)
    result = check_power(NodeFacts(gpus=inv), CFG)
    (f,) = result.findings
    assert f.rule == "host.power-cap.capped" and f.severity == Severity.MONITOR
    assert f.message == "GPU 0 (0000:00:06.0): power limit 500 W enforced, default 700 W"

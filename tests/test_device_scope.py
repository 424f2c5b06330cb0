"""core/device_scope: which faults are one GPU's own (a DRA device taint), which stay node-wide, and
how a GPU is found in the DRA driver's ResourceSlice. Pure: no cluster needed."""

from __future__ import annotations

from typing import Any

from agent.core.device_scope import (
    Device,
    Scope,
    confined_scope,
    devices_for,
    rule_name,
    slice_devices,
    warn_scope,
)
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import Gpu, GpuInventory, LostGpu
from agent.core.severity import Severity

PCIS = [f"00000000:{b}:00.0" for b in ("53", "64", "75", "86", "97", "a8", "b9", "ca")]
INV = GpuInventory("nvml", gpus=tuple(Gpu(i, p) for i, p in enumerate(PCIS)))


def result(check: str, *findings: Finding) -> CheckResult:
    return CheckResult(check, findings=findings)


def xid(code: int, pci: str, severity: Severity = Severity.REBOOT) -> Finding:
    return Finding("xid", f"xid.{code}", severity, f"Xid {code}", key=f"xid/{code}/{pci}")


def test_an_xid_naming_one_gpu_is_confined_to_it() -> None:
    scope = confined_scope([result("xid", xid(79, "0000:86:00.0"))], INV, Severity.RESET)
    assert scope == Scope(False, ("00000000:86:00.0",))


def test_ecc_and_a_lost_handle_are_the_gpus_own() -> None:
    ecc = Finding("gpu.ecc", "gpu.ecc.dram-uncorrectable", Severity.RESET, "DBE", (f"GPU 5 ({PCIS[5]})",))
    lost = Finding("gpu.responsive", "gpu.responsive.lost", Severity.ISOLATE, "lost", key=f"x/{PCIS[1]}")
    inv = GpuInventory("nvml", gpus=INV.gpus[:1] + INV.gpus[2:], lost=(LostGpu(PCIS[1], "lost"),))
    scope = confined_scope([result("gpu.ecc", ecc), result("gpu.responsive", lost)], inv, Severity.RESET)
    assert scope == Scope(False, (PCIS[1], PCIS[5]))


def test_fabric_port_and_unattributed_faults_are_node_wide() -> None:
    sxid = Finding("xid", "xid.sxid", Severity.RESET, "SXid", key=f"sxid/12/{PCIS[0]}")
    aer = Finding("xid", "xid.pcie-aer", Severity.RESET, "AER", key=f"aer/{PCIS[0]}")
    host = Finding("host", "host.memory", Severity.REBOOT, "memory", key="host/mem")
    nameless = xid(79, "0000:ff:00.0")  # a PCI address that is no GPU of the inventory
    for f in (sxid, aer, host, nameless):
        scope = confined_scope([result("x", f)], INV, Severity.RESET)
        assert scope is not None and scope.node_wide, f


def test_most_gpus_at_once_is_a_node_fault() -> None:
    half = [result("xid", *(xid(79, p) for p in PCIS[:4]))]
    more = [result("xid", *(xid(79, p) for p in PCIS[:5]))]
    assert confined_scope(half, INV, Severity.RESET) == Scope(False, tuple(PCIS[:4]))
    scope = confined_scope(more, INV, Severity.RESET)
    assert scope is not None and scope.node_wide and "5 of 8" in scope.why


def test_below_the_taint_minimum_or_unknown_there_is_no_scope() -> None:
    assert confined_scope([result("xid", xid(79, PCIS[3], Severity.MONITOR))], INV, Severity.RESET) is None
    assert confined_scope([CheckResult("gpu", unknown="nvidia-smi hung")], INV, Severity.RESET) is None
    # a node-wide fault below the minimum does not widen a GPU's fault
    low = Finding("host", "host.memory", Severity.MONITOR, "m", key="host/mem")
    both = [result("xid", xid(79, PCIS[3])), result("host", low)]
    assert confined_scope(both, INV, Severity.RESET) == Scope(False, (PCIS[3],))


def trend(rule: str, pci: str) -> Finding:
    return Finding("trends", rule, Severity.MONITOR, rule, (f"GPU ({pci})",), key=f"{rule}/{pci}")


def test_a_warning_of_one_gpu_s_own_trend_is_confined_to_it() -> None:
    """Its memory and its thermal trends are the GPU's own; a monitor-level Xid too."""
    own = [
        result(
            "trends", trend("trend.memory.ecc-rate", PCIS[5]), trend("trend.thermal.clock-stuck", PCIS[5])
        ),
        result("xid", xid(43, "0000:a8:00.0", Severity.MONITOR)),
    ]
    assert warn_scope(own, INV) == Scope(False, (PCIS[5],))


def test_a_link_s_warning_or_a_failing_check_is_no_gpu_s_warning() -> None:
    """NVLink and PCIe trends involve the link's other end: node-wide. A failing check is a taint's
    business (confined_scope), not a warning's; no warning, no scope."""
    for rule in ("trend.nvlink.errors-growing", "trend.pcie.errors-growing"):
        scope = warn_scope([result("trends", trend(rule, PCIS[5]))], INV)
        assert scope is not None and scope.node_wide, rule
    failing = [result("xid", xid(79, "0000:86:00.0"))]
    assert warn_scope(failing, INV) is None
    assert warn_scope([result("trends")], INV) is None
    # A GPU's warning beside a failing check elsewhere is still that GPU's.
    both = [*failing, result("trends", trend("trend.memory.remap-growth", PCIS[1]))]
    assert warn_scope(both, INV) == Scope(False, (PCIS[1],))


def slice_doc(node: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "uuid": {"string": f"GPU-{i}"},
                "resource.kubernetes.io/pciBusID": {"string": p.replace("00000000:", "0000:")},
            },
        }
        for i, p in enumerate(PCIS)
    ]
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices}}


def test_the_driver_s_devices_are_found_by_pci_bus_id_only_on_this_node() -> None:
    devices = slice_devices([slice_doc("n1"), slice_doc("n2"), slice_doc("n1", "other.example.com")], "n1")
    assert len(devices) == 8 and {d.pool for d in devices} == {"n1"}
    assert devices_for([PCIS[3]], devices, {}) == [Device("n1", "gpu-3", PCIS[3], "GPU-3")]
    assert devices_for([PCIS[3], "00000000:ff:00.0"], devices, {}) is None  # one not published: None
    by_uuid = [Device("n1", "gpu-3", "", "GPU-3")]
    assert devices_for([PCIS[3]], by_uuid, {PCIS[3]: "GPU-3"}) == by_uuid


def test_rule_names_start_with_the_node_and_differ_per_device() -> None:
    a, b = (rule_name("node-a", Device("node-a", f"gpu-{i}"), "gpu-healthcheck") for i in (3, 5))
    assert a.startswith("node-a.gpu-3.") and b.startswith("node-a.gpu-5.") and a != b
    # A node name of 253 characters still gives a valid name (at most 253) that keeps its device.
    long = "n" * 250 + "-ab"
    name = rule_name(long, Device(long, "gpu-7"), "gpu-healthcheck")
    assert len(name) <= 253 and ".gpu-7." in name and name[0].isalnum()


def test_the_recorded_fallen_off_gpu_is_confined_to_it_and_a_healthy_node_has_no_scope() -> None:
    """The engine on the p5.48xlarge snapshots: Xid 79 on 0000:97:00 with nvidia-smi reporting that
    GPU's handle lost (examples/snapshots/p5.48xlarge-xid79) is one GPU's fault; healthy: none."""
    from pathlib import Path

    from agent.config import load_config_dir
    from agent.engine.engine import Engine
    from agent.probes.snapshot import SnapshotSource

    root = Path(__file__).parent.parent
    cfg = load_config_dir(root / "config")
    scopes = []
    for name in ("p5.48xlarge-xid79", "p5.48xlarge-healthy"):
        eng = Engine(SnapshotSource(root / "examples" / "snapshots" / name), cfg)
        for tier in ("gpu", "xid", "efa", "topology"):
            eng.run_tier(tier)
        scopes.append(eng.evaluate()[1].scope)
    assert scopes == [Scope(False, ("00000000:97:00.0",)), None]


def test_one_gpus_hung_calls_are_its_own_and_a_whole_read_that_hung_is_the_nodes() -> None:
    from agent.core.gpu import HungGpu

    inv = GpuInventory(
        "nvml", gpus=INV.gpus[:3] + INV.gpus[4:], hung=(HungGpu(3, PCIS[3], None, "no answer"),)
    )
    own = Finding(
        "gpu.responsive",
        "gpu.responsive.timeout",
        Severity.REBOOT,
        "hung",
        key=f"gpu.responsive.timeout/{PCIS[3]}",
    )
    assert confined_scope([result("gpu.responsive", own)], inv, Severity.RESET) == Scope(False, (PCIS[3],))
    whole = Finding("gpu.responsive", "gpu.responsive.timeout", Severity.REBOOT, "nvml: timeout")
    scope = confined_scope([result("gpu.responsive", whole)], INV, Severity.RESET)
    assert scope is not None and scope.node_wide

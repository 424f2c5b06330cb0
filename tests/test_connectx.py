"""check_connectx on the real ConnectX-7 sysfs tree and sysfs trees derived from real `ibstat` outputs
(tests/ib_sysfs_tree.py says how); each fault is a change named in its test."""

from __future__ import annotations

from pathlib import Path

from agent.checks.connectx import check_connectx
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.probed import NotCaptured
from agent.core.rdma import RdmaSample
from agent.core.severity import Severity, Status
from agent.probes.rdma import read_rdma
from tests.conftest import cfg
from tests.ib_sysfs_tree import from_ibstat, from_real

ROOT = Path(__file__).parent.parent
SOME_DOWN = "gpud-h100-ibstat-ib-some-down.txt"
NDR = "gpud-h100-ibstat-ib-ndr-all-active.txt"
ROCE = "gpud-h100-ibstat-roce-all-active.txt"


CFG = cfg()


def run(
    sample: RdmaSample | NotCaptured, itype: str | None, previous: RdmaSample | None = None
) -> CheckResult:
    profile = CFG.profiles[itype] if itype else None
    return check_connectx(
        NodeFacts(instance_type=itype, profile=profile, rdma=sample, rdma_previous=previous), CFG
    )


def sample(class_dir: Path, at: float = 0.0) -> RdmaSample:
    return read_rdma(class_dir, taken_at=at)


def test_real_connectx7_tree_passes_for_a_dgx_h100(tmp_path: Path) -> None:
    result = run(sample(from_real(tmp_path)), "dgx-h100")
    assert result.status == Status.PASS, result.message
    assert "9 ConnectX port(s)" in result.note and "8 of 8 fabric port(s) ACTIVE at 400 Gb/s" in result.note
    assert "other ConnectX ports (not judged): mlx5_bond_0 port 1 ACTIVE" in result.note


def test_real_ibstat_with_disabled_ethernet_ports_passes(tmp_path: Path) -> None:
    # The recording's node has three Ethernet ports Down/Disabled beside eight NDR ports Active:
    # the fabric is whole; the unused Ethernet ports are listed, not judged.
    result = run(sample(from_ibstat(tmp_path, SOME_DOWN)), "dgx-h100")
    assert result.status == Status.PASS, result.message
    assert "mlx5_2 port 1 DOWN" in result.note


def test_real_roce_and_ndr_ibstat_pass(tmp_path: Path) -> None:
    assert run(sample(from_ibstat(tmp_path / "r", ROCE)), "a3-ultragpu-8g").status == Status.PASS
    assert run(sample(from_ibstat(tmp_path / "n", NDR)), "Standard_ND96isr_H100_v5").status == Status.PASS


def test_an_infiniband_port_down_is_reported_not_the_unused_ethernet_ones(tmp_path: Path) -> None:
    # DERIVED from the some-down recording: mlx5_9 (an NDR InfiniBand port) Down/Polling.
    class_dir = from_ibstat(tmp_path, SOME_DOWN, state={"mlx5_9": ("1: DOWN", "2: Polling")})
    result = run(sample(class_dir), "dgx-h100")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "connectx.port-down" and f.severity == Severity.REBOOT
    assert f.message == "ConnectX mlx5_9 port 1 is DOWN, physical Polling"
    assert "7 of 8 fabric port(s) ACTIVE at 400 Gb/s" in result.note


def test_a_port_just_gone_down_waits_for_the_threshold(tmp_path: Path) -> None:
    up = sample(from_real(tmp_path / "a"), at=100.0)
    down_dir = from_real(tmp_path / "b", state={"mlx5_4": ("1: DOWN", "3: Disabled")})
    soon = run(sample(down_dir, at=130.0), "dgx-h100", previous=up)
    assert soon.findings == () and "mlx5_4 port 1 down since the last read: judged after 60 s" in soon.note
    still = run(sample(down_dir, at=430.0), "dgx-h100", previous=sample(down_dir, at=130.0))
    assert [f.rule for f in still.findings] == ["connectx.port-down"]


def test_a_port_at_a_lower_rate_is_reported(tmp_path: Path) -> None:
    # DERIVED: mlx5_5 trained at 200 Gb/sec (2X NDR: two of four lanes).
    result = run(sample(from_real(tmp_path, rate={"mlx5_5": "200 Gb/sec (2X NDR)"})), "dgx-h100")
    (f,) = result.findings
    assert f.rule == "connectx.rate" and f.severity == Severity.MONITOR
    assert f.message == "ConnectX mlx5_5 port 1 is ACTIVE at 200 Gb/sec (2X NDR), expected 400 Gb/s"


def test_a_missing_device_is_a_count_finding(tmp_path: Path) -> None:
    result = run(sample(from_real(tmp_path, drop=["mlx5_7", "mlx5_bond_0"])), "dgx-h100")  # DERIVED
    (f,) = result.findings
    assert f.rule == "connectx.count" and f.severity == Severity.ISOLATE
    assert f.message == "7 ConnectX port(s) found, dgx-h100 has 8"


def test_flaps_and_error_counters_between_two_reads(tmp_path: Path) -> None:
    before = sample(from_real(tmp_path / "a"), at=0.0)
    # DERIVED: mlx5_0 went down 3 times and counted 50 symbol errors in 300 s; mlx5_1 1 link_downed.
    now_dir = from_real(
        tmp_path / "b",
        counters={"mlx5_0": {"link_downed": 3, "symbol_error": 50}, "mlx5_1": {"link_downed": 1}},
    )
    result = run(sample(now_dir, at=300.0), "dgx-h100", previous=before)
    assert [(f.rule, f.message) for f in result.findings] == [
        ("connectx.flap", "ConnectX mlx5_0 port 1 went down 3 times in 300 s (link_downed)"),
        ("connectx.errors", "ConnectX mlx5_0 port 1: symbol_error +50 in 300 s"),
    ]


def test_without_a_fabric_in_the_profile_states_are_listed_not_judged(tmp_path: Path) -> None:
    class_dir = from_ibstat(tmp_path, SOME_DOWN, state={"mlx5_9": ("1: DOWN", "2: Polling")})
    result = run(sample(class_dir), None)
    assert result.status == Status.PASS
    assert "not ACTIVE: mlx5_2 port 1, mlx5_7 port 1, mlx5_8 port 1, mlx5_9 port 1" in result.note
    assert run(NotCaptured("sys/class/infiniband"), "p5.48xlarge").status == Status.SKIPPED


def test_efa_nodes_have_no_connectx(tmp_path: Path) -> None:
    from tests.efa_sysfs_tree import build_efa_tree

    result = run(sample(build_efa_tree(tmp_path)), "p5.48xlarge")
    assert result.status == Status.SKIPPED and result.skipped == "no ConnectX RDMA device"


def test_real_azure_ibstatus_passes_for_nd_a100_v4(tmp_path: Path) -> None:
    from tests.ib_sysfs_tree import from_ibstatus

    result = run(
        sample(from_ibstatus(tmp_path, "gpud-azure-a100-ibstatus-all-active.txt")), "Standard_ND96asr_v4"
    )
    assert result.status == Status.PASS, result.message
    assert "8 of 8 fabric port(s) ACTIVE at 200 Gb/s" in result.note and "mlx5_8 port 1 ACTIVE" in result.note

"""check_efa on the derived p5 EFA sysfs tree (built at test time) and the real Mellanox tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checks.efa import check_efa
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.rdma import RdmaSample
from agent.core.severity import Severity, Status
from agent.probes.rdma import read_rdma
from tests.conftest import cfg
from tests.efa_sysfs_tree import build_efa_tree

ROOT = Path(__file__).parent.parent
FIX = Path(__file__).parent / "fixtures"
MLX = FIX / "infiniband-sysfs" / "gpud-h100-sys-class-infiniband"


CFG = cfg()


def run(
    rdma: RdmaSample | ProbeError | NotCaptured,
    itype: str | None,
    previous: RdmaSample | None = None,
    cfg: Config = CFG,
) -> CheckResult:
    profile = cfg.profiles[itype] if itype else None
    facts = NodeFacts(instance_type=itype, profile=profile, rdma=rdma, rdma_previous=previous)
    return check_efa(facts, cfg)


def efa_sample(tmp: Path, taken_at: float = 0.0, **kw: object) -> RdmaSample:
    return read_rdma(build_efa_tree(tmp, **kw), taken_at=taken_at)  # type: ignore[arg-type]


def test_healthy_p5_passes(tmp_path: Path) -> None:
    result = run(efa_sample(tmp_path), "p5.48xlarge")
    assert result.status == Status.PASS, result.message
    assert "32 EFA device(s)" in result.note and "all ports ACTIVE" in result.note
    assert "no previous sample: counter rates not evaluated" in result.note


def test_31_devices_is_count_finding(tmp_path: Path) -> None:
    result = run(efa_sample(tmp_path, omit=["rdmap201s0"]), "p5.48xlarge")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "efa.count" and f.severity == Severity.ISOLATE
    assert f.message == "31 EFA device(s) found, p5.48xlarge has 32"


def test_port_down(tmp_path: Path) -> None:
    sample = efa_sample(tmp_path, port_state={"rdmap80s0": ("1: DOWN", "3: Disabled")})
    result = run(sample, "p5.48xlarge")
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "efa.port-down" and f.severity == Severity.REBOOT
    assert "rdmap80s0" in f.message and "DOWN" in f.message and "Disabled" in f.message
    assert f.entities == ("rdmap80s0", "0000:50:00.0")


def test_counter_growth_between_samples(tmp_path: Path) -> None:
    before = efa_sample(tmp_path / "a", taken_at=1000.0)
    after = efa_sample(
        tmp_path / "b",
        taken_at=1300.0,
        counters={"rdmap113s0": {"rx_drops": 9000, "retrans_timeout_events": 10}},
    )
    result = run(after, "p5.48xlarge", previous=before)
    assert result.status == Status.WARN
    by_counter = {f.message.split(": ")[1].split()[0]: f for f in result.findings}
    # rx_drops: 9000 in 300 s = 30/s > 10/s; retrans_timeout_events: 10 in 300 s = 0.033/s < 1/s
    assert set(by_counter) == {"rx_drops"}
    f = by_counter["rx_drops"]
    assert f.rule == "efa.counter-rate" and f.severity == Severity.MONITOR
    assert "rdmap113s0" in f.message and "30.00/s" in f.message and "limit 10/s" in f.message


def test_counter_limit_from_config(tmp_path: Path) -> None:
    before = efa_sample(tmp_path / "a", taken_at=0.0)
    grown = {"rdmap79s0": {"unresponsive_remote_events": 1}}
    after = efa_sample(tmp_path / "b", taken_at=10.0, counters=grown)
    assert run(after, "p5.48xlarge", previous=before).status == Status.PASS  # 0.1/s < 1/s
    strict = cfg({"thresholds": {"efaCounterRatePerSec": {"unresponsive_remote_events": 0}}})
    result = run(after, "p5.48xlarge", previous=before, cfg=strict)
    assert [f.rule for f in result.findings] == ["efa.counter-rate"]
    assert "unresponsive_remote_events" in result.findings[0].message


def test_counter_reset_is_not_growth(tmp_path: Path) -> None:
    before = efa_sample(tmp_path / "a", taken_at=0.0, counters={"rdmap79s0": {"rx_drops": 10**9}})
    after = efa_sample(tmp_path / "b", taken_at=10.0)
    result = run(after, "p5.48xlarge", previous=before)
    assert result.status == Status.PASS and "counter rates within limits" in result.note


def test_severity_comes_from_config(tmp_path: Path) -> None:
    isolating = cfg({"severities": {"efa.port-down": "isolate"}})
    sample = efa_sample(tmp_path, port_state={"rdmap79s0": ("2: INIT", "5: LinkUp")})
    result = run(sample, "p5.48xlarge", cfg=isolating)
    assert [f.severity for f in result.findings] == [Severity.ISOLATE]


def test_real_mellanox_tree_on_non_efa_profile_is_skipped() -> None:
    result = run(read_rdma(MLX), "dgx-h100")
    assert result.status == Status.SKIPPED
    assert "no EFA expected for dgx-h100" in result.message
    assert "9 other RDMA device(s) (not judged): all ports ACTIVE" in result.message


def test_real_mellanox_tree_on_p5_profile_is_count_failure() -> None:
    """Mellanox ports are only reported in the note; what fails is the missing EFA."""
    result = run(read_rdma(MLX), "p5.48xlarge")
    (f,) = result.findings
    assert f.rule == "efa.count" and f.message == "0 EFA device(s) found, p5.48xlarge has 32"
    assert "other RDMA device" in result.note


def test_efa_present_without_profile_still_checks_ports(tmp_path: Path) -> None:
    sample = efa_sample(tmp_path, port_state={"rdmap99s0": ("1: DOWN", "2: Polling")})
    result = run(sample, None)
    assert [f.rule for f in result.findings] == ["efa.port-down"]
    assert "rdmap99s0" in result.findings[0].message
    healthy = run(efa_sample(tmp_path / "h"), "g6e.48xlarge")
    assert healthy.status == Status.PASS and "count not checked" in healthy.note


@pytest.mark.parametrize("itype", ["g5.xlarge", None])
def test_not_expected_and_not_readable_is_skipped(itype: str | None) -> None:
    err = ProbeError("sysfs infiniband", ProbeErrorKind.UNAVAILABLE, "no /sys/class/infiniband")
    assert run(err, itype).status == Status.SKIPPED
    assert run(NotCaptured("sysfs infiniband"), itype).status == Status.SKIPPED


def test_expected_but_unreadable_is_unknown() -> None:
    err = ProbeError("sysfs infiniband", ProbeErrorKind.UNREADABLE, "permission denied")
    result = run(err, "p5.48xlarge")
    assert result.status == Status.UNKNOWN and "permission denied" in result.message


def test_unreadable_port_state_is_unknown_not_fail(tmp_path: Path) -> None:
    class_dir = build_efa_tree(tmp_path)
    state = class_dir / "rdmap79s0" / "ports" / "1" / "state"
    state.unlink()
    result = run(read_rdma(class_dir), "p5.48xlarge")
    assert result.status == Status.UNKNOWN
    assert "rdmap79s0 port 1: state unreadable" in result.message

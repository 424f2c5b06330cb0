"""The DCGM client, health poller, diag runner and idle gate on our DCGM binding mirror over our fake
libdcgm.so.4 (tests/fakes/dcgm): the code under test goes through ctypes exactly as on a node."""

from __future__ import annotations

import ctypes
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.checks.dcgm import check_dcgm_diag, check_dcgm_health
from agent.core.dcgm_report import DiagReport, DiagStatus, HealthReport
from agent.core.facts import NodeFacts
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.dcgm.bindings import DEFAULT_DIRS, ENV, BindingsUnavailable, load_bindings
from agent.probes.dcgm.client import DcgmClient, EngineUnavailable
from agent.probes.dcgm.diag import DiagRunner
from agent.probes.dcgm.health import HealthPoller
from agent.probes.dcgm.idle import IdleGate
from tests.conftest import cfg

FIX = Path(__file__).parent / "fixtures" / "dcgm"
FAKE = Path(__file__).parent / "fakes" / "dcgm"
CFG = cfg()  # the shipped config and tables


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def client(clock: Clock | None = None, grace: float = 120.0, timeout: float = 5.0) -> DcgmClient:
    return DcgmClient("nvidia-dcgm.gpu-healthcheck.svc:5555", timeout, grace, clock=clock or Clock())


def gpu_incident(system: int, health: int, code: int, msg: str, gpu: int) -> dict[str, Any]:
    return {"system": system, "health": health, "code": code, "msg": msg, "id": gpu}


def test_bindings_found_through_the_env_override_else_a_clear_error(fake_dcgm: Any) -> None:
    b = load_bindings({ENV: str(FAKE)})
    assert b.path == str(FAKE) and hasattr(b.pydcgm, "DcgmHandle")
    if not any(d.exists() for d in DEFAULT_DIRS):  # a machine with real DCGM would find them
        with pytest.raises(BindingsUnavailable, match="not found"):
            load_bindings({ENV: "/nonexistent"})


def test_connects_to_the_address_with_timeout_and_never_embedded(fake_dcgm: Any) -> None:
    c = client()
    h = c.handle()
    assert fake_dcgm.text("connect_address") == "tcp://nvidia-dcgm.gpu-healthcheck.svc:5555"
    assert fake_dcgm.stat("connect_timeout") == 5000 and fake_dcgm.stat("connect_persist") == 0
    assert isinstance(h.handle, ctypes.c_void_p)  # as DCGM's bindings hand it out
    assert c.state == "connected" and c.generation == 1
    with pytest.raises(ValueError):
        DcgmClient("  ")


def test_unreachable_at_start_is_unknown_in_grace_then_unknown_with_reason(fake_dcgm: Any) -> None:
    fake_dcgm.set_up(False)
    clock = Clock()
    c = client(clock, grace=120, timeout=0.2)
    poller = HealthPoller(c)
    first = poller.poll()
    assert isinstance(first, ProbeError) and first.kind is ProbeErrorKind.UNAVAILABLE
    assert c.state == "starting" and "grace" in first.message
    res = check_dcgm_health(NodeFacts(dcgm_health=first), CFG)
    assert res.status is Status.UNKNOWN  # never fail
    clock.now += 121
    later = poller.poll()
    assert isinstance(later, ProbeError) and c.state == "unreachable"
    assert "unreachable" in later.message and "not valid" in later.message
    assert check_dcgm_health(NodeFacts(dcgm_health=later), CFG).status is Status.UNKNOWN


def test_engine_restart_rebuilds_groups_and_watches(fake_dcgm: Any) -> None:
    c = client()
    poller = HealthPoller(c)
    assert isinstance(poller.poll(), HealthReport)
    assert fake_dcgm.stat("groups_created") == 1 and fake_dcgm.stat("health_sets") == 1
    fake_dcgm.restart()  # old connection now answers -21, its groups and watches are gone
    lost = poller.poll()
    assert isinstance(lost, ProbeError) and c.state == "lost" and "reconnecting" in lost.message
    fake_dcgm.add_incident(**gpu_incident(0x10, 20, 4, "Detected 1 volatile DBE in GPU 1.", 1))
    again = poller.poll()
    assert isinstance(again, HealthReport) and c.generation == 2
    assert fake_dcgm.stat("groups_created") == 2 and fake_dcgm.stat("health_sets") == 2  # set again
    assert fake_dcgm.stat("groups") == 1
    assert [i.code for i in again.incidents] == [4]


def test_failed_health_polls_do_not_leak_engine_groups(fake_dcgm: Any) -> None:
    """The engine has 64 groups for all its clients together; a persistent error must not eat them."""
    fake_dcgm.fail("dcgmHealthCheck", -3)  # DCGM_ST_GENERIC_ERROR on every Check, connection stays up
    c = client()
    poller = HealthPoller(c)
    for _ in range(70):
        out = poller.poll()
        assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.TOOL_FAILED
        assert "DCGMError_GenericError" in out.message
    assert c.state == "connected" and fake_dcgm.stat("groups") <= 1
    exporter = client()  # another client of the same engine (dcgm-exporter) still gets a group
    fake_dcgm.fail("dcgmHealthCheck", 0)
    assert isinstance(HealthPoller(exporter).poll(), HealthReport)
    assert isinstance(poller.poll(), HealthReport) and fake_dcgm.stat("groups") == 2


def test_a_group_that_cannot_be_deleted_is_freed_by_dropping_the_connection(fake_dcgm: Any) -> None:
    fake_dcgm.fail("dcgmHealthCheck", -3)
    c = client()
    poller = HealthPoller(c)
    poller.poll()
    assert fake_dcgm.stat("groups") == 0 and fake_dcgm.stat("groups_destroyed") == 1  # deleted
    fake_dcgm.fail("dcgmGroupDestroy", -3)
    out = poller.poll()
    assert isinstance(out, ProbeError) and c.state == "lost"  # the connection was closed instead
    assert fake_dcgm.stat("groups") == 0 and fake_dcgm.stat("open_connections") == 0


def test_the_engine_wide_group_table_is_shared_and_limited(fake_dcgm: Any) -> None:
    """62 groups for all clients together (64 less the two default groups), as DCGM 4.6."""
    pollers = [HealthPoller(client()) for _ in range(62)]
    assert all(isinstance(p.poll(), HealthReport) for p in pollers)
    out = HealthPoller(client()).poll()
    assert isinstance(out, ProbeError) and "DCGMError_MaxLimit" in out.message
    pollers[0].client.close()  # a closed connection frees its groups
    assert isinstance(HealthPoller(client()).poll(), HealthReport)


def test_health_watches_all_systems_and_incidents_map_through_the_table(fake_dcgm: Any) -> None:
    fake_dcgm.set_gpus([0, 1, 2])
    fake_dcgm.add_incident(**gpu_incident(0x2, 20, 14, "GPU 2's NvLink link 4 is currently down", 2))
    fake_dcgm.add_incident(**gpu_incident(0x1, 10, 3, "Detected more than 8 PCIe replays per minute", 0))
    poller = HealthPoller(client())
    rep = poller.poll()
    assert isinstance(rep, HealthReport)
    assert fake_dcgm.stat("health_systems") == 0xFFFFFFFF
    assert fake_dcgm.stat("health_interval") == 30_000_000 and fake_dcgm.stat("health_keep_age") == 600.0
    res = check_dcgm_health(NodeFacts(dcgm_health=rep), CFG)
    sev = {f.entities[0]: f.severity for f in res.findings}
    assert sev == {"GPU 2": Severity.RESET, "GPU 0": Severity.MONITOR}
    assert res.status is Status.FAIL and "NvLink link 4" in res.message


def test_incidents_deduplicated_across_polls(fake_dcgm: Any) -> None:
    fake_dcgm.add_incident(**gpu_incident(0x10, 20, 4, "DBE", 0))
    poller = HealthPoller(client())
    poller.poll()
    assert len(poller.new_keys) == 1
    poller.poll()
    assert poller.new_keys == ()  # the same incident again is not new
    fake_dcgm.add_incident(**gpu_incident(0x2, 20, 14, "down", 1))
    poller.poll()
    assert len(poller.new_keys) == 1


def test_imex_on_an_nvswitch_node_is_ignored(fake_dcgm: Any) -> None:
    fake_dcgm.set_switches([0, 1])
    fake_dcgm.add_incident(**gpu_incident(0x2, 20, 122, "IMEX daemon status is -3", 0))
    rep = HealthPoller(client()).poll()
    assert isinstance(rep, HealthReport) and rep.single_node_nvswitch
    assert check_dcgm_health(NodeFacts(dcgm_health=rep), CFG).status is Status.PASS


# --------------------------------------------------------------------------- diag


def runner(c: DcgmClient, gate: IdleGate | None = None, **kw: Any) -> DiagRunner:
    return DiagRunner(c, gate or IdleGate(lambda: {0: 0, 1: 0}, lambda: []), **kw)


def test_diag_runs_level_2_with_timeout_and_heartbeat_and_latches(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-gpu3-fail-isolate.json"))
    r = runner(client(), level=2, timeout_s=900)
    assert isinstance(r.latest, NotCaptured)
    assert r.run_if_idle().idle
    assert fake_dcgm.stat("diag_calls") == 1 and fake_dcgm.stat("diag_validate") == 2
    assert fake_dcgm.stat("diag_timeout") == 900 and fake_dcgm.stat("diag_flags") == 0x21  # verbose+beat
    assert fake_dcgm.text("diag_entities") == "*,cpu:*"
    rep = r.latest
    assert isinstance(rep, DiagReport) and rep.source == "DCGM API" and rep.level == 2
    st = {(x.test, x.gpu): x.status for x in rep.results}
    assert st[("diagnostic", "3")] is DiagStatus.FAIL and st[("diagnostic", "0")] is DiagStatus.PASS
    assert {x.category for x in rep.results} == {"Hardware"}  # char[5][20] read as text, not an object
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert res.status is Status.FAIL and res.findings[0].rule == "dcgm-diag.fail-isolate"
    assert "GPU 3" in res.findings[0].message
    # latched: a later postponed run leaves the result in place
    busy = runner(client(), IdleGate(lambda: {0: 1}, lambda: []))
    busy.latest = rep
    assert not busy.run_if_idle().idle and busy.latest is rep


def test_an_unknown_result_code_from_the_api_is_unknown_not_fail(fake_dcgm: Any) -> None:
    doc = json.loads((FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json").read_text())
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][2]["status"] = ""  # enum 7
    fake_dcgm.set_diag_response(fake_dcgm.diag_response(doc))
    r = runner(client())
    r.run_if_idle()
    rep = r.latest
    assert isinstance(rep, DiagReport) and rep.version == "4.6.0"
    assert [x.gpu for x in rep.results if x.status is DiagStatus.UNKNOWN] == ["2"]
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert res.status is Status.UNKNOWN and not res.findings


def test_not_run_results_are_neither_pass_nor_fail(fake_dcgm: Any) -> None:
    doc = json.loads((FIX / "dcgmi_diag_r4_json_v4-DERIVED-gpu3-fail-isolate.json").read_text())
    test = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    for r in test["results"]:
        r["status"], r["warnings"] = "Not Run", []  # DCGM_DIAG_RESULT_NOT_RUN (4): dcgmi -j omits these
    test["test_summary"] = {"status": "Not Run"}
    fake_dcgm.set_diag_response(fake_dcgm.diag_response(doc))
    r = runner(client())
    r.run_if_idle()
    rep = r.latest
    assert isinstance(rep, DiagReport) and {x.status for x in rep.results} == {DiagStatus.NOT_RUN}
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert not res.findings and res.status is Status.UNKNOWN  # nothing ran: no fault, and no pass either
    assert "ran no test" in (res.unknown or "")


def test_connect_waits_within_its_timeout_for_an_engine_that_comes_up(fake_dcgm: Any) -> None:
    fake_dcgm.set_up(False)
    threading.Timer(0.3, fake_dcgm.set_up, (True,)).start()
    c = client(timeout=3.0)
    c.handle()  # DCGM retries every 50 ms within timeoutMs
    assert c.state == "connected"


def test_diag_node_level_error_and_config_warning_from_the_api(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-pcie-node-error-software-warn.json"))
    r = runner(client())
    r.run_if_idle()
    rep = r.latest
    assert isinstance(rep, DiagReport)
    st = {(x.test, x.gpu): x.status for x in rep.results}
    assert st[("pcie", "node")] is DiagStatus.FAIL
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert res.status is Status.UNKNOWN and "not tied to a GPU" in (res.unknown or "")


def test_diag_past_its_timeout_is_unknown_and_the_engine_aborts_it_without_heartbeats(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"))
    fake_dcgm.hold_diag(True)
    fake_dcgm.heartbeat_timeout(0.3)
    c = client()
    r = DiagRunner(c, IdleGate(None, None), timeout_s=0.0, heartbeat_s=0.01, watchdog_margin_s=0.2)
    r.run_if_idle()
    out = r.latest
    assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.TIMEOUT
    assert "did not finish" in out.message and not r.in_progress
    assert fake_dcgm.stat("heartbeats") >= 1  # beats while it waited
    assert c.state == "lost"  # the handle is dropped (closed): the next run reconnects
    deadline = time.monotonic() + 10
    while fake_dcgm.stat("diag_running") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake_dcgm.stat("diag_running") == 0  # no more beats, connection closed: the engine aborted it
    assert check_dcgm_diag(NodeFacts(dcgm_diag=out), CFG).status is Status.UNKNOWN


def test_heartbeats_keep_a_long_diag_alive(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"))
    fake_dcgm.hold_diag(True)
    fake_dcgm.heartbeat_timeout(0.2)
    r = runner(client(), timeout_s=30, heartbeat_s=0.02)
    t = threading.Thread(target=r.run_if_idle)
    t.start()
    time.sleep(0.6)  # three heartbeat timeouts: only the beats keep it running
    assert fake_dcgm.stat("diag_running") == 1 and fake_dcgm.stat("heartbeats") >= 5
    fake_dcgm.hold_diag(False)
    t.join(10)
    assert isinstance(r.latest, DiagReport)


def test_a_client_side_timeout_drops_the_connection_and_the_engine_aborts_the_diag(fake_dcgm: Any) -> None:
    """DcgmDiag(timeout=N): the client gives up after N s (DCGM_ST_TIMEOUT) while the engine would go
    on (dcgm.md §0.3); with the heartbeat flag, closing the connection makes the engine abort it."""
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"))
    fake_dcgm.hold_diag(True)
    c = client()
    first = DiagRunner(c, IdleGate(None, None), timeout_s=1, heartbeat_s=0.05, watchdog_margin_s=5)
    first.run_if_idle()
    assert isinstance(first.latest, ProbeError) and first.latest.kind is ProbeErrorKind.UNAVAILABLE
    assert fake_dcgm.stat("diag_running") == 0 and c.state == "lost"  # aborted: not ALREADY_RUNNING
    second = runner(client(), timeout_s=1)
    fake_dcgm.hold_diag(False)
    second.run_if_idle()
    assert isinstance(second.latest, DiagReport)


def test_diag_already_running_or_engine_down_is_unknown(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"))
    fake_dcgm.diag_error(-39)
    r = runner(client())
    r.run_if_idle()
    assert isinstance(r.latest, ProbeError) and "already running" in r.latest.message
    fake_dcgm.diag_error(-51, "GPU 3 failed the memory test")
    r.run_if_idle()
    assert isinstance(r.latest, ProbeError) and "GPU 3 failed the memory test" in r.latest.message
    fake_dcgm.set_up(False)
    r2 = runner(client(timeout=0.2))
    r2.run_if_idle()
    assert isinstance(r2.latest, ProbeError) and r2.latest.kind is ProbeErrorKind.UNAVAILABLE
    assert check_dcgm_diag(NodeFacts(dcgm_diag=r2.latest), CFG).status is Status.UNKNOWN


def test_diag_progress_is_visible_while_running(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"))
    fake_dcgm.hold_diag(True)
    r = runner(client(), timeout_s=30)
    t = threading.Thread(target=r.run_if_idle)
    t.start()
    while not fake_dcgm.stat("diag_running"):
        time.sleep(0.001)
    assert r.in_progress and r.last_skip == ""  # DcgmTiers.progress() shows it as "running since"
    fake_dcgm.hold_diag(False)
    t.join()
    assert not r.in_progress and isinstance(r.latest, DiagReport)
    assert check_dcgm_diag(NodeFacts(dcgm_diag=r.latest), CFG).status is Status.PASS


# --------------------------------------------------------------------------- idle gating


def test_idle_gate_busy_gpu_blocks_the_diag(fake_dcgm: Any) -> None:
    fake_dcgm.load_diag(str(FIX / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"))
    r = runner(client(), IdleGate(lambda: {0: 0, 1: 2}, lambda: []))
    v = r.run_if_idle()
    assert not v.idle and "GPU(s) 1" in v.reason
    assert fake_dcgm.stat("diag_calls") == 0 and "postponed" in r.last_skip


def test_idle_gate_gpu_pod_on_the_node_blocks_the_diag(fake_dcgm: Any) -> None:
    r = runner(client(), IdleGate(lambda: {0: 0}, lambda: ["team-a/train-0"]))
    v = r.run_if_idle()
    assert not v.idle and "team-a/train-0" in v.reason and fake_dcgm.stat("diag_calls") == 0


def test_idle_gate_unreadable_means_busy() -> None:
    def broken() -> dict[int, int]:
        raise RuntimeError("NVML Shared Library Not Found")

    v = IdleGate(broken, lambda: []).check()
    assert not v.idle and "NVML" in v.reason
    assert IdleGate(lambda: {0: 0}, lambda: []).check().idle


def test_engine_unavailable_message_from_client(fake_dcgm: Any) -> None:
    fake_dcgm.set_up(False)
    with pytest.raises(EngineUnavailable, match="not reachable yet"):
        client(timeout=0.1).handle()

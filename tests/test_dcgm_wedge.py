"""A wedged DCGM engine is "could not look": every DCGM call is bounded and named, a call past its
deadline makes dcgm-health `unknown` ("engine not answering: <op> past N s"), never `fail`, counts
gpu_healthcheck_dcgm_call_hangs_total{op}, and never starts a second call while it waits; when the
engine answers again the connection it held is closed and the groups and watches are made afresh,
with nothing left on the engine. On our DCGM binding mirror over the fake libdcgm.so.4: one API
function blocked, and the answers coming from an engine process that is stopped (SIGSTOP) and
continued."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.checks.dcgm import check_dcgm_health
from agent.core.dcgm_report import HealthReport
from agent.core.facts import NodeFacts
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.severity import Status
from agent.probes.dcgm.client import DcgmClient
from agent.probes.dcgm.health import HealthPoller
from tests.conftest import cfg
from tests.fakes.dcgm.engine_process import Engine

CFG = cfg()
ADDRESS = "nvidia-dcgm.gpu-healthcheck.svc:5555"


def wait_for(what: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def dcgm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dcgm-")]


class Hangs(list[str]):
    """The ops the client counted as hung (the agent's Metrics.record_dcgm_call_hang)."""

    def __call__(self, op: str) -> None:
        self.append(op)


def poller(hangs: Hangs, call_timeout: float = 0.3, connect_timeout: float = 0.3) -> HealthPoller:
    return HealthPoller(
        DcgmClient(ADDRESS, connect_timeout, 120.0, call_timeout_s=call_timeout, on_hang=hangs)
    )


def unknown_text(probed: Any) -> str:
    res = check_dcgm_health(NodeFacts(dcgm_health=probed), CFG)
    assert res.status is Status.UNKNOWN and not res.findings  # never fail, never a finding
    return res.message


def test_a_blocked_call_is_unknown_naming_it_and_the_engine_is_used_afresh_when_it_answers(
    fake_dcgm: Any,
) -> None:
    hangs = Hangs()
    p = poller(hangs)
    assert isinstance(p.poll(), HealthReport)
    assert fake_dcgm.stat("groups") == 1 and fake_dcgm.stat("open_connections") == 1

    fake_dcgm.block("dcgmHealthCheck")
    started = time.monotonic()
    out = p.poll()
    assert 0.3 <= time.monotonic() - started < 2.0  # the caller waited the call's bound, no longer
    assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.TIMEOUT
    assert re.fullmatch(
        r"engine not answering: dcgmHealthCheck past 0.3 s \(no answer since \S+Z\)", out.message
    )
    assert unknown_text(out) == f"could not read dcgm health: {out.message}"
    assert hangs == ["dcgmHealthCheck"]

    for _ in range(5):  # while it waits: no second call, at once, not counted again
        started = time.monotonic()
        again = p.poll()
        assert time.monotonic() - started < 0.2
        assert isinstance(again, ProbeError) and again.kind is ProbeErrorKind.TIMEOUT
        assert again.message == out.message  # the same words while it lasts: no Node write per cycle
    assert hangs == ["dcgmHealthCheck"] and fake_dcgm.stat("waiting") == 1 and len(dcgm_threads()) == 1

    fake_dcgm.block("dcgmHealthCheck", False)  # the engine answers the call that waited ...
    wait_for(lambda: not dcgm_threads())
    # ... and its thread closed the connection it was given up with: the engine freed our group
    assert fake_dcgm.stat("groups") == 0 and fake_dcgm.stat("open_connections") == 0
    back = p.poll()
    assert isinstance(back, HealthReport) and p.client.generation == 2 and p.client.wedged is None
    assert fake_dcgm.stat("groups_created") == 2 and fake_dcgm.stat("health_sets") == 2  # rebuilt
    assert fake_dcgm.stat("groups") == 1 and fake_dcgm.stat("open_connections") == 1  # nothing leaked
    assert check_dcgm_health(NodeFacts(dcgm_health=back), CFG).status is Status.PASS


@pytest.mark.parametrize(
    "op", ["dcgmGetEntityGroupEntities", "dcgmGroupCreate", "dcgmGroupAddEntity", "dcgmHealthSet_v2"]
)
def test_a_call_that_blocks_while_the_watches_are_set_up_is_named_and_leaks_nothing(
    fake_dcgm: Any, op: str
) -> None:
    hangs = Hangs()
    fake_dcgm.block(op)
    p = poller(hangs)
    out = p.poll()
    name = "dcgmHealthSet" if op == "dcgmHealthSet_v2" else op  # the binding's call, not its C version
    assert isinstance(out, ProbeError) and out.message.startswith(
        f"engine not answering: {name} past 0.3 s (no answer since "
    )
    assert hangs == [name]
    fake_dcgm.block(op, False)
    wait_for(lambda: not dcgm_threads())
    assert fake_dcgm.stat("groups") == 0 and fake_dcgm.stat("open_connections") == 0
    assert isinstance(p.poll(), HealthReport)
    assert fake_dcgm.stat("groups") == 1 and fake_dcgm.stat("open_connections") == 1


def test_a_connect_stuck_past_its_own_timeout_is_bounded_and_its_late_connection_closed(
    fake_dcgm: Any,
) -> None:
    hangs = Hangs()
    fake_dcgm.block("dcgmConnect_v3", past_timeouts=True)
    p = poller(hangs, call_timeout=0.3, connect_timeout=0.5)
    started = time.monotonic()
    out = p.poll()
    assert 0.8 <= time.monotonic() - started < 2.0  # its timeout and the call bound, no more
    assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.TIMEOUT
    assert out.message.startswith("engine not answering: dcgmConnect_v3 past 0.8 s (no answer since ")
    assert hangs == ["dcgmConnect_v3"]
    fake_dcgm.block("dcgmConnect_v3", False)
    wait_for(lambda: not dcgm_threads())  # it connected after all, and closed that connection
    assert fake_dcgm.stat("connects") == 1 and fake_dcgm.stat("open_connections") == 0
    assert isinstance(p.poll(), HealthReport) and p.client.generation == 1
    assert fake_dcgm.stat("open_connections") == 1 and fake_dcgm.stat("groups") == 1


def test_a_blocked_connect_answers_at_its_own_timeout_unreachable(fake_dcgm: Any) -> None:
    """An engine that does not answer the connect: the library gives up at timeoutMs (-21)."""
    hangs = Hangs()
    fake_dcgm.block("dcgmConnect_v3")
    out = poller(hangs, connect_timeout=0.2).poll()
    assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.UNAVAILABLE and hangs == []


def test_a_stopped_engine_process_then_continued(fake_dcgm: Any, tmp_path: Path) -> None:
    """SIGSTOP on the engine: every call waits for an answer. The agent's call gives up at its bound,
    says which, makes no other; SIGCONT: the waiting call is answered, its connection closed, and the
    next poll rebuilds the group and watches on a new one."""
    engine = Engine(tmp_path / "engine.sock")
    try:
        fake_dcgm.engine_process(str(engine.path))
        fake_dcgm.add_incident(system=0x10, health=10, code=4, msg="watch me", group=1, id=0)
        hangs = Hangs()
        p = poller(hangs)
        assert isinstance(p.poll(), HealthReport)
        engine.stop()
        out = p.poll()
        assert isinstance(out, ProbeError) and out.message.startswith(
            "engine not answering: dcgmHealthCheck past 0.3 s ("
        )
        assert isinstance(p.poll(), ProbeError) and hangs == ["dcgmHealthCheck"]
        assert fake_dcgm.stat("waiting") == 1  # one call inside the library, not one per poll
        engine.cont()
        wait_for(lambda: not dcgm_threads())
        assert fake_dcgm.stat("groups") == 0 and fake_dcgm.stat("open_connections") == 0
        back = p.poll()
        assert isinstance(back, HealthReport) and [i.code for i in back.incidents] == [4]
        assert p.client.generation == 2 and fake_dcgm.stat("health_sets") == 2
        assert fake_dcgm.stat("groups") == 1 and fake_dcgm.stat("open_connections") == 1
    finally:
        engine.kill()


def test_a_wedge_outlasting_the_client_librarys_own_timeout_stays_a_wedge(
    fake_dcgm: Any, tmp_path: Path
) -> None:
    """The real client gives up on a request after 60 s (DCGM_ST_TIMEOUT): the waiting call returns,
    and a reconnect to the still stopped engine fails. dcgm-health stays `unknown`, still saying the
    engine does not answer, until a call answers."""
    engine = Engine(tmp_path / "engine.sock")
    try:
        fake_dcgm.engine_process(str(engine.path))
        fake_dcgm.request_timeout(1.0)  # the library's request timeout, short for the test
        hangs = Hangs()
        p = poller(hangs)
        assert isinstance(p.poll(), HealthReport)
        engine.stop()
        assert isinstance(p.poll(), ProbeError)
        wait_for(lambda: not dcgm_threads())  # the library answered DCGM_ST_TIMEOUT to the waiting call
        assert fake_dcgm.stat("request_timeouts") == 1 and fake_dcgm.stat("open_connections") == 0
        out = p.poll()  # reconnect: the stopped engine does not answer the connect either
        assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.TIMEOUT
        assert re.match(
            r"engine not answering: dcgmHealthCheck past 0.3 s \(no answer since \S+\); ", out.message
        )
        assert "connection lost, reconnecting" in out.message
        assert check_dcgm_health(NodeFacts(dcgm_health=out), CFG).status is Status.UNKNOWN
        engine.cont()
        assert isinstance(p.poll(), HealthReport) and p.client.wedged is None
        assert fake_dcgm.stat("groups") == 1 and fake_dcgm.stat("open_connections") == 1
    finally:
        engine.kill()


def test_an_engine_process_that_died_is_unreachable_not_a_wedge(fake_dcgm: Any, tmp_path: Path) -> None:
    engine = Engine(tmp_path / "engine.sock")
    fake_dcgm.engine_process(str(engine.path))
    p = poller(Hangs())
    assert isinstance(p.poll(), HealthReport)
    engine.kill()
    out = p.poll()
    assert isinstance(out, ProbeError) and out.kind is ProbeErrorKind.UNAVAILABLE
    assert "connection lost" in out.message and p.client.wedged is None


def test_the_agent_stays_live_and_judges_the_gpus_while_the_engine_is_stopped(
    fake_dcgm: Any, tmp_path: Path
) -> None:
    """Liveness and readiness never wait on DCGM: with the engine stopped the loop keeps its pace,
    the GPUs are judged from their own reads (here the snapshot's nvidia-smi), dcgm-health is
    unknown naming the call, and the hang is counted once."""
    import shutil

    from agent.engine.loop import Agent
    from agent.probes.dcgm.tiers import DcgmTiers
    from agent.probes.snapshot import SnapshotSource
    from agent.reporters.metrics import Metrics

    root = Path(__file__).parent.parent
    snap = tmp_path / "snap"
    shutil.copytree(root / "examples" / "snapshots" / "p5.48xlarge-healthy", snap, symlinks=True)
    config = cfg(
        {
            "intervals": {"gpu": 1, "dcgmHealth": 1},
            "dcgm": {"callTimeout": 0.5, "connectTimeout": 0.5},
            "checks": {"dcgm-diag": False},
        }
    )
    engine = Engine(tmp_path / "engine.sock")
    metrics = Metrics()
    tiers = DcgmTiers(config, lambda: [], metrics)
    agent = Agent(
        SnapshotSource(snap),
        config,
        config_dir=None,
        writer=None,
        node_getter=None,
        kernel_path=None,
        kernel_is_device=False,
        metrics=metrics,
        extra_inputs={k: v for k, v in tiers.inputs().items() if k.value == "dcgm_health"},
    )
    loop = threading.Thread(target=agent.run, daemon=True)
    try:
        fake_dcgm.set_gpus(list(range(8)))  # the engine watches the snapshot's 8 GPUs
        fake_dcgm.engine_process(str(engine.path))
        loop.start()
        results = agent.engine.results
        wait_for(lambda: "dcgm-health" in results and results["dcgm-health"].status is Status.PASS)
        engine.stop()
        wait_for(lambda: results["dcgm-health"].status is Status.UNKNOWN)
        said = results["dcgm-health"].message
        assert said.startswith(
            "could not read dcgm health: engine not answering: dcgmHealthCheck past 0.5 s ("
        )
        ran, evaluations = agent.engine.schedule.last_run["gpu"], agent.engine.evaluations
        time.sleep(3.0)
        assert agent.engine.schedule.last_run["gpu"] >= ran + 1.5  # the gpu tier kept its 1 s pace
        assert agent.engine.evaluations >= evaluations + 2  # verdicts went on
        assert agent.healthy() and agent.ready()
        assert results["gpu.responsive"].status is Status.PASS and results["gpu.ecc"].status is Status.PASS
        assert results["dcgm-health"].status is Status.UNKNOWN  # still, without waiting again
        assert results["dcgm-health"].message == said  # the same words: no write per cycle
        counted = metrics.registry.get_sample_value(
            "gpu_healthcheck_dcgm_call_hangs_total", {"op": "dcgmHealthCheck"}
        )
        assert counted == 1.0
        tiers_ran = metrics.registry.get_sample_value(
            "gpu_healthcheck_tier_duration_seconds_bucket", {"tier": "dcgm-health", "le": "1.0"}
        )
        assert tiers_ran is not None and tiers_ran >= 3  # the stuck engine costs the loop nothing
    finally:
        agent.request_stop()
        engine.kill()
        loop.join(10)

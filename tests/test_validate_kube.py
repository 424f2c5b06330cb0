"""Validate before service on the real API server (issue 31 item 3): the real agent process, one per
Node, each Node registered with the startup taint `gpu-healthcheck/validating:NoSchedule` beside
NVIDIA's own taint, as the kubelet's --register-with-taints leaves it.

- a node whose checks pass loses the validating taint, and only it (NVIDIA's stays, in place);
- a node whose first check fails (Xid 79) keeps it and gets our failure taint and marks;
- a node whose first check is unknown (nvidia-smi unreadable) keeps it;
- with node.validate.addTaint the agent puts it on a node that lacks it, and keeps it while unknown;
- steady state: once the taint is gone, applying the engine's Marks again writes nothing.

Karpenter's controller keeping a replacement node uninitialized until its agent passes:
tests/test_remediation_engines.py. The fence letting a fenced agent lift it: tests/test_manifests.py.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from agent.config import parse_config
from agent.core.node_keys import EventReason, Keys
from agent.core.probed import NotCaptured
from agent.engine.loop import Agent
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import SnapshotSource
from agent.reporters.node_writer import NodeWriter
from tests import eviction_scenario as scenario
from tests.conftest import shipped
from tests.kubeenv.waiting import wait_for

KEYS = Keys()
VALIDATING = {"key": KEYS.validating, "effect": "NoSchedule"}
NVIDIA = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
XID79 = Path(__file__).resolve().parent.parent / "examples" / "snapshots" / "p5.48xlarge-xid79"


def taints(kube: Any, node: str) -> list[dict[str, Any]]:
    return list(kube.request("GET", f"/api/v1/nodes/{node}")[1]["spec"].get("taints") or [])


def label(kube: Any, node: str, key: str) -> str | None:
    return (kube.request("GET", f"/api/v1/nodes/{node}")[1]["metadata"].get("labels") or {}).get(key)


def reasons(kube: Any, node: str) -> set[str]:
    _, out = kube.request(
        "GET", "/api/v1/namespaces/default/events", query={"fieldSelector": f"involvedObject.name={node}"}
    )
    return {e["reason"] for e in out["items"]}


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


@pytest.mark.kube
@pytest.mark.timeout(300)
def test_the_real_agent_lifts_the_taint_only_after_a_pass_and_never_on_fail_or_unknown(
    kube: Any, gpu_node: Any, tmp_path: Path
) -> None:
    config = yaml.safe_dump({"intervals": {"gpu": 2}, "node": {"maxTaintedFraction": 1}})
    adding = yaml.safe_dump(
        {"intervals": {"gpu": 2}, "node": {"maxTaintedFraction": 1, "validate": {"addTaint": True}}}
    )
    nodes = {
        kind: gpu_node(taints=[NVIDIA] if kind == "adds" else [NVIDIA, VALIDATING]).metadata.name
        for kind in ("passes", "fails", "blind", "adds")
    }
    before = {kind: taints(kube, node) for kind, node in nodes.items()}  # admission's not-ready too
    snaps = {
        "passes": scenario.snapshot(tmp_path / "passes" / "snap"),
        "fails": scenario.snapshot(tmp_path / "fails" / "snap"),
        "blind": scenario.snapshot(tmp_path / "blind" / "snap", readable=False),
        "adds": scenario.snapshot(tmp_path / "adds" / "snap", readable=False),
    }
    scenario.append_xid79(snaps["fails"])  # in the kernel log before the agent's first look
    agents = {
        kind: scenario.Agent(
            nodes[kind], snaps[kind], kube.kubeconfig, tmp_path / kind, adding if kind == "adds" else config
        )
        for kind in nodes
    }
    try:
        wait_for(lambda: label(kube, nodes["fails"], KEYS.status) == "fail", 60, "the failing verdict")
        wait_for(lambda: label(kube, nodes["blind"], KEYS.status) == "unknown", 60, "the unknown verdict")
        wait_for(lambda: label(kube, nodes["adds"], KEYS.status) == "unknown", 60, "the unknown verdict")
        wait_for(lambda: VALIDATING not in taints(kube, nodes["passes"]), 60, "the pass to lift the taint")
        # Two more gpu cycles of every agent (the status label is written with the first verdict).
        for kind in ("fails", "blind", "adds"):
            log = agents[kind].log
            wait_for(lambda lg=log: lg.read_text().count("tier gpu") >= 1, 30, f"{kind}: a gpu tier run")
    finally:
        logs = {}
        for kind, agent in agents.items():
            agent.stop()
            logs[kind] = agent.log.read_text()[-3000:]
    # only ours went, NVIDIA's (and admission's not-ready) stay, in place
    assert taints(kube, nodes["passes"]) == [t for t in before["passes"] if t != VALIDATING], logs["passes"]
    assert EventReason.VALIDATION_PASSED in reasons(kube, nodes["passes"])
    failing = taints(kube, nodes["fails"])
    assert VALIDATING in failing and NVIDIA in failing, logs["fails"]
    assert any(t["key"] == KEYS.taint and t["value"] == "reboot" for t in failing), failing
    assert label(kube, nodes["fails"], KEYS.tainted) == "true"
    assert taints(kube, nodes["blind"]) == before["blind"], logs["blind"]  # unknown never lifts it
    assert taints(kube, nodes["adds"]) == [*before["adds"], VALIDATING], logs["adds"]  # kept while unknown
    assert EventReason.VALIDATION_STARTED in reasons(kube, nodes["adds"])
    assert EventReason.VALIDATION_PASSED not in reasons(kube, nodes["blind"]) | reasons(kube, nodes["fails"])


@pytest.mark.kube
@pytest.mark.timeout(120)
def test_once_the_taint_is_gone_nothing_more_is_written(
    core: k8s.CoreV1Api, gpu_node: Any, tmp_path: Path
) -> None:
    """The agent's own loop (engine, fingerprint, writer) in this process, on a 1 s gpu interval:
    once the taint is lifted and the agent has settled, five more verdicts write nothing."""
    name = gpu_node(taints=[NVIDIA, VALIDATING]).metadata.name
    writes: Counter[str] = Counter()
    writer = NodeWriter(
        core, name, on_write=lambda kind, outcome: writes.update([f"{kind}:{outcome}"]), cfg=shipped()
    )

    def node_getter() -> Any:
        return node_from_dict(writer.node) if writer.node else NotCaptured("Node (not read yet)")

    cfg = parse_config({"intervals": {"gpu": 1}, "node": {"maxTaintedFraction": 1}})
    snap = scenario.snapshot(tmp_path / "snap")
    agent = Agent(
        SnapshotSource(snap),
        cfg,
        config_dir=None,
        writer=writer,
        node_getter=node_getter,
        kernel_path=None,
        kernel_is_device=False,
    )
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        wait_for(
            lambda: KEYS.validating not in [t.key for t in core.read_node(name).spec.taints], 30, "lifted"
        )
        # Settled as any healthy node at start (its second gpu run sees the topology tier's reads).
        lifted = agent.engine.evaluations
        wait_for(lambda: agent.engine.evaluations >= lifted + 3, 60, "the agent to settle")
        rv, wrote, seen = (
            core.read_node(name).metadata.resource_version,
            sum(writes.values()),
            agent.engine.evaluations,
        )
        wait_for(lambda: agent.engine.evaluations >= seen + 5, 60, "five more verdicts")
        assert sum(writes.values()) == wrote, writes
        assert core.read_node(name).metadata.resource_version == rv
    finally:
        agent.request_stop()
        loop.join(10)
    assert NVIDIA["key"] in [t.key for t in core.read_node(name).spec.taints]


@pytest.mark.kube
@pytest.mark.timeout(180)
def test_a_node_waiting_for_validation_is_never_silent(kube: Any, gpu_node: Any, tmp_path: Path) -> None:
    """The startup taint with the real agent on the API server: a node whose checks cannot look says
    since when (its creation: the registration put the taint on) and what it waits for, in its
    annotation and metrics; `gpu-healthcheck status` lists it, and beside it a tainted node whose
    agent never started (no report: counted from its creation, its agent column says none)."""
    import json
    import time
    import urllib.request

    from agent.core.results_doc import VALIDATING_FIELD
    from tests.test_agent_kube import AgentProcess, free_port, status_cli

    pool = f"validating-{time.time_ns()}"
    blind, silent = (
        gpu_node(taints=[NVIDIA, VALIDATING], labels={"test.example/pool": pool}).metadata.name
        for _ in range(2)
    )
    created = kube.request("GET", f"/api/v1/nodes/{blind}")[1]["metadata"]["creationTimestamp"]
    snap = scenario.snapshot(tmp_path / "snap", readable=False)
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.yaml").write_text(yaml.safe_dump({"intervals": {"gpu": 2}}))
    port = free_port()
    agent = AgentProcess(kube, blind, snap, cfg, tmp_path / "agent.log", "--metrics-port", str(port))

    def said() -> dict[str, Any]:
        ann = kube.request("GET", f"/api/v1/nodes/{blind}")[1]["metadata"].get("annotations") or {}
        return dict(json.loads(ann.get(KEYS.results) or "{}").get(VALIDATING_FIELD) or {})

    try:
        doc = wait_for(lambda: said().get("waitingFor") == ["gpu"] and said(), 120, "the agent's validating")
        assert doc["since"] == created, doc
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        (line,) = [x for x in text.splitlines() if x.startswith("gpu_healthcheck_validating_seconds ")]
        assert float(line.split()[1]) > 0
        assert 'gpu_healthcheck_validating_waiting_for{what="gpu"} 1.0' in text
        out = status_cli(kube, "--selector", f"test.example/pool={pool}")
        assert out.returncode == 2, out.stdout + out.stderr  # unknown, and a node no agent judged
        section = out.stdout[out.stdout.index("WAITING FOR VALIDATION") :].splitlines()
        rows = {line.split()[0]: line for line in section[1:]}
        assert rows[blind].endswith("waiting for gpu"), section
        assert "no report from an agent in this boot (agent: none)" in rows[silent], section
    finally:
        agent.stop()
    assert VALIDATING in taints(kube, blind) and VALIDATING in taints(kube, silent)

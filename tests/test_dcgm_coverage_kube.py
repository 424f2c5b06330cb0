"""A DCGM engine that watches fewer GPUs than the node has, on the real API server: the real agent
(tests/active_node.py: `gpu-healthcheck agent` on the healthy p5.48xlarge snapshot, 8 GPUs, with the
live DCGM tiers on its own fake libdcgm engine) whose engine has 0 of the 8 GPUs on one Node and 7
of them on another. Each Node's condition says `Unknown` with the count (and, where the engine named
its GPUs' PCI addresses, the GPU it misses); neither is tainted: a source that cannot see a GPU
neither fails nor passes it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.core.node_keys import CONDITIONS, DEFAULT_CONDITION_TYPE, Keys
from agent.core.severity import Status
from agent.probes.nvsmi_text import parse_nvsmi_text
from tests.kubeenv.waiting import wait_for
from tests.test_active_checks_kube import HEALTHY, Worker, check, taint_keys

K = Keys()
pytestmark = pytest.mark.kube


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


@pytest.fixture
def libs(fake_libdcgm_dir: Path, fake_libnvml_dir: Path) -> tuple[Path, Path]:
    return fake_libdcgm_dir, fake_libnvml_dir


def condition(core: k8s.CoreV1Api, node: str) -> Any:
    conds = core.read_node(node).status.conditions or ()
    return next((c for c in conds if c.type == DEFAULT_CONDITION_TYPE), None)


@pytest.mark.timeout(300)
def test_an_engine_watching_0_or_7_of_8_gpus_makes_the_node_unknown_never_pass(
    kube: Any,
    core: k8s.CoreV1Api,
    gpu_node: Any,
    kube_namespace: str,
    tmp_path: Path,
    libs: tuple[Path, Path],
) -> None:
    none, seven = gpu_node().metadata.name, gpu_node().metadata.name
    workers = [
        Worker(node, tmp_path / node, kube.kubeconfig, kube_namespace, libs, diag_seconds=1.0, dcgm_gpus=n)
        for node, n in ((none, 0), (seven, 7))
    ]
    gpu7 = next(g for g in parse_nvsmi_text((HEALTHY / "nvidia-smi-q.txt").read_text()).gpus if g.index == 7)
    unknown = CONDITIONS[Status.UNKNOWN].status
    try:
        for node, words in (
            (none, "dcgm-health: the DCGM engine watches 0 of the 8 GPUs nvidia-smi sees"),
            (seven, f"the DCGM engine watches 7 of the 8 GPUs nvidia-smi sees (not watched: {gpu7.label})"),
        ):
            cond = wait_for(
                lambda node=node, words=words: (
                    all(w.alive() for w in workers)
                    and (c := condition(core, node)) is not None
                    and c.status == unknown
                    and words in (c.message or "")
                    and c
                ),
                180,
                f"{node}'s condition: unknown, {words!r}",
            )
            said = wait_for(
                lambda node=node: check(core, node, "dcgm-health").get("message"),
                30,
                "the results annotation",
            )
            assert check(core, node, "dcgm-health")["status"] == "unknown" and said in cond.message
            assert core.read_node(node).metadata.labels.get(K.status) == "unknown"
            assert K.taint not in taint_keys(core, node)  # unknown never marks
    finally:
        for w in workers:
            w.stop()

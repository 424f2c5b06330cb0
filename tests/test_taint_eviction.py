"""Workloads leave a broken GPU through Kubernetes' own taint-based eviction (issue 22 item 2).

The real agent taints its Node NoExecute (``node.taintEffectBySeverity``); kube-controller-manager's
real ``taint-eviction-controller`` evicts the pods that do not tolerate it, honours
``tolerationSeconds``, keeps our own DaemonSets' pods (their tolerations are read from manifests/),
and leaves a node whose verdict is ``unknown`` alone. The agent itself never deletes or evicts a
pod: the API server's audit log shows every write it made. What "evicted" means without a kubelet
is said in tests/kubeenv/eviction.py. The printed figures come from the audit log's server times;
bench/taint_eviction.py repeats the run for a table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import yaml_safe
from tests import eviction_scenario as scenario
from tests.kubeenv.eviction import EvictionCluster, daemonset_tolerations, eviction_cluster, pretty
from tests.kubeenv.fixtures import _binaries

pytestmark = pytest.mark.kube

TOLERATION_SECONDS = 4


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[EvictionCluster]:
    with eviction_cluster(_binaries(request.config)) as c:
        yield c


@pytest.fixture(scope="module")
def outcome(cluster: EvictionCluster, tmp_path_factory: pytest.TempPathFactory) -> scenario.Outcome:
    return scenario.run(cluster, tmp_path_factory.mktemp("eviction"), TOLERATION_SECONDS)


def test_the_readme_policy_and_toleration_are_what_the_agent_and_kubernetes_read() -> None:
    """The docs' lines (which the eviction test runs) parse as the agent's config, make the
    severities that mean "this GPU is gone" NoExecute, and tolerate exactly our taint."""
    from agent.config import parse_config
    from agent.core.severity import Severity

    node = parse_config({"node": scenario.documented_policy()}).node
    assert [node.effect_for(s) for s in (Severity.RESET, Severity.REBOOT, Severity.ISOLATE)] == [
        "NoSchedule",
        "NoExecute",
        "NoExecute",
    ]
    tol = scenario.documented_toleration()
    assert (tol["key"], tol["operator"], tol["effect"]) == (scenario.KEYS.taint, "Exists", "NoExecute")
    assert isinstance(tol["tolerationSeconds"], int)


def test_the_shipped_rbac_grants_no_pod_deletion_nor_eviction() -> None:
    """Beside what the agent does (the audit test below): what it may do. No Role of manifests/
    lets any of our identities delete or evict a pod, nor drain a node by a wildcard."""

    roles = [
        d
        for path in sorted(Path(scenario.ROOT / "manifests").glob("*.yaml"))
        for d in yaml_safe.load_all(path.read_text())
        if isinstance(d, dict) and d.get("kind") in ("Role", "ClusterRole")
    ]
    assert roles
    for role in roles:
        for rule in role.get("rules") or []:
            resources, verbs = set(rule.get("resources") or []), set(rule.get("verbs") or [])
            assert "*" not in resources and "*" not in verbs, (role["metadata"]["name"], rule)
            if resources & {"pods", "pods/eviction"}:
                assert verbs <= {"get", "list", "watch"}, (role["metadata"]["name"], rule)


def test_the_manifests_daemonsets_tolerate_every_taint() -> None:
    """What keeps our pods on a node we taint NoExecute: one toleration that matches everything."""
    found = daemonset_tolerations()
    assert {"gpu-healthcheck-agent", "nvidia-dcgm"} <= set(found), found
    for name, tolerations in found.items():
        assert {"operator": "Exists"} in tolerations, name


def test_a_broken_gpu_evicts_the_pods_that_do_not_tolerate_the_taint(outcome: scenario.Outcome) -> None:
    o = outcome
    taints = [t for t in o.taints[o.broken] if t["key"] == scenario.KEYS.taint]
    assert [(t["value"], t["effect"]) for t in taints] == [("reboot", "NoExecute")], o.agent_logs[o.broken]
    assert o.labels[o.broken][scenario.KEYS.status] == "fail"

    plain, timed = o.pod(o.broken, "plain"), o.pod(o.broken, "timed")
    for pod in (plain, timed):
        assert o.evicted[pod], pod
        assert o.disruption_reason.get(pod) == "DeletionByTaintManager", o.disruption_reason
    stays = [p for p, (n, k) in o.pods.items() if n == o.broken and k not in ("plain", "timed")]
    assert len(stays) == 1 + len(daemonset_tolerations())
    assert not any(o.evicted[p] for p in stays), {p: o.evicted[p] for p in stays}

    # tolerationSeconds is honoured: the timed pod went after the plain one, and not before its time.
    # (A lower bound on Kubernetes' behaviour, not a speed limit on ours.)
    plain_s, timed_s = o.seconds_after_taint(plain), o.seconds_after_taint(timed)
    assert plain_s is not None and timed_s is not None, (o.taint_at, o.evicted_at)
    assert timed_s > plain_s and timed_s >= TOLERATION_SECONDS - 0.5, (plain_s, timed_s)
    print(
        f"\ntaint -> pod deleted (server audit times): no toleration {plain_s:.3f}s; "
        f"tolerationSeconds={TOLERATION_SECONDS}: {timed_s:.3f}s"
    )


def test_the_taint_eviction_controller_does_not_honour_pod_disruption_budgets(
    outcome: scenario.Outcome,
) -> None:
    """docs/clusters/device-plugin.md "NoExecute": the controller DELETEs pods
    (pkg/controller/tainteviction), it does not ask the Eviction API, so a PodDisruptionBudget that
    refuses every eviction does not hold it."""
    o = outcome
    assert o.evicted[o.pod(o.broken, "plain")] and o.evicted[o.pod(o.broken, "timed")]
    code, message = o.eviction_api
    assert code == 429 and "disruption budget" in message, o.eviction_api  # the budget holds evictions
    assert not o.evicted[o.pod(o.blind, "plain")]


def test_an_unknown_verdict_evicts_nothing(outcome: scenario.Outcome) -> None:
    o = outcome
    assert o.labels[o.blind][scenario.KEYS.status] == "unknown", o.agent_logs[o.blind]
    assert not [t for t in o.taints[o.blind] if t["key"] == scenario.KEYS.taint]
    on_blind = [p for p, (n, _) in o.pods.items() if n == o.blind]
    assert on_blind and not any(o.evicted[p] for p in on_blind)
    assert not [p for p in o.evicted_at if p in on_blind]


def test_the_agent_itself_never_deletes_nor_evicts(outcome: scenario.Outcome) -> None:
    writes = outcome.agent_writes
    # The log does see the agent: its Node writes are there (so an empty list below means something).
    assert any(e.resource == "nodes" and e.verb == "patch" for e in writes), pretty(writes)
    assert {e.resource for e in writes} <= {"nodes"}, pretty(writes)
    assert not [e for e in writes if e.verb in ("delete", "deletecollection")], pretty(writes)
    assert not [e for e in writes if e.subresource == "eviction"], pretty(writes)
    # ...while the pods that went were deleted by the taint-eviction controller.
    assert set(outcome.evicted_at) == {p for p, gone in outcome.evicted.items() if gone}

"""The fence's blast radius on a real API server (issue 28 item 1): in every state of our install,
no identity but the agent's (and the quarantine Job's) is refused a Node write by our policies, and
the agent's own writes fail closed.

An API server of its own (the states delete our namespace and cluster-wide objects), with the
namespace controller. Each state starts from `kubectl apply -f manifests/`, then breaks it the way
an operator or a half-done uninstall does. In each one:
  - a cluster-admin (`system:masters`) labels and cordons the Node (kubectl);
  - a kubelet (`system:node:NAME` in `system:nodes`, a client certificate, the Node authorizer and
    NodeRestriction in force) PATCHes its `nodes/status`;
  - the node-lifecycle controller's identity (kube-system/node-controller, its bootstrap RBAC) taints;
  - a kubelet renews its Node Lease, and a cluster-admin writes a release record of the repair
    budget under their own name (the records policy, gpu-healthcheck-own-records, matches Leases);
  - the agent (its Node-bound token) is refused a foreign label on its own Node wherever the fence
    is installed; where it is half gone the API server would take it, and the agent's start-up
    proof finds itself marked yet unfenced, so it holds every write (agent/reporters/fence_guard.py);
  - the agent is refused a forged release record wherever the records policy is installed (its
    Role in the namespace carries the mark: also where the ClusterRole is gone).
Before this change, deleting the ConfigMap (or deleting and re-applying manifests/) refused every
Node UPDATE in the cluster: "failed to configure binding: no params found for policy binding".
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import yaml_safe
from tests.kubeenv.env import KubeEnv, unique_name
from tests.kubeenv.pki import _signed_cert
from tests.kubeenv.server import ControlPlane

pytestmark = pytest.mark.kube

ROOT = Path(__file__).parent.parent
MANIFESTS = ROOT / "manifests"
POLICY_FILE = MANIFESTS / "30-admission-policy.yaml"
JOB_RBAC = MANIFESTS / "jobs" / "quarantine-rbac.yaml"
JOB_SA = "gpu-healthcheck-quarantine"  # the quarantine Job's identity, fenced like the agent's
NS, SA, CM = "gpu-healthcheck", "gpu-healthcheck-agent", "gpu-healthcheck-config"
MERGE = "application/merge-patch+json"
# our policies, and their bindings
BOTH = ("gpu-healthcheck-own-node", "gpu-healthcheck-own-events", "gpu-healthcheck-own-records")
SETTLE_S = 2.0  # the API server's informers see a change within moments: let them


@pytest.fixture(scope="module")
def cluster(kube: KubeEnv) -> Iterator[KubeEnv]:
    plane = ControlPlane(kube.binaries)
    plane.start()
    try:
        plane.start_controller_manager()  # the namespace controller: a namespace deleted goes
        yield KubeEnv(plane)
    finally:
        plane.stop()


def kubelet_cert(env: KubeEnv, node: str) -> tuple[Path, Path]:
    """A kubelet's client certificate for *node* (CN system:node:NODE, O system:nodes)."""
    pki = env.plane.pki
    assert pki is not None
    d = env.workdir / "kubelets"
    d.mkdir(exist_ok=True)
    ext = (
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n"
    )
    return _signed_cert(d, node, f"/O=system:nodes/CN=system:node:{node}", ext, pki.ca_cert, pki.ca_key)


def kubelet_status_patch(env: KubeEnv, cert: tuple[Path, Path], node: str, body: Any) -> tuple[int, Any]:
    """PATCH nodes/NODE/status as the kubelet does (strategic merge), with its certificate."""
    ctx = ssl.create_default_context(cafile=str(env.ca_cert))
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    req = urllib.request.Request(
        f"{env.url}/api/v1/nodes/{node}/status", data=json.dumps(body).encode(), method="PATCH"
    )
    req.add_header("Content-Type", "application/strategic-merge-patch+json")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(req, timeout=30) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.fixture(scope="module")
def world(cluster: KubeEnv) -> dict[str, Any]:
    env = cluster
    node = unique_name("blast")
    env.make_gpu_node(node)
    env.kubectl("apply", "-f", str(MANIFESTS))
    env.kubectl("create", "serviceaccount", "node-controller", "-n", "kube-system")
    controller = env.token_for("kube-system", "node-controller", expiration=3600, create=False)
    return {
        "env": env,
        "node": node,
        "kubelet": kubelet_cert(env, node),
        "controller": env.kubeconfig_for_token(controller),
    }


# ------------------------------------------------------------------------------------------ states


def docs(path: Path, kind: str) -> str:
    """The documents of *kind* in a manifest file, as YAML."""
    return yaml.safe_dump_all([d for d in yaml_safe.load_all(path.read_text()) if d and d["kind"] == kind])


def delete_fence(env: KubeEnv) -> None:
    env.kubectl("delete", "-f", str(POLICY_FILE), "--ignore-not-found", "--wait")


def configmap_missing(env: KubeEnv) -> None:
    env.kubectl("delete", "configmap", CM, "-n", NS, "--wait")


def configmap_renamed(env: KubeEnv) -> None:
    cm = json.loads(env.kubectl("get", "configmap", CM, "-n", NS, "-o", "json").stdout)
    cm["metadata"] = {"name": "renamed-config", "namespace": NS}
    env.kubectl("create", "-f", "-", input=json.dumps(cm))
    configmap_missing(env)


def configmap_recreated(env: KubeEnv) -> None:
    configmap_missing(env)
    time.sleep(SETTLE_S)
    env.kubectl("apply", "-f", str(MANIFESTS / "20-configmap.yaml"))


def policy_then_binding(env: KubeEnv) -> None:
    delete_fence(env)
    env.kubectl("apply", "-f", "-", input=docs(POLICY_FILE, "ValidatingAdmissionPolicy"))
    time.sleep(SETTLE_S)
    env.kubectl("apply", "-f", "-", input=docs(POLICY_FILE, "ValidatingAdmissionPolicyBinding"))


def binding_then_policy(env: KubeEnv) -> None:
    delete_fence(env)
    env.kubectl("apply", "-f", "-", input=docs(POLICY_FILE, "ValidatingAdmissionPolicyBinding"))
    time.sleep(SETTLE_S)
    env.kubectl("apply", "-f", "-", input=docs(POLICY_FILE, "ValidatingAdmissionPolicy"))


def one_batch(env: KubeEnv) -> None:
    delete_fence(env)
    env.kubectl("apply", "-f", str(POLICY_FILE))


def deleted_and_reapplied(env: KubeEnv) -> None:
    """`kubectl delete -f manifests/ && kubectl apply -f manifests/` (kubernetes#133827 left the
    old design's param unresolved after this)."""
    env.kubectl("delete", "-f", str(MANIFESTS), "--wait", timeout=180)
    env.kubectl("apply", "-f", str(MANIFESTS))


def namespace_deleted(env: KubeEnv) -> None:
    env.kubectl("delete", "namespace", NS, "--wait", timeout=180)


def policy_gone(env: KubeEnv) -> None:
    """A half-done uninstall: the policies deleted, their bindings left."""
    env.kubectl("delete", "validatingadmissionpolicy", *BOTH)


def binding_gone(env: KubeEnv) -> None:
    env.kubectl("delete", "validatingadmissionpolicybinding", *BOTH)


def rbac_gone(env: KubeEnv) -> None:
    env.kubectl("delete", "clusterrolebinding,clusterrole", "gpu-healthcheck-agent")


# What the agent's token meets in each state: the fence refuses (403 by the policy), the API
# server would accept (the agent then holds its writes itself), RBAC refuses, or the token is dead.
FENCED, HELD, NO_RBAC, NO_TOKEN = "fenced", "held by the agent", "refused by RBAC", "token dying"
STATES: dict[str, tuple[Callable[[KubeEnv], None], str]] = {
    "installed": (lambda env: None, FENCED),
    "configmap-missing": (configmap_missing, FENCED),
    "configmap-renamed": (configmap_renamed, FENCED),
    "configmap-deleted-and-recreated": (configmap_recreated, FENCED),
    "policy-then-binding": (policy_then_binding, FENCED),
    "binding-then-policy": (binding_then_policy, FENCED),
    "policy-and-binding-in-one-batch": (one_batch, FENCED),
    "manifests-deleted-and-reapplied": (deleted_and_reapplied, FENCED),
    "namespace-deleted": (namespace_deleted, NO_TOKEN),
    "policy-gone-binding-left": (policy_gone, HELD),
    "binding-gone-policy-left": (binding_gone, HELD),
    "rbac-gone": (rbac_gone, NO_RBAC),
}


def release_record(node: str, by: str) -> dict[str, Any]:
    """A release record of the repair budget (as `gpu-healthcheck brake release` writes it)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "generateName": "gpu-healthcheck-release-",
            "labels": {"gpu-healthcheck/record": "release"},
            "annotations": {
                "gpu-healthcheck/node": node,
                "gpu-healthcheck/by": by,
                "gpu-healthcheck/key": "",
            },
        },
        "spec": {"holderIdentity": "gpu-healthcheck"},
    }


def kubelet_lease(env: KubeEnv, cert: tuple[Path, Path], node: str) -> int:
    """The kubelet writes its Node Lease in kube-node-lease (a dry-run create: 201, or 409 when
    the Lease is there). The status."""
    ctx = ssl.create_default_context(cafile=str(env.ca_cert))
    ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
    }
    req = urllib.request.Request(
        f"{env.url}/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?dryRun=All",
        data=json.dumps(body).encode(),
        method="POST",
    )
    req.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    try:
        with opener.open(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


def wait_for_fence(env: KubeEnv, node: str, token: str) -> None:
    """The fence of a fresh install in force (the agent's foreign label refused)."""
    deadline = time.monotonic() + 30
    while (got := agent_foreign_label(env, node, token))[0] != 403:
        assert time.monotonic() < deadline, f"the fence never took effect: {got}"
        time.sleep(0.3)
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    forged = release_record(node, "alice@example.com")
    while (got := env.request("POST", leases, forged, query={"dryRun": "All"}, token=token))[0] != 403:
        assert time.monotonic() < deadline, f"the records fence never took effect: {got}"
        time.sleep(0.3)


def agent_foreign_label(env: KubeEnv, node: str, token: str) -> tuple[int, Any]:
    """The agent's (or the Job's) token asks for a label outside its prefix on its own Node (a dry
    run)."""
    return env.request(  # type: ignore[no-any-return]
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": {"team": "agent-was-here"}}},
        query={"dryRun": "All"},
        token=token,
        content_type=MERGE,
    )


@pytest.fixture(params=list(STATES))
def state(world: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    env, node = world["env"], world["node"]
    # a clean install first (a namespace being deleted must be gone before it can be re-created)
    deadline = time.monotonic() + 120
    while (
        env.kubectl("get", "namespace", NS, "-o", "jsonpath={.status.phase}", check=False).stdout
        == "Terminating"
    ):
        assert time.monotonic() < deadline, "namespace still terminating"
        time.sleep(0.5)
    env.kubectl("apply", "-f", str(MANIFESTS))
    env.kubectl("apply", "-f", str(JOB_RBAC))
    token = env.token_for(NS, SA, bound_node=node, expiration=3600, create=False)
    job = env.token_for(NS, JOB_SA, bound_node=node, expiration=3600, create=False)
    wait_for_fence(env, node, token)
    breaks, expect = STATES[request.param]
    breaks(env)
    time.sleep(SETTLE_S)
    if expect == FENCED:  # the ServiceAccounts may be new ones (manifests deleted and re-applied)
        env.kubectl("apply", "-f", str(JOB_RBAC))
        token = env.token_for(NS, SA, bound_node=node, expiration=3600, create=False)
        job = env.token_for(NS, JOB_SA, bound_node=node, expiration=3600, create=False)
        wait_for_fence(env, node, token)
    yield {**world, "token": token, "job": job, "expect": expect, "name": request.param}


# ------------------------------------------------------------------------------------------ checks


def test_no_one_else_is_refused_and_the_agent_fails_closed(state: dict[str, Any]) -> None:
    env, node, name = state["env"], state["node"], state["name"]

    # a cluster-admin: kubectl label, cordon, uncordon
    env.kubectl("label", "node", node, f"blast-state={name}", "--overwrite")
    env.kubectl("cordon", node)
    env.kubectl("uncordon", node)

    # a kubelet: its own nodes/status (the Ready condition's heartbeat)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": f"kubelet is posting ready status ({name})",
        "lastHeartbeatTime": now,
    }
    status, body = kubelet_status_patch(env, state["kubelet"], node, {"status": {"conditions": [ready]}})
    assert status == 200, body

    # the node-lifecycle controller: a taint, and off again
    taint = "node.kubernetes.io/unreachable:NoExecute"
    env.kubectl("taint", "node", node, taint, kubeconfig=state["controller"])
    env.kubectl("taint", "node", node, f"{taint}-", kubeconfig=state["controller"])

    # a kubelet's Node Lease, and a cluster-admin's release record under their own name (dry runs;
    # with the namespace deleted there is nowhere to write one)
    assert kubelet_lease(env, state["kubelet"], node) in (201, 409)
    admin = env.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )[1]["status"]["userInfo"]["username"]
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    status, body = env.request("POST", leases, release_record("", admin), query={"dryRun": "All"})
    assert status == 201 or (state["expect"] == NO_TOKEN and status == 404), body

    got = json.loads(env.kubectl("get", "node", node, "-o", "json").stdout)
    assert got["metadata"]["labels"]["blast-state"] == name and not got["spec"].get("unschedulable")
    assert next(c for c in got["status"]["conditions"] if c["type"] == "Ready")["message"] == ready["message"]

    # the agent's own token
    status, body = agent_foreign_label(env, node, state["token"])
    expect = state["expect"]
    if expect == FENCED:
        assert status == 403 and "only labels under gpu-healthcheck/" in json.dumps(body), body
    elif expect == NO_RBAC:
        assert status == 403 and "cannot patch resource" in json.dumps(body), body
    elif expect == NO_TOKEN:
        # its ServiceAccount is gone: the token dies (401) once the API server's token cache lets go
        # of it; the cluster-wide fence holds it until then
        assert status == 401 or (status == 403 and "only labels under" in json.dumps(body)), body
    else:
        assert expect == HELD and status == 200, body  # the API server would take it: the agent must not
        assert_agent_holds(env, node, state["token"])

    # the agent's token forges a release (dry run): refused wherever the records policy is whole
    forged = release_record(node, "alice@example.com")
    status, body = env.request("POST", leases, forged, query={"dryRun": "All"}, token=state["token"])
    if expect in (FENCED, NO_RBAC):
        assert status == 403 and "a release is an operator" in json.dumps(body), body
    elif expect == NO_TOKEN:
        assert status in (401, 403, 404), body  # a dead token, or no Role and no namespace left
    else:
        assert expect == HELD and status == 201, body  # the policy or its binding is gone

    # the quarantine Job's token (its own RBAC, left in place by every state but the namespace's)
    status, body = agent_foreign_label(env, node, state["job"])
    if expect in (FENCED, NO_RBAC):
        assert status == 403 and "only labels under gpu-healthcheck/" in json.dumps(body), body
    elif expect == NO_TOKEN:
        assert status == 401 or (status == 403 and "only labels under" in json.dumps(body)), body
    else:
        assert status == 200, body  # and the Job's own proof holds its write (it cannot list Nodes)
        from agent.cli.agent import kube_core
        from agent.reporters.fence import prove_fence

        proof = prove_fence(kube_core(str(env.kubeconfig_for_token(state["job"]))), node, "gpu-healthcheck")
        assert proof.holds_writes, proof


def assert_agent_holds(env: KubeEnv, node: str, token: str) -> None:
    """The agent's start-up proof under its token: unfenced, marked to be fenced, so its guard
    holds every Node write (and no write reaches the writer)."""
    from agent.cli.agent import kube_core
    from agent.reporters.fence import FenceResult, prove_fence
    from agent.reporters.fence_guard import FenceGuard, GuardedWriter

    other = unique_name("blast-other")
    env.make_gpu_node(other)  # the proof's second write goes to another Node
    try:
        core = kube_core(str(env.kubeconfig_for_token(token)))
        proof = prove_fence(core, node, "gpu-healthcheck")
        assert proof.result is FenceResult.UNFENCED and proof.marked is True, proof
        assert proof.holds_writes

        class Writer:
            applied = 0

            def apply(self, marks: Any) -> Any:
                self.applied += 1

        writer = Writer()
        guard = FenceGuard(lambda: prove_fence(core, node, "gpu-healthcheck"), lambda p: None)
        guard.start().join()
        outcome = GuardedWriter(writer, guard).apply(None)  # type: ignore[arg-type]
        assert not outcome.ok and "fail closed" in outcome.error and writer.applied == 0
    finally:
        env.delete_node(other)

"""node.remediationConditions on the real API server (issue 22 item 1, issue 28 item 1).

The admission fence allows exactly the condition types written into it (generated from the config:
no parameter object) and refuses any other, also after a kustomize rename; the agent adopts only a
config whose types the fence allows (a dry run); the agent process writes the conditions through
fail, unknown, recovery, the brake and reloads, all of them in one status PATCH.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agent.config import yaml_safe
from agent.core.remediation_types import RemediationReason
from tests.kubeenv.env import unique_name
from tests.test_agent_kube import (
    HEALTHY,
    XID_LINE,
    AgentProcess,
    condition,
    events,
    hang_nvidia_smi,
    node_dict,
    our_taint,
    reload_config,
    start_agent,
    wait_for,
)

pytestmark = pytest.mark.kube

ROOT = Path(__file__).parent.parent
MANIFESTS = ROOT / "manifests"
CONFIG_YAML = (ROOT / "config" / "config.yaml").read_text()
NS, SA, CM = "gpu-healthcheck", "gpu-healthcheck-agent", "gpu-healthcheck-config"
POLICY = "gpu-healthcheck-own-node"
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
AHR = "AcceleratedHardwareReady"
R = RemediationReason


def with_entries(*types: str, text: str = CONFIG_YAML) -> str:
    """config.yaml with node.remediationConditions listing *types* (block style, as shipped)."""
    entries = "".join(
        f'    - type: {t}\n      unhealthyStatus: "False"\n      minSeverity: reset\n' for t in types
    )
    out = text.replace(
        "  remediationConditions: []\n",
        f"  remediationConditions:\n{entries}" if types else "  remediationConditions: []\n",
    )
    assert out != text or not types
    # A repair budget per node (its hostname label): the marks of the other tests on this shared API
    # server must not spend this test's budget (tests/test_repair_budget_kube.py tests the budget).
    return out.replace('    perLabel: ""', "    perLabel: kubernetes.io/hostname")


def cond(kind: str, status: str = "False", reason: str = R.FAILED, message: str = "") -> dict[str, str]:
    """A condition; its message differs from call to call, so a PATCH is never a no-op (which the
    fence has no reason to refuse)."""
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message or f"test {time.monotonic_ns()}",
    }


def status_patch(
    kube: Any, node: str, conds: list[dict[str, str]], token: str | None = None
) -> tuple[int, Any]:
    return kube.request(  # type: ignore[no-any-return]
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {"status": {"conditions": conds}},
        token=token,
        content_type=STRATEGIC,
    )


def set_config(kube: Any, namespace: str, name: str, text: str) -> None:
    status, body = kube.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/configmaps/{name}",
        {"data": {"config.yaml": text}},
        content_type=MERGE,
    )
    assert status == 200, body


def set_policy_types(kube: Any, types: list[str], name: str = POLICY) -> None:
    """The policy with *types* as its condition types, as gen-configmap.py or a Helm upgrade writes
    it for a config that names them."""
    doc = json.loads(kube.kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout)
    var = next(v for v in doc["spec"]["variables"] if v["name"] == "conditionTypes")
    var["expression"] = "[" + ", ".join(f"'{t}'" for t in types) + "]"
    kube.kubectl("replace", "-f", "-", input=json.dumps(doc))


def until_status(fn: Callable[[], tuple[int, Any]], want: int, what: str, timeout: float = 30) -> Any:
    """The API server's policy informer sees a policy edit within moments: wait for it."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = fn()
        if status == want:
            return body
        assert time.monotonic() < deadline, f"{what}: still {status}: {body}"
        time.sleep(0.3)


def conditions_of(kube: Any, node: str) -> dict[str, dict[str, Any]]:
    status, body = kube.request("GET", f"/api/v1/nodes/{node}")
    assert status == 200
    return {c["type"]: c for c in body["status"].get("conditions") or ()}


@pytest.fixture(scope="module")
def installed(kube: Any) -> Iterator[Any]:
    """manifests/ applied (as test_manifests does); the shipped config and policy put back afterwards."""
    kube.kubectl("apply", "--server-side", "-f", str(MANIFESTS))
    yield kube
    set_config(kube, NS, CM, CONFIG_YAML)
    set_policy_types(kube, ["GPUHealthy"])


@pytest.fixture
def fenced(installed: Any, gpu_node: Any) -> Iterator[dict[str, Any]]:
    kube = installed
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    token = kube.token_for(NS, SA, bound_node=node, expiration=600, create=False)
    until_status(  # the policy is enforced once the API server's informer has it
        lambda: kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            # a new value each time: once a probe landed before the policy did, the same label again
            # would change nothing, which the fence rightly allows (the fixture's old flake)
            {"metadata": {"labels": {"x": str(time.monotonic_ns())}}},
            token=token,
            content_type=MERGE,
        ),
        403,
        "the fence in force",
    )
    release = {  # and the records fence: the agent's start-up proof asks for a release too
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"generateName": "probe-", "labels": {"gpu-healthcheck/record": "release"}},
    }
    until_status(
        lambda: kube.request(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
            release,
            query={"dryRun": "All"},
            token=token,
        ),
        403,
        "the records fence in force",
    )
    yield {"kube": kube, "node": node, "token": token}
    set_config(kube, NS, CM, CONFIG_YAML)
    set_policy_types(kube, ["GPUHealthy"])


def test_the_fence_allows_exactly_the_types_it_lists(fenced: dict[str, Any]) -> None:
    kube, node, token = fenced["kube"], fenced["node"], fenced["token"]
    vendor = cond("VendorGPUHealthy", "False", "VendorXidCheck", "another component's")
    assert status_patch(kube, node, [vendor])[0] == 200  # the admin writes another component's condition

    # Not listed: refused, and the message names what is allowed and where it is said.
    body = until_status(lambda: status_patch(kube, node, [cond(AHR)], token), 403, "AHR refused")
    assert "(GPUHealthy, as this policy lists them from its config)" in json.dumps(body)

    set_policy_types(kube, ["GPUHealthy", AHR])  # what gen-configmap.py writes for a config with AHR
    until_status(lambda: status_patch(kube, node, [cond(AHR)], token), 200, "AHR allowed after the edit")
    # Ours together in one PATCH: allowed.
    assert status_patch(kube, node, [cond("GPUHealthy", "False", "ChecksFailed"), cond(AHR)], token)[0] == 200
    # Anything else: refused, also when it comes with ours.
    for conds in (
        [cond("SomethingElse")],
        [cond(AHR), cond("SomethingElse")],
        [cond("Ready", "False", "KubeletNotReady")],
        [cond("VendorGPUHealthy", "True", "VendorXidCheck")],
        [{"type": "VendorGPUHealthy", "$patch": "delete"}],  # another component's: never removed
    ):
        status, body = status_patch(kube, node, conds, token)
        assert status == 403 and "only its own conditions" in json.dumps(body), (conds, body)
    assert conditions_of(kube, node)["VendorGPUHealthy"]["reason"] == "VendorXidCheck"

    # The type no longer listed: refused again, but ours of that type may still be removed.
    set_policy_types(kube, ["GPUHealthy"])
    until_status(
        lambda: status_patch(kube, node, [cond(AHR, "True", R.PASSED)], token), 403, "AHR refused again"
    )
    assert status_patch(kube, node, [{"type": AHR, "$patch": "delete"}], token)[0] == 200
    got = conditions_of(kube, node)
    assert AHR not in got and "VendorGPUHealthy" in got and "Ready" in got


def test_the_config_proof_asks_the_real_fence(fenced: dict[str, Any], tmp_path: Path) -> None:
    """The agent's vet (a dry-run status PATCH under its own token) refuses a config whose types the
    policy does not list, with the API server's words, and allows it once the policy lists them;
    nothing is written."""
    from agent.cli.agent import kube_core
    from agent.config import load_config_dir
    from agent.reporters.config_proof import config_vetter

    kube, node, token = fenced["kube"], fenced["node"], fenced["token"]
    (tmp_path / "config.yaml").write_text(with_entries(AHR))
    cfg = load_config_dir(tmp_path)
    vet = config_vetter(kube_core(str(kube.kubeconfig_for_token(token))), node)
    before = conditions_of(kube, node)
    why = vet(cfg)
    assert (
        why is not None
        and "refuses the condition types this config writes (GPUHealthy, AcceleratedHardwareReady)" in why
    )
    assert "ValidatingAdmissionPolicy 'gpu-healthcheck-own-node'" in why and "only its own conditions" in why
    assert vet(load_config_dir(ROOT / "config")) is None  # the shipped types: allowed
    set_policy_types(kube, ["GPUHealthy", AHR])
    deadline = time.monotonic() + 30
    while vet(cfg) is not None:
        assert time.monotonic() < deadline, "the policy listing AHR never allowed the config"
        time.sleep(0.3)
    assert conditions_of(kube, node) == before  # dry runs: nothing written


def test_an_agent_under_a_config_the_fence_refuses_runs_on_the_shipped_one(
    fenced: dict[str, Any], tmp_path: Path
) -> None:
    """At start, with no last good config: the agent rejects the mounted config (ConfigRejected, the
    server's message), runs on the shipped defaults and writes only what the fence allows."""
    kube, node, token = fenced["kube"], fenced["node"], fenced["token"]
    until_status(lambda: status_patch(kube, node, [cond(AHR)], token), 403, "the policy lists no AHR")
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.yaml").write_text(
        with_entries(AHR).replace("  maxTaintedFraction: 0.2 ", "  maxTaintedFraction: 1.0 ")
    )
    argv = [sys.executable, "-m", "agent.cli", "agent", "--node", node, "--once", "--metrics-port", "0"]
    argv += ["--from-snapshot", str(ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79")]
    argv += ["--kubeconfig", str(kube.kubeconfig_for_token(token)), "--config-dir", str(cfg)]
    argv += ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "refuses the condition types this config writes" in out and "shipped default" in out, out[-3000:]
    assert "Node write failed" not in out, out[-3000:]
    got = conditions_of(kube, node)
    assert AHR not in got and got["GPUHealthy"]["status"] == "False"
    assert "config rejected" in got["GPUHealthy"]["message"]
    assert "ConfigRejected" in events({"kube": kube, "node": node})


def test_a_condition_of_that_type_not_written_by_us_is_never_removed(fenced: dict[str, Any]) -> None:
    kube, node, token = fenced["kube"], fenced["node"], fenced["token"]
    assert status_patch(kube, node, [cond("OldType", "True", "SomeoneElse")])[0] == 200
    status, body = status_patch(kube, node, [{"type": "OldType", "$patch": "delete"}], token)
    assert status == 403, body
    assert "OldType" in conditions_of(kube, node)


def test_the_operator_is_not_fenced(fenced: dict[str, Any], kube_namespace: str) -> None:
    """An identity that may patch Nodes without the fence's mark (an operator, `gpu-healthcheck
    clear`) writes any annotation and condition: the fence holds only the agent's identity."""
    kube, node = fenced["kube"], fenced["node"]
    rbac = "rbac.authorization.k8s.io"
    role = f"{kube_namespace}-operator"
    kube.kubectl(
        "create",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                {
                    "apiVersion": f"{rbac}/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": role},
                    "rules": [
                        {"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get", "patch"]}
                    ],
                },
                {
                    "apiVersion": f"{rbac}/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": role},
                    "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": kube_namespace}],
                },
            ]
        ),
    )
    try:
        token = kube.token_for(kube_namespace, "operator", expiration=600)
        ann = {"gpu-healthcheck/clear-latched": "all", "gpu-healthcheck/clear-latched-by": "{}", "team": "x"}
        status, body = kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"annotations": ann}},
            token=token,
            content_type=MERGE,
        )
        assert status == 200, body
        assert status_patch(kube, node, [cond("AnyType", "False", "Operator")], token)[0] == 200
    finally:
        kube.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)


# ------------------------------------------------------------------------------------------ rename


def _kustomize_install(kube: Any, tmp: Path, namespace: str, prefix: str) -> list[dict[str, Any]]:
    overlay = tmp / "overlay"
    overlay.mkdir()
    (overlay / "base").symlink_to(MANIFESTS)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["base"], "namespace": namespace, "namePrefix": prefix})
    )
    built = list(yaml_safe.load_all(kube.kubectl("kustomize", str(overlay)).stdout))
    kube.kubectl("apply", "--server-side", "-k", str(overlay))
    return built


@pytest.fixture
def renamed(installed: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    kube = installed
    ns, prefix = unique_name("gpuhc-rem", max_len=30), "blue-"
    built = _kustomize_install(kube, tmp_path, ns, prefix)
    yield {"kube": kube, "ns": ns, "prefix": prefix, "built": built}
    for doc in built:
        if doc["kind"] in (
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            kube.kubectl(
                "delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found", check=False
            )
    kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def test_after_a_rename_the_fence_follows_the_install(renamed: dict[str, Any], gpu_node: Any) -> None:
    """A renamed install (kustomize namespace and namePrefix) fences its own agent with its own
    policy; every install's policy holds every fenced identity to its own list, so two installs must
    list the same types (the agent's config proof tells when they do not)."""
    kube, ns, prefix = renamed["kube"], renamed["ns"], renamed["prefix"]
    binding = next(
        d
        for d in renamed["built"]
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and "own-node" in d["metadata"]["name"]
    )
    assert binding["spec"] == {"policyName": f"{prefix}{POLICY}", "validationActions": ["Deny"]}
    node, other = gpu_node().metadata.name, gpu_node().metadata.name
    blue = kube.token_for(ns, f"{prefix}{SA}", bound_node=node, expiration=600, create=False)
    default = kube.token_for(NS, SA, bound_node=other, expiration=600, create=False)
    set_policy_types(kube, ["GPUHealthy", "BlueReplace"], f"{prefix}{POLICY}")

    # The default install's policy does not list BlueReplace: it refuses it to blue's agent too
    # (once blue's own policy, just edited, lets it through).
    deadline = time.monotonic() + 30
    while f"'{POLICY}'" not in json.dumps(body := status_patch(kube, node, [cond("BlueReplace")], blue)[1]):
        assert time.monotonic() < deadline, body
        time.sleep(0.3)
    assert "(GPUHealthy, as this policy" in json.dumps(body), body
    set_policy_types(kube, ["GPUHealthy", "BlueReplace"])
    until_status(lambda: status_patch(kube, node, [cond("BlueReplace")], blue), 200, "both list it")
    until_status(lambda: status_patch(kube, other, [cond("BlueReplace")], default), 200, "the default's")
    # The renamed policy holds the renamed install's agent (and the default's) to its own list.
    status, body = status_patch(kube, node, [cond(AHR)], blue)
    assert status == 403 and "(GPUHealthy, BlueReplace, as this policy" in json.dumps(body), body
    # The rest of the fence holds after the rename too: another Node, a foreign label.
    status, body = status_patch(kube, other, [cond("BlueReplace")], blue)
    assert status == 403 and "only the Node its token is bound to" in json.dumps(body), body
    status, body = kube.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"labels": {"team": "x"}}},
        token=blue,
        content_type=MERGE,
    )
    assert status == 403 and "only labels under gpu-healthcheck/" in json.dumps(body), body
    set_policy_types(kube, ["GPUHealthy"])


# ------------------------------------------------------------------------------------------ the agent


def apiserver_status_patches(kube: Any) -> float:
    """PATCH requests on nodes/status the API server has answered so far (its own /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = kube.request("GET", "/metrics", timeout=60)
    assert status == 200
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "apiserver_request":
            for s in fam.samples:
                labels = s.labels
                if (
                    s.name.endswith("_total")
                    and labels.get("resource") == "nodes"
                    and labels.get("subresource") == "status"
                    and labels.get("verb") == "PATCH"
                ):
                    total += s.value
    return total


def garble(snap: Path) -> None:
    (snap / "errors.json").unlink(missing_ok=True)
    (snap / "nvidia-smi-q.txt").write_bytes(b"\x00\x01 garbage, not nvidia-smi output")


ONE_ENTRY = (  # the brake off, and a repair budget per node (with_entries says why)
    f"intervals:\n  gpu: 1\nnode:\n  maxTaintedFraction: 1\n  remediationConditions:\n    - type: {AHR}\n"
    "  repairBudget:\n    perLabel: kubernetes.io/hostname\n"
)


def test_unknown_first_then_fail_unknown_and_recovery_in_one_patch_each(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    node = gpu_node(instance_type="p5.48xlarge", gpus=8).metadata.name
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    garble(snap)  # the very first verdict is unknown
    (tmp_path / "config").mkdir()
    # confirmAfter 1: a timeout fails at once, so that the pass → fail transition is one status PATCH
    # (with the default 2 an unknown "confirming" cycle comes first; tests/test_confirm.py has that)
    (tmp_path / "config" / "config.yaml").write_text(
        ONE_ENTRY.replace("node:\n", "node:\n  confirmAfter: 1\n")
    )
    agent = AgentProcess(kube, node, snap, tmp_path / "config", tmp_path / "agent.log")
    world = {
        "node": node,
        "snap": snap,
        "cfg": tmp_path / "config",
        "agent": agent,
        "core": kube.api_client(),
        "kube": kube,
    }
    try:
        first = wait_for(lambda: condition(world, AHR), what="the first AHR condition")
        assert (first["status"], first["reason"]) == ("True", R.COULD_NOT_CHECK)
        assert condition(world)["status"] == "Unknown"  # GPUHealthy says what it knows

        shutil.copy(HEALTHY / "nvidia-smi-q.txt", world["snap"] / "nvidia-smi-q.txt")
        wait_for(lambda: (condition(world, AHR) or {}).get("reason") == R.PASSED, what="pass")
        time.sleep(3)  # quiet: nothing changes, nothing is written
        before = apiserver_status_patches(kube)
        hang_nvidia_smi(world["snap"])
        failed = wait_for(
            lambda: (c := condition(world, AHR)) and c["status"] == "False" and c,
            timeout=20,
            what="AHR=False",
        )
        assert failed["reason"] == "GPUHealthcheckGPULostReboot"  # the fault class and the action
        assert "gpu.responsive" in failed["message"] and "→ reboot" in failed["message"]
        assert our_taint(node_dict(world)) is not None and condition(world)["status"] == "False"
        time.sleep(3)
        # a new fault: the taint goes first, GPUHealthy and AHR together in the one status PATCH
        # after it landed (node_story): a node the engines may replace is always tainted
        assert apiserver_status_patches(kube) - before == 1, "the taint first, then GPUHealthy and AHR"

        garble(world["snap"])
        wait_for(
            lambda: "recovery paused" in (condition(world, AHR) or {}).get("message", ""),
            timeout=20,
            what="AHR paused by unknown cycles",
        )
        time.sleep(4)  # several unknown cycles
        kept = condition(world, AHR)
        assert (kept["status"], kept["reason"]) == ("False", R.RECOVERING), "unknown after fail keeps it"
        assert node_dict(world)["metadata"]["labels"]["gpu-healthcheck/status"] == "unknown"

        shutil.copy(HEALTHY / "nvidia-smi-q.txt", world["snap"] / "nvidia-smi-q.txt")
        # the conditions lead (node_story), the taint goes in the Node PATCH right after: wait for both
        back = wait_for(
            lambda: (
                (c := condition(world, AHR))
                and c["status"] == "True"
                and our_taint(node_dict(world)) is None
                and c
            ),
            timeout=30,
            what="AHR=True and the taint gone",
        )
        assert back["reason"] == R.PASSED
    finally:
        world["agent"].stop(signal.SIGKILL)


def test_a_brake_held_node_is_not_marked_and_says_so(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    held = ONE_ENTRY.replace("maxTaintedFraction: 1", "maxTaintedFraction: 0")
    world = start_agent(kube, gpu_node, tmp_path, held)
    try:
        wait_for(lambda: (condition(world, AHR) or {}).get("reason") == R.PASSED, what="pass")
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        wait_for(lambda: "BrakeOpen" in events(world), what="BrakeOpen")
        got = wait_for(
            lambda: (c := condition(world, AHR)) and c["reason"] == R.BRAKE_HELD and c, what="held"
        )
        assert got["status"] == "True" and "the brake holds this node back" in got["message"]
        assert "Xid 79" in got["message"] and our_taint(node_dict(world)) is None

        reload_config(world, ONE_ENTRY.replace("gpu: 1", "gpu: 2"))  # the brake lets it through
        got = wait_for(lambda: (c := condition(world, AHR)) and c["status"] == "False" and c, what="marked")
        assert got["reason"] == "GPUHealthcheckXidReboot" and our_taint(node_dict(world)) is not None
    finally:
        world["agent"].stop(signal.SIGKILL)


def test_a_reload_adds_renames_and_removes_entries_and_leaves_others_alone(
    kube: Any, gpu_node: Callable[..., Any], tmp_path: Path
) -> None:
    base = "intervals:\n  gpu: 30\nnode:\n  maxTaintedFraction: 1\n"
    base += "  repairBudget:\n    perLabel: kubernetes.io/hostname\n"  # with_entries says why
    world = start_agent(kube, gpu_node, tmp_path, base)
    try:
        wait_for(
            lambda: node_dict(world)["metadata"]["labels"].get("gpu-healthcheck/status") == "pass",
            what="pass",
        )
        theirs = cond("NvidiaGPUHealthy", "False", "NvidiaXidError", "another component's")
        assert status_patch(kube, world["node"], [theirs])[0] == 200
        with (world["snap"] / "kmsg.log").open("a") as fh:
            fh.write(XID_LINE)
        wait_for(lambda: our_taint(node_dict(world)), what="taint")
        assert {c["type"] for c in node_dict(world)["status"]["conditions"]} >= {
            "GPUHealthy",
            "NvidiaGPUHealthy",
        }

        two = (
            base
            + f"  remediationConditions:\n    - type: {AHR}\n"
            + "    - type: GPUReplace\n      minSeverity: isolate\n"
        )
        reload_config(world, two)
        wait_for(lambda: condition(world, AHR) and condition(world, "GPUReplace"), what="both entries")
        assert condition(world, AHR)["status"] == "False"
        assert (condition(world, "GPUReplace")["status"], condition(world, "GPUReplace")["reason"]) == (
            "True",
            R.BELOW_MIN_SEVERITY,
        )

        reload_config(world, two.replace(f"type: {AHR}", "type: NodeGPUFailed"))  # a renamed entry
        wait_for(lambda: condition(world, AHR) is None and condition(world, "NodeGPUFailed"), what="renamed")

        reload_config(world, base + "  mode: observe\n  remediationConditions:\n    - type: NodeGPUFailed\n")
        observed = wait_for(
            lambda: (c := condition(world, "NodeGPUFailed")) and c["status"] == "True" and c, what="observe"
        )
        assert observed["reason"] == R.NOT_ENFORCED and "mode observe" in observed["message"]
        assert condition(world, "GPUReplace") is None

        reload_config(world, base)
        wait_for(lambda: condition(world, "NodeGPUFailed") is None, what="the last entry removed")
        kept = condition(world, "NvidiaGPUHealthy")
        assert kept == {**kept, **theirs}, "another component's condition is never touched"
        assert condition(world) is not None
    finally:
        world["agent"].stop(signal.SIGKILL)


def test_the_agent_under_its_fenced_token_writes_its_conditions(
    fenced: dict[str, Any], tmp_path: Path
) -> None:
    """The install as shipped plus one entry in its ConfigMap: the agent's real writes pass the fence."""
    kube, node, token = fenced["kube"], fenced["node"], fenced["token"]
    text = with_entries(AHR).replace("  maxTaintedFraction: 0.2 ", "  maxTaintedFraction: 1.0 ")
    set_config(kube, NS, CM, text)
    set_policy_types(kube, ["GPUHealthy", AHR])  # the policy generated for this config
    cfg = tmp_path / "config"
    cfg.mkdir()
    (cfg / "config.yaml").write_text(text)
    until_status(
        lambda: status_patch(kube, node, [cond(AHR, "True", R.PASSED)], token), 200, "the fence has it"
    )
    argv = [sys.executable, "-m", "agent.cli", "agent", "--node", node, "--once", "--metrics-port", "0"]
    argv += ["--from-snapshot", str(ROOT / "examples" / "snapshots" / "p5.48xlarge-xid79")]
    argv += ["--kubeconfig", str(kube.kubeconfig_for_token(token)), "--config-dir", str(cfg)]
    argv += ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Forbidden" not in out, out[-3000:]
    got = conditions_of(kube, node)
    want = ("False", "GPUHealthcheckGPULostReboot")  # the xid79 snapshot's worst finding: the GPU is lost
    assert (got[AHR]["status"], got[AHR]["reason"]) == want and "→ reboot" in got[AHR]["message"]
    assert got["GPUHealthy"]["status"] == "False"


def test_a_reload_the_fence_refuses_is_rejected_with_the_servers_words(
    fenced: dict[str, Any], tmp_path: Path
) -> None:
    """The running agent under its fenced token: an edit that adds a type the policy does not list
    is rejected (ConfigRejected with the API server's message; the last good config, and the Node's
    conditions, stay as they were); with the policy updated, the next edit is adopted."""
    kube, node, token = fenced["kube"], fenced["node"], fenced["token"]
    until_status(lambda: status_patch(kube, node, [cond(AHR)], token), 403, "the policy lists no AHR")
    base = "intervals:\n  gpu: 2\nnode:\n  maxTaintedFraction: 1\n"
    snap, cfg = tmp_path / "snap", tmp_path / "config"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    cfg.mkdir()
    (cfg / "config.yaml").write_text(base)
    as_agent = SimpleNamespace(  # its token, not admin's; the records' namespace made by admin
        kubeconfig=kube.kubeconfig_for_token(token), ensure_namespace=kube.ensure_namespace
    )
    agent = AgentProcess(as_agent, node, snap, cfg, tmp_path / "agent.log")
    world = {"kube": kube, "node": node, "core": kube.api_client()}
    try:
        wait_for(lambda: (condition(world) or {}).get("reason") == "AllChecksPassed", what="pass")
        (cfg / "config.yaml").write_text(base + f"  remediationConditions:\n    - type: {AHR}\n")
        wait_for(lambda: "ConfigRejected" in events(world), timeout=30, what="ConfigRejected")
        out = kube.kubectl(
            "get", "events", "-A", "--field-selector", f"involvedObject.name={node}", "-o", "json"
        )
        why = next(e["message"] for e in json.loads(out.stdout)["items"] if e["reason"] == "ConfigRejected")
        assert f"refuses the condition types this config writes (GPUHealthy, {AHR})" in why, why
        assert "ValidatingAdmissionPolicy 'gpu-healthcheck-own-node'" in why, why
        assert condition(world, AHR) is None and "config rejected" in condition(world)["message"]
        assert "Node write failed" not in agent.log.read_text()  # nothing it writes is refused

        set_policy_types(kube, ["GPUHealthy", AHR])  # the policy generated for the new config
        until_status(lambda: status_patch(kube, node, [cond(AHR, "True", R.PASSED)], token), 200, "listed")
        (cfg / "config.yaml").write_text(
            base + f"  remediationConditions:\n    - type: {AHR}\n  recoverAfter: 2\n"
        )
        got = wait_for(lambda: condition(world, AHR), timeout=30, what="AHR written after the policy")
        assert got["reason"] == R.PASSED
        wait_for(lambda: "ConfigReloaded" in events(world), what="ConfigReloaded")
        wait_for(lambda: "config rejected" not in condition(world)["message"], what="the note gone")
    finally:
        agent.stop(signal.SIGKILL)

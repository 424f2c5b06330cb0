"""A refused write is loud and retried, and never leaves a failing node untainted.

The pure parts (the server's message in describe_error, what a refusal is, one Event per refusal,
the order of the two PATCHes, the metrics of what the Node shows) without a server; then the writer
on the real API server under a ServiceAccount's token, with a ValidatingAdmissionPolicy of the
test's own that refuses that identity's status PATCH, its Node PATCH, or a change of one condition
type (as the fence refuses a type its ConfigMap does not name). The agent process end to end (log,
metric, Event, retry) is in tests/test_refusals_kube.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from prometheus_client import generate_latest

from agent.core.marks import NodeEvent
from agent.core.node_keys import CONDITIONS, DEFAULT_CONDITION_TYPE, DEFAULT_PREFIX, TRUE, EventReason, Keys
from agent.core.remediation_types import RemediationMark, RemediationReason
from agent.core.severity import Severity, Status
from agent.reporters.kube_rest import API_MESSAGE_MAX, describe_error
from agent.reporters.metrics import Metrics
from agent.reporters.node_story import (
    NodeState,
    adds_taint,
    contradictions,
    lead_conditions,
    node_state,
    revert_conditions,
)
from agent.reporters.node_writer import NodeWriter
from agent.reporters.refusals import REPEAT_S, Refusal, RefusalNotices, refusal_of
from tests.conftest import shipped
from tests.kubeenv.env import unique_name
from tests.test_node_writer import FAIL, PASS, make_marks

P = DEFAULT_PREFIX
K = Keys(P)
COND = DEFAULT_CONDITION_TYPE
AHR = "AcceleratedHardwareReady"
R = RemediationReason
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


def api_error(status: int, message: str | None, reason: str = "Forbidden") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    if message is not None:
        exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return exc


# --- describe_error: the server's own words -----------------------------------------------------------


def test_describe_error_carries_the_servers_message() -> None:
    msg = (
        "nodes \"gpu-d\" is forbidden: ValidatingAdmissionPolicy 'gpu-healthcheck-own-node' with binding "
        "'gpu-healthcheck-own-node' denied request: gpu-healthcheck may change only its own conditions"
    )
    assert describe_error(api_error(403, msg)) == f"API error 403 Forbidden: {msg}"


def test_describe_error_cuts_a_long_message_and_keeps_one_line() -> None:
    got = describe_error(api_error(422, "a\nb  " + "x" * 5000, reason="Unprocessable Entity"))
    assert got.startswith("API error 422 Unprocessable Entity: a b xxx") and "\n" not in got
    assert got.endswith("…") and len(got) == len("API error 422 Unprocessable Entity: ") + API_MESSAGE_MAX


def test_describe_error_without_a_message_or_for_other_errors_is_as_before() -> None:
    assert (
        describe_error(api_error(503, None, reason="Service Unavailable"))
        == "API error 503 Service Unavailable"
    )
    plain = ApiException(status=500, reason="Internal Server Error")
    plain.body = "etcd timeout"  # not JSON: its text
    assert describe_error(plain) == "API error 500 Internal Server Error: etcd timeout"
    assert describe_error(TimeoutError("read timed out")) == "TimeoutError: read timed out"


# --- what a refusal is, and its Event once --------------------------------------------------------------


def test_a_refusal_is_an_answer_that_says_no() -> None:
    got = refusal_of(api_error(403, "denied by policy"), "status")
    assert got == Refusal("status", 403, "Forbidden", "denied by policy")
    assert refusal_of(api_error(422, "invalid", reason="Unprocessable Entity"), "node") is not None
    for code in (404, 408, 409, 429, 500, 503):  # gone, timeouts, conflicts, throttling, outages
        assert refusal_of(api_error(code, "x"), "node") is None, code
    assert refusal_of(TimeoutError(), "node") is None


def test_one_event_per_distinct_refusal_and_episode() -> None:
    now = [0.0]
    notices = RefusalNotices(clock=lambda: now[0])
    a = Refusal("status", 403, "Forbidden", "denied: type AcceleratedHardwareReady")
    first = notices.notice(a, kept="Nothing written", wanted="fail/reboot, taint reboot:NoSchedule")
    assert first is not None and first.reason == EventReason.NODE_WRITE_REFUSED and first.type == "Warning"
    assert "denied: type AcceleratedHardwareReady" in first.message and "403 Forbidden" in first.message
    assert "wanted: fail/reboot" in first.message and "Nothing written" in first.message
    assert notices.notice(a, kept="k", wanted="w") is None  # a retry: said already
    other = replace(a, message="another rule")
    assert notices.notice(other, kept="k", wanted="w") is not None
    now[0] += REPEAT_S  # past the Events' TTL: said again
    assert notices.notice(a, kept="k", wanted="w") is not None
    assert notices.accepted() == 4  # the episode had four refusals
    assert notices.notice(a, kept="k", wanted="w") is not None  # a new episode
    assert notices.accepted() == 1 and notices.accepted() == 0


# --- the order of the two PATCHes (node_story) ----------------------------------------------------------


def rmark(unhealthy: bool, reason: str = R.FAILED) -> RemediationMark:
    return RemediationMark(AHR, "False", unhealthy, reason, f"{reason} message")


def node_with(
    labels: dict[str, str] | None = None,
    conditions: list[dict[str, str]] | None = None,
    taint: bool = False,
) -> dict[str, Any]:
    taints = [{"key": K.taint, "value": "reboot", "effect": "NoSchedule"}] if taint else []
    return {
        "metadata": {"name": "n1", "resourceVersion": "7", "labels": labels or {}},
        "spec": {"taints": taints},
        "status": {"conditions": conditions or []},
    }


def entry(ctype: str, status: str, reason: str = "r") -> dict[str, str]:
    return {"type": ctype, "status": status, "reason": reason, "message": "m"}


def test_a_remediation_condition_turns_unhealthy_only_after_the_taint() -> None:
    marks = replace(FAIL, remediation=(rmark(True),))
    planned = [entry(COND, "False"), entry(AHR, "False", R.FAILED)]
    healthy_ahr = node_with(conditions=[entry(AHR, "True", R.PASSED)])
    assert lead_conditions(healthy_ahr, marks, planned) == [entry(COND, "False")]  # AHR waits
    unhealthy_ahr = node_with(conditions=[entry(AHR, "False", R.FAILED)])
    assert lead_conditions(unhealthy_ahr, marks, planned) == planned  # stays unhealthy: no wait
    recovered = replace(PASS, remediation=(rmark(False, R.PASSED),))
    to_healthy = [entry(COND, "True"), entry(AHR, "True", R.PASSED)]
    assert lead_conditions(unhealthy_ahr, recovered, to_healthy) == to_healthy  # before the taint goes


def test_a_new_fault_puts_the_node_out_of_service_first() -> None:
    """adds_taint: the Marks want our taint and the Node has neither it nor the opt-out label."""
    assert adds_taint(node_with(), FAIL, P)
    assert not adds_taint(node_with(taint=True), FAIL, P)  # tainted already: the conditions lead
    assert not adds_taint(node_with(labels={K.taint_opt_out: "disabled"}), FAIL, P)
    assert not adds_taint(node_with(), PASS, P) and not adds_taint(node_with(taint=True), PASS, P)
    assert not adds_taint(node_with(), make_marks(Status.UNKNOWN), P)


def test_reverting_puts_back_each_condition_as_it_was() -> None:
    old = {**entry(COND, "True", "AllChecksPassed"), "lastTransitionTime": "t0", "lastHeartbeatTime": "h0"}
    gone = entry("OldType", "True", R.PASSED)
    before = node_with(conditions=[old, gone])
    written = [
        entry(COND, "False"),
        entry(AHR, "True", R.NOT_ENFORCED),
        {"type": "OldType", "$patch": "delete"},
    ]
    assert revert_conditions(before, written) == [old, {"type": AHR, "$patch": "delete"}, gone]


def test_contradictions_name_what_the_node_tells_against_itself() -> None:
    marks = (rmark(True),)
    labels = {K.status: "fail", K.severity: "reboot", K.tainted: TRUE}
    good = node_with(labels, [entry(COND, "False"), entry(AHR, "False")], taint=True)
    assert contradictions(good, prefix=P, condition_type=COND, remediation=marks) == []
    assert contradictions(node_with(), prefix=P, condition_type=COND, remediation=marks) == []
    sre = node_with(labels, [entry(COND, "True"), entry(AHR, "True")], taint=True)  # harness2 R4
    assert contradictions(sre, prefix=P, condition_type=COND, remediation=marks) == [
        f"label {K.status}=fail but {COND}=True"
    ]
    untainted = node_with({K.status: "fail"}, [entry(COND, "False"), entry(AHR, "False")])
    assert contradictions(untainted, prefix=P, condition_type=COND, remediation=marks) == [
        f"{AHR}=False (marked for remediation) without our taint"
    ]
    half = node_with({K.status: "fail"}, [entry(COND, "False")], taint=True)
    assert contradictions(half, prefix=P, condition_type=COND, remediation=()) == [
        f"taint {K.taint} on but label {K.tainted}"
    ]
    assert contradictions(node_with({K.status: "pass"}), prefix=P, condition_type=COND, remediation=())


def test_node_state_and_its_metrics() -> None:
    node = node_with(conditions=[entry(AHR, "False")], taint=True)
    state = node_state(node, P, (rmark(True), RemediationMark("Other", "True", False, R.PASSED, "")), False)
    assert state == NodeState(tainted=True, taint_held=False, marked={AHR: True, "Other": False})
    assert node_state(node_with(), P, (), brake_held=True).taint_held  # wanted, held, not on the Node
    assert not node_state(node, P, (), brake_held=True).taint_held  # on the Node: not held
    m = Metrics()
    m.record_node_state(state)
    m.record_taint_wanted(True)
    m.record_write_refused("status", 403)
    m.record_write_refused("status", 403)
    text = generate_latest(m.registry).decode()
    for line in (
        "gpu_healthcheck_node_tainted 1.0",
        "gpu_healthcheck_taint_wanted 1.0",
        "gpu_healthcheck_taint_held 0.0",
        'gpu_healthcheck_remediation_marked{type="AcceleratedHardwareReady"} 1.0',
        'gpu_healthcheck_remediation_marked{type="Other"} 0.0',
        'gpu_healthcheck_node_write_refusals_total{code="403",kind="status"} 2.0',
    ):
        assert line in text, line
    m.record_node_state(NodeState(taint_held=True))  # the types are no longer configured
    text = generate_latest(m.registry).decode()
    assert "gpu_healthcheck_remediation_marked{" not in text and "gpu_healthcheck_taint_held 1.0" in text


# --- on the real API server -------------------------------------------------------------------------------


@dataclass
class Identity:
    """A ServiceAccount with the agent's API rights (not fenced by the shipped policy) and its token."""

    kube: Any
    namespace: str
    name: str
    token: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def rbac_docs(ns: str, sa: str, name: str) -> list[dict[str, Any]]:
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                {  # the repair budget's Leases (counted before a remediation condition's mark)
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["create", "get", "list", "delete"],  # as manifests/10-rbac.yaml grants
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subject,
        },
    ]


@pytest.fixture
def identity(kube: Any, kube_namespace: str) -> Iterator[Identity]:
    sa = "agent"
    name = unique_name(f"refused-{kube_namespace}", max_len=60)
    kube.create_service_account(kube_namespace, sa)
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac_docs(kube_namespace, sa, name)))
    yield Identity(
        kube, kube_namespace, sa, kube.token_for(kube_namespace, sa, expiration=3600, create=False)
    )
    kube.kubectl("delete", "clusterrole,clusterrolebinding", name, "--ignore-not-found", check=False)


class Refuser:
    """A ValidatingAdmissionPolicy of the test's own: refuses *identity*'s UPDATEs of *resource*
    (nodes or nodes/status) unless *allowed* (CEL) holds, saying *message*."""

    def __init__(
        self, ident: Identity, node: str, resource: str, allowed: str, probe: dict[str, Any]
    ) -> None:
        self.ident, self.node, self.resource, self.probe_body = ident, node, resource, probe
        self.name = unique_name(f"refuse-{node}", max_len=60)
        self.message = f"test policy {self.name} refuses this write"
        self.policy = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": self.name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": [resource],
                        }
                    ]
                },
                "matchConditions": [
                    {"name": "the-agent", "expression": f"request.userInfo.username == '{ident.username}'"}
                ],
                "validations": [{"expression": allowed, "message": self.message, "reason": "Forbidden"}],
            },
        }
        self.binding = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": self.name},
            "spec": {"policyName": self.name, "validationActions": ["Deny"]},
        }

    def probe(self) -> int:
        """A dry-run PATCH under the agent's token that the policy refuses: 403 while it is in force."""
        sub = "/status" if self.resource == "nodes/status" else ""
        status, _ = self.ident.kube.request(
            "PATCH",
            f"/api/v1/nodes/{self.node}{sub}",
            self.probe_body,
            query={"dryRun": "All"},
            token=self.ident.token,
            content_type=STRATEGIC if sub else MERGE,
        )
        return int(status)

    def _until(self, want: int, what: str) -> None:
        deadline = time.monotonic() + 60
        while (got := self.probe()) != want:
            assert time.monotonic() < deadline, f"{what}: the probe still answers {got}"
            time.sleep(0.3)

    def on(self) -> None:
        self.ident.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([self.policy, self.binding]))
        self._until(403, "the refusal in force")

    def off(self) -> None:
        self.ident.kube.kubectl("delete", "validatingadmissionpolicybinding", self.name, "--ignore-not-found")
        self._until(200, "the refusal lifted")

    def remove(self) -> None:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            self.ident.kube.kubectl("delete", kind, self.name, "--ignore-not-found", check=False)


@pytest.fixture
def refusers() -> Iterator[list[Refuser]]:
    made: list[Refuser] = []
    yield made
    for r in made:
        r.remove()


def status_probe(ctype: str = "TestProbe") -> dict[str, Any]:
    return {"status": {"conditions": [{"type": ctype, "status": "True", "reason": "Probe", "message": "p"}]}}


def node_of(kube: Any, name: str) -> dict[str, Any]:
    status, body = kube.request("GET", f"/api/v1/nodes/{name}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def refused_events(kube: Any, node: str) -> list[dict[str, Any]]:
    status, body = kube.request(
        "GET",
        "/api/v1/namespaces/default/events",
        query={"fieldSelector": f"involvedObject.name={node},reason={EventReason.NODE_WRITE_REFUSED}"},
    )
    assert status == 200, body
    return list(body["items"])


def reasons_of(kube: Any, node: str) -> list[str]:
    status, body = kube.request(
        "GET", "/api/v1/namespaces/default/events", query={"fieldSelector": f"involvedObject.name={node}"}
    )
    assert status == 200
    return [e["reason"] for e in body["items"]]


def conds(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node["status"].get("conditions") or ()}


def story(node: dict[str, Any], remediation: tuple[RemediationMark, ...] = ()) -> list[str]:
    return contradictions(node, prefix=P, condition_type=COND, remediation=remediation)


def our_taint(node: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in node["spec"].get("taints") or () if t["key"] == K.taint), None)


class Hooks:
    def __init__(self) -> None:
        self.refused: list[tuple[str, int]] = []
        self.states: list[NodeState] = []


def writer_for(ident: Identity, node: str, hooks: Hooks) -> Iterator[NodeWriter]:
    with ident.kube.api_client_for_token(ident.token) as api:
        w = NodeWriter(
            api,
            node,
            on_refused=lambda kind, code: hooks.refused.append((kind, code)),
            on_state=hooks.states.append,
            cfg=shipped(),
        )
        yield w
        w.stop()


UNKNOWN = make_marks(Status.UNKNOWN, message="nvidia-smi timed out")
GPU_EVENT = NodeEvent(EventReason.GPU_HEALTH_CHANGED, "pass → fail: GPU 3: Xid 79 → reboot", "Warning")


@pytest.mark.kube
def test_a_refused_status_write_after_the_taint_leaves_the_node_out_of_service_and_says_so(
    identity: Identity,
    gpu_node: Callable[..., Any],
    kube_node_name: str,
    refusers: list[Refuser],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SRE's reproduction, with the write order of a new fault: the taint goes first, so a
    refused status PATCH leaves the failing node tainted (never untainted), and it is loud: the log
    and the Event carry the server's message and say what the Node shows meanwhile (the labels and
    taint, our condition not yet), the hook counts it by code, one Event however often it is
    retried, and once the refusal is lifted a retry writes the condition."""
    kube = identity.kube
    gpu_node()
    hooks = Hooks()
    for w in writer_for(identity, kube_node_name, hooks):
        assert w.apply(PASS).ok
        healthy = node_of(kube, kube_node_name)
        assert healthy["metadata"]["labels"][K.status] == "pass" and story(healthy) == []
        refuser = Refuser(identity, kube_node_name, "nodes/status", "false", status_probe())
        refusers.append(refuser)
        refuser.on()

        caplog.set_level(logging.WARNING, logger="agent.reporters.node_writer")
        res = w.apply(replace(FAIL, events=(GPU_EVENT,)))
        assert not res.ok and res.refused is not None and res.tainted and res.node_writes == 1
        assert (res.refused.kind, res.refused.code) == (
            "status",
            403,
        ) and refuser.message in res.refused.message
        assert refuser.message in (res.error or "")
        assert hooks.refused == [("status", 403)]
        assert any(
            refuser.message in r.getMessage() and "refused the status write" in r.getMessage()
            for r in caplog.records
        )
        node = node_of(kube, kube_node_name)
        assert node["metadata"]["labels"][K.status] == "fail" and our_taint(node) is not None
        assert conds(node)[COND]["status"] == CONDITIONS[Status.PASS].status  # not written yet
        events = refused_events(kube, kube_node_name)
        assert len(events) == 1 and refuser.message in events[0]["message"] and events[0]["type"] == "Warning"
        assert "labels and taint are written" in events[0]["message"]
        assert reasons_of(kube, kube_node_name).count(EventReason.GPU_HEALTH_CHANGED) == 1  # not held back
        assert EventReason.TAINT_ADDED in reasons_of(kube, kube_node_name)

        for _ in range(3):  # the agent's retries: counted, not one Event each; the taint stays
            assert w.apply(FAIL).refused is not None
            assert our_taint(node_of(kube, kube_node_name)) is not None
        assert hooks.refused == [("status", 403)] * 4 and len(refused_events(kube, kube_node_name)) == 1
        assert hooks.states[-1] == NodeState(tainted=True, taint_held=False, marked={})

        refuser.off()
        res = w.apply(FAIL)
        assert res.ok and res.tainted and res.status_writes
        node = node_of(kube, kube_node_name)
        assert node["metadata"]["labels"][K.status] == "fail" and our_taint(node) is not None
        assert conds(node)[COND]["status"] == CONDITIONS[Status.FAIL].status and story(node) == []
        assert hooks.states[-1].tainted  # the metric follows the Node
        assert reasons_of(kube, kube_node_name).count(EventReason.GPU_HEALTH_CHANGED) == 1  # posted once


@pytest.mark.kube
def test_a_refused_status_write_of_a_change_without_a_new_taint_leaves_the_old_story_whole(
    identity: Identity, gpu_node: Callable[..., Any], kube_node_name: str, refusers: list[Refuser]
) -> None:
    """No taint to add (pass → unknown): the conditions still lead, so a refused status PATCH
    writes nothing of the change and the Node keeps its story whole."""
    kube = identity.kube
    gpu_node()
    hooks = Hooks()
    for w in writer_for(identity, kube_node_name, hooks):
        assert w.apply(PASS).ok
        healthy = node_of(kube, kube_node_name)
        refuser = Refuser(identity, kube_node_name, "nodes/status", "false", status_probe())
        refusers.append(refuser)
        refuser.on()
        res = w.apply(UNKNOWN)
        assert not res.ok and res.refused is not None and not res.wrote
        node = node_of(kube, kube_node_name)
        assert node["metadata"]["resourceVersion"] == healthy["metadata"]["resourceVersion"]
        assert node["metadata"]["labels"][K.status] == "pass" and story(node) == []
        (event,) = refused_events(kube, kube_node_name)
        assert refuser.message in event["message"] and "Nothing of this change" in event["message"]
        refuser.off()
        assert w.apply(UNKNOWN).ok
        node = node_of(kube, kube_node_name)
        assert node["metadata"]["labels"][K.status] == "unknown" and story(node) == []


@pytest.mark.kube
def test_a_refused_node_write_puts_the_leading_conditions_back(
    identity: Identity, gpu_node: Callable[..., Any], kube_node_name: str, refusers: list[Refuser]
) -> None:
    """No taint to add (pass → unknown): the status PATCH went through, the Node PATCH is refused,
    and the conditions are written back as they were (status, reason, message, times), so the Node
    tells its old story whole. A new fault's Node PATCH refused writes nothing at all: the
    conditions wait for it."""
    kube = identity.kube
    gpu_node()
    hooks = Hooks()
    for w in writer_for(identity, kube_node_name, hooks):
        assert w.apply(PASS).ok
        healthy = node_of(kube, kube_node_name)
        old = conds(healthy)[COND]
        probe = {"metadata": {"labels": {K.status: "probe"}}}
        refuser = Refuser(identity, kube_node_name, "nodes", "false", probe)
        refusers.append(refuser)
        refuser.on()
        res = w.apply(UNKNOWN)
        assert (
            not res.ok and res.refused is not None and (res.refused.kind, res.refused.code) == ("node", 403)
        )
        node = node_of(kube, kube_node_name)
        assert conds(node)[COND] == old and node["metadata"]["labels"][K.status] == "pass"
        assert our_taint(node) is None and story(node) == []
        (event,) = refused_events(kube, kube_node_name)
        assert refuser.message in event["message"] and "put back" in event["message"]

        rv = node["metadata"]["resourceVersion"]
        res = w.apply(FAIL)  # a new fault: the Node PATCH leads, refused: nothing is sent after it
        assert not res.ok and res.refused is not None and res.refused.kind == "node" and not res.wrote
        node = node_of(kube, kube_node_name)
        assert node["metadata"]["resourceVersion"] == rv and conds(node)[COND] == old and story(node) == []
        refuser.off()
        assert w.apply(FAIL).ok
        node = node_of(kube, kube_node_name)
        assert conds(node)[COND]["status"] == "False" and our_taint(node) is not None and story(node) == []


@pytest.mark.kube
def test_a_refused_remediation_type_leaves_the_node_tainted_and_unmarked(
    identity: Identity, gpu_node: Callable[..., Any], kube_node_name: str, refusers: list[Refuser]
) -> None:
    """The fence refuses a remediation type its ConfigMap does not name (harness2 R4): the labels,
    taint and GPUHealthy go on, the remediation condition keeps its healthy value (a node an engine
    may replace is always tainted, never the reverse), the refusal is said, and it is written once
    allowed."""
    kube = identity.kube
    gpu_node()
    hooks = Hooks()
    healthy = replace(PASS, remediation=(rmark(False, R.PASSED),))
    failing = replace(FAIL, remediation=(rmark(True),))
    for w in writer_for(identity, kube_node_name, hooks):
        assert w.apply(healthy).ok
        ahr = f"conditions.filter(c, c.type == '{AHR}')"
        same = f"object.status.{ahr} == oldObject.status.{ahr}"  # as the fence: no change of this type
        refuser = Refuser(identity, kube_node_name, "nodes/status", same, status_probe(AHR))
        refusers.append(refuser)
        refuser.on()
        res = w.apply(failing)
        assert not res.ok and res.refused is not None and res.refused.kind == "status" and res.tainted
        assert EventReason.TAINT_ADDED in res.events and EventReason.NODE_WRITE_REFUSED in res.events
        node = node_of(kube, kube_node_name)
        assert node["metadata"]["labels"][K.status] == "fail" and our_taint(node) is not None
        assert conds(node)[COND]["status"] == "False"
        assert (conds(node)[AHR]["status"], conds(node)[AHR]["reason"]) == ("True", R.PASSED)
        assert story(node, failing.remediation) == []
        assert hooks.states[-1] == NodeState(tainted=True, taint_held=False, marked={AHR: False})
        refuser.off()
        assert w.apply(failing).ok
        node = node_of(kube, kube_node_name)
        assert (conds(node)[AHR]["status"], conds(node)[AHR]["reason"]) == ("False", R.FAILED)
        assert story(node, failing.remediation) == [] and hooks.states[-1].marked == {AHR: True}


def versions_since(kube: Any, node: str, rv: str) -> list[dict[str, Any]]:
    """Every version of the Node the API server stored after *rv*, in order (a watch from it)."""
    query = {"watch": "true", "resourceVersion": rv, "fieldSelector": f"metadata.name={node}"}
    status, body = kube.request("GET", "/api/v1/nodes", query={**query, "timeoutSeconds": "2"}, timeout=10)
    assert status == 200, body
    events = [body] if isinstance(body, dict) else [json.loads(x) for x in body.splitlines() if x.strip()]
    assert all(e["type"] == "MODIFIED" for e in events), [e["type"] for e in events]
    return [e["object"] for e in events]


@pytest.mark.kube
def test_a_new_fault_is_out_of_service_first_and_no_remediation_condition_runs_ahead(
    identity: Identity, gpu_node: Callable[..., Any], kube_node_name: str
) -> None:
    """The order on the real API server, read from every version of the Node it stored: the first
    write of a new fault puts our taint on (the node leaves service before anything else is said),
    our condition and the remediation condition follow in one status PATCH, and no version ever
    shows a remediation condition unhealthy without our taint. The recovery: the conditions lead,
    the taint goes after them; no version shows AHR unhealthy without the taint either."""
    kube = identity.kube
    gpu_node()
    hooks = Hooks()
    healthy = replace(PASS, remediation=(rmark(False, R.PASSED),))
    failing = replace(FAIL, remediation=(rmark(True),))
    for w in writer_for(identity, kube_node_name, hooks):
        assert w.apply(healthy).ok
        rv = node_of(kube, kube_node_name)["metadata"]["resourceVersion"]
        res = w.apply(failing)
        assert res.ok and res.tainted and (res.node_writes, res.status_writes) == (1, 1)
        versions = versions_since(kube, kube_node_name, rv)
        assert len(versions) == 2, [v["metadata"]["resourceVersion"] for v in versions]
        first, then = versions
        assert our_taint(first) is not None and first["metadata"]["labels"][K.status] == "fail"
        assert conds(first)[COND]["status"] == "True" and conds(first)[AHR]["status"] == "True"
        assert conds(then)[COND]["status"] == "False" and conds(then)[AHR]["status"] == "False"
        assert story(then, failing.remediation) == []
        for v in versions:
            assert not [c for c in story(v, failing.remediation) if "without our taint" in c]

        rv = then["metadata"]["resourceVersion"]
        assert w.apply(healthy).ok
        versions = versions_since(kube, kube_node_name, rv)
        assert conds(versions[0])[AHR]["status"] == "True" and our_taint(versions[0]) is not None
        assert our_taint(versions[-1]) is None and story(versions[-1], healthy.remediation) == []
        for v in versions:
            assert not [c for c in story(v, failing.remediation) if "without our taint" in c]


def test_the_fail_marks_used_here_fail() -> None:
    """The marks the kube tests write are the failing, tainting ones (a check that can fail)."""
    assert FAIL.taint and FAIL.status is Status.FAIL and FAIL.severity is Severity.REBOOT
    assert make_marks(Status.PASS).taint is False

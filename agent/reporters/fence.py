"""The start-up proof that the agent is fenced: asked to do what it must never do, the API server
refuses.

RBAC lets the agent patch every Node; only the ValidatingAdmissionPolicy of
manifests/30-admission-policy.yaml narrows that to its own Node and its own keys. That policy can be
missing (Kubernetes before 1.30, a partial install), or not match the agent's identity (an installer
that dropped the RBAC mark it fences by), and then nothing says so. So at start the agent asks the
API server, as dry runs that write nothing, to (1) put a label outside its prefix on its own Node
and (2) put one of its own labels on another Node, and (3), given the namespace of the repair
budget's records, to create a release record there (gpu-healthcheck-own-records refuses it), and
expects each to be refused with 403/422.
When it is not fenced it asks whether it should be: RBAC marks the identities the policy fences
(the permission `fenced`, agent/reporters/fence_guard.py holds every write of a marked identity the
fence does not hold: half an install).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

from agent.core.record_kind import RecordKind
from agent.reporters.kube_rest import MERGE_PATCH, KubeRest, api_status, describe_error, node_path
from agent.reporters.lease_records import lease_path

log = logging.getLogger(__name__)

PROBE_LABEL = "gpu-healthcheck.invalid/fence-probe"  # a key no one owns, never written (dry run)
VAP_RESOURCE = "validatingadmissionpolicies"
VAP_GROUP = "/apis/admissionregistration.k8s.io/v1"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
MARK_GROUP = "fence.gpu-healthcheck.io"  # the made-up permissions of 10-rbac.yaml
REFUSED = (403, 422)
TIMEOUT = (5, 15)  # not kube_rest's (5, 30): dry runs and discovery at start, small answers


class FenceResult(str, enum.Enum):
    FENCED = "fenced"  # both refused
    UNFENCED = "unfenced"  # the API server would have done one of them
    UNKNOWN = "unknown"  # could not tell (API unreachable, no other Node to try, ...)


@dataclass(frozen=True)
class FenceProof:
    result: FenceResult
    detail: str
    marked: bool | None = None  # RBAC marks this identity to be fenced (asked only when unfenced)

    @property
    def holds_writes(self) -> bool:
        """Marked to be fenced, yet unfenced: half an install (the policy or its binding gone, a
        cluster without ValidatingAdmissionPolicy). The agent writes nothing then (fail closed)."""
        return self.result is FenceResult.UNFENCED and self.marked is True


def _dry_patch(rest: KubeRest, name: str, labels: dict[str, str]) -> int:
    """The HTTP status of a dry-run merge patch of *name*'s labels (200 = it would have landed)."""
    try:
        rest.json(
            "PATCH",
            node_path(name),
            query={"dryRun": "All", "fieldManager": "gpu-healthcheck-fence-probe"},
            body={"metadata": {"labels": labels}},
            content_type=MERGE_PATCH,
            timeout=TIMEOUT,
        )
    except Exception as exc:
        status = api_status(exc)
        if status is None:
            raise
        return status
    return 200


def _dry_release(rest: KubeRest, namespace: str, node_name: str, prefix: str) -> int:
    """The HTTP status of a dry-run create of a release record (201 = it would have landed)."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "generateName": f"{prefix}-fence-probe-",
            "labels": {f"{prefix}/record": RecordKind.RELEASE},
            "annotations": {f"{prefix}/node": node_name},
        },
    }
    try:
        rest.json(
            "POST",
            lease_path(namespace),
            query={"dryRun": "All", "fieldManager": "gpu-healthcheck-fence-probe"},
            body=body,
            timeout=TIMEOUT,
        )
    except Exception as exc:
        status = api_status(exc)
        if status is None:
            raise
        return status
    return 201


def _has_vap(rest: KubeRest) -> bool | None:
    """Does the API server serve ValidatingAdmissionPolicies (GA in 1.30)? None: could not ask."""
    try:
        doc = rest.json("GET", VAP_GROUP, timeout=TIMEOUT)
    except Exception as exc:
        if api_status(exc) == 404:
            return False
        return None
    return any(r.get("name") == VAP_RESOURCE for r in doc.get("resources") or ())


def _may(rest: KubeRest, verb: str) -> bool:
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"group": MARK_GROUP, "resource": "nodes", "verb": verb}},
    }
    doc = rest.json("POST", SSAR, body=body, timeout=TIMEOUT)
    return bool((doc.get("status") or {}).get("allowed"))


def _marked(rest: KubeRest) -> bool | None:
    """Does RBAC mark this identity to be fenced (`fenced`, and not `exempt` as `*` holds)? Every
    authenticated identity may ask this of itself. None: could not ask."""
    try:
        return _may(rest, "fenced") and not _may(rest, "exempt")
    except Exception as exc:
        log.warning("fence: could not ask whether this identity is marked fenced: %s", describe_error(exc))
        return None


def _another_node(rest: KubeRest, node_name: str) -> str | None:
    doc = rest.json("GET", "/api/v1/nodes", query={"limit": 2, "resourceVersion": "0"}, timeout=TIMEOUT)
    names = [str((i.get("metadata") or {}).get("name")) for i in doc.get("items") or ()]
    return next((n for n in names if n != node_name), None)


def prove_fence(core: Any, node_name: str, prefix: str, records_namespace: str = "") -> FenceProof:
    """Ask for the forbidden writes as dry runs; never raises."""
    rest = KubeRest.of(core)
    try:
        own = _dry_patch(rest, node_name, {PROBE_LABEL: "x"})
        released = _dry_release(rest, records_namespace, node_name, prefix) if records_namespace else None
        if released == 404:  # no such namespace: no record can be written there either
            released = None
    except Exception as exc:
        return FenceProof(FenceResult.UNKNOWN, f"could not ask the API server: {describe_error(exc)}")
    try:
        other = _another_node(rest, node_name)
        theirs = _dry_patch(rest, other, {f"{prefix}/fence-probe": "x"}) if other else None
    except Exception as exc:  # (the quarantine Job may not list Nodes): the first answer still counts
        if own == 200:
            other = theirs = None
        else:
            return FenceProof(FenceResult.UNKNOWN, f"could not ask the API server: {describe_error(exc)}")
    accepted = []
    if own == 200:
        accepted.append(f"a label outside {prefix}/ on its own Node")
    if theirs == 200:
        accepted.append(f"a {prefix}/ label on another Node ({other})")
    if released == 201:
        accepted.append(f"a release record of the repair budget in {records_namespace}")
    if accepted:
        vap = _has_vap(rest)
        why = (
            "this API server has no ValidatingAdmissionPolicy (Kubernetes < 1.30)"
            if vap is False
            else "the policy of manifests/30-admission-policy.yaml is not installed or does not "
            "match this agent's identity (its ClusterRole must grant the `fenced` mark)"
        )
        would = " and ".join(accepted)
        marked = _marked(rest)
        return FenceProof(FenceResult.UNFENCED, f"the API server would accept {would}: {why}", marked)
    unexpected = [s for s in (own, theirs, released) if s is not None and s not in REFUSED]
    if unexpected:
        return FenceProof(FenceResult.UNKNOWN, f"unexpected answers to the dry runs: {unexpected}")
    if theirs is None:
        return FenceProof(
            FenceResult.UNKNOWN, "foreign keys are refused; no other Node to try a write on another Node"
        )
    what = "foreign keys and other Nodes" + (", and a release record," if released else "")
    return FenceProof(FenceResult.FENCED, f"{what} are refused (dry runs)")


def report_fence(proof: FenceProof) -> None:
    """The log line: an unfenced agent is an error an operator must see."""
    if proof.holds_writes:
        log.error(
            "fence: this agent runs UNFENCED although RBAC marks it to be fenced (half an install): "
            "%s; it writes nothing to its Node until the fence is back (fail closed)",
            proof.detail,
        )
    elif proof.result is FenceResult.UNFENCED:
        log.error("fence: this agent runs UNFENCED: %s", proof.detail)
    elif proof.result is FenceResult.UNKNOWN:
        log.warning("fence: could not prove the admission fence: %s", proof.detail)
    else:
        log.info("fence: %s", proof.detail)

"""`gpu-healthcheck clear NODE`: un-quarantine a node's latched findings in one command, audited.

It sets the existing `<prefix>/clear-latched` annotation ("all" or the latch keys) and, beside it,
`<prefix>/clear-latched-by`: who asked (the Kubernetes identity the API server sees, by
SelfSubjectReview; else the kubeconfig's user) and why. The agent consumes both, answers with a
LatchesCleared Event naming the latches, who and why, and keeps the request as `lastClear` in its
results annotation, which `gpu-healthcheck status` shows for 24 h.

It refuses, unless --force, to clear a node whose current checks still fail (other than the checks
whose latches it clears), naming them: clearing a latch does not fix a GPU, and the next cycle
would fail the node again. The write goes with the Node's resourceVersion as precondition, so the
judgement and the request concern the same Node.

Exit codes, as `status`: 0 requested (and, with --wait, acted on by the agent); 1 refused, a check
still fails; 2 the node's health cannot be judged (no results from an agent) or, with --wait, no
agent acted on the request in time; 64 usage (unknown node, a latch not latched, no reason);
69 the cluster cannot be read or written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.marks import ClearRequest
from agent.core.node_keys import CLEAR_ALL, Keys
from agent.core.results_doc import LAST_CLEAR_FIELD, decode_results, now_iso
from agent.reporters.kube_rest import MERGE_PATCH, REQUEST_TIMEOUT, KubeRest, api_status, node_path

EXIT_OK, EXIT_REFUSED, EXIT_UNKNOWN, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 64, 69
CONFLICT_ATTEMPTS = 5


class ClearUsageError(Exception):
    """Bad arguments for this node: exit 64."""


@dataclass(frozen=True)
class Judgement:
    """What `clear` makes of the Node before it writes anything."""

    value: str  # the clear-latched annotation's value: "all" or comma-separated keys
    latches: tuple[str, ...]  # the latched keys it clears
    failing: tuple[str, ...]  # checks that still fail and that the clear does not concern
    judged: bool  # the agent's results annotation was there to judge by


def judge(node: Mapping[str, Any], prefix: str, latch: Sequence[str] | None) -> Judgement:
    """Pure: the request for *latch* (None: all) against the Node's results annotation."""
    ann = (node.get("metadata") or {}).get("annotations") or {}
    results = decode_results(ann.get(Keys(prefix).results))
    if results is None:
        return Judgement(CLEAR_ALL if latch is None else ",".join(latch), tuple(latch or ()), (), False)
    latched = {
        str(x.get("key")): str(x.get("check"))
        for x in results.get("latched") or ()
        if isinstance(x, Mapping) and x.get("key")
    }
    if latch is None:
        keys = tuple(latched)
    else:
        unknown = [k for k in latch if k not in latched]
        if unknown:
            have = ", ".join(latched) or "none"
            raise ClearUsageError(f"not latched on this node: {', '.join(unknown)} (latched: {have})")
        keys = tuple(dict.fromkeys(latch))
    concerned = {latched[k] for k in keys}
    failing = tuple(
        str(c.get("name"))
        for c in results.get("checks") or ()
        if isinstance(c, Mapping) and c.get("status") == "fail" and c.get("name") not in concerned
    )
    value = CLEAR_ALL if latch is None else ",".join(keys)
    return Judgement(value, keys, failing, True)


def whoami(rest: KubeRest, fallback: Callable[[], str | None]) -> str:
    """The requester as the API server knows it (SelfSubjectReview, Kubernetes >= 1.28), else the
    kubeconfig's user, else "unknown"."""
    try:
        doc = rest.json(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            timeout=REQUEST_TIMEOUT,
        )
        name = ((doc.get("status") or {}).get("userInfo") or {}).get("username")
        if isinstance(name, str) and name:
            return name
    except Exception:  # an older or locked-down API server: the kubeconfig's word instead
        pass
    return fallback() or "unknown"


def kubeconfig_user(kubeconfig: str | None) -> str | None:
    """The current context's user name in the kubeconfig (None in-cluster or when unreadable)."""
    from kubernetes import config

    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception:
        return None
    user = ((active or {}).get("context") or {}).get("user")
    return str(user) if user else None


@dataclass(frozen=True)
class Outcome:
    code: int
    message: str


def clear(
    rest: KubeRest,
    node_name: str,
    *,
    prefix: str,
    latch: Sequence[str] | None,
    reason: str,
    force: bool,
    who: str,
    wait_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Judge the Node, write the request, and with *wait_s* wait for the agent to act on it."""
    keys = Keys(prefix)
    for _ in range(CONFLICT_ATTEMPTS):
        try:
            node = rest.json("GET", node_path(node_name), timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                raise ClearUsageError(f"no such Node: {node_name}") from exc
            raise
        got = judge(node, prefix, latch)
        if not got.judged and not force:
            return Outcome(
                EXIT_UNKNOWN,
                f"{node_name}: no results from a gpu-healthcheck agent ({keys.results}): cannot tell "
                "whether its checks still fail; --force to clear anyway",
            )
        if got.failing and not force:
            return Outcome(
                EXIT_REFUSED,
                f"{node_name}: refused: {', '.join(got.failing)} still "
                f"{'fails' if len(got.failing) == 1 else 'fail'}; clearing a latch does not fix it "
                "(--force to clear anyway)",
            )
        request = ClearRequest(by=who, reason=reason, at=now_iso(), force=force, failing=got.failing)
        body = {
            "metadata": {
                "resourceVersion": node["metadata"]["resourceVersion"],
                "annotations": {keys.clear_latched: got.value, keys.clear_latched_by: request.encode()},
            }
        }
        try:
            rest.json(
                "PATCH",
                node_path(node_name),
                body=body,
                content_type=MERGE_PATCH,
                query={"fieldManager": "gpu-healthcheck-clear"},
                timeout=REQUEST_TIMEOUT,
            )
        except Exception as exc:
            if api_status(exc) == 409:
                continue  # the Node changed meanwhile: judge it again
            raise
        break
    else:
        raise RuntimeError(f"{node_name} kept changing ({CONFLICT_ATTEMPTS} attempts)")
    what = "every latch" if latch is None else ", ".join(got.latches)
    said = f"{node_name}: asked the agent to clear {what} ({len(got.latches)} latched) as {who}: {reason}"
    if force and got.failing:
        said += f" (forced while {', '.join(got.failing)} still fails)"
    if wait_s <= 0:
        return Outcome(EXIT_OK, said + "; the agent answers with a LatchesCleared Event")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        sleep(0.5)
        node = rest.json("GET", node_path(node_name), timeout=REQUEST_TIMEOUT)
        ann = (node.get("metadata") or {}).get("annotations") or {}
        if keys.clear_latched not in ann:
            done = (decode_results(ann.get(keys.results)) or {}).get(LAST_CLEAR_FIELD) or {}
            cleared = ", ".join(done.get("latches") or ()) or "none"
            status = ((node.get("metadata") or {}).get("labels") or {}).get(keys.status, "-")
            return Outcome(EXIT_OK, f"{said}\nthe agent cleared: {cleared}; the node is now {status}")
    return Outcome(
        EXIT_UNKNOWN,
        f"{said}\nno agent acted on it within {wait_s:g} s (is the gpu-healthcheck agent running on "
        f"{node_name}?); the request stays on the Node until one does",
    )


__all__ = ["ClearUsageError", "Judgement", "Outcome", "clear", "judge", "kubeconfig_user", "whoami"]

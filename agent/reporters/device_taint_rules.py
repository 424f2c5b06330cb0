"""The DeviceTaintRule API as the server serves it, and a rule's shape as read back: which version
(`resource.k8s.io/v1` from Kubernetes 1.37, GA and served by default; `v1beta2` in 1.36, behind the
gate DRADeviceTaintRules and `--runtime-config`, both off by default; `v1alpha3` before, alpha),
asked of the discovery documents, v1 first, at start, again after a 404 and after a config reload,
never per cycle. The body is the same in the three but for its apiVersion; where the rule's
`status` subresource is served (1.35 and later) the `None` effect is too, and a warning shows on a
device with it (it moves no pod). Also the brake's count of nodes held back by our rules.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.device_scope import Device
from agent.core.metric_labels import DeviceTaintFallback
from agent.core.node_keys import DEFAULT_PREFIX
from agent.reporters.kube_rest import KubeRest, api_status, describe_error

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")  # preferred first: GA (1.37), beta (1.36), alpha (1.33-1.35)
RESOURCE = "devicetaintrules"
TIMEOUT = (5, 15)  # not kube_rest's (5, 30): discovery and this node's few rules, small answers
LABEL_VALUE_MAX = 63
NONE_EFFECT = "None"  # a device taint that shows and moves no pod (served with the rule's status)
FIELD_MANAGER = "gpu-healthcheck"


@dataclass(frozen=True)
class RuleApi:
    """The DeviceTaintRule API the server serves: its version, and whether the rule's status (and
    with it the `None` effect, both Kubernetes 1.35) is served."""

    version: str
    status: bool

    @property
    def path(self) -> str:
        return f"/apis/{GROUP}/{self.version}/{RESOURCE}"

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    @property
    def none_effect(self) -> bool:
        return self.status


def discover(rest: Any) -> RuleApi | None:
    """The DeviceTaintRule API served (v1, else v1beta2, else v1alpha3), from the discovery documents
    (one GET per version asked; open to every authenticated user); None when none serves it.
    Raises on API trouble other than a version that is not served (404)."""
    client = KubeRest.of(rest)
    for version in VERSIONS:
        try:
            doc = client.json("GET", f"/apis/{GROUP}/{version}", timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                continue
            raise
        names = {str(r.get("name") or "") for r in doc.get("resources") or ()}
        if RESOURCE in names:
            return RuleApi(version, f"{RESOURCE}/status" in names)
    return None


class Unavailable(RuntimeError):
    """The API server serves no version of DeviceTaintRules."""


@dataclass(frozen=True)
class Wanted:
    """One device taint: the device, and the taint's value (severity) and effect."""

    device: Device
    value: str
    effect: str  # NoSchedule | NoExecute | None (PreferNoSchedule is not a device taint effect)


def node_label(node_name: str) -> str:
    """The `<prefix>/node` label's value: the node's name, or a hash where it is too long."""
    if len(node_name) <= LABEL_VALUE_MAX:
        return node_name
    return "h-" + hashlib.sha256(node_name.encode()).hexdigest()[:40]


def device_effect(effect: str) -> str:
    """A node taint's effect as a device taint's: PreferNoSchedule has no device form (NoSchedule)."""
    return "NoExecute" if effect == "NoExecute" else "NoSchedule"


def taint_of(rule: Mapping[str, Any]) -> dict[str, Any]:
    return dict((rule.get("spec") or {}).get("taint") or {})


def selected_device(rule: Mapping[str, Any]) -> dict[str, str]:
    sel = (rule.get("spec") or {}).get("deviceSelector") or {}
    return {k: str(sel.get(k) or "") for k in ("driver", "pool", "device")}


def node_owner(rule: Mapping[str, Any], node_name: str) -> dict[str, Any] | None:
    """The rule's ownerReference to Node *node_name*, if it has one."""
    for ref in (rule.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("apiVersion") == "v1" and ref.get("kind") == "Node" and ref.get("name") == node_name:
            return dict(ref)
    return None


def eviction_status(rule: Mapping[str, Any]) -> dict[str, Any] | None:
    """The rule's EvictionInProgress condition (written by kube-controller-manager's
    device-taint-eviction controller), or None when there is none yet."""
    for cond in (rule.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "EvictionInProgress":
            return dict(cond)
    return None


def tainted_nodes(
    rest: Any, prefix: str = DEFAULT_PREFIX, *, api: Callable[[], RuleApi | None] | None = None
) -> set[str]:
    """The nodes whose GPUs carry our DeviceTaintRules of an effect that keeps work off (their pools:
    the driver names a pool after its node), for the brake's count. *api*: the discovered API (asked
    of the server here when not given). Asked only when the brake is (a new taint), never per cycle;
    an API server without DeviceTaintRules counts none, one that does not answer counts none (logged).
    A rule of effect None (an early warning) holds nothing back and is not counted."""
    try:
        served = api() if api is not None else discover(rest)
        if served is None:
            return set()
        doc = KubeRest.of(rest).json(
            "GET", served.path, query={"labelSelector": f"{prefix}/node"}, timeout=TIMEOUT
        )
    except Exception as exc:
        if api_status(exc) != 404:
            log.warning("brake: could not count the nodes with device taints: %s", exc)
        return set()
    return {
        selected_device(i)["pool"] for i in doc.get("items") or () if taint_of(i).get("effect") != NONE_EFFECT
    } - {""}


def describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, Unavailable) else describe_error(exc)


def fallback_reason(exc: BaseException) -> DeviceTaintFallback:
    """Why a rule is not in place, for the metric."""
    if isinstance(exc, Unavailable):
        return DeviceTaintFallback.API_UNAVAILABLE
    code = api_status(exc)
    if code is None:
        return DeviceTaintFallback.RULE_UNANSWERED
    return DeviceTaintFallback.RULE_REFUSED if 400 <= code < 500 else DeviceTaintFallback.RULE_FAILED


__all__ = [
    "FIELD_MANAGER",
    "GROUP",
    "LABEL_VALUE_MAX",
    "NONE_EFFECT",
    "RESOURCE",
    "TIMEOUT",
    "VERSIONS",
    "RuleApi",
    "Unavailable",
    "Wanted",
    "describe",
    "device_effect",
    "discover",
    "eviction_status",
    "fallback_reason",
    "node_label",
    "node_owner",
    "selected_device",
    "taint_of",
    "tainted_nodes",
]

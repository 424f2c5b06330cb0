"""The DeviceTaintRules of this node's own GPUs (resource.k8s.io/v1alpha3, Kubernetes 1.34 with the
DRADeviceTaints gate): one rule per tainted GPU, selecting exactly that device in this node's pool.

Why it is built this way:
- A rule names one device by driver, pool and device (spec.deviceSelector): the scheduler skips the
  device for new claims (NoSchedule) and kube-controller-manager's device-taint-eviction controller
  deletes the pods whose allocated claims hold it (NoExecute). The driver's ResourceSlice is never
  written: its own taints (gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost) stand beside ours.
- Our rules carry the label `<prefix>/node=<node>` (a hash for names over 63 characters) and names
  that start with `<node>.`: the admission fence (manifests/30-admission-policy.yaml) lets this
  node's agent touch only rules of its own node's pool, and refuses no one else.
- The rules this writer holds are listed once at start (a restarted agent keeps them); after that it
  writes only when the wanted set differs from what it holds, and reads nothing per cycle.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.device_scope import DRIVER, Device, rule_name
from agent.core.node_keys import DEFAULT_PREFIX
from agent.reporters.kube_rest import MERGE_PATCH, KubeRest, api_status

log = logging.getLogger(__name__)

RULES = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"
TIMEOUT = (5, 15)
LABEL_VALUE_MAX = 63


@dataclass(frozen=True)
class Wanted:
    """One device taint: the device, and the taint's value (severity) and effect."""

    device: Device
    value: str
    effect: str  # NoSchedule | NoExecute (PreferNoSchedule is not a device taint effect)


def node_label(node_name: str) -> str:
    """The `<prefix>/node` label's value: the node's name, or a hash where it is too long."""
    if len(node_name) <= LABEL_VALUE_MAX:
        return node_name
    return "h-" + hashlib.sha256(node_name.encode()).hexdigest()[:40]


def device_effect(effect: str) -> str:
    """A node taint's effect as a device taint's: PreferNoSchedule has no device form (NoSchedule)."""
    return "NoExecute" if effect == "NoExecute" else "NoSchedule"


def tainted_nodes(rest: Any, prefix: str = DEFAULT_PREFIX) -> set[str]:
    """The nodes whose GPUs carry our DeviceTaintRules (their pools: the driver names a pool after
    its node), for the brake's count. Asked only when the brake is (a new taint), never per cycle;
    an API server without DeviceTaintRules, or one that does not answer, counts none (logged)."""
    try:
        doc = KubeRest.of(rest).json("GET", RULES, query={"labelSelector": f"{prefix}/node"}, timeout=TIMEOUT)
    except Exception as exc:
        if api_status(exc) != 404:
            log.warning("brake: could not count the nodes with device taints: %s", exc)
        return set()
    return {
        str(((i.get("spec") or {}).get("deviceSelector") or {}).get("pool") or "")
        for i in doc.get("items") or ()
    } - {""}


class DeviceTaints:
    """Keeps this node's DeviceTaintRules equal to a wanted set; never raises for API trouble."""

    def __init__(
        self,
        rest: Any,
        node_name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        dry_run: bool = False,
        on_write: Callable[[str, str], None] | None = None,
    ) -> None:
        self.rest = KubeRest.of(rest)
        self.node_name = node_name
        self.prefix = prefix
        self.dry_run = dry_run
        self._on_write = on_write
        self.held: dict[str, dict[str, Any]] | None = None  # rule name → the rule (None: not listed)
        self.writes = 0
        self.reads = 0

    @property
    def label(self) -> str:
        return f"{self.prefix}/node"

    @property
    def taint_key(self) -> str:
        return f"{self.prefix}/unhealthy"

    def _note(self, outcome: str) -> None:
        if self._on_write is not None:
            try:
                self._on_write("devicetaintrule", outcome)
            except Exception:  # a metrics hook must not break writing
                log.exception("on_write hook failed")

    def load(self) -> dict[str, dict[str, Any]]:
        """The rules of this node (one LIST, at start or after an error). Raises on API trouble
        (a server without v1alpha3 DeviceTaintRules: 404, this node holds none)."""
        try:
            doc = self.rest.json(
                "GET",
                RULES,
                query={"labelSelector": f"{self.label}={node_label(self.node_name)}"},
                timeout=TIMEOUT,
            )
        except Exception as exc:
            if api_status(exc) != 404:
                raise
            doc = {}
        self.reads += 1
        self.held = {str(i["metadata"]["name"]): i for i in doc.get("items") or ()}
        return self.held

    def held_devices(self) -> list[str]:
        """The devices (names) our rules select now."""
        return sorted(
            str(((r.get("spec") or {}).get("deviceSelector") or {}).get("device") or "")
            for r in (self.held or {}).values()
        )

    def body(self, want: Wanted) -> dict[str, Any]:
        d = want.device
        return {
            "apiVersion": "resource.k8s.io/v1alpha3",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": rule_name(self.node_name, d, self.prefix),
                "labels": {self.label: node_label(self.node_name), f"{self.prefix}/device": d.name},
            },
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": d.pool, "device": d.name},
                "taint": {"key": self.taint_key, "value": want.value, "effect": device_effect(want.effect)},
            },
        }

    def sync(self, wanted: Mapping[str, Wanted]) -> int:
        """Make our rules equal *wanted* (rule name → Wanted). Returns the writes; raises on API trouble
        (what was written stays held, the caller applies again)."""
        if self.held is None:
            self.load()
        assert self.held is not None
        writes = 0
        for name, want in sorted(wanted.items()):
            body = self.body(want)
            have = self.held.get(name)
            taint = body["spec"]["taint"]
            if have is not None:
                t = (have.get("spec") or {}).get("taint") or {}
                if (t.get("value"), t.get("effect")) == (taint["value"], taint["effect"]):
                    continue
            writes += self._write(name, body, have)
        for name in sorted(set(self.held) - set(wanted)):
            writes += self._delete(name)
        return writes

    def _write(self, name: str, body: dict[str, Any], have: dict[str, Any] | None) -> int:
        query = {"fieldManager": "gpu-healthcheck", **({"dryRun": "All"} if self.dry_run else {})}
        try:
            if have is None:
                got = self.rest.json("POST", RULES, query=query, body=body, timeout=TIMEOUT)
            else:
                patch = {"spec": {"taint": body["spec"]["taint"]}}
                got = self.rest.json(
                    "PATCH",
                    f"{RULES}/{name}",
                    query=query,
                    body=patch,
                    content_type=MERGE_PATCH,
                    timeout=TIMEOUT,
                )
        except Exception as exc:
            if have is None and api_status(exc) == 409:  # ours from before, not listed: take it over
                self.load()
                return 0
            self._note(f"error-{api_status(exc) or 'unreachable'}")
            raise
        self._note("ok")
        self.writes += 1
        if not self.dry_run:
            assert self.held is not None
            self.held[name] = got
        taint = body["spec"]["taint"]
        log.warning(
            "node %s: device %s tainted %s=%s:%s (DeviceTaintRule %s)",
            self.node_name,
            body["spec"]["deviceSelector"]["device"],
            taint["key"],
            taint["value"],
            taint["effect"],
            name,
        )
        return 1

    def _delete(self, name: str) -> int:
        query = {"dryRun": "All"} if self.dry_run else {}
        try:
            self.rest.json("DELETE", f"{RULES}/{name}", query=query, timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) != 404:
                self._note(f"error-{api_status(exc) or 'unreachable'}")
                raise
        self._note("ok")
        self.writes += 1
        assert self.held is not None
        if not self.dry_run:
            self.held.pop(name, None)
        log.info("node %s: DeviceTaintRule %s removed", self.node_name, name)
        return 1


__all__ = ["RULES", "DeviceTaints", "Wanted", "device_effect", "node_label", "tainted_nodes"]

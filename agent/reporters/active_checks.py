"""Active checks against the API server (core/active_checks.py says why; probes/dcgm/window.py runs them).

- FleetSlots: the fleet-wide bound. A `slot` record per node while its diag runs: a Lease in the
  agent's namespace, in the style of the repair budget's records (label `<prefix>/record=slot`, the
  node in the annotation `<prefix>/node`, holderIdentity the node, no `<prefix>/by`), named after the
  node (`<prefix>-slot-<hash>`: one per node; a restarted agent finds its own and replaces it), owned
  by the Node (the garbage collector removes the slot of a deleted Node). A node writes its record
  first, then lists the slots from the watch cache not older than its own and counts the live ones
  written before it (resourceVersion order): at the bound, it deletes its own and waits. Racing
  nodes agree without a lock, as the repair budget's marks do. A slot lives no longer than a diag
  can (expire_s): one left by an agent that died is not counted after that. The admission policy
  `gpu-healthcheck-own-slots` holds a fenced identity to its own node's slot.
- PodArrivals: pods bound to this node since the diag started that ask for an NVIDIA GPU (a device
  plugin or MIG resource, or a DRA claim), from the API server, with the kubelet's PodResources
  view (a pod holding an NVIDIA device): why to abort.
- NodeHold: the testing taint, wished through the shared state and written by the engine's Node
  writer like our other taints; held() reads the watched Node.
Nothing here runs in steady state: only while a diag is due and the GPUs are idle.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent.core.active_checks import (
    Abort,
    ActivePolicy,
    ActiveState,
    slots_before,
)
from agent.core.metric_labels import ActiveCheckAbort
from agent.core.node_keys import MODE_TAINT, Keys
from agent.core.record_kind import RecordKind
from agent.core.repair_budget import Record
from agent.core.workloads import NVIDIA_RESOURCE
from agent.reporters.gpu_total import GpuFleet
from agent.reporters.kube_rest import KubeRest, api_status, describe_error
from agent.reporters.lease_records import LeaseRecords, parse

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agent.config import Config

SLOT_SLACK_S = 180.0  # a slot outlives diagTimeout by the watchdog's margin, the taint's wait and this
API_POLL_S = 2.0  # the API server is asked at most this often for pods arriving during a diag


def slot_name(prefix: str, node: str) -> str:
    return f"{prefix}-slot-{hashlib.sha256(node.encode()).hexdigest()[:20]}"


def slot_record(item: Mapping[str, Any], prefix: str) -> Record | None:
    """A listed (or created) Lease as a slot Record (core slots_before counts them); None when it is
    not one."""
    lease = parse(item, prefix)
    if lease.kind != RecordKind.SLOT:
        return None
    return Record(lease.name, RecordKind.SLOT, lease.node, at=lease.at, rv=lease.rv)


class FleetSlots:
    """One node's slot (see the module docstring)."""

    def __init__(
        self,
        core: Any,
        node_name: str,
        *,
        namespace: str,
        brake: GpuFleet,
        cfg: Config,
        node_uid: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rest = KubeRest.of(core)
        self.node_name, self.namespace, self.prefix = node_name, namespace, cfg.prefix  # restart-only
        self.brake = brake  # the GPU-node total (and the tests' scope)
        self.cfg, self.node_uid = cfg, node_uid  # node.activeChecks and dcgm.diagTimeout are read from cfg
        self._clock = clock
        self.name = slot_name(self.prefix, node_name)
        self.records = LeaseRecords(self.rest, namespace, self.prefix)

    def policy(self) -> ActivePolicy:  # node.activeChecks
        return self.cfg.node.active_checks

    def expire_s(self) -> float:
        """How long a slot counts: dcgm.diagTimeout and a slack (one left by a dead agent stops counting)."""
        return self.cfg.dcgm.diag_timeout + SLOT_SLACK_S

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): the next count is made by the new policy."""
        self.cfg = new

    def acquire(self) -> str | None:
        """None: this node holds a slot now; else why not. Never raises: a count that cannot be
        made holds the diag back (it never runs on a guess)."""
        try:
            own = self._create()
        except Exception as exc:
            return f"the fleet's active-check slots could not be taken ({describe_error(exc)})"
        try:
            total = self.brake.gpu_node_total()
            policy = self.policy()
            limit = policy.limit(total)
            before = slots_before(self._list(str(own.rv)), own, self._clock(), self.expire_s())
        except Exception as exc:
            self.release()
            return f"the fleet's active-check slots could not be counted ({describe_error(exc)})"
        if len(before) >= limit:
            self.release()
            log.debug("node %s: no fleet slot: %s hold them", self.node_name, [r.node for r in before])
            return (
                f"waiting for a fleet slot: {limit} of {total} GPU node(s) may run one at once "
                f"(node.activeChecks.maxConcurrent {policy.max_concurrent})"
            )
        return None

    def release(self) -> None:
        try:
            self.records.delete(self.name)
        except Exception as exc:
            log.warning("node %s: giving back the fleet slot failed: %s", self.node_name, describe_error(exc))

    def _create(self) -> Record:
        """Write this node's slot record; one already there (this node's, from a run that never gave
        it back) is replaced, so the new one takes its turn by its own resourceVersion."""
        for attempt in (1, 2):
            try:
                uid = self.node_uid()
                doc = self.records.create(
                    RecordKind.SLOT, self.node_name, name=self.name, holder=self.node_name,
                    owner={"metadata": {"name": self.node_name, "uid": uid}} if uid else None,
                    duration_s=max(1, int(self.expire_s())),
                )  # fmt: skip
            except Exception as exc:
                if api_status(exc) != 409 or attempt == 2:
                    raise
                self.release()
                continue
            rec = slot_record(doc, self.prefix)
            if rec is None:
                raise ValueError(f"the API server answered a slot create with {str(doc)[:200]}")
            return rec
        raise AssertionError("unreachable")

    def _list(self, min_rv: str) -> list[Record]:
        items, _ = self.records.list((RecordKind.SLOT,), min_rv=min_rv)
        return [r for r in (slot_record(i, self.prefix) for i in items) if r is not None]


def wants_gpu(pod: Mapping[str, Any]) -> str | None:
    """What an NVIDIA GPU a pod asks for (a device-plugin or MIG resource, or a DRA claim), None
    when it asks for none or has finished."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        res = c.get("resources") or {}
        for name in {**(res.get("limits") or {}), **(res.get("requests") or {})}:
            if NVIDIA_RESOURCE.match(str(name)):
                return str(name)
    if spec.get("resourceClaims"):
        return "a DRA resource claim"
    return None


class PodArrivals:
    """Pods that came for the GPUs while a diag runs (see the module docstring)."""

    def __init__(
        self,
        core: Any | None,
        node_name: str,
        kubelet_pods: Callable[[], list[str]] | None,
        *,
        api_poll_s: float = API_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rest = KubeRest.of(core) if core is not None else None
        self.node_name, self.kubelet_pods = node_name, kubelet_pods
        self.api_poll_s, self._clock = api_poll_s, clock
        self._before: set[str] = set()
        self._asked = 0.0

    def _pods(self) -> list[Mapping[str, Any]]:
        assert self.rest is not None
        query = {"fieldSelector": f"spec.nodeName={self.node_name}", "resourceVersion": "0"}
        doc = self.rest.json("GET", "/api/v1/pods", query=query, timeout=(5, 15))
        return list(doc.get("items") or ())

    def start(self) -> None:
        """The pods on the node when the diag starts (they hold no GPU: the node was idle)."""
        self._asked = self._clock()
        self._before = set()
        if self.rest is not None:
            try:
                self._before = {str((p.get("metadata") or {}).get("uid")) for p in self._pods()}
            except Exception as exc:  # then every GPU pod listed later counts as arrived
                log.warning("node %s: listing its pods failed: %s", self.node_name, describe_error(exc))

    def poll(self) -> Abort | None:
        if self.kubelet_pods is not None:
            try:
                holding = self.kubelet_pods()
            except Exception as exc:
                return Abort(
                    ActiveCheckAbort.KUBELET_UNREADABLE,
                    f"the kubelet cannot say which pods hold GPUs ({exc})",
                )
            if holding:
                return Abort(
                    ActiveCheckAbort.GPU_HELD,
                    f"pod {', '.join(holding[:3])} holds an NVIDIA device (kubelet)",
                )
        if self.rest is None or self._clock() - self._asked < self.api_poll_s:
            return None
        self._asked = self._clock()
        try:
            pods = self._pods()
        except Exception as exc:  # the kubelet's view still guards; the API is asked again
            log.info("node %s: listing its pods failed: %s", self.node_name, describe_error(exc))
            return None
        for p in pods:
            meta = p.get("metadata") or {}
            if str(meta.get("uid")) in self._before:
                continue
            what = wants_gpu(p)
            if what is not None:
                text = f"pod {meta.get('namespace')}/{meta.get('name')} arrived asking for {what}"
                return Abort(ActiveCheckAbort.POD_ARRIVED, text)
        return None


class NodeHold:
    """The testing taint: wished through *state* (the engine's Marks.testing, written by the Node
    writer), and on the Node as the writer's watch shows it. In modes observe and label no taint is
    put on, and the diag does not wait for one."""

    def __init__(
        self,
        state: ActiveState,
        *,
        cfg: Config,
        node: Callable[[], Mapping[str, Any] | None],
        poke: Callable[[], None],
    ) -> None:
        self.state, self.key, self.node, self.poke = state, Keys(cfg.prefix).testing, node, poke
        self.cfg = cfg  # node.mode is read from it

    def mode(self) -> str:  # node.mode
        return self.cfg.node.mode

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): node.mode from the next question."""
        self.cfg = new

    def hold(self, on: bool) -> None:
        self.state.hold(on)
        self.poke()

    def held(self) -> bool:
        if self.mode() != MODE_TAINT:
            return True
        return self._on_node()

    def lifted(self) -> bool:
        """The Node no longer shows the taint (or the mode puts none on)."""
        return self.mode() != MODE_TAINT or not self._on_node()

    def _on_node(self) -> bool:
        node = self.node() or {}
        return any(t.get("key") == self.key for t in (node.get("spec") or {}).get("taints") or ())


__all__ = ["FleetSlots", "NodeHold", "PodArrivals", "slot_name", "slot_record", "wants_gpu"]

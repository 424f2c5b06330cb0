"""Per-GPU isolation (node.isolation): a taint confined to GPUs goes on those DRA devices, not the Node.

The engine says whether the node is to be tainted (marks.taint, with the hysteresis of recoverAfter)
and where the failing findings lie (marks.scope, core/device_scope). This writer sits in front of
the Node writer and, for one taint episode (from the first taint until marks.taint turns false):
- collects the GPUs of every confined scope it sees and keeps a DeviceTaintRule on each, while the
  Node gets no taint (its other GPUs keep serving; the remediation conditions, which follow our node
  taint, stay healthy: one GPU is no reason to replace eight);
- turns node-wide for the rest of the episode once a node-wide scope is seen, or a GPU the driver
  does not publish in this node's ResourceSlices (it cannot be isolated alone), or our node taint
  is already on (a restarted agent): the node taint goes on as before, device rules stay too;
- when marks.taint turns false (recoverAfter passing cycles, or `gpu-healthcheck clear`), removes
  every rule it holds. `unknown` never changes marks.taint, so it never taints nor untaints.
The brake is asked before the first device taint of an episode, as for a node taint.

Never open: a rule the server did not accept (refused, failed, unanswered, or no version of the API
served) leaves the Node tainted in the same apply, and the apply says it failed, so it is retried on
the write policy's backoff. That node taint lifts by the usual hysteresis, or once the rules are in
place and the brake counts them (reporters/device_taint_rules.tainted_nodes: else the node would drop out
of the brake's count); a brake that does not count them keeps the episode node-wide. Where no version
is served at all, the episode posts one `DeviceTaintsUnavailable` Event and `auto` is `node` until
the next discovery (at start, after a 404 or a reload, or when the next episode begins).

Nothing left behind: every agent, whatever its isolation, lists this node's rules at its first apply
(ours: our label and an ownerReference to this Node) and removes those it no longer wants; a rule is
removed only once the failing GPU is covered otherwise (the Node taint on, or its rule in place), so
a rollback to `node` while the fault lasts taints the Node first.

Early warnings: a `warn` confined to GPUs (marks.warn_scope) shows on those devices as a rule of
effect None, where the server serves that effect; it moves no pod and the brake does not count it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agent.core.device_scope import ISOLATION_GPU, ISOLATION_NODE, devices_for, rule_name
from agent.core.marks import Marks, NodeEvent
from agent.core.metric_labels import DeviceTaintFallback
from agent.core.node_keys import WARNING, EventReason, Keys
from agent.reporters.device_taint_rules import (
    NONE_EFFECT,
    Wanted,
    describe,
    fallback_reason,
    selected_device,
    taint_of,
)
from agent.reporters.device_taints import DeviceTaints
from agent.reporters.device_warnings import warning_rules
from agent.reporters.history_entry import isolated_gpus
from agent.reporters.isolation_events import failed_again, isolated_events, returned_events
from agent.reporters.kube_rest import api_status
from agent.reporters.node_patch import find_our_taint, taint_disabled

if TYPE_CHECKING:
    from agent.config import Config

log = logging.getLogger(__name__)

SLICE_WAIT_S = 5.0  # the first apply waits this long for the slice watch's first list


class IsolatingWriter:
    """The Node writer with per-GPU isolation in front (see the module docstring)."""

    def __init__(
        self,
        writer: Any,
        slices: Any,
        taints: DeviceTaints,
        cfg: Config,
        *,
        brake: Any = None,
        metrics: Any = None,
    ) -> None:
        self.writer, self.slices, self.taints = writer, slices, taints
        self.cfg = cfg  # its settings are read from here, whether at start or after a reload
        self.brake = brake
        self.metrics = metrics  # reporters/metrics.Metrics, or None
        self.node_wide = False  # this episode is node-wide
        self.wanted: dict[str, Wanted] = {}  # rule name → device taint, this episode
        self.brake_open = False
        self.covering = ""  # why the node taint stands in for this episode's rules ("": it does not)
        self.unavailable_said = False  # this episode's DeviceTaintsUnavailable Event is posted
        self.rediscovered = False  # this episode asked discovery again (none was served)

    @property
    def isolation(self) -> str:
        """node.isolation: node | gpu | auto."""
        return self.cfg.node.isolation

    @property
    def node_at(self) -> int:
        """node.isolationNodeAtGpus: this episode's GPUs that make it node-wide (0: off)."""
        return self.cfg.node.isolation_node_at

    # -- the Writer protocol ---------------------------------------------------------------------------
    def start(self) -> None:
        """The Node writer's watch; the slices' watch starts with the first apply in mode gpu|auto
        (isolation `node` never reads ResourceSlices)."""
        self.writer.start()

    def stop(self) -> None:
        self.slices.stop()
        self.writer.stop()

    def read_results(self) -> dict[str, Any] | None:
        return self.writer.read_results()  # type: ignore[no-any-return]

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): node.isolation from the next apply, and the DeviceTaintRule
        version served is asked again then (the API server may have been upgraded meanwhile)."""
        self.cfg = new
        self.taints.forget()

    def apply(self, marks: Marks) -> Any:
        mode = self.isolation
        try:
            self._prepare(mode)
        except Exception as exc:  # which rules are ours is not known: the Node gets its marks as they are
            log.warning("node %s: device taints not read: %s", self.taints.node_name, describe(exc))
            result = self.writer.apply(marks)
            return replace(result, ok=False, error=f"device taints: {describe(exc)}")
        disabled = self._taint_disabled()
        events: list[NodeEvent] = []
        taint_rules = self._episode(marks, mode, disabled, events)
        warned = warning_rules(marks.warn_scope, mode, disabled, self.taints, self._devices, taint_rules)
        target = {**warned, **taint_rules}
        isolating = bool(taint_rules) and not self.node_wide  # the rules, not the Node, isolate
        had = self._taint_rules()
        failure: BaseException | None = None
        try:
            self.taints.upsert(target)
        except Exception as exc:
            failure = exc
            if isolating:
                self._cover(exc, events)
        else:
            if isolating and self.covering:
                self._uncover()
        isolated = isolating and not self.covering and not self.node_wide
        node_marks = marks
        if isolated:
            node_marks = replace(marks.degraded or marks, taint=False)
            events += isolated_events(taint_rules, set(taint_rules) - set(had), marks, self.taints.taint_key)
        events += self._shown_events(node_marks)
        held = () if self.node_wide else isolated_gpus(w.device for w in taint_rules.values())
        node_marks = replace(node_marks, isolated=held)  # the history's per-GPU risk (history_entry.py)
        if events:
            node_marks = replace(node_marks, events=(*node_marks.events, *events))
        result = self.writer.apply(node_marks)
        # A rule goes only once its GPU is covered otherwise: no fault, the Node taint on, the taint
        # disabled by hand, or this episode's rules in place.
        if not marks.taint or disabled or bool(getattr(result, "tainted", False)) or isolated:
            try:
                self.taints.prune(target)
            except Exception as exc:
                failure = failure or exc
            else:
                gone = {n: d for n, d in had.items() if n not in target}
                self._returned(gone, bool(getattr(result, "tainted", False)))
        if failure is not None:
            log.warning("node %s: device taints not written: %s", self.taints.node_name, describe(failure))
            return replace(result, ok=False, error=f"device taints: {describe(failure)}")
        if self.metrics is not None and getattr(result, "ok", False):
            self.metrics.record_isolated_gpus(len(taint_rules) if isolated else 0, node_marks.status)
        return replace(result, shown=node_marks.status) if hasattr(result, "shown") else result

    # -- the parts -------------------------------------------------------------------------------------
    def _prepare(self, mode: str) -> None:
        """At the first apply (and after a 404 or a reload): discovery and the list of our rules,
        whatever the isolation; the slices' watch in gpu|auto; this Node's uid for the owner."""
        if mode != ISOLATION_NODE:
            self.slices.start()  # one list + watch for the agent's life (a running one is kept)
        if not self.taints.node_uid:
            node = getattr(self.writer, "node", None)
            if node is None and hasattr(self.writer, "watch"):
                node = self.writer.watch.current(fresh=True)
            self.taints.node_uid = str(((node or {}).get("metadata") or {}).get("uid") or "")
        was = self.taints.discovered
        try:
            self.taints.ensure()
        except Exception as exc:
            if mode != ISOLATION_NODE or api_status(exc) not in (401, 403):
                raise
            # `node` needs the list only to remove rules left behind; RBAC without it (an install
            # older than per-GPU isolation) must not hold the Node's writes back.
            log.warning(
                "node %s: cannot list DeviceTaintRules (%s): rules an earlier agent left are not removed",
                self.taints.node_name,
                describe(exc),
            )
            self.taints.held = {}
        if not was and self.taints.discovered:
            self._note_api()

    def _note_api(self) -> None:
        if self.metrics is not None:
            api = self.taints.api
            self.metrics.record_device_taint_api(api.version if api is not None else "none")

    def _taint_disabled(self) -> bool:
        node = getattr(self.writer, "node", None)
        return node is not None and taint_disabled(node, self.taints.prefix)

    def _our_node_taint(self) -> bool:
        node = getattr(self.writer, "node", None)
        return node is not None and find_our_taint(node, self.taints.prefix) is not None

    def _episode(self, marks: Marks, mode: str, disabled: bool, events: list[NodeEvent]) -> dict[str, Wanted]:
        """The device taints this apply wants (rule name → Wanted), for the taint episode."""
        if not marks.taint or mode == ISOLATION_NODE or disabled:
            self.node_wide, self.wanted, self.brake_open, self.covering = False, {}, False, ""
            self.unavailable_said = self.rediscovered = False
            return {}
        if not self.wanted and not self.node_wide and self._our_node_taint():
            self.node_wide = True  # the taint of this episode is on the Node already
        if self.taints.held and not self.wanted:  # a restarted agent: keep the rules it finds
            self.wanted = self._kept(marks)
        scope = marks.scope
        if not self.node_wide and scope is not None:
            if scope.node_wide:
                self._go_node_wide(scope.why)
            else:
                self._add(marks, scope.gpus, mode, events)
        return self._restamped(marks)

    def _taint_rules(self) -> dict[str, str]:
        """The rules of ours on the server that take a GPU out (not the warnings, effect None): name →
        the device it selects."""
        held = self.taints.held or {}
        return {
            n: selected_device(r)["device"]
            for n, r in held.items()
            if taint_of(r).get("effect") != NONE_EFFECT
        }

    def _shown_events(self, node_marks: Marks) -> list[NodeEvent]:
        node = getattr(self.writer, "node", None) or {}
        why = self.covering or ("the fault is node-wide" if self.node_wide else "the GPUs are not isolated")
        return failed_again(node, Keys(self.taints.prefix).status, node_marks, why)

    def _returned(self, gone: Mapping[str, str], tainted: bool) -> None:
        """GPUReturned for each rule of ours removed while the node is not tainted (a GPU the node
        taint covers instead has not returned): posted now, the Node write being done."""
        if not gone or tainted:
            return
        events = returned_events(gone)
        for ev in events:
            log.warning("node %s: %s", self.taints.node_name, ev.message)
        poster = getattr(self.writer, "poster", None)
        if poster is not None:
            poster.post(events, getattr(self.writer, "node", None) or {}, dry_run=self.taints.dry_run)

    def _go_node_wide(self, why: str) -> None:
        self.node_wide = True
        log.warning("node %s: the fault is node-wide (%s): tainting the node", self.taints.node_name, why)

    def _devices(self, gpus: tuple[str, ...]) -> Any:
        self.slices.wait_synced(SLICE_WAIT_S)
        return devices_for(gpus, self.slices.devices() or [], {})

    def _add(self, marks: Marks, gpus: tuple[str, ...], mode: str, events: list[NodeEvent]) -> None:
        devices = self._devices(gpus)
        if devices is None:
            loud = log.warning if mode == ISOLATION_GPU else log.info
            loud(
                "node %s: GPU(s) %s not found in this node's %s ResourceSlices: tainting the node",
                self.taints.node_name,
                ", ".join(gpus),
                "gpu.nvidia.com",
            )
            self.node_wide = True
            return
        if self.taints.api is None and not self.rediscovered:
            self.rediscovered = True  # a new episode asks once more (an API turned on meanwhile)
            try:
                self.taints.discover()
                self._note_api()
            except Exception as exc:
                log.warning("node %s: DeviceTaintRule discovery: %s", self.taints.node_name, describe(exc))
        if self.taints.api is None:
            self._unavailable(gpus, events)
            self.node_wide = True
            return
        new = {rule_name(self.taints.node_name, d, self.taints.prefix): d for d in devices}
        if not self.wanted and set(new) - set(self.wanted) and self.brake is not None:
            ok, reason = self.brake.allows_new_taint(self.taints.node_name)
            self.brake_open = not ok
            if not ok:
                log.warning("node %s: brake open, no device taint: %s", self.taints.node_name, reason)
                return
        for name, d in new.items():
            self.wanted[name] = Wanted(d, marks.taint_value, marks.device_effect)
        if self.node_at and len(self.wanted) >= self.node_at:
            self._go_node_wide(f"{len(self.wanted)} GPUs isolated (node.isolationNodeAtGpus: {self.node_at})")

    def _unavailable(self, gpus: tuple[str, ...], events: list[NodeEvent]) -> None:
        """No DeviceTaintRule version served: the node taint, one Event this episode, the metric."""
        if self.unavailable_said:
            return
        self.unavailable_said = True
        message = (
            f"GPU(s) {', '.join(gpus)} could be isolated alone, but the API server serves no "
            "DeviceTaintRules (resource.k8s.io v1, v1beta2 or v1alpha3): the Node is tainted instead. "
            "Kubernetes 1.37 serves them; 1.36 with the feature gate DRADeviceTaintRules and "
            '--runtime-config=resource.k8s.io/v1beta2=true (docs/clusters/dra-only.md "Per-GPU isolation")'
        )
        log.warning("node %s: %s", self.taints.node_name, message)
        events.append(NodeEvent(EventReason.DEVICE_TAINTS_UNAVAILABLE, message, WARNING))
        if self.metrics is not None:
            self.metrics.record_device_taint_fallback(DeviceTaintFallback.API_UNAVAILABLE)

    def _cover(self, exc: BaseException, events: list[NodeEvent]) -> None:
        """A rule the server did not accept: the Node taint stands in for it, from this apply on."""
        reason = fallback_reason(exc)
        if reason is DeviceTaintFallback.API_UNAVAILABLE:
            self._unavailable(tuple(w.device.name for w in self.wanted.values()), events)
        if not self.covering:
            log.warning(
                "node %s: the DeviceTaintRule(s) of %s are not in place (%s: %s): tainting the node "
                "until they are",
                self.taints.node_name,
                ", ".join(sorted(w.device.name for w in self.wanted.values())),
                reason,
                describe(exc),
            )
            if self.metrics is not None and reason is not DeviceTaintFallback.API_UNAVAILABLE:
                self.metrics.record_device_taint_fallback(reason)
        self.covering = reason

    def _uncover(self) -> None:
        """The rules are in place: the node taint lifts, but only where the brake counts them."""
        if self._brake_counts():
            log.warning(
                "node %s: the DeviceTaintRule(s) are in place and the brake counts them: the node "
                "taint lifts",
                self.taints.node_name,
            )
            self.covering = ""
            return
        log.warning(
            "node %s: the DeviceTaintRule(s) are in place but the brake does not count them: the node "
            "taint stays for this episode",
            self.taints.node_name,
        )
        if self.metrics is not None:
            self.metrics.record_device_taint_fallback(DeviceTaintFallback.RULE_NOT_COUNTED)
        self.covering = ""
        self.node_wide = True

    def _brake_counts(self) -> bool:
        if self.brake is None:
            return True  # no brake to count anything (no API server for it)
        count = getattr(self.brake, "also_tainted", None)
        if count is None:
            return False
        try:
            return self.taints.node_name in count()
        except Exception as exc:
            log.warning("node %s: the brake's count failed: %s", self.taints.node_name, describe(exc))
            return False

    def _kept(self, marks: Marks) -> dict[str, Wanted]:
        """The taint rules a previous agent left (not its warnings, not an earlier Node's)."""
        devices = {d.name: d for d in self.slices.devices() or []}
        out = {}
        for name, rule in (self.taints.held or {}).items():
            if self.taints.stale(name) or taint_of(rule).get("effect") == NONE_EFFECT:
                continue
            sel = ((rule.get("spec") or {}).get("deviceSelector")) or {}
            d = devices.get(str(sel.get("device") or ""))
            if d is not None:
                out[name] = Wanted(d, marks.taint_value, marks.device_effect)
        return out

    def _restamped(self, marks: Marks) -> dict[str, Wanted]:
        """The episode's rules with the taint's current value and effect (a worse severity moves them)."""
        effect = marks.device_effect
        self.wanted = {n: Wanted(w.device, marks.taint_value, effect) for n, w in self.wanted.items()}
        return dict(self.wanted)


__all__ = ["IsolatingWriter"]

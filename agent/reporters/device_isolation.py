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
Isolation `node`, or `auto` on a node without the driver's slices: Marks pass through unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agent.core.device_scope import ISOLATION_GPU, ISOLATION_NODE, devices_for, rule_name
from agent.core.marks import Marks
from agent.reporters.device_taints import DeviceTaints, Wanted
from agent.reporters.kube_rest import describe_error
from agent.reporters.node_patch import find_our_taint
from agent.reporters.resource_slices import SliceWatch

log = logging.getLogger(__name__)

SLICE_WAIT_S = 5.0  # the first apply waits this long for the slice watch's first list


class IsolatingWriter:
    """The Node writer with per-GPU isolation in front (see the module docstring)."""

    def __init__(
        self,
        writer: Any,
        slices: SliceWatch,
        taints: DeviceTaints,
        isolation: Callable[[], str],
        *,
        brake: Any = None,
    ) -> None:
        self.writer, self.slices, self.taints, self.isolation = writer, slices, taints, isolation
        self.brake = brake
        self.node_wide = False  # this episode is node-wide
        self.wanted: dict[str, Wanted] = {}  # rule name → device taint, this episode
        self.brake_open = False

    # -- the Writer protocol ---------------------------------------------------------------------------
    def start(self) -> None:
        """The Node writer's watch; the slices' watch starts with the first apply in mode gpu|auto
        (isolation `node` never reads ResourceSlices nor DeviceTaintRules)."""
        self.writer.start()

    def stop(self) -> None:
        self.slices.stop()
        self.writer.stop()

    def read_results(self) -> dict[str, Any] | None:
        return self.writer.read_results()  # type: ignore[no-any-return]

    def apply(self, marks: Marks) -> Any:
        try:
            node_marks = self._isolate(marks)
        except Exception as exc:  # API trouble: the Node still gets its marks, the rules next apply
            log.warning("node %s: device taints not written: %s", self.taints.node_name, describe_error(exc))
            result = self.writer.apply(self._node_marks(marks))
            return replace(result, ok=False, error=f"device taints: {describe_error(exc)}")
        return self.writer.apply(node_marks)

    def _node_marks(self, marks: Marks) -> Marks:
        """What the Node shows: the node taint unless this episode isolates GPUs alone."""
        isolated = marks.taint and self.wanted and not self.node_wide and self.isolation() != ISOLATION_NODE
        return replace(marks, taint=False) if isolated else marks

    # -- the episode -----------------------------------------------------------------------------------
    def _our_node_taint(self) -> bool:
        node = getattr(self.writer, "node", None)
        return node is not None and find_our_taint(node, self.taints.prefix) is not None

    def _isolate(self, marks: Marks) -> Marks:
        mode = self.isolation()
        if mode != ISOLATION_NODE:
            self.slices.start()  # one list + watch for the agent's life (a running one is kept)
        if self.taints.held is None and mode != ISOLATION_NODE:
            self.taints.load()  # once: the rules a previous agent left are ours to keep or remove
            self.wanted = {}
        if not marks.taint or mode == ISOLATION_NODE:
            self.node_wide, self.wanted, self.brake_open = False, {}, False
            if self.taints.held:
                self.taints.sync({})
            return marks
        if not self.wanted and not self.node_wide and self._our_node_taint():
            self.node_wide = True  # the taint of this episode is on the Node already
        if self.taints.held and not self.wanted:  # a restarted agent: keep the rules it finds
            self.wanted = self._kept(marks)
        scope = marks.scope
        if not self.node_wide and scope is not None:
            if scope.node_wide:
                self._go_node_wide(scope.why)
            else:
                self._add(marks, scope.gpus, mode)
        if not self.node_wide and not self.wanted:
            return marks  # nothing isolated (e.g. the brake refused it): the node writer decides
        self.taints.sync(self._restamped(marks))
        return self._node_marks(marks)

    def _go_node_wide(self, why: str) -> None:
        self.node_wide = True
        log.warning("node %s: the fault is node-wide (%s): tainting the node", self.taints.node_name, why)

    def _add(self, marks: Marks, gpus: tuple[str, ...], mode: str) -> None:
        self.slices.wait_synced(SLICE_WAIT_S)
        devices = devices_for(gpus, self.slices.devices() or [], {})
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
        new = {rule_name(self.taints.node_name, d, self.taints.prefix): d for d in devices}
        if not self.wanted and set(new) - set(self.wanted) and self.brake is not None:
            ok, reason = self.brake.allows_new_taint(self.taints.node_name)
            self.brake_open = not ok
            if not ok:
                log.warning("node %s: brake open, no device taint: %s", self.taints.node_name, reason)
                return
        for name, d in new.items():
            self.wanted[name] = Wanted(d, marks.taint_value, marks.taint_effect)

    def _kept(self, marks: Marks) -> dict[str, Wanted]:
        devices = {d.name: d for d in self.slices.devices() or []}
        out = {}
        for name in self.taints.held or {}:
            sel = ((self.taints.held or {})[name].get("spec") or {}).get("deviceSelector") or {}
            d = devices.get(str(sel.get("device") or ""))
            if d is not None:
                out[name] = Wanted(d, marks.taint_value, marks.taint_effect)
        return out

    def _restamped(self, marks: Marks) -> dict[str, Wanted]:
        """The episode's rules with the taint's current value and effect (a worse severity moves them)."""
        self.wanted = {
            n: Wanted(w.device, marks.taint_value, marks.taint_effect) for n, w in self.wanted.items()
        }
        return self.wanted


__all__ = ["IsolatingWriter"]

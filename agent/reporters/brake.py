"""The cluster-wide brake (DESIGN.md §6.1): stop adding taints when too many GPU nodes are already tainted.

A bad driver push or a false positive must not taint a whole GPU fleet: the brake bounds the blast
radius by a fraction of the GPU nodes and, optionally, an absolute count. It is asked only when a
node is about to *gain* our taint, never to keep or remove one. At most

    cap = ceil(max_fraction * total), and at most max_nodes when max_nodes > 0   (brake_rule.brake_cap)

nodes hold our taint at once: `max_fraction >= 1` (with no max_nodes) turns the brake off, `<= 0`
forbids every new taint.

Exact without counting the fleet: a node takes our taint only while it holds one of `cap` numbered
slots (brake_slots.py: a Lease whose creation is atomic), claims it on its Node (the
`<prefix>/brake-slot` label, in the PATCH that adds the taint) and frees it only after its taint is
off. It looks for one with a few creates (`probes`), never a list of the tainted nodes. What counts
is nodes, not slots (core/brake_count.py): a node tainted without a slot (an older version, by
hand) counts, and a slot its holder does not claim (one stolen token's extra slots) counts for
nothing; those two states are settled by a count of nodes (brake_audit.py). A create whose answer
is lost is "could not count", never a free slot. The total is the agent DaemonSets' desired count
(gpu_total.py), else the GPU nodes listed by name; read when first needed and again when older than
`total_cache_seconds`. A refusal is cached for `cache_seconds`, an "allowed" never. Outside its
install (no namespace for the slots) it counts the tainted Nodes instead, which racing agents can
pass. What each rule fixed: bench/README.md ("The brake").
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.core.brake_count import GRACE_S
from agent.core.node_keys import Keys
from agent.reporters.brake_audit import AUDIT_PERIOD_S, Audit, Count
from agent.reporters.brake_rule import brake_cap
from agent.reporters.brake_slots import Slots
from agent.reporters.gpu_total import DEFAULT_SERVICE_ACCOUNT, GpuNodes
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, api_message, api_status, describe_error
from agent.reporters.node_names import METADATA_LIST_ACCEPT as METADATA_LIST_ACCEPT
from agent.reporters.node_names import names_in_list as names_in_list

if TYPE_CHECKING:
    from agent.config import Config

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "gpu-healthcheck"  # where the slots live: the agents' own namespace
REAP_PERIOD_S = 300.0  # a refused node checks the holders of the slots it tried at most this often


@dataclass(frozen=True)
class BrakeState:
    """The last answer, for metrics and logs."""

    open: bool  # True = refusing new taints
    cap: int  # the most nodes it lets hold our taint at once
    total: int  # GPU nodes
    reason: str
    at: float  # time.monotonic() of the answer


class Brake:
    """Slots for our taint, cluster-wide (or within *scope*); one per agent, or shared by the
    writers of a tool or a test (it keeps the slots of each node apart)."""

    def __init__(
        self,
        core: KubeRest,
        *,
        cfg: Config,
        node_name: str | None = None,
        scope: str = "",
        on_count: Callable[[int, bool], None] | None = None,
        cache_seconds: float = 10,
        clock: Callable[[], float] = time.monotonic,
        total_cache_seconds: float = 300,
        namespace: str = DEFAULT_NAMESPACE,
        service_account: str = DEFAULT_SERVICE_ACCOUNT,
        probes: int = 3,
        also_tainted: Callable[[], set[str]] | None = None,
        on_audit: Callable[[Count], None] | None = None,
        slot_grace_s: float = GRACE_S,
        audit_period_s: float = AUDIT_PERIOD_S,
    ) -> None:
        self._rest = KubeRest.of(core)  # also takes a CoreV1Api or an ApiClient (tools, bench/fleet.py)
        self.node_name = node_name  # this agent's Node
        # A label selector ANDed into every list, and a brake of its own (slots apart): one pool of
        # Nodes (tests use it to keep apart the Nodes of other tests on one API server). Empty: the
        # cluster, its total from the agent DaemonSets.
        self.scope = scope
        self.gpus = GpuNodes(self._rest, cfg.gpu_node_selection, scope=scope, node_name=node_name,
                             namespace=namespace, service_account=service_account, clock=clock,
                             cache_seconds=total_cache_seconds, on_count=on_count)  # fmt: skip
        self.cfg = cfg  # the limits are read from it, never copied; the selection is the GPU nodes'
        self.prefix = prefix = cfg.prefix  # restart-only (config/schema.py RESTART_ONLY)
        self.cache_seconds = cache_seconds
        self.namespace = namespace
        self.service_account = service_account
        self.probes = probes
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BrakeState | None = None
        self._refused: dict[str, BrakeState] = {}  # node -> its cached refusal
        self._slots = Slots(self._rest, namespace, prefix, scope)
        self._audit = Audit(
            self._slots, self.gpus.selected, period_s=audit_period_s, grace_s=slot_grace_s, on_count=on_audit
        )
        self._held: dict[str, str] = {}  # node -> the name of the slot it holds
        self._looked: set[str] = set()  # nodes whose slots were looked for since the last doubt
        self._outside = False  # no namespace for the slots: tainted Nodes are counted instead
        self._reaped_at = float("-inf")  # when held slots were last checked for a Node that is gone
        # who the brake counts besides Nodes carrying our taint: a node whose GPUs are isolated by
        # DeviceTaintRules instead (reporters/device_isolation.py lifts its node taint only when
        # this names it). With slots: the nodes holding one, which a failing node keeps.
        self.also_tainted: Callable[[], set[str]] = also_tainted or self.holders

    @property
    def state(self) -> BrakeState | None:
        """The last answer (None before the first one)."""
        return self._state

    @property
    def off(self) -> bool:
        """No limit: a fraction of 1 or more and no absolute cap. No slot is taken then."""
        return self.max_fraction >= 1 and self.max_nodes <= 0

    # -- the total (gpu_total.GpuNodes) ---------------------------------------------------------------
    def total(self, node: Mapping[str, Any] | None = None) -> int:
        return self.gpus.total(node)

    def gpu_node_total(self) -> int:
        """The GPU nodes as last counted (read now when never read): the repair budget's total."""
        return self.gpus.total()

    def count_selected(self, extra: str) -> int:
        return len(self.gpus.selected(extra))

    def names(self, label_selector: str, *, min_rv: str | None = None) -> list[str]:
        return self.gpus.names(label_selector, min_rv=min_rv)

    def list_doc(self, label_selector: str, *, min_rv: str | None = None) -> dict[str, Any]:
        return self.gpus.list_doc(label_selector, min_rv=min_rv)

    @property
    def selectors(self) -> tuple[str, ...]:
        return self.gpus.selectors

    @property
    def max_fraction(self) -> float:  # node.maxTaintedFraction
        return self.cfg.node.max_tainted_fraction

    @property
    def max_nodes(self) -> int:  # node.maxTaintedNodes
        return self.cfg.node.max_tainted_nodes

    @property
    def min_severity(self) -> str:  # node.taintMinSeverity (reporters/taint_gate asks)
        return self.cfg.node.taint_min_severity.label

    @property
    def selection_problem(self) -> str | None:
        return self.gpus.selection_problem

    # -- the slots ----------------------------------------------------------------------------------
    def cap(self, node: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """(the most nodes that may hold our taint at once, the total it was taken of)."""
        total = self.total(node)
        return brake_cap(total, self.max_fraction, self.max_nodes), total

    def holds(self, node_name: str) -> bool:
        """Does *node_name* hold a slot (as far as this brake knows)?"""
        return node_name in self._held

    def _look(self, node_name: str, cap: int, *, consistent: bool = False) -> None:
        """Find the slots *node_name* holds already (a restarted agent; a create whose answer was
        lost): keep the lowest below the cap, free the others."""
        names = self._slots.held_by(node_name, consistent=consistent)
        keep = next((n for n in names if self._slots.index(n) < cap or self._slots.is_overflow(n)), None)
        for extra in names:
            if extra != keep:
                self._slots.free(extra)
        if keep is not None:
            self._held[node_name] = keep
        self._looked.add(node_name)

    def _take(
        self, node_name: str, cap: int, node: Mapping[str, Any] | None, *, adopting: bool = False
    ) -> str | None:
        """Try up to `probes` free numbers below *cap*; the slot taken, or None when all were held.
        Owned by its Node (read when the asker did not pass it), so that a deleted Node frees it.
        Nodes no number shows, or a number held by a slot that counts for nothing: a count of
        nodes decides instead (brake_audit.py). *adopting*: the node carries our taint already (it
        counts either way): a free number is its own, and no count is made for it."""
        if node is None:
            node = self._rest.json("GET", f"/api/v1/nodes/{node_name}", timeout=REQUEST_TIMEOUT)
        held = []
        for i in random.sample(range(cap), min(self.probes, cap)):
            try:
                if self._slots.take(i, node_name, node):
                    if adopting:
                        return self._keep(node_name, self._slots.name(i))
                    return self._keep(node_name, self._settle_number(node_name, i, cap, node))
            except Exception:
                self._looked.discard(node_name)  # it may have landed: look again next time
                raise
            held.append(i)
        if self._clock() - self._reaped_at >= REAP_PERIOD_S:
            self._reaped_at = self._clock()
            for i in held:
                if self._slots.reap(i) and self._slots.take(i, node_name, node):
                    return self._keep(node_name, self._slots.name(i))
        if (
            held and self._audit.due(node_name) and self._audit.suspect(held[:1])
        ):  # one: a probe, not a survey
            return self._keep(node_name, self._audit.take(node_name, cap, node))
        return None

    def _settle_number(self, node_name: str, i: int, cap: int, node: Mapping[str, Any]) -> str | None:
        """Number *i* is ours: it settles the ask unless nodes count that no number shows; then a count
        does, and the number is kept when it grants (an older agent counts only numbers)."""
        name = self._slots.name(i)
        try:
            if not self._audit.outside_numbers(node_name):
                return name
            counted = self._audit.take(node_name, cap, node)
        except Exception:
            self._slots.free(name)
            raise
        self._slots.free(counted or name)  # granted: the overflow slot ordered the count, the number holds
        return name if counted else None

    def _keep(self, node_name: str, slot: str | None) -> str | None:
        if slot is not None:
            self._held[node_name] = slot
        return slot

    def allows_new_taint(
        self, node_name: str | None = None, min_rv: str | None = None, node: Mapping[str, Any] | None = None
    ) -> tuple[bool, str]:
        """May *node_name* gain our taint now? True once it holds a slot (kept until release()).
        *node* is its Node when the asker has it (its owner reference and selection check); *min_rv*
        is accepted for the Node writer's sake and not needed (a create of a fixed name is exact).
        API errors propagate (the caller retries next cycle; a transient error neither opens the
        brake nor taints blindly)."""
        name = node_name or self.node_name or ""
        with self._lock:
            now, now_wall = self._clock(), time.time()
            if self.off:
                return self._answer(True, 0, 0, "the brake is off (maxTaintedFraction >= 1)", now)
            if name in self._held:
                return self._answer(True, 0, 0, f"this node holds {self._held[name]}", now)
            refused = self._refused.get(name)
            if refused is not None and now - refused.at < self.cache_seconds:
                return False, refused.reason
            cap, total = self.cap(node)
            if cap <= 0:
                why = f"maxTaintedFraction={self.max_fraction} allows no taint among {total} GPU nodes"
                return self._refuse(name, cap, total, why, now)
            if self._outside:
                return self._count_tainted(name, cap, total, min_rv, now)
            try:
                if name and name not in self._looked:
                    self._look(name, cap, consistent=False)
                    if name in self._held:
                        return self._answer(True, cap, total, f"this node holds {self._held[name]}", now)
                slot = self._take(name, cap, node) if name else None
            except Exception as exc:
                if not (api_status(exc) == 404 and "namespaces" in api_message(exc)):
                    raise
                self._outside = True
                log.warning(
                    "brake: no namespace %s for its slots (an agent or tool outside its install): counting "
                    "tainted Nodes instead, which racing agents can pass: %s",
                    self.namespace,
                    describe_error(exc),
                )
                return self._count_tainted(name, cap, total, min_rv, now)
            if slot is not None:
                return self._answer(True, cap, total, f"slot {slot} of {cap} for {total} GPU nodes", now)
            limit = (
                f"maxTaintedNodes={self.max_nodes}"
                if cap == self.max_nodes
                else f"maxTaintedFraction={self.max_fraction}"
            )
            last = self._audit.last
            seen = (
                f"{last.counted} nodes count now (tainted, or holding a slot they claim)"
                if last is not None and last.at >= now_wall
                else f"the {min(self.probes, cap)} of those slots this node tried are held"
            )
            why = f"{cap}/{total} GPU nodes may be tainted ({limit}) and {seen}: at or above the limit"
            return self._refuse(name, cap, total, why, now)

    def _count_tainted(
        self, name: str, cap: int, total: int, min_rv: str | None, now: float
    ) -> tuple[bool, str]:
        """Outside the install (no namespace for slots): the Nodes that carry our taint, by name,
        not older than this node's last write. Exact for one asker; racing askers can pass the cap."""
        tainted = set(self.names(Keys(self.prefix).tainted_selector(self.scope), min_rv=min_rv)) - {name}
        if len(tainted) < cap:
            return self._answer(
                True, cap, total, f"{len(tainted)}/{total} GPU nodes tainted, below {cap}", now
            )
        why = f"{len(tainted)}/{total} GPU nodes already tainted, at or above the limit of {cap}"
        return self._refuse(name, cap, total, why, now)

    def _answer(self, ok: bool, cap: int, total: int, reason: str, now: float) -> tuple[bool, str]:
        self._state = BrakeState(open=not ok, cap=cap, total=total, reason=reason, at=now)
        return ok, reason

    def _refuse(self, name: str, cap: int, total: int, why: str, now: float) -> tuple[bool, str]:
        self._answer(False, cap, total, why, now)
        assert self._state is not None
        self._refused[name] = self._state
        return False, why

    def adopt(self, node_name: str, node: Mapping[str, Any] | None = None) -> None:
        """Our taint is on *node_name* already (a restarted agent, one that ran an older version):
        find its slot, or take one if one is free. Never takes the taint away (the brake does not
        take away a taint it did not just grant): a node without a slot is logged. Never raises."""
        if self.off:
            return
        with self._lock:
            if node_name in self._held:
                return
            try:
                cap, _ = self.cap(node)
                if cap > 0 and node_name not in self._looked:
                    self._look(node_name, cap)
                free = node_name in self._held or cap <= 0 or self._take(node_name, cap, node, adopting=True)
                if not free:  # it counts as tainted all the same (core/brake_count.py)
                    log.warning("brake: %s carries our taint but every slot tried is held", node_name)
            except Exception as exc:
                log.warning("brake: looking for the slot of %s failed: %s", node_name, describe_error(exc))

    def claim(self, node_name: str) -> str | None:
        """The `<prefix>/brake-slot` label's value while *node_name* holds a slot (None: absent)."""
        with self._lock:
            slot = self._held.get(node_name)
        return self._slots.claim(slot) if slot else None

    def holders(self) -> set[str]:
        """The nodes this brake holds a slot for (counted against its cap whatever carries their
        taint)."""
        with self._lock:
            return set(self._held)

    def release(self, node_name: str) -> None:
        """*node_name*'s taint is off and wanted no more: free its slot. A failure is logged; the
        slot is freed at the next release (or with the Node)."""
        with self._lock:
            if node_name not in self._looked and not self.off and not self._outside:
                try:  # once a life: an untainted node frees the slots its last life (or a token) left
                    self._look(node_name, 0, consistent=False)
                except Exception as exc:
                    log.info(
                        "brake: looking for slots of %s to free failed: %s", node_name, describe_error(exc)
                    )
            slot = self._held.get(node_name)
            if slot is None:
                return
            try:
                self._slots.free(slot)
            except Exception as exc:
                log.warning("brake: freeing %s failed: %s", slot, describe_error(exc))
                return
            del self._held[node_name]
            self._refused.pop(node_name, None)

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): new limits count from the next ask (a cached refusal is
        dropped); a new GPU-node selection drops the GPU-node total (read again at the next ask)."""
        with self._lock:
            self.cfg, self._state = new, None
            self._refused.clear()
            self._looked.clear()  # a lower cap: a slot above it is let go at the next look
            self.gpus.select(new.gpu_node_selection)

    def forget(self, node_name: str | None = None) -> None:
        """Drop a cached refusal (the node no longer wants a taint)."""
        with self._lock:
            self._state = None
            self._refused.clear() if node_name is None else self._refused.pop(node_name, None)

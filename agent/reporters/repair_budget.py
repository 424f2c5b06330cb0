"""The repair budget and the wave hold against the API server (decisions: core/repair_budget.py).

A repair engine deletes the Node it repairs, so nothing kept on the Node can count toward a budget:
the records are Leases in the agent's own namespace (labelled `<prefix>/record=fail|mark|release`,
the node, key and pool in annotations, the time is the server's creationTimestamp), written only
when a node is about to newly mark a remediation condition and listed then, from the API server's
watch cache. Steady state costs nothing: a node that is already marked, or wants no mark, never asks.

What each record is and who deletes it: reporters/budget_records.py.

A held answer is kept for `hold_cache_s` (a held node asks again every reask period; the records
change slowly); an allowed answer never is. API errors propagate: the writer keeps the condition as
it is and tries again, so an unreadable budget never marks a node blindly.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.core.marks import Marks, NodeEvent
from agent.core.node_keys import WARNING, EventReason, Keys
from agent.core.record_kind import RecordKind
from agent.core.repair_budget import (
    BudgetPolicy,
    Hold,
    HoldReason,
    Record,
    RecordKeys,
    WavePolicy,
    budget_count,
    budget_hold,
    budget_limit,
    budget_spent,
    markers_holding,
    newly_marking,
    released_rv,
    wave_decision,
)
from agent.reporters.budget_records import WaveQuorum, create_fixed, create_record, list_records
from agent.reporters.gpu_total import GpuFleet
from agent.reporters.kube_rest import KubeRest, describe_error
from agent.reporters.lease_records import LeaseRecords
from agent.reporters.node_names import names_in_list

if TYPE_CHECKING:
    from agent.config import Config

log = logging.getLogger(__name__)

GC_PER_LIST = 20  # an agent deletes at most this many of its own expired records per list


class RepairBudget:
    """One agent's view of the budget and the wave hold (see the module docstring)."""

    def __init__(
        self,
        core: KubeRest,
        node_name: str,
        *,
        namespace: str,
        brake: GpuFleet,
        cfg: Config,
        hold_cache_s: float = 30.0,
        clock: Any = time.time,
        marker_recheck_s: float | None = None,
    ) -> None:
        self.rest = KubeRest.of(core)
        self.node_name, self.namespace = node_name, namespace
        self.brake = brake  # its GPU-node total and scope (tests keep their Nodes apart with it)
        self.cfg = cfg  # node.repairBudget and node.waveHold are read from it, never copied
        self.prefix = cfg.prefix  # restart-only (config/schema.py RESTART_ONLY)
        self.hold_cache_s = hold_cache_s
        self._marker_recheck_s = marker_recheck_s  # None: a third of the wave's window, at most 5 min
        self._clock = clock
        self._failed: set[str] = set()  # keys this node's fail record was written for (this episode)
        self._own_records: set[str] = set()  # this node's fail records and wave markers, written or listed
        self._markers: dict[str, tuple[str, float]] = {}  # key -> (its marker's name, when counted)
        self._quorum = WaveQuorum()  # other nodes' markers: whether they stand on their quorum
        self._own_marks: dict[str, float] = {}  # this node's marks: name -> when (deleted past the window)
        self._held: tuple[float, Hold] | None = None
        self._pool_totals: dict[str, tuple[float, int]] = {}
        self._last_hold: tuple[str, str] | None = None  # (why, key) of the hold the last Event named

    @property
    def budget(self) -> BudgetPolicy:  # node.repairBudget
        return self.cfg.node.repair_budget

    @property
    def wave(self) -> WavePolicy:  # node.waveHold
        return self.cfg.node.wave_hold

    @property
    def on(self) -> bool:
        return self.budget.on or self.wave.on

    def apply_config(self, old: Config, new: Config) -> None:
        """A reload (config/live_part.py): the new config counts from the next ask (a cached hold
        and quorum are dropped)."""
        self.cfg, self._held, self._quorum = new, None, WaveQuorum()

    def settled(self) -> None:
        """The node wants no new mark (marked already, recovered): the next failure is a new episode."""
        self._failed.clear()
        self._held = None

    def recovered(self) -> None:
        """The node wants no remediation mark at all: its fail records no longer count toward a
        wave, its wave markers hold no more; delete those this agent knows of (once: steady state
        sends nothing). Others, left by an agent that restarted in between, no longer count either
        (the wave counts failing Nodes only) and go with the Node (owner reference)."""
        self.settled()
        names, self._own_records = self._own_records, set()
        self._markers.clear()
        for name in sorted(names):
            self._delete(name)

    # -- the writer's questions ----------------------------------------------------------------------
    def ask(self, node: Mapping[str, Any], marks: Marks, taint_on: bool) -> Hold | None:
        """Asked by the Node writer on every apply, answered from memory unless a remediation
        condition would newly turn unhealthy (never in steady state). A budget that cannot be read
        holds the mark: an unreadable count never marks a node blindly; the next ask tries again."""
        key = newly_marking(node, marks, taint_on) if self.on else None
        if key is None:
            if any(m.unhealthy for m in marks.remediation):
                self.settled()
            else:
                self.recovered()
            return None
        try:
            return self.decide(node, key)
        except Exception as exc:
            msg = describe_error(exc)
            log.warning("node %s: counting the repair budget failed: %s", self.node_name, msg)
            return Hold(
                HoldReason.BUDGET, key, f"the repair budget could not be counted ({msg}); asking again"
            )

    def events(self, hold: Hold | None) -> list[NodeEvent]:
        """A RemediationHeld Event when a hold begins (or changes why or key), not every cycle."""
        now = (hold.why, hold.key) if hold is not None else None
        before, self._last_hold = self._last_hold, now
        if hold is None or now == before:
            return []
        return [
            NodeEvent(EventReason.REMEDIATION_HELD, f"Not marked for remediation: {hold.message}", WARNING)
        ]

    # -- the decision --------------------------------------------------------------------------------
    def decide(self, node: Mapping[str, Any], key: str) -> Hold | None:
        """This node is about to newly mark a remediation condition for *key*: None to go ahead,
        else why not. API errors propagate.

        What it reads stays small whatever the fleet: the budget's marks and the releases (at most
        the budget's limit per window), and the key's wave markers. Only a node that finds no
        marker counts the wave in full (the key's fail records and the failing Nodes): at its first
        ask of an episode, or when the budget would let it mark. A full count that finds a wave
        leaves a marker (its node's own record), so that the other nodes of the wave are held by
        two small lists (the markers; the key's fail records up to a bound: the marker's quorum,
        else the full count decides); a marker's owner counts again every `marker_recheck_s` and
        takes its marker away when the wave has ended (a marker left by a node that recovered goes
        with it)."""
        now = self._clock()
        if self._held is not None and now - self._held[0] < self.hold_cache_s and self._held[1].key == key:
            return self._held[1]
        first = key not in self._failed
        min_rv = self._record_failure(key, node)
        ledger = self._ledger(min_rv, now)
        self._collect(ledger, now)
        hold, recount = self._marked_wave(key, ledger, now) if self.wave.on else (None, False)
        spent = self._budget_spent(node, key, ledger, now) if hold is None and self.budget.on else None
        due = (first or spent is None) and not self._marker_fresh(key, now)
        if hold is None and self.wave.on and (recount or due):
            node_rv = str((node.get("metadata") or {}).get("resourceVersion") or "") or None
            hold = self._count_wave(key, ledger, node, node_rv, min_rv, now)
        hold = hold or spent
        if hold is None and self.budget.on:
            hold = self._spend(node, key, now)
        if hold is not None:
            # kept a random share of hold_cache_s longer: the held nodes of a fleet do not all ask
            # again in the same instant when the budget's window moves or a release comes
            self._held = (now + random.uniform(0, self.hold_cache_s), hold)
            log.info("node %s: remediation held: %s", self.node_name, hold.message)
        else:
            self._held = None
        return hold

    @property
    def marker_recheck_s(self) -> float:
        """How often a wave marker's owner counts the wave again (a third of its window, at most 5 min)."""
        if self._marker_recheck_s is not None:
            return self._marker_recheck_s
        return min(300.0, self.wave.window_s / 3)

    def _marker_fresh(self, key: str, now: float) -> bool:
        """This node's own marker for *key* stands and was counted within marker_recheck_s."""
        own = self._markers.get(key)
        return own is not None and now - own[1] < self.marker_recheck_s

    def _marked_wave(self, key: str, ledger: list[Record], now: float) -> tuple[Hold | None, bool]:
        """A wave marker of *key* written after its last release, on its quorum: held without
        counting in full (unless it is this node's own and due to be counted again); and whether the
        caller must count in full (a quorum the bounded list could not confirm)."""
        markers = list_records(self.rest, self.namespace, self.prefix, kinds=(RecordKind.WAVE,), key=key)
        after = released_rv(ledger, key)
        standing = [m for m in markers if m.rv > after and m.kind == RecordKind.WAVE and m.key == key]
        if not standing:
            return None, False
        mine = next((m for m in standing if m.node == self.node_name), None)
        if mine is not None and key not in self._markers:  # left by this node's last life: count it again
            self._markers[key] = (mine.name, float("-inf"))
            self._own_records.add(mine.name)
        quorum: bool | None = True
        if any(m.node != self.node_name for m in standing):
            quorum = self._quorum.confirm(
                self.rest, self.namespace, self.prefix, key, after_rv=after, min_nodes=self.wave.min_nodes,
                newest_rv=max(m.rv for m in standing), now=now, keep_s=self.marker_recheck_s,
            )  # fmt: skip
        if quorum is None:
            return None, True  # the bounded list could not confirm theirs: the full count decides
        holding = markers_holding(standing, self.node_name, quorum)
        own = self._markers.get(key)
        older = [m for m in holding if m.node != self.node_name and (mine is None or m.rv < mine.rv)]
        if own is not None and older:  # another node's marker (on its quorum) came first: ours goes
            del self._markers[key]
            self._delete(own[0])
            own = None
        if (own is not None and now - own[1] >= self.marker_recheck_s) or not holding:
            return None, False  # ours and due (the caller counts again), or none holds this node
        first = min(holding, key=lambda m: m.rv)
        why = first.reason or f"a correlated wave on {key} (node.waveHold)"
        return Hold(HoldReason.WAVE, key, why), False

    def _count_wave(
        self,
        key: str,
        ledger: list[Record],
        node: Mapping[str, Any],
        node_rv: str | None,
        min_rv: str | None,
        now: float,
    ) -> Hold | None:
        """The wave counted in full: the key's fail records and the failing Nodes. Leaves (or keeps)
        this node's marker when it holds, takes it away when it does not."""
        fails = list_records(
            self.rest, self.namespace, self.prefix, min_rv, kinds=(RecordKind.FAIL,), key=key
        )
        self._own_records.update(r.name for r in fails if r.node == self.node_name)
        failing = self._failing(node_rv)
        hold = wave_decision([*fails, *ledger], key, failing, self.brake.gpu_node_total(), self.wave)
        own = self._markers.get(key)
        if hold is not None:
            if own is None:
                self._markers[key] = (self._write_marker(key, hold, node), now)
            else:
                self._markers[key] = (own[0], now)
        elif own is not None:
            del self._markers[key]
            self._delete(own[0])
        return hold

    def _write_marker(self, key: str, hold: Hold, node: Mapping[str, Any]) -> str:
        keys = RecordKeys(self.prefix)
        digest = hashlib.sha256(f"{self.node_name}\0{key}\0wave".encode()).hexdigest()[:20]
        name = f"{self.prefix}-wave-{digest}"
        ann = {keys.node: self.node_name, keys.key: key, keys.reason: hold.message}
        create_fixed(
            self.rest,
            self.namespace,
            self.prefix,
            RecordKind.WAVE,
            ann,
            name=name,
            holder=self.node_name,
            owner=node,
        )
        self._own_records.add(name)
        return name

    def _ledger(self, min_rv: str | None, now: float) -> list[Record]:
        """The marks that can count now (those labelled with this window's bucket or its neighbours:
        a writer's clock may be off by less than a window; and any without a bucket) and the
        releases: bounded by the budget's limit and the releases of a week, whatever the fleet and
        however many marked Nodes are gone."""
        b = int(now // self.budget.window_s)
        label = RecordKeys(self.prefix).window_label
        buckets = f"{label} in ({b - 1},{b},{b + 1})"
        marks = list_records(
            self.rest, self.namespace, self.prefix, min_rv, kinds=(RecordKind.MARK,), extra=buckets
        )
        # marks written without a bucket (an agent from before buckets, during a rollout) count
        # too: only within the window, as any mark, and their nodes delete them at their next ask
        unbucketed = f"!{label}"
        marks += list_records(
            self.rest, self.namespace, self.prefix, min_rv, kinds=(RecordKind.MARK,), extra=unbucketed
        )
        return marks + list_records(
            self.rest, self.namespace, self.prefix, min_rv, kinds=(RecordKind.RELEASE,)
        )

    def _budget_spent(
        self, node: Mapping[str, Any], key: str, ledger: list[Record], now: float
    ) -> Hold | None:
        """The cheap look before writing a mark: held when the window's marks are at the limit."""
        pool = self._pool(node)
        limit = budget_limit(self.budget, self._pool_total(pool))
        spent = budget_spent(ledger, now, self.budget.window_s, pool, self.node_name)
        return budget_hold(spent + 1, limit, self.budget, key, pool)

    def _pool(self, node: Mapping[str, Any]) -> str | None:
        per = self.budget.per_label
        return ((node.get("metadata") or {}).get("labels") or {}).get(per, "") if per else None

    def _spend(self, node: Mapping[str, Any], key: str, now: float) -> Hold | None:
        """Take one of the budget's marks: write ours, count what was written before it."""
        pool = self._pool(node)
        limit = budget_limit(self.budget, self._pool_total(pool))
        keys = RecordKeys(self.prefix)
        ann = {keys.node: self.node_name, keys.key: key, keys.pool: pool or ""}
        bucket = {keys.window_label: str(int(now // self.budget.window_s))}
        own = create_record(
            self.rest, self.namespace, self.prefix, RecordKind.MARK, ann, holder=self.node_name, labels=bucket
        )
        self._own_marks[own.name] = own.at or now
        after = self._ledger(str(own.rv), now)
        hold = budget_hold(
            budget_count(after, own, self.budget.window_s, pool), limit, self.budget, key, pool
        )
        if hold is None and self.wave.on:  # a wave that landed while we counted holds us too
            hold = self._count_wave(key, after, node, None, str(own.rv), now)
        if hold is not None:
            self._delete(own.name)
        return hold

    # -- records -------------------------------------------------------------------------------------
    def _record_failure(self, key: str, node: Mapping[str, Any]) -> str | None:
        """Write this node's fail record for *key* once per episode, owned by its Node; its
        resourceVersion (None when it was there already: then the cache as it is)."""
        if key in self._failed or not self.wave.on:
            return None
        keys = RecordKeys(self.prefix)
        digest = hashlib.sha256(f"{self.node_name}\0{key}".encode()).hexdigest()[:20]
        name = f"{self.prefix}-fail-{digest}"
        self._own_records.add(name)
        ann = {keys.node: self.node_name, keys.key: key}
        rec = create_fixed(
            self.rest,
            self.namespace,
            self.prefix,
            RecordKind.FAIL,
            ann,
            name=name,
            holder=self.node_name,
            owner=node,
        )
        self._failed.add(key)
        return str(rec.rv) if rec is not None else None

    def _failing(self, min_rv: str | None) -> set[str]:
        """The Nodes failing now (`<prefix>/status=fail`), names only, from the watch cache."""
        selector = Keys.selector(self.brake.scope, f"{Keys(self.prefix).status}=fail")
        return set(names_in_list(self.brake.list_doc(selector, min_rv=min_rv))) | {self.node_name}

    def _pool_total(self, pool: str | None) -> int:
        """GPU nodes in this node's pool (the perLabel value: the GPU nodes with that value, listed by
        name, at most every 5 minutes)."""
        if pool is None:
            return self.brake.gpu_node_total()
        cached = self._pool_totals.get(pool)
        if cached is not None and self._clock() - cached[0] < 300:
            return cached[1]
        total = max(self.brake.count_selected(f"{self.budget.per_label}={pool}"), 1)
        self._pool_totals[pool] = (self._clock(), total)
        return total

    def _collect(self, records: list[Record], now: float) -> None:
        """Delete this node's own marks past the window (never another node's record: the admission
        policy refuses that, and a record that no longer counts may linger, never count again), and
        remember its own fail records (deleted when the node recovers)."""
        own = [r for r in records if r.node == self.node_name]
        self._own_records.update(r.name for r in own if r.kind in (RecordKind.FAIL, RecordKind.WAVE))
        self._own_marks.update({r.name: r.at for r in own if r.kind == RecordKind.MARK})
        gone = [n for n, at in self._own_marks.items() if now - at > self.budget.window_s + 60]
        for name in gone[:GC_PER_LIST]:
            del self._own_marks[name]
            self._delete(name)

    def _delete(self, name: str) -> None:
        try:
            LeaseRecords(self.rest, self.namespace, self.prefix).delete(name)
        except Exception as exc:
            log.info("repair budget: deleting record %s failed: %s", name, describe_error(exc))


__all__ = ["RepairBudget"]

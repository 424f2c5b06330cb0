"""The cluster-wide brake (DESIGN.md §6.1): stop adding taints when too many GPU nodes are already tainted.

A bad driver push or a false positive must not taint a whole GPU fleet: the brake bounds the blast
radius by a fraction of the GPU nodes and, optionally, an absolute count. It is asked only when a
node is about to *gain* our taint, never to keep or remove one. It refuses, this node not counted,

    iff  tainted_now >= max_fraction * total  (exact)  or  (max_nodes > 0 and tainted_now >= max_nodes)

so on a small pool the first failing node can always be tainted; `max_fraction >= 1` turns the
fraction off, `<= 0` forbids every new taint. Counting lists Node *names only* (Table rows without
objects), always from the API server's watch cache, never from etcd: the GPU-node total as the cache
has it, read ahead of need; the tainted and contender lists not older than our own last write, so
every write that landed before ours is counted. Free slots go to the contenders (failing, untainted
GPU nodes that want our taint) in name order, so racing agents agree without a lock; the writer's
post-taint re-count (taint_gate) catches what a racer could not see. A refusal is cached for
`cache_seconds`, an "allowed" never. What each rule fixed, measured: bench/README.md ("The brake").
The rule itself, pure, is brake_rule.py; this module counts and asks it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.gpu_nodes import DEFAULT_GPU_NODE_SELECTORS
from agent.core.node_keys import DEFAULT_PREFIX, TAINT_SEVERITIES, Keys
from agent.reporters.brake_rule import brake_cap, brake_decision, must_back_off, rank_decision
from agent.reporters.kube_rest import KubeRest, api_status

log = logging.getLogger(__name__)

METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
NAMES_LIST_ACCEPT = "application/json;as=Table;g=meta.k8s.io;v=v1," + METADATA_LIST_ACCEPT
REQUEST_TIMEOUT = (5, 30)


def names_in_list(doc: Mapping[str, Any]) -> list[str]:
    """Pure: the object names in a list response, whichever form the server chose: a Table (the
    column whose format is "name", else the first; or a row's object when one was included), a
    PartialObjectMetadataList or a plain list. Raises ValueError on anything else, so that a proxy
    answering with something unexpected is "could not count", never "0 tainted"."""
    kind = doc.get("kind")
    if kind == "Table":
        cols = doc.get("columnDefinitions") or []
        idx = next((i for i, c in enumerate(cols) if c.get("format") == "name"), 0)
        names = []
        for row in doc.get("rows") or ():
            obj = row.get("object") or {}
            name = (obj.get("metadata") or {}).get("name")
            if not name:
                cells = row.get("cells") or []
                name = cells[idx] if idx < len(cells) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"a Table row without a name: {str(row)[:200]}")
            names.append(name)
        return names
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items") or [], list):
        return [str((i.get("metadata") or {}).get("name", "")) for i in doc.get("items") or ()]
    raise ValueError(f"not a list response: kind={kind!r}")


@dataclass(frozen=True)
class BrakeState:
    """The last answer, for metrics and logs."""

    open: bool  # True = refusing new taints
    tainted: int
    total: int
    reason: str
    at: float  # time.monotonic() of the count


class Brake:
    """Counts our tainted GPU nodes cluster-wide; shared by nothing but its own Node writer."""

    def __init__(
        self,
        core: KubeRest,
        *,
        selectors: Sequence[str] = DEFAULT_GPU_NODE_SELECTORS,
        node_name: str | None = None,
        scope: str = "",
        on_count: Callable[[int, bool], None] | None = None,
        max_fraction: float = 0.2,
        max_nodes: int = 0,
        prefix: str = DEFAULT_PREFIX,
        cache_seconds: float = 10,
        clock: Callable[[], float] = time.monotonic,
        total_cache_seconds: float = 300,
        refresh_jitter_s: float = 60,
        rank_patience_s: float = 90,
        settle_s: float = 1.0,
        settle_max_s: float = 6.0,
        min_severity: str = TAINT_SEVERITIES[0],
    ) -> None:
        self._rest = KubeRest.of(core)  # also takes a CoreV1Api or an ApiClient (tools, bench/fleet.py)
        self.selectors = tuple(selectors)  # any one makes a GPU node (core/gpu_nodes.py)
        self.node_name = node_name  # this agent's Node: is it among the GPU nodes counted?
        # A label selector ANDed into every list: a brake of its own for one pool of Nodes (tests
        # use it to keep apart the Nodes of other tests on one API server). Empty: the cluster.
        self.scope = scope
        self._on_count = on_count  # (GPU nodes counted, this Node among them) -> metrics
        self.selection_problem: str | None = None  # set while the selection does not hold
        self.max_fraction = max_fraction
        self.max_nodes = max_nodes
        self.prefix = prefix
        self.min_severity = min_severity  # node.taintMinSeverity: who contends for a slot
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BrakeState | None = None
        self.total_cache_seconds = total_cache_seconds
        self.refresh_jitter_s = refresh_jitter_s
        self._lock_total = threading.Lock()
        self._total_pending = False
        self._total_cache: tuple[float, set[str]] | None = None
        self.rank_patience_s = rank_patience_s
        self._ranked_out_since: float | None = None
        self.settle_s = settle_s
        self.settle_max_s = settle_max_s
        self.stale_reads = 0  # lists answered from a cache behind our own write (504, then as is)
        # Nodes held back by our DRA device taints alone (reporters/device_taints.tainted_nodes):
        # counted as tainted, so that per-GPU isolation cannot pass the brake's limit.
        self.also_tainted: Callable[[], set[str]] | None = None

    @property
    def state(self) -> BrakeState | None:
        """The last count and decision (None before the first one)."""
        return self._state

    @property
    def contenders_selector(self) -> str:
        """Failing nodes that want our taint (at node.taintMinSeverity or above) and do not have it
        (nor refuse it). Only our agents write these labels, and they run only on GPU nodes, so no
        GPU-node selector is needed."""
        return Keys(self.prefix).contenders_selector(self.scope, self.min_severity)

    @property
    def tainted_selector(self) -> str:
        """Nodes that carry our taint (counted in the total too: a taint is a GPU node held back)."""
        return Keys(self.prefix).tainted_selector(self.scope)

    def _selected(self, min_rv: str | None = None) -> set[str]:
        """The GPU nodes: the union of one names-only list per selector (a selector cannot OR)."""
        names: set[str] = set()
        for selector in self.selectors:
            names.update(self._names(Keys.selector(selector, self.scope), min_rv=min_rv))
        self._check_selection(names)
        return names

    def _check_selection(self, names: set[str]) -> None:
        """A selection that misses this Node (or every Node) would shrink the brake's total to
        "this node alone", i.e. one taint at most: say so in the log and the metrics."""
        ours = self.node_name is None or self.node_name in names
        problem = None
        if not names:
            problem = "node.gpuNodeSelector matches no Node"
        elif not ours:
            problem = f"this Node is not among the {len(names)} Nodes node.gpuNodeSelector matches"
        if problem and problem != self.selection_problem:
            log.warning("brake: %s; the brake's fraction counts only the Nodes it matches", problem)
        elif self.selection_problem and not problem:
            log.info("brake: node.gpuNodeSelector matches this Node again (%d GPU nodes)", len(names))
        self.selection_problem = problem
        if self._on_count is not None:
            self._on_count(len(names), ours)

    def _names(self, label_selector: str, *, min_rv: str | None = None) -> list[str]:
        """Names of the Nodes matching *label_selector* (Table rows, no objects; see the module doc)."""
        return names_in_list(self.list_doc(label_selector, min_rv=min_rv))

    def list_doc(self, label_selector: str, *, min_rv: str | None = None) -> dict[str, Any]:
        """The raw list response the count reads (public for tests and benchmarks). Always served
        from the API server's watch cache: with *min_rv* once the cache has caught up with that
        resourceVersion (our own last write: every write that landed before it is seen), else as
        the cache has it (resourceVersion=0). Never a consistent read: under a fleet-wide burst
        those fall back to etcd, where each one is a range over every Node. A cache more than ~3 s
        behind our write answers 504 ("Too large resource version"): then the cache as it is, since
        the settle loop and the post-taint re-count look again anyway, and a failed write retried
        with backoff would only add load to a server that is already behind."""
        query = {"labelSelector": label_selector, "includeObject": "None", "resourceVersion": "0"}
        if min_rv:
            fresh = {**query, "resourceVersion": min_rv, "resourceVersionMatch": "NotOlderThan"}
            try:
                return self._list(fresh)
            except Exception as exc:
                if api_status(exc) != 504:
                    raise
                self.stale_reads += 1
                log.info(
                    "brake: the API server's cache is behind our write (%s); counting from it as is", exc
                )
        return self._list(query)

    def _list(self, query: dict[str, str]) -> dict[str, Any]:
        return self._rest.json(
            "GET", "/api/v1/nodes", query=query, accept=NAMES_LIST_ACCEPT, timeout=REQUEST_TIMEOUT
        )

    def _gpu_nodes(self, min_rv: str | None = None) -> set[str]:
        """All GPU nodes. The one list of the whole fleet (11 ms of API server CPU for 2,000 Nodes,
        ten times a filtered list), so it is kept off the path of a taint: read once ahead of need
        (warm, at agent start), then served from here; when older than total_cache_seconds it is
        still used and re-read in the background after a random delay, so that a fleet-wide fault
        does not make every agent list every Node at the same moment. A fleet's size changes slowly."""
        cached = self._total_cache
        if cached is None:  # no total yet: read it now, not older than our write when we know it
            names = self._selected(min_rv)
            self._total_cache = (self._clock(), names)
            return names
        if self._clock() - cached[0] >= self.total_cache_seconds:
            self._refresh_total_later(random.uniform(0, self.refresh_jitter_s))
        return cached[1]

    def gpu_node_names(self) -> set[str]:
        """The GPU nodes as last counted (read now when never read): the repair budget's total."""
        return self._gpu_nodes()

    def warm(self, delay_s: float = 0.0) -> threading.Thread | None:
        """Read the GPU-node total in the background after *delay_s* (the agent starts with a random
        delay, so that a DaemonSet rollout spreads these lists). Returns the thread (None if a read
        is already pending)."""
        return self._refresh_total_later(delay_s)

    def _refresh_total_later(self, delay_s: float) -> threading.Thread | None:
        with self._lock_total:
            if self._total_pending:
                return None
            self._total_pending = True
        thread = threading.Thread(
            target=self._refresh_total, args=(delay_s,), name="brake-total", daemon=True
        )
        thread.start()
        return thread

    def _refresh_total(self, delay_s: float) -> None:
        try:
            if delay_s > 0:
                time.sleep(delay_s)
            names = self._selected()
            self._total_cache = (self._clock(), names)
            log.info("brake: %d GPU nodes (%d selectors)", len(names), len(self.selectors))
        except Exception as exc:  # the next need reads it (synchronously if there is no total yet)
            log.warning("brake: reading the GPU-node total failed: %s", exc)
        finally:
            with self._lock_total:
                self._total_pending = False

    def _others_tainted(self, node_name: str | None, min_rv: str | None = None) -> set[str]:
        devices = self.also_tainted() if self.also_tainted is not None else set()
        return (set(self._names(self.tainted_selector, min_rv=min_rv)) | devices) - {node_name or ""}

    def _total(self, node_name: str | None, min_rv: str | None = None, tainted: Sequence[str] = ()) -> int:
        """GPU nodes, the asking one counted even when the total was read before it existed, and
        every tainted one (ours are GPU nodes even where the selection misses their labels)."""
        return len(self._gpu_nodes(min_rv) | set(tainted) | ({node_name} if node_name else set()))

    def allows_new_taint(self, node_name: str | None = None, min_rv: str | None = None) -> tuple[bool, str]:
        """May *node_name* gain our taint now? API errors propagate (the caller retries next cycle; a
        transient error neither opens the brake nor taints blindly)."""
        with self._lock:
            now = self._clock()
            st = self._state
            if st is not None and st.open and now - st.at < self.cache_seconds:
                return False, st.reason
            tainted = self._others_tainted(node_name, min_rv)
            total = self._total(node_name, min_rv, sorted(tainted))
            ok, reason = brake_decision(len(tainted), total, self.max_fraction, self.max_nodes)
            if not ok:
                self._ranked_out_since = None  # the count explains the refusal
            elif node_name is not None:
                ok, reason = self._take_turn(node_name, tainted, total, now, min_rv)
            self._state = BrakeState(open=not ok, tainted=len(tainted), total=total, reason=reason, at=now)
            return ok, reason

    def _turn(
        self, node_name: str, tainted: set[str], total: int, min_rv: str | None = None
    ) -> tuple[bool, str, set[str]]:
        """rank_decision over the contenders as listed now; also the view (contenders and tainted)."""
        contenders = self._names(self.contenders_selector, min_rv=min_rv)
        ok, reason = rank_decision(
            node_name, len(tainted), total, contenders, self.max_fraction, self.max_nodes
        )
        return ok, reason, set(contenders) | tainted

    def _take_turn(
        self, node_name: str, tainted: set[str], total: int, now: float, min_rv: str | None
    ) -> tuple[bool, str]:
        """rank_decision over the contenders. Other contenders in view mean a fault on several nodes
        at once, whose labels are still landing: wait `settle_s` and count again, until no new
        failing node appears (at most `settle_max_s`: a slow API server lands a burst's writes over
        seconds), so that racers decide on the same view. A lone failing node never waits.
        A contender that never takes its slot (its agent is gone and its labels stayed) must not hold
        this node back forever: after `rank_patience_s` of rank refusals while slots stay free, the
        count decides."""
        ok, reason, view = self._turn(node_name, tainted, total, min_rv)
        if ok and self.settle_s > 0 and view - tainted - {node_name}:
            # Watch the burst land, from the cache as it is (asking it not to be older than our
            # write would make a lagging server wait 3 s each time): count again every second until
            # no new failing node appears or this node's turn is gone. A contender that got its
            # taint meanwhile stays in the view.
            seen: set[str] = set()
            waited = 0.0
            while ok and view - seen and waited < self.settle_max_s:
                seen = view
                time.sleep(self.settle_s)
                waited += self.settle_s
                ok, reason, view = self._turn(node_name, self._others_tainted(node_name), total)
        if ok:
            self._ranked_out_since = None
            return ok, reason
        if self._ranked_out_since is None:
            self._ranked_out_since = now
        elif now - self._ranked_out_since >= self.rank_patience_s:
            head = reason.split(";")[0]
            return True, f"{head}; contenders ahead did not take a slot in {self.rank_patience_s:.0f} s"
        return ok, reason

    def overshoot(self, node_name: str, min_rv: str | None = None, last: bool = False) -> tuple[bool, str]:
        """After our taint landed: must this node yield because racing agents tainted too many? The
        ones beyond the limit in name order yield; at its *last* re-count a node still above the
        limit yields whatever its name, because the ones after it by name may have finished their
        re-counts before a late racer (one whose writes waited on a loaded API server) landed. That
        may leave a slot free for a moment; the brake fills it on the next ask (safe side)."""
        tainted = self._names(self.tainted_selector, min_rv=min_rv)
        total = self._total(node_name, min_rv, tainted)
        cap = brake_cap(total, self.max_fraction, self.max_nodes)
        over = last and node_name in tainted and len(set(tainted)) > cap
        if must_back_off(node_name, tainted, cap) or over:
            reason = f"{len(set(tainted))} GPU nodes were tainted at once, above the limit of {cap}: yielding"
            with self._lock:
                self._state = BrakeState(
                    open=True, tainted=len(tainted) - 1, total=total, reason=reason, at=self._clock()
                )
            return True, reason
        return False, ""

    def reconfigure(
        self,
        *,
        selectors: Sequence[str],
        max_fraction: float,
        max_nodes: int,
        min_severity: str = TAINT_SEVERITIES[0],
    ) -> None:
        """A reloaded config: new limits count from the next ask (a cached refusal is dropped); a new
        GPU-node selection drops the GPU-node total and reads it again now."""
        with self._lock:
            self.max_fraction, self.max_nodes = max_fraction, max_nodes
            self.min_severity = min_severity
            self._state = None
            self._ranked_out_since = None
            new_selection = tuple(selectors) != self.selectors
            self.selectors = tuple(selectors)
        if new_selection:
            self._total_cache = None
            self.warm()

    def forget(self) -> None:
        """Drop a cached refusal (the node no longer wants a taint)."""
        with self._lock:
            self._state = None

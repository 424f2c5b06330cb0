"""The GPU-node total the brake's fraction and the repair budget are taken of, without listing the fleet.

The agent's DaemonSet runs on every GPU node (its node affinity is the GPU-node selection,
core/gpu_nodes.py, written into manifests/60-agent.yaml and the chart by gen-configmap), so its
status.desiredNumberScheduled, kept by the DaemonSet controller, is the number of GPU nodes: one
read of the agents' own namespace, whatever the fleet's size, and nothing an agent can write (RBAC
gives it no write on DaemonSets). Every DaemonSet there whose pods run as the agent's
ServiceAccount counts (an image canary's DaemonSet beside the main one: they share the nodes
between them). None when there is none, it cannot be read, or its count is 0 (not counted yet: this
agent is one of its pods): the caller lists the Nodes instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agent.core.gpu_nodes import DEFAULT_GPU_NODE_SELECTORS, matches
from agent.core.node_keys import Keys
from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, api_status, describe_error
from agent.reporters.node_names import list_names_doc, names_in_list

log = logging.getLogger(__name__)

DEFAULT_SERVICE_ACCOUNT = "gpu-healthcheck-agent"  # manifests/10-rbac.yaml; $POD_SERVICE_ACCOUNT in a pod


def daemonset_total(rest: KubeRest, namespace: str, service_account: str) -> int | None:
    """The GPU nodes the agent's DaemonSets are to run on (the sum of their desiredNumberScheduled),
    from the watch cache; None when no such DaemonSet is there or it cannot be read (403, 404)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    try:
        doc = rest.json("GET", path, query={"resourceVersion": "0"}, timeout=REQUEST_TIMEOUT)
    except Exception as exc:
        if api_status(exc) in (401, 403, 404):
            log.info("brake: the agent's DaemonSets cannot be read (%s): counting Nodes", describe_error(exc))
            return None
        raise
    ours = [
        d
        for d in doc.get("items") or ()
        if ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("serviceAccountName")
        == service_account
    ]
    total = sum(int((d.get("status") or {}).get("desiredNumberScheduled") or 0) for d in ours)
    return total or None  # 0: the controller has not counted yet (this agent is one of its pods)


class GpuFleet(Protocol):
    """What the repair budget and the active checks ask of the fleet's GPU nodes: a Brake answers it
    (its delegates to GpuNodes), so neither imports the brake."""

    scope: str  # the tests' label selector that keeps their Nodes apart ("" in a cluster)

    def gpu_node_total(self) -> int: ...

    def count_selected(self, extra: str) -> int: ...

    def list_doc(self, label_selector: str, *, min_rv: str | None = None) -> dict[str, Any]: ...


class GpuNodes:
    """The GPU nodes a brake, the repair budget and the active checks take their shares of: the
    DaemonSets' count (else the selected Nodes listed by name), cached for *cache_seconds*, and the
    names-only lists of GPU nodes matching one more selector. Apart from the brake, which only asks."""

    def __init__(
        self,
        rest: KubeRest,
        selectors: Sequence[str] = DEFAULT_GPU_NODE_SELECTORS,
        *,
        scope: str = "",
        node_name: str | None = None,
        namespace: str = "gpu-healthcheck",
        service_account: str = DEFAULT_SERVICE_ACCOUNT,
        clock: Callable[[], float] = time.monotonic,
        cache_seconds: float = 300,
        on_count: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.rest = rest
        self.selectors = tuple(selectors)  # any one makes a GPU node (core/gpu_nodes.py)
        self.scope, self.node_name = scope, node_name
        self.namespace, self.service_account = namespace, service_account
        self._clock, self.cache_seconds = clock, cache_seconds
        self._on_count = on_count  # (GPU nodes counted, this Node among them) -> metrics
        self.selection_problem: str | None = None  # set while the selection does not hold
        self._total: tuple[float, int] | None = None  # (when, GPU nodes counted)
        self._listed_ours: bool | None = None  # this node among the listed ones (None: not listed)

    def select(self, selectors: Sequence[str]) -> None:
        """A new GPU-node selection: the total is read again at the next ask."""
        if tuple(selectors) != self.selectors:
            self._total = None
        self.selectors = tuple(selectors)

    def total(self, node: Mapping[str, Any] | None = None) -> int:
        """The GPU nodes (this one among them), as last read; read now when never read or older
        than cache_seconds. API errors propagate. *node*: this agent's Node, when the asker has it
        (is it among the GPU nodes? judged from its labels where the DaemonSet gave the total)."""
        cached = self._total
        if cached is None or self._clock() - cached[0] >= self.cache_seconds:
            counted, listed = None, None
            if not self.scope:
                counted = daemonset_total(self.rest, self.namespace, self.service_account)
            if counted is None:
                names = self.selected()
                listed = self.node_name in names if self.node_name else True
                counted = len(names)
            cached = (self._clock(), counted)
            self._total, self._listed_ours = cached, listed
            log.info("brake: %d GPU nodes", counted)
        ours = self._listed_ours
        if ours is None:
            labels = ((node or {}).get("metadata") or {}).get("labels")
            ours = labels is None or any(matches(s, labels) for s in self.selectors)
        self._check_selection(cached[1], ours)
        return max(cached[1] + (0 if ours else 1), 1)

    def selected(self, extra: str = "") -> set[str]:
        """The GPU nodes (and *extra*): the union of one names-only list per selector (a selector
        cannot OR)."""
        names: set[str] = set()
        for selector in self.selectors:
            names.update(self.names(Keys.selector(Keys.selector(selector, self.scope), extra)))
        return names

    def _check_selection(self, counted: int, ours: bool) -> None:
        """A selection that misses this Node (or every Node) makes the total wrong: say so in the
        log and the metrics."""
        problem = None
        if counted <= 0:
            problem = "node.gpuNodeSelector matches no Node"
        elif not ours:
            problem = f"this Node is not among the {counted} Nodes node.gpuNodeSelector matches"
        if problem and problem != self.selection_problem:
            log.warning("brake: %s; the brake's fraction counts only the Nodes it matches", problem)
        elif self.selection_problem and not problem:
            log.info("brake: node.gpuNodeSelector matches this Node again (%d GPU nodes)", counted)
        self.selection_problem = problem
        if self._on_count is not None:
            self._on_count(counted, ours)

    def names(self, label_selector: str, *, min_rv: str | None = None) -> list[str]:
        """Names of the Nodes matching *label_selector* (Table rows, no objects)."""
        return names_in_list(self.list_doc(label_selector, min_rv=min_rv))

    def list_doc(self, label_selector: str, *, min_rv: str | None = None) -> dict[str, Any]:
        """The raw names-only list of Nodes matching *label_selector* (the repair budget's failing
        nodes, a pool, the fallback total). Always from the API server's watch cache: not older
        than *min_rv* (our own last write: every write that landed before it is seen), else as the
        cache has it. Never a consistent read: under a fleet-wide burst those fall back to etcd,
        each a range over every Node. A cache more than ~3 s behind our write answers 504: then the
        cache as it is (the caller's next ask looks again)."""
        return list_names_doc(self.rest, "/api/v1/nodes", label_selector, min_rv=min_rv)


__all__ = [
    "DEFAULT_SERVICE_ACCOUNT",
    "GpuFleet",
    "GpuNodes",
    "daemonset_total",
]

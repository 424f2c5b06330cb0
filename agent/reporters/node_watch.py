"""The watch of the agent's own Node and the latest copy of it (DESIGN.md §4).

One watch keeps the writer's copy of its Node current, so that deciding whether anything differs
costs the API server nothing but that watch. The copy is the newest by resourceVersion of what the
watch, our reads and our write answers saw (`observe`). Each Node the watch sees also goes to a
callback (the writer's: put a removed taint back). A 410 Gone lists again at once; other failures
back off from 0.5 s to 30 s; a deleted Node empties the copy until it is seen again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from agent.reporters.kube_rest import KubeRest, api_status, describe_error, node_path
from agent.reporters.node_patch import rv_number

log = logging.getLogger(__name__)

OnNode = Callable[[dict[str, Any]], None]


class NodeWatch:
    """The latest seen copy of one Node, kept current by a watch in a daemon thread."""

    def __init__(
        self,
        rest: KubeRest,
        node_name: str,
        *,
        on_node: OnNode,
        timeout_seconds: int,
        request_timeout: tuple[float, float],
        on_copy: Callable[[], None] | None = None,
    ) -> None:
        self.rest = rest
        self.node_name = node_name
        self.timeout_seconds = timeout_seconds
        self.request_timeout = request_timeout
        self._on_node = on_node
        self._on_copy = on_copy  # the copy changed (the writer's metrics of what the Node shows)
        self._node_lock = threading.Lock()
        self._node: dict[str, Any] | None = None  # the last seen Node (watch, reads, write responses)
        self._version = 0  # one more on every change of _node
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.synced = threading.Event()  # set while the watch keeps the copy current

    # -- the copy ------------------------------------------------------------------------------------
    def observe(self, node: dict[str, Any]) -> None:
        """Keep *node* if it is not older than the copy."""
        with self._node_lock:
            newer = self._node is None or rv_number(node) >= rv_number(self._node)
            if newer:
                self._node = node
                self._version += 1
        if newer:
            self._copied()

    def _copied(self) -> None:
        if self._on_copy is not None:
            try:
                self._on_copy()
            except Exception:  # a metrics hook must not break the watch or a write
                log.exception("node %s: the copy's hook failed", self.node_name)

    def read(self) -> dict[str, Any]:
        """GET the Node (and keep it)."""
        node = self.rest.json("GET", node_path(self.node_name), timeout=self.request_timeout)
        self.observe(node)
        return node

    def current(self, *, fresh: bool) -> dict[str, Any]:
        """The copy, or a GET when *fresh* or when there is none."""
        with self._node_lock:
            cached = self._node
        if cached is not None and not fresh:
            return cached
        return self.read()

    @property
    def version(self) -> int:
        """Counts the changes of the copy: a reader keys its own parse of the Node on it, instead of
        copying and parsing the Node again whenever it looks."""
        with self._node_lock:
            return self._version

    @property
    def latest(self) -> dict[str, Any] | None:
        """The last seen Node itself, not a copy: only to read (the metrics of what it shows)."""
        with self._node_lock:
            return self._node

    @property
    def node(self) -> dict[str, Any] | None:
        """A deep copy of the last seen Node (API JSON)."""
        with self._node_lock:
            return json.loads(json.dumps(self._node)) if self._node is not None else None

    # -- the thread ----------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the watch (daemon thread); a running one is left as it is."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"node-watch-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the watch; returns within *timeout* seconds."""
        self._stop.set()
        self.synced.clear()
        w = self._watch
        if w is not None:
            with contextlib.suppress(Exception):
                w.stop()
        t = self._thread
        if t is not None:
            t.join(timeout)

    def _seen(self, node: dict[str, Any]) -> None:
        self.observe(node)
        self._on_node(node)

    def _loop(self) -> None:
        backoff = 0.5
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    node = self.read()
                    rv = str(node["metadata"]["resourceVersion"])
                    self.synced.set()
                    self._seen(node)
                w = self.rest.watch(
                    "/api/v1/nodes",
                    query={
                        "fieldSelector": f"metadata.name={self.node_name}",
                        "resourceVersion": rv,
                        "timeoutSeconds": self.timeout_seconds,
                        "allowWatchBookmarks": True,
                    },
                    timeout=(5, self.timeout_seconds + 15),
                )
                self._watch = w
                if self._stop.is_set():
                    break
                for ev in w:
                    if self._stop.is_set():
                        break
                    obj = ev.get("object") or {}
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self._seen(obj)
                    elif ev.get("type") == "DELETED":
                        with self._node_lock:
                            self._node = None
                            self._version += 1
                        self._copied()
                        self.synced.clear()
                        rv = None
                backoff = 0.5
            except Exception as exc:
                if self._stop.is_set():
                    break
                if api_status(exc) == 410:
                    log.info("node %s: watch expired (410 Gone); listing again", self.node_name)
                    rv = None
                    continue
                log.warning(
                    "node %s: watch failed (%s); retrying in %.1fs",
                    self.node_name,
                    describe_error(exc),
                    backoff,
                )
                self.synced.clear()
                rv = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        self._watch = None


__all__ = ["NodeWatch", "OnNode"]

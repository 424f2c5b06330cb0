"""The DRA input of the checks (NVIDIA's DRA driver's devices on this node) from the agent's one
ResourceSlice list + watch (reporters/resource_slices.SliceWatch, shared with per-GPU isolation).

The watch costs one LIST, then one open WATCH (renewed every 5 minutes, with no LIST while the
server keeps the resourceVersion), so a node reads nothing per cycle; it starts only where it tells
something. A Node whose device plugin registers `nvidia.com/gpu` is judged on that: no watch for it
(unless `node.isolation` started one). A Node without it (a DRA-only node), or not read yet: the
first gpu cycle starts the watch and waits up to WAIT_S for its first list; until a list has
answered the input is a ProbeError (the check is `unknown`, so the validating taint stays).
"""

from __future__ import annotations

from collections.abc import Callable

from agent.core.dra import DraSlices
from agent.core.node import NodeObject
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.probes.dra_slices import slices_from_objects
from agent.reporters.resource_slices import SliceWatch

SOURCE = "ResourceSlices"
WAIT_S = 5.0  # the first read waits this long for the watch's first list


class SliceInput:
    """The DRA input's reader (an extra input of the engine): the watch's copy, parsed once per
    change of it."""

    def __init__(
        self,
        watch: SliceWatch,
        node: Callable[[], Probed[NodeObject]],
        wait_s: float = WAIT_S,
    ) -> None:
        self.watch, self.node, self.wait_s = watch, node, wait_s
        self._parsed: tuple[tuple[tuple[str, str], ...], Probed[DraSlices]] | None = None

    def __call__(self) -> Probed[DraSlices]:
        if not self.watch.synced.is_set():
            node = self.node()
            if isinstance(node, NodeObject) and node.plugin_gpus > 0:
                return NotCaptured(f"{SOURCE} (not watched: the device plugin publishes nvidia.com/gpu)")
            self.watch.start()  # a running one is kept
            if not self.watch.wait_synced(self.wait_s):
                return ProbeError(
                    SOURCE,
                    ProbeErrorKind.UNAVAILABLE,
                    f"this node's {SOURCE} are not listed yet (resource.k8s.io/v1; the watch retries)",
                )
        objects = self.watch.objects() or []
        versions = tuple(
            sorted(
                (str(meta.get("name") or ""), str(meta.get("resourceVersion") or ""))
                for meta in (o.get("metadata") or {} for o in objects)
            )
        )
        if self._parsed is not None and self._parsed[0] == versions:
            return self._parsed[1]
        parsed: Probed[DraSlices]
        try:
            parsed = slices_from_objects(objects, self.watch.node_name)
        except ParseError as exc:
            parsed = ProbeError(SOURCE, ProbeErrorKind.UNREADABLE, str(exc))
        self._parsed = (versions, parsed)
        return parsed


__all__ = ["SliceInput"]

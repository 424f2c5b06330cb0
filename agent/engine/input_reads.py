"""How the engine reads an input (engine/engine.py runs the tiers): its reader (the source's, an
input nothing reads here, or one the wiring gives: the DCGM poller and diag runner), within
`timeouts.check`. A probe stuck in the kernel (a sysfs read of a dying device) costs one parked
thread and an `unknown`, never the loop; a read still stuck from last time is not started again; a
probe's bug is "could not look", never a stopped loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.core.facts import Input
from agent.core.gpu import GpuInventory
from agent.core.probed import ProbeError, ProbeErrorKind
from agent.core.telemetry import Telemetry
from agent.core.workloads import GpuIdentity, gpu_holders
from agent.probes.bounded import Bounded, StillStuck, TimedOut
from agent.probes.inputs import source_readers, unread_readers
from agent.probes.source import Source

Holders = Callable[[], dict[int, tuple[str, ...]]]
log = logging.getLogger("gpu-healthcheck.engine")


class InputReads:
    def __init__(self, metrics: Telemetry, limit_s: Callable[[], float]) -> None:
        self.metrics = metrics
        self.limit_s = limit_s  # timeouts.check, as the config in force says
        self.readers: dict[Input, Callable[[], Any]] = {}
        self._bounded = Bounded()  # per input: a read stuck past its limit is parked, not restarted

    def set_readers(self, source: Source, extra: dict[Input, Callable[[], Any]]) -> None:
        self.readers = {**unread_readers(), **source_readers(source), **extra}

    def read(self, name: Input) -> Any:
        value = self.bounded(name.value, self.readers[name])
        if isinstance(value, ProbeError):
            self.metrics.record_probe_error(name.value, value.kind.value)
        return value

    def bounded(self, name: str, reader: Callable[[], Any]) -> Any:
        """reader(), or the ProbeError that says why it could not look."""
        limit = self.limit_s()

        def guarded() -> Any:
            try:
                return reader()
            except Exception as exc:  # a probe bug must not stop the loop: record "could not look"
                log.exception("probe failed", extra={"tier": name})
                return ProbeError(
                    name, ProbeErrorKind.UNREADABLE, f"internal error: {type(exc).__name__}: {exc}"
                )

        try:
            return self._bounded.run(name, guarded, limit, thread_name=f"probe-{name}")
        except StillStuck:
            return ProbeError(
                name, ProbeErrorKind.TIMEOUT, f"still stuck from an earlier read (> {limit:g} s)"
            )
        except TimedOut:
            log.error(f"probe {name} did not finish in {limit:g} s", extra={"tier": name})
            return ProbeError(name, ProbeErrorKind.TIMEOUT, f"did not finish in {limit:g} s")

    def holders(self, workloads: Callable[[], Any] | None, inventory: Callable[[], Any]) -> Holders | None:
        """Who holds each GPU, as the kubelet says (*workloads*, None where there is none to ask), to
        be asked only when a GPU has a finding: GPU index -> its containers, {} when it cannot be
        asked."""
        if workloads is None:
            return None

        def ask() -> dict[int, tuple[str, ...]]:
            containers, inv = self.bounded("pod-resources", workloads), inventory()
            if isinstance(containers, ProbeError) or not isinstance(inv, GpuInventory):
                return {}
            return gpu_holders(containers, [GpuIdentity(g.index, g.uuid) for g in inv.gpus])[0]

        return ask


__all__ = ["InputReads"]

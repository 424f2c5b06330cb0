"""The dcgm-health tier: health watches on every GPU (and NVSwitch) of the engine, polled into a HealthReport.

Watches are set once per connection generation (an engine restart loses them, dcgm.md §0.7) on all
supported systems (DCGM_HEALTH_WATCH_ALL). An incident repeats on every check while its sample is the
latest (dcgm.md §0.10), so the poller keeps the keys it saw last time: `new_keys` lists only incidents
that appeared since the previous poll (for logs and events); the findings themselves carry stable keys.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from agent.core.dcgm_report import HealthIncident, HealthReport, WatchedGpu
from agent.core.probed import Probed, ProbeError, ProbeErrorKind
from agent.probes.dcgm.bindings import DCGM_FE_GPU, DCGM_FE_SWITCH
from agent.probes.dcgm.client import DcgmClient, EngineUnavailable

log = logging.getLogger(__name__)
DCGM_HEALTH_WATCH_ALL = 0xFFFFFFFF
SOURCE = "dcgm health"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def incident_key(i: HealthIncident) -> str:
    return f"{i.system}/{i.code}/{i.entity_group}-{i.entity_id}"


class HealthPoller:
    """poll() → HealthReport, or ProbeError (unknown) while the engine is unreachable.

    single_node_nvswitch: None = infer (NVSwitch entities visible on this node ⇒ an HGX-style
    single-node NVSwitch system; multi-node NVLink racks keep their switches off the node)."""

    def __init__(
        self,
        client: DcgmClient,
        *,
        systems: int = DCGM_HEALTH_WATCH_ALL,
        update_interval_s: float = 30.0,
        max_keep_age_s: float = 600.0,
        single_node_nvswitch: bool | None = None,
        engines_on_node: Callable[[], list[str]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.systems = systems
        self.update_interval_s = update_interval_s
        self.max_keep_age_s = max_keep_age_s
        self.single_node_nvswitch = single_node_nvswitch
        self.engines_on_node = engines_on_node
        self._clock = clock
        self._group: Any = None
        self._generation = -1
        self._switches = 0
        self._watched: tuple[WatchedGpu, ...] = ()
        self._seen: set[str] = set()
        self.new_keys: tuple[str, ...] = ()

    def _setup(self) -> None:
        c, b = self.client, self.client.bindings

        def entities(kind: int) -> list[int]:
            return c.call(
                "dcgmGetEntityGroupEntities",
                lambda h: list(h.GetSystem().discovery.GetEntityGroupEntities(kind, True)),
            )

        gpus = entities(DCGM_FE_GPU)
        try:
            switches = entities(DCGM_FE_SWITCH)
        except EngineUnavailable:
            raise
        except Exception:  # engines without the NvSwitch module
            switches = []
        group = c.call(
            "dcgmGroupCreate",
            lambda h: b.pydcgm.DcgmGroup(
                h,
                groupName=f"gpu-healthcheck-health-{os.getpid()}",
                groupType=getattr(b.dcgm_structs, "DCGM_GROUP_EMPTY", 0),
            ),
        )
        self._group, self._switches = group, len(switches)  # held from here: released on any failure

        def add(kind: int, eid: int) -> Callable[[Any], None]:
            return lambda h: group.AddEntity(kind, eid)

        for kind, ids in ((DCGM_FE_GPU, gpus), (DCGM_FE_SWITCH, switches)):
            for eid in ids:
                c.call("dcgmGroupAddEntity", add(kind, eid))

        def watch(h: Any) -> None:
            try:
                group.health.Set(
                    self.systems, int(self.update_interval_s * 1_000_000), float(self.max_keep_age_s)
                )
            except TypeError:  # older bindings: Set(mask) only (30 s / 600 s defaults)
                group.health.Set(self.systems)

        c.call("dcgmHealthSet", watch)
        self._watched = self._named(gpus)
        log.info("DCGM health watches set on %d GPU(s), %d NVSwitch(es)", len(gpus), len(switches))

    def _named(self, gpus: list[int]) -> tuple[WatchedGpu, ...]:
        """The watched GPUs with the PCI address the engine gives each (dcgmGetDeviceAttributes), so
        that dcgm-health can name a GPU NVML sees and the engine does not watch. Asked once per
        connection; an engine or bindings that cannot say leave the addresses empty (counted only)."""
        named: list[WatchedGpu] = []

        def attributes(gid: int) -> Callable[[Any], Any]:
            return lambda h: h.GetSystem().discovery.GetGpuAttributes(gid)

        for gid in gpus:
            try:
                attrs = self.client.call("dcgmGetDeviceAttributes", attributes(gid))
                pci = _text(attrs.identifiers.pciBusId).strip()
            except EngineUnavailable:
                raise
            except Exception as exc:  # an older engine or bindings: count them, name none
                log.info("DCGM does not name its GPUs' PCI addresses (%s: %s)", type(exc).__name__, exc)
                return tuple(WatchedGpu(g) for g in gpus)
            named.append(WatchedGpu(gid, pci))
        return tuple(named)

    def _check(self) -> HealthReport:
        self.client.handle()  # (re)connected: the generation is current
        if self._group is None or self._generation != self.client.generation:
            self._group = None  # made on a closed connection: the engine freed it with that connection
            self._generation = self.client.generation
            self._setup()
        group = self._group
        resp = self.client.call("dcgmHealthCheck", lambda h: group.health.Check())
        incidents = tuple(
            HealthIncident(
                system=int(inc.system),
                health=int(inc.health),
                code=int(inc.error.code),
                message=_text(inc.error.msg).strip(),
                entity_group=int(inc.entityInfo.entityGroupId),
                entity_id=int(inc.entityInfo.entityId),
            )
            for inc in list(resp.incidents)[: int(resp.incidentCount)]
        )
        single = self.single_node_nvswitch if self.single_node_nvswitch is not None else self._switches > 0
        return HealthReport(
            overall=int(resp.overallHealth),
            incidents=incidents,
            single_node_nvswitch=single,
            polled_at=self._clock(),
            engine=self.client.address,
            engines_on_node=self._engines(),
            gpus_watched=self._watched,
        )

    def _engines(self) -> tuple[str, ...] | None:
        """The DCGM engines in this node's pods (engines.py), or None when they cannot be listed."""
        if self.engines_on_node is None:
            return None
        try:
            return tuple(self.engines_on_node())
        except Exception as exc:  # no API access: a missing signal, not a finding
            log.warning("cannot list the DCGM engines on this node: %s", exc)
            return None

    def _release_group(self) -> None:
        """Delete our group on the engine before the next poll makes a new one. The engine has 64 groups
        for all its clients together (DCGM_MAX_NUM_GROUPS) and keeps each until deleted or its
        connection closes: one leaked per failed poll would soon starve dcgm-exporter too."""
        group, self._group = self._group, None
        if group is None or self._generation != self.client.generation:
            return
        try:
            self.client.call("dcgmGroupDestroy", lambda h: group.Delete())
        except EngineUnavailable:  # gone or given up with its connection, which frees it
            return
        except Exception as exc:  # cannot free it: drop the connection, which frees every group on it
            self.client.drop(f"could not delete DCGM group after a failed poll ({type(exc).__name__}: {exc})")

    def poll(self) -> Probed[HealthReport]:
        """The report; or ProbeError: TIMEOUT while the engine does not answer (a call past its
        deadline, and until a call answers again), UNAVAILABLE while it cannot be reached."""
        try:
            report = self._check()
        except EngineUnavailable as exc:
            self._group = None  # the connection is gone or given up, and its groups with it
            kind = ProbeErrorKind.TIMEOUT if self.client.wedged is not None else ProbeErrorKind.UNAVAILABLE
            return ProbeError(SOURCE, kind, str(exc))
        except Exception as exc:  # an answer we did not expect: cannot judge, say so
            self._release_group()
            return ProbeError(SOURCE, ProbeErrorKind.TOOL_FAILED, f"{type(exc).__name__}: {exc}")
        keys = {incident_key(i) for i in report.incidents}
        self.new_keys = tuple(sorted(keys - self._seen))
        self._seen = keys
        for k in self.new_keys:
            log.warning("new DCGM health incident %s", k)
        return report

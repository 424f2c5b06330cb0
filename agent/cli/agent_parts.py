"""The long-lived parts `gpu-healthcheck agent` builds beside the engine (cli/agent.py wires them):
the live DCGM tiers as a reloadable part, the window an active check's diag waits for, and this
node's DRA device taints."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.config import Config
from agent.config.live_part import LivePart
from agent.core.facts import Input
from agent.engine.engine import Engine
from agent.engine.loop import Agent
from agent.reporters.metrics import Metrics

if TYPE_CHECKING:
    from agent.core.active_checks import ActiveState
    from agent.probes.dcgm.tiers import DcgmTiers
    from agent.probes.dcgm.window import DiagWindow
    from agent.probes.sdc_probe import SdcTier
    from agent.reporters.brake import Brake
    from agent.reporters.node_writer import NodeWriter

log = logging.getLogger("gpu-healthcheck.agent")

DCGM_CHECKS = ("dcgm-health", "dcgm-diag")


def validation_diag_level(engine: Engine) -> int | None:
    """node.validate.diagLevel while the node is not validated since the agent's start (or a clear)."""
    return None if engine.validation.complete else engine.cfg.node.validate.diag_level


def read_tier_now(agent: Agent, tier: str) -> None:
    """An active check's thread changed what the Node must show (an SDC run completed; the testing
    taint wished on or off for the check of *tier*): the loop runs that tier now, which starts no
    check of another kind."""
    agent.engine.schedule.next_due[tier] = 0.0
    agent.poke.set()


def read_diag_now(agent: Agent) -> None:
    """A DCGM diag finished (its thread): the loop reads it now, not one dcgmDiag interval later."""
    agent.engine.schedule.next_due["dcgm-diag"] = 0.0
    agent.poke.set()


class DcgmPart:
    """The live DCGM tiers as a LivePart (config/live_part.py): built from the config when a DCGM
    check is on; a reload with a new address or timeouts, or one that switches a DCGM check on,
    rebuilds them and hands the engine the new inputs. *loop*: the agent's loop (built after this
    part, which gives it its inputs); called only once the loop runs."""

    def __init__(
        self,
        metrics: Metrics,
        pods: Callable[[], list[str]] | None,
        engines: Callable[[], list[str]] | None = None,
        *,
        dcgm_wanted: bool,
        loop: Callable[[], Agent],
        api_inputs: dict[Input, Callable[[], Any]] | None = None,
        window: DiagWindow | None = None,
    ) -> None:
        self.metrics, self.pods, self.engines, self.loop = metrics, pods, engines, loop
        self.dcgm_wanted = dcgm_wanted  # a snapshot-backed agent reads DCGM from the snapshot
        self.dcgm: DcgmTiers | None = None
        # Inputs read from the API (the DRA driver's devices: reporters/published_slices.py), kept
        # beside the DCGM ones when a reload rebuilds those.
        self.api_inputs = dict(api_inputs or {})
        # Active checks (core/active_checks.py): the window a diag waits for (live DCGM with an API
        # server only).
        self.window = window
        self.sdc: SdcTier | None = None  # the SDC probe (probes/sdc_probe.py), in the same window

    def sdc_inputs(self, cfg: Config) -> dict[Input, Callable[[], Any]]:
        """The SDC probe's tier where sdc.address is set, the check on and a window to run in; kept
        across a reload that leaves `sdc:` as it was."""
        wanted = bool(cfg.sdc.address) and cfg.enabled("sdc") and self.window is not None
        old = self.sdc
        if old is not None and (not wanted or old.cfg.sdc != cfg.sdc):
            old.stop()
            self.sdc = None
        if wanted and self.window is not None and self.sdc is None:
            from agent.probes.pod_resources import gpu_pods
            from agent.probes.sdc_probe import SdcTier

            self.sdc = SdcTier(
                cfg,
                self.window,
                self.pods or gpu_pods(),
                on_done=lambda: read_tier_now(self.loop(), "sdc-probe"),
            )
            if old is not None and not old.runner.in_progress:
                self.sdc.runner.latest = old.runner.latest  # the last run's result stays in force
        elif self.sdc is not None:
            self.sdc.cfg = cfg  # its retry pace reads node.activeChecks and intervals.sdcProbe
        return self.sdc.inputs() if self.sdc is not None else {}

    def dcgm_inputs(self, cfg: Config) -> tuple[dict[Input, Callable[[], Any]], Callable[[], str] | None]:
        """(Re)build the DCGM tiers on the configured engine when a DCGM check is on."""
        sdc = self.sdc_inputs(cfg)
        if not self.dcgm_wanted or not any(cfg.enabled(c) for c in DCGM_CHECKS):
            return {**self.api_inputs, **sdc}, None
        from agent.probes.dcgm.tiers import DcgmTiers
        from agent.probes.pod_resources import gpu_pods

        old, self.dcgm = (
            self.dcgm,
            DcgmTiers(
                cfg,
                self.pods or gpu_pods(),
                self.metrics,
                engines_on_node=self.engines,
                wanted_level=lambda: validation_diag_level(self.loop().engine),
                on_done=lambda: read_diag_now(self.loop()),
                window=self.window,
            ),
        )
        if old is not None:
            if not old.runner.in_progress:
                self.dcgm.runner.latest = old.runner.latest  # the last diag's result stays in force
            old.stop()  # a diag waiting for a window stops waiting
            old.health.client.close()  # a diag still running on the old client finishes on its own
        return {**self.api_inputs, **sdc, **self.dcgm.inputs()}, self.dcgm.progress

    def apply_config(self, old: Config, new: Config) -> None:
        dcgm_on = [new.enabled(c) for c in DCGM_CHECKS]
        sdc_changed = new.sdc != old.sdc or new.enabled("sdc") != old.enabled("sdc")
        if new.dcgm != old.dcgm or (self.dcgm is None and any(dcgm_on)) or sdc_changed:
            engine = self.loop().engine
            waiting = self.dcgm is not None and self.dcgm.waiting
            engine.set_inputs(*self.dcgm_inputs(new))
            if waiting:  # the diag that waited for a window waits on the new tiers
                engine.schedule.next_due["dcgm-diag"] = 0.0
            log.info(f"DCGM client rebuilt for {new.dcgm.address}", extra={"event": "config"})


def active_window(
    core: Any,
    node_name: str,
    namespace: str,
    brake: Brake,
    writer: NodeWriter,
    start: Config,
    pods: Callable[[], list[str]] | None,
    loop: Callable[[], Agent],
    metrics: Metrics,
) -> tuple[ActiveState, DiagWindow, tuple[LivePart, ...]]:
    """The window a DCGM diag waits for (probes/dcgm/window.py) and the state it shares with the
    engine: the fleet slot and the pods arriving (reporters/active_checks.py), the testing taint
    through the engine's Marks (its writes poke the loop as a finished diag does). The slot, the
    taint and the window (its retry pace) are parts (config/live_part.py) that read *start* and each
    reload."""
    from agent.core.active_checks import ActiveState
    from agent.probes.dcgm.window import DiagWindow
    from agent.probes.pod_resources import gpu_pods
    from agent.reporters.active_checks import FleetSlots, NodeHold, PodArrivals

    state = ActiveState()
    slots = FleetSlots(
        core,
        node_name,
        namespace=namespace,
        brake=brake,
        cfg=start,
        node_uid=lambda: str(((writer.node or {}).get("metadata") or {}).get("uid") or "") or None,
    )
    hold = NodeHold(
        state,
        cfg=start,
        node=lambda: writer.node,
        poke=lambda: read_tier_now(loop(), window.holding_tier),  # the check that holds it
    )
    window = DiagWindow(
        state,
        slots,
        hold,
        PodArrivals(core, node_name, pods or gpu_pods()),
        cfg=start,
        metrics=metrics,
    )
    return state, window, (slots, hold, window)


def device_taints(core: Any, node_name: str, cfg: Config, metrics: Metrics, dry_run: bool) -> Any:
    """This node's DRA device taints (node.isolation; reporters/device_taints)."""
    from agent.reporters.device_taints import DeviceTaints

    return DeviceTaints(
        core,
        node_name,
        prefix=cfg.prefix,
        dry_run=dry_run,
        on_write=lambda kind, outcome: metrics.node_writes.labels(kind, outcome).inc(),
    )

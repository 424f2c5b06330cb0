"""`gpu-healthcheck agent`: the DaemonSet process. Wires probes, engine, Node writer, metrics, config
reload and signals together."""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.checks.registry import RULE_BOOK
from agent.config import Config, default_config_dir
from agent.config.last_good import load_at_start
from agent.core.facts import Input
from agent.core.node import NodeObject
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.engine.engine import Engine
from agent.engine.loop import Agent
from agent.probes.live import LiveSource
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import KMSG, SnapshotSource
from agent.probes.source import Source
from agent.reporters.http import serve_http
from agent.reporters.kube_rest import KubeRest, client_modules
from agent.reporters.metrics import Metrics

if TYPE_CHECKING:
    from agent.core.active_checks import ActiveState
    from agent.probes.dcgm.tiers import DcgmTiers
    from agent.probes.dcgm.window import DiagWindow
    from agent.reporters.brake import Brake
    from agent.reporters.fence import FenceProof
    from agent.reporters.fence_guard import FenceGuard, GuardedWriter
    from agent.reporters.node_writer import NodeWriter

BRAKE_WARM_JITTER_S = 30.0


def fence_guard(core: Any, node_name: str, prefix: str, metrics: Metrics) -> FenceGuard:
    """The admission fence's proof (reporters/fence.py) and the guard that holds every Node write of
    an identity marked to be fenced that the fence does not hold (reporters/fence_guard.py)."""
    from agent.reporters.fence import prove_fence, report_fence
    from agent.reporters.fence_guard import FenceGuard

    def reported(proof: FenceProof) -> None:
        report_fence(proof)
        metrics.record_fence(proof.result.value)

    return FenceGuard(lambda: prove_fence(core, node_name, prefix), reported)


log = logging.getLogger("gpu-healthcheck.agent")
ETC_CONFIG = Path("/etc/gpu-healthcheck")
ETC_CANARY = Path("/etc/gpu-healthcheck-canary")  # the optional canary ConfigMap (config/canary.py)


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # the kubelet's mount


def kube_core(kubeconfig: str | None, service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeRest:
    """The API client: raw JSON over the official client's transport (kube_rest says why). In a pod
    (KUBERNETES_SERVICE_HOST set, no --kubeconfig) the client's in-cluster loader reads the service
    account's token (re-read as the kubelet rotates it) and CA from *service_account_dir*; else the
    client's kubeconfig loader (--kubeconfig, $KUBECONFIG, ~/.kube/config), which a pod never loads."""
    client_modules()
    from kubernetes.client.configuration import Configuration

    cfg = Configuration()
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        from kubernetes.config.incluster_config import InClusterConfigLoader

        loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(service_account_dir / "token"),
            cert_filename=str(service_account_dir / "ca.crt"),
        )
        loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
    else:
        from kubernetes.config.kube_config import load_kube_config

        load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    return KubeRest(cfg)


def reproving(
    vet: Callable[[Config], str | None] | None, guard: FenceGuard
) -> Callable[[Config], str | None] | None:
    """The reload's vet, which also proves the fence again (a reload is not steady state)."""
    if vet is None:
        return None

    def again(cfg: Config) -> str | None:
        guard.prove_now()
        return vet(cfg)

    return again


DCGM_CHECKS = ("dcgm-health", "dcgm-diag")
DEFAULT_NAMESPACE = "gpu-healthcheck"  # manifests/: where the repair budget's records live


def agent_namespace(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> str:
    """The agent's own namespace (the repair budget's records): $POD_NAMESPACE, else the service
    account's (in a pod), else the namespace manifests/ installs into."""
    env = os.environ.get("POD_NAMESPACE", "").strip()
    if env:
        return env
    try:
        return (service_account_dir / "namespace").read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def validation_diag_level(engine: Engine) -> int | None:
    """node.validate.diagLevel while the node is not validated since the agent's start (or a clear)."""
    return None if engine.validation.complete else engine.cfg.node.validate.diag_level


def read_diag_now(agent: Agent) -> None:
    """A DCGM diag finished (its thread): the loop reads it now, not one dcgmDiag interval later."""
    agent.engine.schedule.next_due["dcgm-diag"] = 0.0
    agent.poke.set()


class LiveParts:
    """What the wiring builds from the config, and how a reload reaches it: the writer's condition
    type, the brake's selector and limits, the probes' timeouts, and the DCGM client (rebuilt on a
    new address or timeouts, or when a DCGM check is switched on). The engine reads the rest (checks,
    severities, thresholds, intervals, the taint policy) from the config it is handed."""

    def __init__(
        self,
        source: Source,
        writer: NodeWriter | None,
        brake: Brake | None,
        metrics: Metrics,
        pods: Callable[[], list[str]] | None,
        engines: Callable[[], list[str]] | None = None,
        *,
        dcgm_wanted: bool,
    ) -> None:
        self.source, self.writer, self.brake, self.metrics, self.pods = source, writer, brake, metrics, pods
        self.engines = engines
        self.dcgm_wanted = dcgm_wanted  # a snapshot-backed agent reads DCGM from the snapshot
        self.dcgm: DcgmTiers | None = None
        # Set once the agent exists: the diag level a pending validation needs, and a finished
        # diag's wake-up (engine/validation.py; main() wires them to the agent's engine and loop).
        self.wanted_level: Callable[[], int | None] = lambda: None
        self.diag_done: Callable[[], None] = lambda: None
        # Inputs read from the API (the DRA driver's devices: reporters/published_slices.py), kept
        # beside the DCGM ones when a reload rebuilds those.
        self.api_inputs: dict[Input, Callable[[], Any]] = {}
        # Active checks (core/active_checks.py): the window a diag waits for (live DCGM with an API
        # server only), and the config in force (the agent's, once it exists).
        self.window: DiagWindow | None = None
        self.cfg: Callable[[], Config | None] = lambda: None

    def dcgm_inputs(self, cfg: Config) -> tuple[dict[Input, Callable[[], Any]], Callable[[], str] | None]:
        """(Re)build the DCGM tiers on the configured engine when a DCGM check is on."""
        if not self.dcgm_wanted or not any(cfg.enabled(c) for c in DCGM_CHECKS):
            return dict(self.api_inputs), None
        from agent.probes.dcgm.tiers import DcgmTiers
        from agent.probes.pod_resources import gpu_pods

        old, self.dcgm = (
            self.dcgm,
            DcgmTiers(
                cfg,
                self.pods or gpu_pods(),
                self.metrics,
                engines_on_node=self.engines,
                wanted_level=lambda: self.wanted_level(),
                on_done=lambda: self.diag_done(),
                window=self.window,
                retry_s=lambda: (self.cfg() or cfg).node.active_checks.retry_s,
            ),
        )
        if old is not None:
            if not old.runner.in_progress:
                self.dcgm.runner.latest = old.runner.latest  # the last diag's result stays in force
            old.stop()  # a diag waiting for a window stops waiting
            old.health.client.close()  # a diag still running on the old client finishes on its own
        return {**self.api_inputs, **self.dcgm.inputs()}, self.dcgm.progress

    def diag_done_now(self) -> None:
        """Wake the loop now (a wish of the diag thread for the Node: the testing taint)."""
        self.diag_done()

    def reconfigure(self, engine: Engine, old: Config, new: Config) -> None:
        if self.writer is not None:
            self.writer.set_condition_type(new.node.condition_type)
        if self.writer is not None and self.writer.repair is not None:
            self.writer.repair.reconfigure(new.node.repair_budget, new.node.wave_hold)
        if self.brake is not None:
            n = new.node
            self.brake.reconfigure(
                selectors=new.gpu_node_selection,
                max_fraction=n.max_tainted_fraction,
                max_nodes=n.max_tainted_nodes,
                min_severity=n.taint_min_severity.label,
            )
        if isinstance(self.source, LiveSource):
            self.source.timeout_s = new.timeouts.nvidia_smi
            self.source.nvml_timeout_s = new.timeouts.nvml
            self.source.check_timeout_s = new.timeouts.check
        dcgm_on = [new.enabled(c) for c in DCGM_CHECKS]
        if new.dcgm != old.dcgm or (self.dcgm is None and any(dcgm_on)):
            waiting = self.dcgm is not None and self.dcgm.waiting
            engine.set_inputs(*self.dcgm_inputs(new))
            if waiting:  # the diag that waited for a window waits on the new tiers
                engine.schedule.next_due["dcgm-diag"] = 0.0
            log.info(f"DCGM client rebuilt for {new.dcgm.address}", extra={"event": "config"})


SLOT_SLACK_S = 180.0  # a slot outlives diagTimeout by the watchdog's margin, the taint's wait and this


def active_window(
    core: Any, node_name: str, namespace: str, brake: Brake, writer: NodeWriter, live: LiveParts
) -> tuple[ActiveState, DiagWindow]:
    """The window a DCGM diag waits for (probes/dcgm/window.py) and the state it shares with the
    engine: the fleet slot and the pods arriving (reporters/active_checks.py), the testing taint
    through the engine's Marks (its writes poke the loop as a finished diag does)."""
    from agent.core.active_checks import ActiveState
    from agent.probes.dcgm.window import DiagWindow
    from agent.probes.pod_resources import gpu_pods
    from agent.reporters.active_checks import FleetSlots, NodeHold, PodArrivals

    def cfg() -> Config:
        now = live.cfg()
        assert now is not None
        return now

    state = ActiveState()
    slots = FleetSlots(
        core,
        node_name,
        namespace=namespace,
        prefix=cfg().prefix,
        brake=brake,
        policy=lambda: cfg().node.active_checks,
        expire_s=lambda: cfg().dcgm.diag_timeout + SLOT_SLACK_S,
        node_uid=lambda: str(((writer.node or {}).get("metadata") or {}).get("uid") or "") or None,
    )
    hold = NodeHold(
        state,
        prefix=cfg().prefix,
        mode=lambda: cfg().node.mode,
        node=lambda: writer.node,
        poke=live.diag_done_now,
    )
    return state, DiagWindow(state, slots, hold, PodArrivals(core, node_name, live.pods or gpu_pods()))


def isolating_writer(
    core: Any,
    node_name: str,
    cfg: Config,
    writer: Any,
    brake: Any,
    metrics: Metrics,
    dry_run: bool,
    slices: Any = None,
) -> Any:
    """The Node writer behind per-GPU isolation (node.isolation; reporters/device_isolation);
    *slices*: the node's ResourceSlice watch, shared with the checks' DRA input."""
    from agent.reporters.device_isolation import IsolatingWriter
    from agent.reporters.device_taints import DeviceTaints, tainted_nodes
    from agent.reporters.resource_slices import SliceWatch

    taints = DeviceTaints(
        core,
        node_name,
        prefix=cfg.prefix,
        dry_run=dry_run,
        on_write=lambda kind, outcome: metrics.node_writes.labels(kind, outcome).inc(),
    )
    if brake is not None:  # the brake counts device taints, in the version the writer discovered
        brake.also_tainted = lambda: tainted_nodes(core, cfg.prefix, api=taints.served)
    return IsolatingWriter(
        writer,
        slices or SliceWatch(core, node_name),
        taints,
        lambda: cfg.node.isolation,
        brake=brake,
        metrics=metrics,
    )


def main(args: Any) -> int:
    from agent.reporters import logs

    logs.setup(os.environ.get("GPU_HEALTHCHECK_LOG_LEVEL", "info"))
    config_dir = args.config_dir or (ETC_CONFIG if ETC_CONFIG.is_dir() else default_config_dir())
    canary_dir = getattr(args, "canary_config_dir", None) or (ETC_CANARY if ETC_CANARY.is_dir() else None)
    state_dir = args.state_dir
    node_name = args.node or os.environ.get("NODE_NAME")
    if not node_name:
        log.error("no node name: pass --node or set NODE_NAME (downward API)")
        return 64
    core = None
    vet: Callable[[Config], str | None] | None = None
    if not args.no_kube:
        from agent.reporters.config_proof import config_vetter

        core = kube_core(args.kubeconfig, getattr(args, "service_account_dir", None) or SERVICE_ACCOUNT_DIR)
        vet = config_vetter(core, node_name)  # the admission fence must allow the config's types
    # An invalid (or newer) config, or one whose condition types the fence refuses, never stops the
    # agent: it runs on the last good one or the shipped defaults and says why (Event, metric,
    # condition reason; agent.config.last_good).
    start = load_at_start(config_dir, state_dir, RULE_BOOK, vet)
    cfg = start.config
    source: Source
    if args.from_snapshot:
        source = SnapshotSource(Path(args.from_snapshot))
        kernel_path, device = Path(args.from_snapshot) / KMSG, False
    else:
        t = cfg.timeouts
        source = LiveSource(timeout_s=t.nvidia_smi, nvml_timeout_s=t.nvml, check_timeout_s=t.check)
        kernel_path, device = Path("/dev/kmsg"), True
    writer: NodeWriter | None = None
    brake: Brake | None = None
    node_getter = None
    dra_input: Callable[[], Any] | None = None
    fence: threading.Thread | None = None
    guarded: GuardedWriter | None = None
    metrics = Metrics()
    if isinstance(source, LiveSource):
        source.telemetry = metrics  # tool latency (gpu_healthcheck_tool_seconds)
    if core is not None:
        from agent.reporters.brake import Brake
        from agent.reporters.fence_guard import GuardedWriter
        from agent.reporters.node_writer import NodeWriter
        from agent.reporters.repair_budget import RepairBudget

        brake = Brake(
            core,
            selectors=cfg.gpu_node_selection,
            node_name=node_name,
            on_count=metrics.record_gpu_nodes,
            max_fraction=cfg.node.max_tainted_fraction,
            max_nodes=cfg.node.max_tainted_nodes,
            prefix=cfg.prefix,
            min_severity=cfg.node.taint_min_severity.label,
        )
        if not getattr(args, "once", False):
            # The fleet's GPU-node total, read ahead of any taint; spread over a DaemonSet rollout.
            brake.warm(random.uniform(0, BRAKE_WARM_JITTER_S))
        guard = fence_guard(core, node_name, cfg.prefix, metrics)
        fence = guard.start()
        sa_dir = getattr(args, "service_account_dir", None) or SERVICE_ACCOUNT_DIR
        repair = RepairBudget(
            core,
            node_name,
            namespace=agent_namespace(sa_dir),
            brake=brake,
            budget=cfg.node.repair_budget,
            wave=cfg.node.wave_hold,
            prefix=cfg.prefix,
        )
        writer = NodeWriter(
            core,
            node_name,
            prefix=cfg.prefix,
            condition_type=cfg.node.condition_type,
            brake=brake,
            dry_run=args.dry_run,
            on_write=lambda kind, outcome: metrics.node_writes.labels(kind, outcome).inc(),
            on_refused=metrics.record_write_refused,
            on_state=metrics.record_node_state,
            repair=repair,
        )
        from agent.reporters.published_slices import SliceInput
        from agent.reporters.resource_slices import SliceWatch

        slices = SliceWatch(core, node_name)  # one watch: per-GPU isolation and the DRA input
        isolating = isolating_writer(core, node_name, cfg, writer, brake, metrics, args.dry_run, slices)
        guarded = GuardedWriter(isolating, guard)
        vet = reproving(vet, guard)

        parsed: list[tuple[int, Probed[NodeObject]]] = []  # (writer.node_version, the Node parsed)

        def node_getter() -> Probed[NodeObject]:
            """The watched Node, parsed once per change of it (the engine asks several times a cycle)."""
            version = writer.node_version
            if parsed and parsed[0][0] == version:
                return parsed[0][1]
            current = writer.node
            node: Probed[NodeObject]
            if current is None:
                node = NotCaptured("Node object (not read yet)")
            else:
                try:
                    node = node_from_dict(current)
                except ParseError as exc:
                    node = ProbeError("Node object", ProbeErrorKind.UNREADABLE, str(exc))
            parsed[:] = [(version, node)]
            return node

        dra_input = SliceInput(slices, node_getter)

    from agent.probes.pod_resources import gpu_pods, list_devices

    pods = gpu_pods()  # the kubelet's PodResources API: this node's GPU holders, no API right
    engines = None
    if core is not None:
        from agent.cli.dcgm_engines import dcgm_engines_on_node

        engines = dcgm_engines_on_node(core, node_name)  # a second DCGM engine on this node
    live = LiveParts(source, writer, brake, metrics, pods, engines, dcgm_wanted=not args.from_snapshot)
    if dra_input is not None:
        live.api_inputs[Input.DRA] = dra_input  # the API's slices, a snapshot-backed node's too
    live.cfg = lambda: cfg
    active_state = None
    if core is not None and writer is not None and brake is not None and live.dcgm_wanted:
        sa_dir = getattr(args, "service_account_dir", None) or SERVICE_ACCOUNT_DIR
        active_state, live.window = active_window(
            core, node_name, agent_namespace(sa_dir), brake, writer, live
        )
    extra_inputs, progress = live.dcgm_inputs(cfg)
    agent = Agent(
        source,
        cfg,
        config_dir=config_dir,
        writer=guarded,
        node_getter=node_getter,
        kernel_path=kernel_path if kernel_path.exists() else None,
        kernel_is_device=device,
        metrics=metrics,
        extra_inputs=extra_inputs,
        progress=progress,
        config_problem=start.problem,
        state_dir=state_dir,
        workloads=None if args.from_snapshot else list_devices,  # who is hit: the kubelet says
        canary_dir=canary_dir,
        vet_config=vet,
        config_fence_refused=start.fence_refused,
    )
    agent.on_config = lambda old, new: live.reconfigure(agent.engine, old, new)
    if guarded is not None:
        isolating = guarded.writer
        isolating.isolation = lambda: agent.engine.cfg.node.isolation  # live on reload

        def reconfigure(old: Config, new: Config) -> None:
            live.reconfigure(agent.engine, old, new)
            isolating.rediscover()  # the DeviceTaintRule version is asked again at the next apply

        agent.on_config = reconfigure
    live.wanted_level = lambda: validation_diag_level(agent.engine)
    live.diag_done = lambda: read_diag_now(agent)
    live.cfg = lambda: agent.engine.cfg
    agent.engine.active = active_state  # the testing taint and `gpu-healthcheck diag` (engine/active.py)
    port = args.metrics_port if args.metrics_port is not None else cfg.metrics_port
    server = serve_http(port, metrics.registry, agent.healthy, agent.ready)
    signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
    signal.signal(signal.SIGINT, lambda *_: agent.request_stop())
    log.info(f"agent starting on node {node_name}", extra={"node": node_name, "event": "start"})
    agent.run(once=args.once)
    if fence is not None and args.once:
        fence.join(timeout=30)  # a one-shot run reports its fence too
    if server is not None:
        server.shutdown()
    return 0

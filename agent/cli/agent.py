"""`gpu-healthcheck agent`: the DaemonSet process. Wires probes, engine, Node writer, metrics, config
reload and signals together."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.checks.registry import RULE_BOOK
from agent.cli.agent_parts import DcgmPart, active_window, device_taints
from agent.config import Config, default_config_dir
from agent.config.last_good import load_at_start
from agent.config.live_part import LivePart
from agent.core.facts import Input
from agent.core.node import NodeObject
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.engine.loop import Agent
from agent.probes.live import LiveSource
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import KMSG, SnapshotSource
from agent.probes.source import Source
from agent.reporters.gpu_total import DEFAULT_SERVICE_ACCOUNT
from agent.reporters.http import serve_http
from agent.reporters.kube_rest import KubeRest, client_modules
from agent.reporters.metrics import Metrics

if TYPE_CHECKING:
    from agent.reporters.brake import Brake
    from agent.reporters.fence import FenceProof
    from agent.reporters.fence_guard import FenceGuard, GuardedWriter
    from agent.reporters.node_writer import NodeWriter


def fence_guard(
    core: Any, node_name: str, prefix: str, metrics: Metrics, records_namespace: str = ""
) -> FenceGuard:
    """The admission fence's proof (reporters/fence.py; the repair budget's records in
    *records_namespace* too) and the guard that holds every Node write of an identity marked to be
    fenced that the fence does not hold (reporters/fence_guard.py)."""
    from agent.reporters.fence import prove_fence, report_fence
    from agent.reporters.fence_guard import FenceGuard

    def reported(proof: FenceProof) -> None:
        report_fence(proof)
        metrics.record_fence(proof.result.value)

    return FenceGuard(lambda: prove_fence(core, node_name, prefix, records_namespace), reported)


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


def reads_live_dcgm(args: Any) -> bool:
    """The DCGM tiers (and the active checks' window) on the live host engine; a snapshot-backed agent
    reads DCGM from the snapshot."""
    return not args.from_snapshot


@dataclass(frozen=True)
class Wired:
    """What main() builds before the loop runs: the loop (its `parts` take every reload), the fence's
    first proof (a thread) and the metrics registry."""

    agent: Agent
    metrics: Metrics
    fence: threading.Thread | None
    metrics_port: int


def wire(args: Any) -> Wired | int:
    """Build the agent from its arguments (an int: the exit status of a start that cannot be)."""
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
    metrics = Metrics()
    parts: list[LivePart] = []  # what holds configuration: each reload reaches them (config/live_part.py)
    source: Source
    if args.from_snapshot:
        source = SnapshotSource(Path(args.from_snapshot))
        kernel_path, device = Path(args.from_snapshot) / KMSG, False
    else:
        source = LiveSource(
            cfg,
            telemetry=metrics,  # tool latency (gpu_healthcheck_tool_seconds)
        )
        parts.append(source)
        kernel_path, device = Path("/dev/kmsg"), True

    def loop() -> Agent:
        """The loop, for the callbacks of parts built before it; none is called before it runs."""
        return agent

    writer: NodeWriter | None = None
    brake: Brake | None = None
    node_getter = None
    dra_input: Callable[[], Any] | None = None
    fence: threading.Thread | None = None
    guarded: GuardedWriter | None = None
    if core is not None:
        from agent.reporters.brake import Brake
        from agent.reporters.device_isolation import IsolatingWriter
        from agent.reporters.fence_guard import GuardedWriter
        from agent.reporters.node_writer import NodeWriter
        from agent.reporters.repair_budget import RepairBudget

        sa_dir = getattr(args, "service_account_dir", None) or SERVICE_ACCOUNT_DIR
        # Its slots and the total (the agent DaemonSets' desired count) are in the agents' namespace;
        # nothing is read before a first taint: a DaemonSet rollout costs no count of the fleet.
        taints = device_taints(core, node_name, cfg, metrics, args.dry_run)
        brake = Brake(
            core,
            cfg=cfg,
            node_name=node_name,
            on_count=metrics.record_gpu_nodes,
            on_audit=lambda c: metrics.record_brake_count(c.counted, c.cap),
            namespace=agent_namespace(sa_dir),
            service_account=os.environ.get("POD_SERVICE_ACCOUNT", "").strip() or DEFAULT_SERVICE_ACCOUNT,
        )
        guard = fence_guard(core, node_name, cfg.prefix, metrics, agent_namespace(sa_dir))
        fence = guard.start()
        repair = RepairBudget(
            core,
            node_name,
            namespace=agent_namespace(sa_dir),
            brake=brake,
            cfg=cfg,
        )
        writer = NodeWriter(
            core,
            node_name,
            cfg=cfg,
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
        # The Node writer behind per-GPU isolation (node.isolation; reporters/device_isolation).
        isolating = IsolatingWriter(writer, slices, taints, cfg, brake=brake, metrics=metrics)
        guarded = GuardedWriter(isolating, guard)
        vet = reproving(vet, guard)
        parts += [writer, repair, brake, isolating]

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
    dcgm_wanted = reads_live_dcgm(args)
    active_state, window = None, None
    if core is not None and writer is not None and brake is not None and dcgm_wanted:
        sa_dir = getattr(args, "service_account_dir", None) or SERVICE_ACCOUNT_DIR
        active_state, window, active_parts = active_window(
            core, node_name, agent_namespace(sa_dir), brake, writer, cfg, pods, loop, metrics
        )
        parts += active_parts
    dcgm = DcgmPart(
        metrics,
        pods,
        engines,
        dcgm_wanted=dcgm_wanted,
        loop=loop,
        api_inputs={Input.DRA: dra_input} if dra_input is not None else None,  # a snapshot's node too
        window=window,
    )
    parts.append(dcgm)
    extra_inputs, progress = dcgm.dcgm_inputs(cfg)
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
        parts=parts,
        config_problem=start.problem,
        state_dir=state_dir,
        workloads=None if args.from_snapshot else list_devices,  # who is hit: the kubelet says
        canary_dir=canary_dir,
        vet_config=vet,
        config_fence_refused=start.fence_refused,
        active=active_state,  # the testing taint and `gpu-healthcheck diag` (engine/active.py)
    )
    if core is not None:  # the validating taint's wait for NVIDIA's DRA driver (engine/driver_wait.py)
        from agent.reporters.driver_class import DriverClass

        agent.engine.validation.driver.read = DriverClass(core)
    port = args.metrics_port if args.metrics_port is not None else cfg.metrics_port
    return Wired(agent, metrics, fence, port)


def main(args: Any) -> int:
    from agent.reporters import logs

    logs.setup(os.environ.get("GPU_HEALTHCHECK_LOG_LEVEL", "info"))
    wired = wire(args)
    if isinstance(wired, int):
        return wired
    agent, fence = wired.agent, wired.fence
    server = serve_http(wired.metrics_port, wired.metrics.registry, agent.healthy, agent.ready)
    signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
    signal.signal(signal.SIGINT, lambda *_: agent.request_stop())
    node_name = args.node or os.environ.get("NODE_NAME")
    log.info(f"agent starting on node {node_name}", extra={"node": node_name, "event": "start"})
    agent.run(once=args.once)
    if fence is not None and args.once:
        fence.join(timeout=30)  # a one-shot run reports its fence too
    if server is not None:
        server.shutdown()
    return 0

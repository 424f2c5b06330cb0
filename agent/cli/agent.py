"""`gpu-healthcheck agent`: the DaemonSet process. Wires probes, engine, Node writer, metrics, config
reload and signals together."""

from __future__ import annotations

import logging
import os
import random
import signal
from pathlib import Path
from typing import Any

from agent.checks.registry import RULE_BOOK
from agent.config import ConfigError, default_config_dir, load_config_dir
from agent.core.model import NodeObject
from agent.core.probed import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.engine.loop import Agent
from agent.probes.live import LiveSource
from agent.probes.node_object import node_from_dict
from agent.probes.snapshot import KMSG, SnapshotSource
from agent.probes.source import Source
from agent.reporters.http import serve_http
from agent.reporters.kube_rest import KubeRest
from agent.reporters.metrics import Metrics

BRAKE_WARM_JITTER_S = 30.0
log = logging.getLogger("gpu-healthcheck.agent")
ETC_CONFIG = Path("/etc/gpu-healthcheck")


def kube_core(kubeconfig: str | None) -> KubeRest:
    """The API client: raw JSON over the official client's ApiClient (kube_rest says why)."""
    from kubernetes import config
    from kubernetes.client import ApiClient

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return KubeRest(ApiClient())


def main(args: Any) -> int:
    from agent.reporters import logs

    logs.setup(os.environ.get("GPU_HEALTHCHECK_LOG_LEVEL", "info"))
    config_dir = args.config_dir or (ETC_CONFIG if ETC_CONFIG.is_dir() else default_config_dir())
    try:
        cfg = load_config_dir(config_dir, rules=RULE_BOOK)
    except ConfigError as exc:
        log.error(f"invalid configuration, cannot start: {exc}", extra={"event": "config"})
        return 64
    node_name = args.node or os.environ.get("NODE_NAME")
    if not node_name:
        log.error("no node name: pass --node or set NODE_NAME (downward API)")
        return 64
    source: Source
    if args.from_snapshot:
        source = SnapshotSource(Path(args.from_snapshot))
        kernel_path, device = Path(args.from_snapshot) / KMSG, False
    else:
        source = LiveSource(timeout_s=cfg.timeouts.nvidia_smi)
        kernel_path, device = Path("/dev/kmsg"), True
    writer = None
    node_getter = None
    metrics = Metrics()
    if not args.no_kube:
        from agent.reporters.brake import Brake
        from agent.reporters.node_writer import NodeWriter

        core = kube_core(args.kubeconfig)
        brake = Brake(
            core,
            selector=cfg.node.gpu_node_selector,
            max_fraction=cfg.node.max_tainted_fraction,
            max_nodes=cfg.node.max_tainted_nodes,
            prefix=cfg.prefix,
        )
        if not getattr(args, "once", False):
            # The fleet's GPU-node total, read ahead of any taint; spread over a DaemonSet rollout.
            brake.warm(random.uniform(0, BRAKE_WARM_JITTER_S))
        writer = NodeWriter(
            core,
            node_name,
            prefix=cfg.prefix,
            condition_type=cfg.node.condition_type,
            taint_effect=cfg.node.taint_effect,
            brake=brake,
            dry_run=args.dry_run,
            on_write=lambda kind, outcome: metrics.node_writes.labels(kind, outcome).inc(),
        )

        def node_getter() -> Probed[NodeObject]:
            current = writer.node
            if current is None:
                return NotCaptured("Node object (not read yet)")
            try:
                return node_from_dict(current)
            except ParseError as exc:
                return ProbeError("Node object", ProbeErrorKind.UNREADABLE, str(exc))

    extra_inputs, progress = None, None
    if not args.from_snapshot and (cfg.enabled("dcgm-health") or cfg.enabled("dcgm-diag")):
        from agent.cli.dcgm_engines import dcgm_engines_on_node
        from agent.probes.dcgm.tiers import DcgmTiers
        from agent.reporters.pods import gpu_pods_on_node, pods_unknown

        pods = gpu_pods_on_node(core, node_name) if writer is not None else pods_unknown
        engines = dcgm_engines_on_node(core, node_name) if writer is not None else None
        dcgm = DcgmTiers(cfg, pods, metrics, engines_on_node=engines)
        extra_inputs, progress = dcgm.inputs(), dcgm.progress
    agent = Agent(
        source,
        cfg,
        config_dir=config_dir,
        writer=writer,
        node_getter=node_getter,
        kernel_path=kernel_path if kernel_path.exists() else None,
        kernel_is_device=device,
        metrics=metrics,
        extra_inputs=extra_inputs,
        progress=progress,
    )
    port = args.metrics_port if args.metrics_port is not None else cfg.metrics_port
    server = serve_http(port, metrics.registry, agent.healthy, agent.ready)
    signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
    signal.signal(signal.SIGINT, lambda *_: agent.request_stop())
    log.info(f"agent starting on node {node_name}", extra={"node": node_name, "event": "start"})
    agent.run(once=args.once)
    if server is not None:
        server.shutdown()
    return 0

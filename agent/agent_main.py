"""`gpu-healthcheck agent`: the DaemonSet process. Wires sources, engine, Node writer, metrics, config
reload and signals together; the loop never crashes on bad input or an unreachable API server."""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.config import Config, default_config_dir, load_config_dir
from agent.config_watch import ConfigWatcher
from agent.engine import Engine, fingerprint
from agent.kernel_follow import KernelFollower
from agent.kube_rest import KubeRest
from agent.metrics import Metrics
from agent.model import NodeObject
from agent.probes.node_object import node_from_dict
from agent.probes.result import NotCaptured, ParseError, Probed, ProbeError, ProbeErrorKind
from agent.reporters.marks import Marks, NodeEvent
from agent.sources import KMSG, LiveSource, SnapshotSource, Source

BRAKE_WARM_JITTER_S = 30.0
log = logging.getLogger("gpu-healthcheck.agent")
ETC_CONFIG = Path("/etc/gpu-healthcheck")


class Writer(Protocol):
    def apply(self, marks: Marks) -> Any: ...
    def read_results(self) -> dict[str, Any] | None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


class Agent:
    def __init__(
        self,
        source: Source,
        cfg: Config,
        *,
        config_dir: Path | None,
        writer: Writer | None,
        node_getter: Callable[[], Probed[NodeObject]] | None,
        kernel_path: Path | None,
        kernel_is_device: bool,
        metrics: Metrics | None = None,
        extra_inputs: dict[str, Callable[[], Any]] | None = None,
        progress: Callable[[], str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self.engine = Engine(
            source,
            cfg,
            metrics=self.metrics,
            node_getter=node_getter,
            extra_inputs=extra_inputs,
            progress=progress,
        )
        self.writer = writer
        self.watcher = ConfigWatcher(config_dir, cfg) if config_dir is not None else None
        self.stop_event = threading.Event()
        self.poke = threading.Event()
        self.xid_pending = threading.Event()
        self.pending_events: list[NodeEvent] = []
        self.last_fingerprint = ""
        self.retry_at = 0.0
        self.retry_delay = 1.0
        self.follower: KernelFollower | None = None
        if kernel_path is not None:
            self.follower = KernelFollower(kernel_path, self._xid_seen, device=kernel_is_device)

    # ------------------------------------------------------------------ lifecycle

    def _xid_seen(self) -> None:
        """The follower saw an Xid-like line: run the xid tier now, not at the next tick."""
        self.xid_pending.set()
        self.poke.set()

    def request_stop(self) -> None:
        self.stop_event.set()
        self.poke.set()

    def run(self, once: bool = False) -> None:
        if self.writer is not None:
            self.writer.start()
            self.engine.restore(self.writer.read_results())
        if self.follower is not None:
            self.follower.start()
        next_reload = 0.0
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                ran = False
                if self.xid_pending.is_set():
                    self.xid_pending.clear()
                    self.engine.run_tier("xid")
                    ran = True
                for tier in self.engine.due_tiers(now):
                    if self.stop_event.is_set():
                        break
                    self.engine.run_tier(tier)
                    ran = True
                if self.watcher is not None and now >= next_reload:
                    ran |= self._reload()
                    next_reload = now + float(self.cfg.get("configPollSeconds"))
                ran |= self._clear_requested()
                if ran or self.pending_events or (self.retry_at and now >= self.retry_at):
                    self._publish()
                if once:
                    return
                waits = [self.engine.seconds_to_next(time.monotonic()), 1.0]
                if self.watcher is not None:
                    waits.append(max(0.0, next_reload - time.monotonic()))
                if self.retry_at:
                    waits.append(max(0.0, self.retry_at - time.monotonic()))
                self.poke.wait(min(waits))
                self.poke.clear()
        finally:
            if self.follower is not None:
                self.follower.stop()
            if self.writer is not None:
                self.writer.stop()  # never touches the Node: a shutdown or rollout keeps the taint
            log.info("agent stopped", extra={"event": "stop"})

    # ------------------------------------------------------------------ steps

    def _reload(self) -> bool:
        assert self.watcher is not None
        outcome = self.watcher.poll()
        if outcome is None:
            return False
        if outcome.config is None:
            self.metrics.config_reloads.labels("rejected").inc()
            log.error(
                f"config rejected, keeping the last good one: {outcome.error}", extra={"event": "config"}
            )
            self.pending_events.append(NodeEvent("ConfigRejected", f"{outcome.error}"[:1000], "Warning"))
            return True
        self.cfg = outcome.config
        self.engine.cfg = outcome.config
        self.engine.reschedule_all()
        self.metrics.config_reloads.labels("applied").inc()
        log.info("config reloaded", extra={"event": "config"})
        self.pending_events.append(NodeEvent("ConfigReloaded", "configuration reloaded and applied"))
        return True

    def _publish(self) -> None:
        _, marks = self.engine.evaluate()
        if self.pending_events:
            marks = replace(marks, events=(*self.pending_events, *marks.events))
        fp = fingerprint(marks)
        if fp == self.last_fingerprint and not marks.events and not self.retry_at:
            return
        if self.writer is None:
            log.info(
                f"marks: status={marks.status.value} severity={marks.severity.label} taint={marks.taint}",
                extra={"status": marks.status.value, "event": "marks"},
            )
            self.last_fingerprint, self.pending_events = fp, []
            return
        result = self.writer.apply(marks)
        self.pending_events = []  # the writer keeps unsent Events and posts them with its next success
        if bool(getattr(result, "ok", True)):
            self.last_fingerprint = fp
            self.retry_at, self.retry_delay = 0.0, 1.0
            braked = bool(getattr(result, "brake_open", False))
            self.metrics.brake_open.set(1 if braked else 0)
            if braked:  # the brake closes by itself: ask again (only braked nodes pay this list)
                self.retry_at = time.monotonic() + min(30.0, float(self.cfg.get("intervals.gpu")))
        else:
            self.retry_at = time.monotonic() + self.retry_delay
            log.warning(
                f"Node write failed, retrying in {self.retry_delay:.0f} s: {getattr(result, 'error', '')}",
                extra={"event": "write"},
            )
            self.retry_delay = min(self.retry_delay * 2, 30.0)

    def _clear_requested(self) -> bool:
        """An operator annotated the Node to clear latched findings: act now, not at the next tick."""
        getter = self.engine.node_getter
        node = getter() if getter else None
        return isinstance(node, NodeObject) and f"{self.cfg.get('prefix')}/clear-latched" in node.annotations

    def healthy(self) -> bool:
        limit = max(60.0, 3 * float(self.cfg.get("intervals.gpu")))
        return time.monotonic() - self.engine.heartbeat < limit

    def ready(self) -> bool:
        return self.engine.evaluations > 0


def serve_http(agent: Agent, port: int) -> ThreadingHTTPServer | None:
    if port <= 0:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body, ctype, code = generate_latest(agent.metrics.registry), CONTENT_TYPE_LATEST, 200
            elif self.path.startswith("/healthz"):
                ok = agent.healthy()
                body, ctype, code = (b"ok\n" if ok else b"loop stalled\n"), "text/plain", 200 if ok else 503
            elif self.path.startswith("/readyz"):
                ok = agent.ready()
                body, ctype, code = (
                    (b"ready\n" if ok else b"no verdict yet\n"),
                    "text/plain",
                    200 if ok else 503,
                )
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


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
    from agent import logs

    logs.setup(os.environ.get("GPU_HEALTHCHECK_LOG_LEVEL", "info"))
    config_dir = args.config_dir or (ETC_CONFIG if ETC_CONFIG.is_dir() else default_config_dir())
    try:
        cfg = load_config_dir(config_dir)
    except Exception as exc:
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
        source = LiveSource(timeout_s=float(cfg.get("timeouts.nvidiaSmi")))
        kernel_path, device = Path("/dev/kmsg"), True
    writer = None
    node_getter = None
    if not args.no_kube:
        from agent.reporters.brake import Brake
        from agent.reporters.node_writer import NodeWriter

        core = kube_core(args.kubeconfig)
        metrics = Metrics()
        brake = Brake(
            core,
            selector=str(cfg.get("node.gpuNodeSelector")),
            max_fraction=float(cfg.get("node.maxTaintedFraction")),
            max_nodes=int(cfg.get("node.maxTaintedNodes")),
            prefix=str(cfg.get("prefix")),
        )
        if not getattr(args, "once", False):
            # The fleet's GPU-node total, read ahead of any taint; spread over a DaemonSet rollout.
            brake.warm(random.uniform(0, BRAKE_WARM_JITTER_S))
        writer = NodeWriter(
            core,
            node_name,
            prefix=str(cfg.get("prefix")),
            condition_type=str(cfg.get("node.conditionType")),
            taint_effect=str(cfg.get("node.taintEffect")),
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
    else:
        metrics = Metrics()
    extra_inputs, progress = None, None
    if not args.from_snapshot and (cfg.enabled("dcgm-health") or cfg.enabled("dcgm-diag")):
        from agent.dcgm_tiers import DcgmTiers, gpu_pods_on_node, pods_unknown

        pods = gpu_pods_on_node(core, node_name) if writer is not None else pods_unknown
        dcgm = DcgmTiers(cfg, pods, metrics)
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
    server = serve_http(
        agent, args.metrics_port if args.metrics_port is not None else int(cfg.get("metrics.port"))
    )
    signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
    signal.signal(signal.SIGINT, lambda *_: agent.request_stop())
    log.info(f"agent starting on node {node_name}", extra={"node": node_name, "event": "start"})
    agent.run(once=args.once)
    if server is not None:
        server.shutdown()
    return 0

"""The live agent's DCGM inputs: a health poller and a diag runner on the shared host engine.

The diag takes minutes, so it runs in its own thread: the loop (and Xid latency) never waits for it.
Two connections, as dcgm.md recommends: a long diag does not stall the health polls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from agent.config import Config
from agent.dcgm.client import DcgmClient
from agent.dcgm.diag import DiagRunner
from agent.dcgm.health import HealthPoller
from agent.dcgm.idle import IdleGate
from agent.dcgm.report import DiagReport
from agent.kube_rest import KubeRest
from agent.metrics import Metrics
from agent.probes.result import Probed

log = logging.getLogger("gpu-healthcheck.dcgm")


class DcgmTiers:
    def __init__(
        self,
        cfg: Config,
        pods_requesting_gpus: Callable[[], list[str]] | None,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics
        address = str(cfg.get("dcgm.address"))
        timeout, grace = float(cfg.get("dcgm.connectTimeout")), float(cfg.get("dcgm.graceSeconds"))
        self.health = HealthPoller(DcgmClient(address, timeout, grace))
        self.runner = DiagRunner(
            DcgmClient(address, timeout, grace),
            IdleGate(pods_requesting_gpus=pods_requesting_gpus),
            level=int(cfg.get("dcgm.diagLevel")),
            timeout_s=float(cfg.get("dcgm.diagTimeout")),
            heartbeat_s=float(cfg.get("dcgm.heartbeatSeconds")),
        )
        self._thread: threading.Thread | None = None
        self.running_since: str = ""

    def inputs(self) -> dict[str, Callable[[], Any]]:
        return {"dcgm_health": self.health.poll, "dcgm_diag": self.diag}

    def diag(self) -> Probed[DiagReport]:
        """Start a diag in the background if none runs; return the latched result of the last one."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="dcgm-diag", daemon=True)
            self._thread.start()
        return self.runner.latest

    def _run(self) -> None:
        self.running_since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = time.monotonic()
        if self.metrics is not None:
            self.metrics.dcgm_diag_running.set(1)
        try:
            verdict = self.runner.run_if_idle()
            if verdict.idle:
                log.info(
                    f"DCGM diag level {self.runner.level} finished in {time.monotonic() - started:.0f} s"
                )
        except Exception:  # a bindings bug must not kill the agent; the check reads `unknown`
            log.exception("DCGM diag failed")
        finally:
            self.running_since = ""
            if self.metrics is not None:
                self.metrics.dcgm_diag_running.set(0)

    def progress(self) -> str:
        """A stable text for the condition message (no running seconds: no write every cycle)."""
        if self.runner.in_progress and self.running_since:
            return f"DCGM diag level {self.runner.level} running since {self.running_since}"
        return self.runner.last_skip or ""


def gpu_pods_on_node(core: Any, node_name: str) -> Callable[[], list[str]]:
    """Pods on this node that request nvidia.com/gpu and have not finished (idle gating)."""
    rest = KubeRest.of(core)
    selector = f"spec.nodeName={node_name},status.phase!=Succeeded,status.phase!=Failed"

    def pods() -> list[str]:
        listing = rest.json("GET", "/api/v1/pods", query={"fieldSelector": selector}, timeout=(5, 15))
        return gpu_pod_names(listing)

    return pods


def gpu_pod_names(listing: dict[str, Any]) -> list[str]:
    """Pure: namespace/name of the pods in a PodList whose containers or init containers request or
    limit nvidia.com/gpu."""
    out = []
    for pod in listing.get("items") or ():
        spec = pod.get("spec") or {}
        for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
            res = c.get("resources") or {}
            wanted = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            if str(wanted.get("nvidia.com/gpu", "0")) not in ("0", ""):
                meta = pod.get("metadata") or {}
                out.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
                break
    return out


def pods_unknown() -> list[str]:
    """Without API access nobody can tell whether a GPU pod runs here: never call the GPUs idle."""
    raise RuntimeError("no Kubernetes API access: cannot tell whether GPU pods run on this node")

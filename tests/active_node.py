"""One GPU node's agent for tests/test_active_checks_kube.py (and test_dcgm_coverage_kube.py), as a
child process.

It is `gpu-healthcheck agent` itself (agent.cli.main, the wiring of agent/cli/agent.py unchanged) on
a snapshot-backed node, with three things a snapshot agent lacks, each at the lowest layer:
- the live DCGM tiers (a snapshot agent reads DCGM from its files) against this process's own fake
  engine (tests/fakes/dcgm over the fake libdcgm.so.4: the engine lives in the library, so every
  process has one, as every node does), which has the snapshot's GPUs (--dcgm-gpus: its first N).
  Its diag answers the recorded passing DCGM 4.x document (tests/fixtures/dcgm/*wrapped-pass.json)
  after --diag-seconds, or never (0) until it is aborted;
- a kubelet PodResources socket (tests/fake_kubelet.py: a real gRPC server) whose pods hold nothing,
  or, while the file `<work>/kubelet-pods` lists them (one `namespace/name` a line), those pods
  holding the node's 8 GPUs (nvidia.com/gpu), as the kubelet shows a pod it admitted;
- the fake libnvidia-ml.so.1 (tests/fakes/nvml), so the idle gate's NVML asks for compute processes
  (there are none).
The diag's start and end, as the fake engine sees them, are printed as `DIAG start <epoch>` and
`DIAG end <epoch>` lines (stdout), for the test to hold against the taints it watches.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PASS_DOC = ROOT / "tests" / "fixtures" / "dcgm" / "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"
RECORDING = ROOT / "tests" / "fixtures" / "nvidia-smi-q" / "nvgpuexp-h100-80gb-hbm3-590.48.01-q-idle.txt"


def say(line: str) -> None:
    """One write(2) for the line and its newline: the agent's threads log to the same stdout, and a
    print (the text, then the newline) let a log line land between them."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def diag_clock(engine: Any, diag_seconds: float) -> None:
    """Hold each diag for *diag_seconds* (0: forever), and say when one starts and ends."""
    running = False
    started = 0.0
    while True:
        now = engine.stat("diag_running") == 1
        if now and not running:
            started = time.time()
            say(f"DIAG start {started:.3f}")
        if running and not now:
            say(f"DIAG end {time.time():.3f}")
            engine.hold_diag(True)  # the next one is held again
        if now and diag_seconds > 0 and time.time() - started >= diag_seconds:
            engine.hold_diag(False)
        running = now
        time.sleep(0.05)


def kubelet_follows(listing: Path, pb2: Any, state: dict[str, Any]) -> None:
    """The kubelet's answer follows *listing*: the pods it names hold every GPU, or none."""
    from tests.fake_kubelet import pod

    said = None
    while True:
        names = listing.read_text().split() if listing.exists() else []
        if names != said:
            said = names
            pods = [
                pod(pb2, *name.split("/", 1), "main", "nvidia.com/gpu", *(f"GPU-{i}" for i in range(8)))
                for name in names
            ]
            state["response"] = pb2.ListPodResourcesResponse(pod_resources=pods)
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--node", required=True)
    p.add_argument("--snapshot", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--config-dir", required=True)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--diag-seconds", type=float, default=5.0)
    p.add_argument("--dcgm-gpus", type=int, default=8, help="the engine has the snapshot's first N GPUs")
    args = p.parse_args(argv)

    from agent.probes.dcgm.bindings import load_bindings

    load_bindings()  # the mirror, from GPU_HEALTHCHECK_DCGM_PYTHON
    import fake_engine  # type: ignore[import-not-found]

    fake_engine.reset()
    # The engine has the snapshot's first --dcgm-gpus GPUs (8: all; fewer: dcgm-health is unknown),
    # each named by its PCI address, as a real engine names them.
    from agent.probes.nvsmi_text import parse_nvsmi_text

    seen = parse_nvsmi_text((Path(args.snapshot) / "nvidia-smi-q.txt").read_text(encoding="utf-8")).gpus
    fake_engine.set_gpus(list(range(args.dcgm_gpus)))
    fake_engine.set_gpu_pci({g.index: g.pci_bus_id for g in seen if g.index < args.dcgm_gpus})
    fake_engine.load_diag(str(PASS_DOC))
    fake_engine.hold_diag(True)
    threading.Thread(target=diag_clock, args=(fake_engine, args.diag_seconds), daemon=True).start()

    from tests.fake_kubelet import compile_api, serve
    from tests.fakes.nvml.fake_nvml import from_recordings

    conf = args.work / "fake-nvml.conf"
    conf.write_text(from_recordings(RECORDING).text(), encoding="utf-8")  # FAKE_NVML_CONFIG names it
    api = compile_api(args.work)
    sock = Path(tempfile.mkdtemp(prefix="kubelet-")) / "pod-resources.sock"  # a unix path is short

    import agent.cli.agent as wiring
    import agent.probes.pod_resources as pod_resources

    # the kubelet's socket where this node's kubelet is (the agent asks the default path)
    ask, pods = pod_resources.list_devices, pod_resources.gpu_pods

    def at_sock(socket: str = str(sock), timeout_s: float = 5.0) -> Any:
        return ask(socket, timeout_s)

    pod_resources.list_devices = at_sock  # type: ignore[assignment]
    pod_resources.gpu_pods = lambda *a, **kw: pods(str(sock))  # type: ignore[assignment]
    wiring.reads_live_dcgm = lambda args: True  # the live DCGM tiers on a snapshot-backed node
    from agent.cli.main import main as cli

    with serve(api, sock, api[0].ListPodResourcesResponse()) as kubelet:
        follow = (args.work / "kubelet-pods", api[0], kubelet)
        threading.Thread(target=kubelet_follows, args=follow, daemon=True).start()
        return cli(
            [
                "agent", "--node", args.node, "--from-snapshot", args.snapshot,
                "--kubeconfig", args.kubeconfig, "--config-dir", args.config_dir,
                "--state-dir", str(args.work / "state"), "--metrics-port", "0",
            ]
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The node-local DCGM host engine container: nv-hostengine in the foreground, one per node.

Runs `nv-hostengine -n -b <bind> -p <port> --log-level <level> -f -`, forwards its log lines to stdout,
terminates it on SIGTERM/SIGINT, and refuses to start (exit 3, one clear log line) when another engine
already serves this node: the port already accepts connections, an nv-hostengine process is running in
this pod, or (with the API, NODE_NAME) another pod on this node runs one: the GPU Operator's nvidia-dcgm
or a dcgm-exporter with an embedded engine (a second engine breaks the exporter's modules and splits
the view of the GPUs, dcgm.md §7.4).
Settings: flags, else env HOSTENGINE_BIND (127.0.0.1, DCGM's default), HOSTENGINE_PORT (5555),
HOSTENGINE_LOG_LEVEL (ERROR).

Guarded (HOSTENGINE_GUARD_LISTEN set, e.g. to the pod IP): the engine binds 127.0.0.1 only, and
hostengine/guard.py listens on HOSTENGINE_GUARD_LISTEN:HOSTENGINE_PORT, forwarding only connections
from allowed pods on this node (NODE_NAME; HOSTENGINE_GUARD_NAMESPACES, HOSTENGINE_GUARD_SELECTOR).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from agent.probes.dcgm.engines import engines_in
from hostengine.guard import DEFAULT_SELECTOR, SA_DIR, Allowlist, Api, Guard, allowed_pod_ips

EXIT_ALREADY_SERVED = 3
LEVELS = ("NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG")


def log(msg: str) -> None:
    print(f"hostengine: {msg}", flush=True)


def port_answers(port: int, host: str = "127.0.0.1", timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def running_engines(proc: Path = Path("/proc"), name: str = "nv-hostengine") -> list[int]:
    """PIDs of processes named nv-hostengine (needs hostPID to see the host's; the pod's otherwise)."""
    pids = []
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm == name[:15]:
            pids.append(int(entry.name))
    return sorted(pids)


def build_command(binary: str, bind: str, port: int, level: str) -> list[str]:
    return [binary, "-n", "-b", bind, "-p", str(port), "--log-level", level, "-f", "-"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m hostengine", description=__doc__.splitlines()[0])
    p.add_argument(
        "--bind", default=env.get("HOSTENGINE_BIND", "127.0.0.1"), help="-b of nv-hostengine (an IP, or ALL)"
    )
    p.add_argument("--port", type=int, default=int(env.get("HOSTENGINE_PORT", "5555")))
    p.add_argument(
        "--log-level",
        type=str.upper,
        default=env.get("HOSTENGINE_LOG_LEVEL", "ERROR").upper(),
        choices=LEVELS,
    )
    p.add_argument("--binary", default=env.get("HOSTENGINE_BINARY", "nv-hostengine"))
    p.add_argument(
        "--guard-listen",
        default=env.get("HOSTENGINE_GUARD_LISTEN", ""),
        help="address of the guard (the pod IP); the engine then binds 127.0.0.1 only",
    )
    p.add_argument("--guard-namespaces", default=env.get("HOSTENGINE_GUARD_NAMESPACES", "gpu-healthcheck"))
    p.add_argument("--guard-selector", default=env.get("HOSTENGINE_GUARD_SELECTOR", DEFAULT_SELECTOR))
    p.add_argument("--node", default=env.get("NODE_NAME", ""))
    p.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--sa-dir", default=str(SA_DIR), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def api_of(args: argparse.Namespace) -> Api | None:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return Api.in_cluster(host, port, Path(args.sa_dir)) if host and args.node else None


def engines_in_other_pods(args: argparse.Namespace) -> list[str] | None:
    """DCGM engines in the other pods on this node (the GPU Operator's nvidia-dcgm, a dcgm-exporter that
    embeds its own), from the API server; None when it cannot be asked."""
    api = api_of(args)
    if api is None:
        return None
    try:
        running = f"spec.nodeName={args.node},status.phase=Running"
        listing = api.get("/api/v1/pods", {"fieldSelector": running})
    except (OSError, ValueError) as exc:
        log(f"cannot list this node's pods for other DCGM engines ({exc}); the agent reports them")
        return None
    own = f"{os.environ.get('POD_NAMESPACE', '')}/{os.environ.get('POD_NAME', socket.gethostname())}"
    return engines_in(listing, exclude=[own])


def start_guard(args: argparse.Namespace) -> Guard:
    """The guard in front of the engine; OSError/ValueError when it cannot listen or is not configured."""
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST", ""),
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
    )
    if not (host and args.node):
        raise ValueError("the guard needs NODE_NAME and the in-cluster API (KUBERNETES_SERVICE_HOST)")
    api = Api.in_cluster(host, port, Path(args.sa_dir))
    namespaces = [n.strip() for n in args.guard_namespaces.split(",") if n.strip()]
    allowlist = Allowlist(lambda: allowed_pod_ips(api, args.node, namespaces, args.guard_selector))
    guard = Guard(args.guard_listen, args.port, "127.0.0.1", args.port, allowlist)
    allowlist.refresh()
    guard.start()
    where = ", ".join(namespaces)
    log(f"guard on {args.guard_listen}:{args.port}: clients {args.guard_selector!r} in {where}")
    return guard


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="hostengine: %(message)s")
    if port_answers(args.port):
        log(
            f"refusing to start: something already answers on port {args.port} on this node "
            "(another DCGM host engine?); point clients at it instead of starting a second engine"
        )
        return EXIT_ALREADY_SERVED
    others = running_engines(Path(args.proc), Path(args.binary).name)
    if others:
        log(
            "refusing to start: nv-hostengine already running on this node "
            f"(pid {', '.join(map(str, others))})"
        )
        return EXIT_ALREADY_SERVED
    elsewhere = engines_in_other_pods(args)
    if elsewhere:
        log(
            f"refusing to start: another DCGM engine runs on this node: {', '.join(elsewhere)}; use the "
            "GPU Operator overlay (overlays/) so that one engine serves the node"
        )
        return EXIT_ALREADY_SERVED
    guard: Guard | None = None
    if args.guard_listen:
        args.bind = "127.0.0.1"  # reachable only through the guard
        try:
            guard = start_guard(args)
        except (OSError, ValueError) as exc:
            log(f"cannot start the guard: {exc}")
            return 2
    cmd = build_command(args.binary, args.bind, args.port, args.log_level)
    log(f"starting: {' '.join(cmd)}")
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    except OSError as exc:
        log(f"cannot start {args.binary}: {exc.strerror or exc}")
        return 127
    stopping = ""

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = signal.Signals(signum).name  # logged after the loop: no print inside a handler
        child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    assert child.stdout is not None
    for line in child.stdout:  # forward the engine's log
        sys.stdout.write(line)
        sys.stdout.flush()
    try:
        rc = child.wait(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        rc = child.wait()
    if guard is not None:
        guard.stop()
    if stopping:
        log(f"signal {stopping}: stopped nv-hostengine (pid {child.pid})")
    log(f"nv-hostengine exited with {rc}")
    return 0 if stopping else (rc if rc > 0 else 1)

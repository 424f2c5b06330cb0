"""The node's SDC probe server: a tiny HTTP API the agent drives inside its active-check window.

    POST /runs              start a run → 202 {"id"}; 409 {"id"} while one runs (one at a time)
    GET  /runs/<id>         {"id", "state": running|completed|aborted|failed, "report"?, "error"?}
    POST /runs/<id>/abort   kill the run's compute at once → 200 {"id", "state": "aborted"}
    GET  /healthz           200 "ok"

Each run is a subprocess (`python -m sdcprobe run`) in its own process group: the CUDA contexts
exist only while it runs, and an abort (a pod arrived) or a run past --timeout kills the group at
once, GPU memory freed by the driver as the process dies. The server holds no GPU between runs and
keeps only the last run. Why a server the agent calls, not a pod the agent creates: DESIGN.md §6.4.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RUNNING, COMPLETED, ABORTED, FAILED = "running", "completed", "aborted", "failed"


class Run:
    def __init__(self, run_id: str, cmd: list[str], out: Path, timeout_s: float) -> None:
        self.id, self.out, self.timeout_s = run_id, out, timeout_s
        self.state, self.error, self.report = RUNNING, "", None
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        threading.Thread(target=self._watch, name=f"sdc-run-{run_id}", daemon=True).start()

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _watch(self) -> None:
        try:
            _, err = self.proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            _, err = self.proc.communicate()
            self._end(FAILED, f"the run went past {self.timeout_s:g} s and was killed")
            return
        if self.proc.returncode == 0 and self.out.is_file():
            report = json.loads(self.out.read_text())
            with self.lock:
                if self.state == RUNNING:
                    self.state, self.report = COMPLETED, report
            return
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        self._end(FAILED, f"the run exited {self.proc.returncode}: {' / '.join(tail)}")

    def _end(self, state: str, error: str) -> None:
        with self.lock:
            if self.state == RUNNING:
                self.state, self.error = state, error

    def abort(self) -> None:
        self._end(ABORTED, "aborted on request")
        self._kill()

    def doc(self) -> dict[str, Any]:
        with self.lock:
            out: dict[str, Any] = {"id": self.id, "state": self.state}
            if self.report is not None:
                out["report"] = self.report
            if self.error:
                out["error"] = self.error
            return out


class Server:
    """One run at a time; *run_args*: the `run` arguments (backend, sizes, precisions)."""

    def __init__(self, run_args: list[str], timeout_s: float, workdir: Path) -> None:
        self.run_args, self.timeout_s, self.workdir = run_args, timeout_s, workdir
        self.last: Run | None = None
        self.lock = threading.Lock()
        self._ids = itertools.count(1)

    def start(self) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.last is not None and self.last.doc()["state"] == RUNNING:
                return 409, {"id": self.last.id, "error": "a run is in progress"}
            run_id = f"{int(time.time())}-{next(self._ids)}"
            out = self.workdir / f"report-{run_id}.json"
            cmd = [sys.executable, "-m", "sdcprobe", "run", *self.run_args, "--out", str(out)]
            self.last = Run(run_id, cmd, out, self.timeout_s)
            return 202, {"id": run_id}

    def find(self, run_id: str) -> Run | None:
        with self.lock:
            return self.last if self.last is not None and self.last.id == run_id else None


def handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, doc: object) -> None:
            body = json.dumps(doc).encode() if not isinstance(doc, str) else doc.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json" if not isinstance(doc, str) else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if parts == ["healthz"]:
                return self._send(200, "ok")
            run = server.find(parts[1]) if len(parts) == 2 and parts[0] == "runs" else None
            return (
                self._send(200, run.doc()) if run is not None else self._send(404, {"error": "no such run"})
            )

        def do_POST(self) -> None:
            parts = self.path.strip("/").split("/")
            if parts == ["runs"]:
                return self._send(*server.start())
            if len(parts) == 3 and parts[0] == "runs" and parts[2] == "abort":
                run = server.find(parts[1])
                if run is None:
                    return self._send(404, {"error": "no such run"})
                run.abort()
                return self._send(200, run.doc())
            return self._send(404, {"error": "no such path"})

        def log_message(self, format: str, *args: Any) -> None:
            return  # one line per request would be the node's only log: the agent logs the runs

    return Handler


def run_args(args: argparse.Namespace) -> list[str]:
    """The `run` arguments of `serve`'s own (the backend and its plan)."""
    out = ["--backend", args.backend, "--repeats", str(args.repeats), "--precisions", args.precisions]
    out += [
        "--seed",
        str(args.seed),
        "--cpu-devices",
        str(args.cpu_devices),
        "--cpu-delay",
        str(args.cpu_delay),
    ]
    if args.size:
        out += ["--size", str(args.size)]
    if args.inject:
        out += ["--inject", args.inject]
    return out


def make_server(args: argparse.Namespace, workdir: Path) -> ThreadingHTTPServer:
    host, _, port = args.listen.rpartition(":")
    return ThreadingHTTPServer((host, int(port)), handler(Server(run_args(args), args.timeout, workdir)))


def serve_forever(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="sdcprobe-") as tmp:
        httpd = make_server(args, Path(tmp))
        httpd.serve_forever()
    return 0


__all__ = ["Server", "handler", "make_server", "serve_forever"]

"""The agent's HTTP endpoint: Prometheus metrics and the kubelet's liveness and readiness probes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve_http(
    port: int, registry: CollectorRegistry, healthy: Callable[[], bool], ready: Callable[[], bool]
) -> ThreadingHTTPServer | None:
    """/metrics, /healthz (the loop checked lately) and /readyz (a fresh verdict exists); None for port 0."""
    if port <= 0:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif self.path.startswith("/healthz"):
                ok = healthy()
                body, ctype, code = (b"ok\n" if ok else b"loop stalled\n"), "text/plain", 200 if ok else 503
            elif self.path.startswith("/readyz"):
                ok = ready()
                body, ctype, code = (
                    (b"ready\n" if ok else b"no fresh verdict\n"),
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

"""The agent's connection to the node-local nv-hostengine. It never starts an engine.

State machine: `starting` (never connected, inside the grace period) → `connected` → on
DCGM_ST_CONNECTION_NOT_VALID (-21) or a timeout (-11): `lost` (the engine restarted or died; every
group/watch made on the old connection is gone, dcgm.md §0.7) → the next call reconnects and bumps
`generation`, which tells users to rebuild their groups and watches. Never connected after the
grace period: `unreachable`. All non-connected states mean `unknown`, never `fail`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agent.probes.dcgm.bindings import (
    DCGM_ST_CONNECTION_NOT_VALID,
    DCGM_ST_TIMEOUT,
    Bindings,
    BindingsUnavailable,
    error_code,
    load_bindings,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_ADDRESS = "nvidia-dcgm.gpu-healthcheck.svc:5555"
_CONNECTION_CODES = (DCGM_ST_CONNECTION_NOT_VALID, DCGM_ST_TIMEOUT)


class EngineUnavailable(RuntimeError):
    """No usable engine connection now; the message says why (for the check's `unknown`)."""


class DcgmClient:
    """One connection (handle) to the engine at `address` ("host:port"). Thread-safe."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        connect_timeout_s: float = 5.0,
        grace_s: float = 120.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        loader: Callable[[], Bindings] = load_bindings,
    ) -> None:
        if not address.strip():
            raise ValueError("a DCGM address is required (an empty one would start an embedded engine)")
        self.address = address.strip()
        self.connect_timeout_s = connect_timeout_s
        self.grace_s = grace_s
        self._clock = clock
        self._loader = loader
        self._lock = threading.RLock()
        self._started = clock()
        self._bindings: Bindings | None = None
        self._handle: Any = None
        self.generation = 0  # +1 per successful (re)connect: rebuild groups/watches when it changes
        self.ever_connected = False
        self.last_error = ""
        self.lost_at: float | None = None

    @property
    def bindings(self) -> Bindings:
        if self._bindings is None:
            self._bindings = self._loader()
        return self._bindings

    @property
    def state(self) -> str:
        if self._handle is not None:
            return "connected"
        if not self.ever_connected:
            return "starting" if self._clock() - self._started < self.grace_s else "unreachable"
        return "lost"

    def reason(self) -> str:
        """Why there is no connection, for an `unknown` check result."""
        state, why = self.state, f": {self.last_error}" if self.last_error else ""
        if state == "starting":
            left = self.grace_s - (self._clock() - self._started)
            return (
                f"DCGM host engine at {self.address} not reachable yet "
                f"(agent starting, {left:.0f} s of grace left)"
            )
        if state == "unreachable":
            return f"DCGM host engine at {self.address} unreachable{why}"
        if state == "lost":
            return f"DCGM host engine at {self.address} connection lost, reconnecting{why}"
        return "connected"

    def handle(self) -> Any:
        """The live pydcgm.DcgmHandle, connecting if needed; EngineUnavailable otherwise."""
        with self._lock:
            if self._handle is not None:
                return self._handle
            try:
                b = self.bindings
            except BindingsUnavailable as exc:
                self.last_error = str(exc)
                raise EngineUnavailable(self.reason()) from exc
            try:
                self._handle = self._connect(b)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise EngineUnavailable(self.reason()) from exc
            self.generation += 1
            if self.ever_connected:
                log.info(
                    "reconnected to DCGM host engine at %s (generation %d)", self.address, self.generation
                )
            self.ever_connected = True
            self.last_error = ""
            self.lost_at = None
            return self._handle

    def _connect(self, b: Bindings) -> Any:
        kwargs: dict[str, Any] = {
            "ipAddress": self.address,
            "opMode": getattr(b.dcgm_structs, "DCGM_OPERATION_MODE_AUTO", 1),
            "persistAfterDisconnect": False,
        }
        try:
            return b.pydcgm.DcgmHandle(timeoutMs=int(self.connect_timeout_s * 1000), **kwargs)
        except TypeError:  # bindings without the timeoutMs parameter
            return b.pydcgm.DcgmHandle(**kwargs)

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run fn(handle). A connection-level DCGM error drops the handle and raises EngineUnavailable;
        other exceptions propagate (a real answer from the engine, e.g. DIAG_ALREADY_RUNNING)."""
        handle = self.handle()
        try:
            return fn(handle)
        except Exception as exc:
            if error_code(exc) in _CONNECTION_CODES:
                self.drop(f"{type(exc).__name__}: {exc}")
                raise EngineUnavailable(self.reason()) from exc
            raise

    def drop(self, why: str) -> None:
        """Forget the connection (the engine restarted or hung); the next call reconnects."""
        with self._lock:
            handle, self._handle = self._handle, None
            self.last_error = why
            self.lost_at = self._clock()
        if handle is not None:
            log.warning("DCGM host engine connection at %s lost: %s", self.address, why)
            with contextlib.suppress(Exception):  # the connection is already gone
                handle.Shutdown()

    def close(self) -> None:
        self.drop("closed")

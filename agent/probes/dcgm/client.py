"""The agent's connection to the node-local nv-hostengine. It never starts an engine.

State machine: `starting` (never connected, inside the grace period) → `connected` → on
DCGM_ST_CONNECTION_NOT_VALID (-21) or a timeout (-11): `lost` (the engine restarted or died; every
group/watch made on the old connection is gone, dcgm.md §0.7) → the next call reconnects and bumps
`generation`, which tells users to rebuild their groups and watches. Never connected after the
grace period: `unreachable`. All non-connected states mean `unknown`, never `fail`.

Every call is bounded and named (`call(op, fn)`): it runs in a worker thread its caller waits for
at most `call_timeout_s` (a connect: its own timeout plus that). A wedged engine (a GPU storming the
driver, NVSentinel#1748) can hold a call far longer than the client library's own 60 s request
timeout, and a call stuck in C cannot be killed. So a call past its deadline raises EngineHung
("engine not answering: <op> past N s"), its thread is left waiting, the connection is given up
(not closed under the stuck call), and no other call is started on this client until that one
returns: then its thread closes the abandoned connection, which frees our groups and watches on the
engine, and the next call reconnects (a new generation: rebuilt). `wedged` says since when the
engine has not answered, until a call answers again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agent.probes.bounded import Bounded, StillStuck, TimedOut
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
DEFAULT_CALL_TIMEOUT_S = 10.0
CONNECT = "dcgmConnect_v3"
_CONNECTION_CODES = (DCGM_ST_CONNECTION_NOT_VALID, DCGM_ST_TIMEOUT)


class EngineUnavailable(RuntimeError):
    """No usable engine connection now; the message says why (for the check's `unknown`)."""


@dataclass(frozen=True)
class Wedge:
    """The engine stopped answering: the last call that did not return in time, its limit, and when
    the first such call was made (time.monotonic, and as text: a message that stays the same while
    the wedge lasts, so that it costs no Node write per cycle)."""

    op: str
    limit_s: float
    since: float
    since_text: str

    def text(self) -> str:
        return f"engine not answering: {self.op} past {self.limit_s:g} s (no answer since {self.since_text})"


class EngineHung(EngineUnavailable):
    """A DCGM call did not return within its deadline, or one that did not is still waiting (then
    no other call is made until it returns)."""

    def __init__(self, wedge: Wedge) -> None:
        self.wedge = wedge
        super().__init__(wedge.text())


class _Pending:
    """One bounded call: whoever comes second (the call returning, or its caller giving up) runs
    `late` with the call's value, so that what a given-up call still holds is released once."""

    def __init__(self, late: Callable[[Any], None]) -> None:
        self.late = late
        self.lock = threading.Lock()
        self.finished = False
        self.given_up = False
        self.value: Any = None

    def finish(self, value: Any) -> None:
        with self.lock:
            self.finished, self.value = True, value
            late = self.given_up
        if late:
            self._release()

    def give_up(self) -> None:
        with self.lock:
            self.given_up = True
            late = self.finished
        if late:
            self._release()

    def _release(self) -> None:
        try:
            self.late(self.value)
        except Exception as exc:  # the engine may be gone by now: nothing left to free
            log.debug("releasing a given-up DCGM call: %s", exc)


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
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        on_hang: Callable[[str], None] | None = None,
    ) -> None:
        """call_timeout_s: how long a call may take (dcgm.callTimeout); on_hang(op): a call passed
        it (the agent's gpu_healthcheck_dcgm_call_hangs_total)."""
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
        self.call_timeout_s = call_timeout_s
        self.on_hang = on_hang
        self.wedged: Wedge | None = None
        self._calls = Bounded()  # one key: while a call is stuck, no other is started

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
        """Why there is no connection, for an `unknown` check result (the wedge first, if any)."""
        base = self._reason()
        return f"{self.wedged.text()}; {base}" if self.wedged is not None else base

    def _reason(self) -> str:
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
        """The live pydcgm.DcgmHandle, connecting if needed (bounded: EngineHung); EngineUnavailable
        otherwise."""
        with self._lock:
            if self._handle is not None:
                return self._handle
            try:
                b = self.bindings
            except BindingsUnavailable as exc:
                self.last_error = str(exc)
                raise EngineUnavailable(self.reason()) from exc
            limit = self.connect_timeout_s + self.call_timeout_s
            try:
                self._handle = self._bounded(CONNECT, lambda: self._connect(b), limit, _shut_down)
            except EngineHung:
                raise
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

    def call(self, op: str, fn: Callable[[Any], T], limit_s: float | None = None) -> T:
        """fn(handle): one DCGM operation, named `op` (its C function: dcgmHealthCheck), within
        limit_s (call_timeout_s). Past it: EngineHung. A connection-level DCGM error drops the handle
        and raises EngineUnavailable; other exceptions propagate (a real answer from the engine, e.g.
        DIAG_ALREADY_RUNNING)."""
        handle = self.handle()
        limit = self.call_timeout_s if limit_s is None else limit_s
        try:
            return self._bounded(op, lambda: fn(handle), limit, lambda _: self._close_given_up(handle))
        except EngineUnavailable:
            raise
        except Exception as exc:
            if error_code(exc) in _CONNECTION_CODES:
                self.drop(f"{type(exc).__name__}: {exc}")
                raise EngineUnavailable(self.reason()) from exc
            raise

    def _bounded(self, op: str, fn: Callable[[], T], limit_s: float, late: Callable[[Any], None]) -> T:
        """fn() in a worker thread, waited for at most limit_s; late(value) once a given-up call
        returns (or at once if it returned just as its caller gave up)."""
        wedge = self.wedged
        pending = _Pending(late)

        def work() -> T:
            value: T | None = None
            try:
                value = fn()
                return value
            finally:
                pending.finish(value)

        try:
            value = self._calls.run("call", work, limit_s, thread_name=f"dcgm-{op}")
        except StillStuck:
            raise EngineHung(wedge or Wedge(op, limit_s, time.monotonic(), _iso(time.time()))) from None
        except TimedOut:
            pending.give_up()
            raise EngineHung(self.hung(op, limit_s)) from None
        except Exception as exc:
            if error_code(exc) not in _CONNECTION_CODES:  # an error is an answer too
                self._answered(wedge)
            raise
        self._answered(wedge)
        return value

    def _answered(self, wedge: Wedge | None) -> None:
        if wedge is None or self.wedged is not wedge:
            return
        self.wedged = None
        log.warning(
            "DCGM host engine at %s answers again after %.0f s (%s had hung)",
            self.address,
            time.monotonic() - wedge.since,
            wedge.op,
        )

    def hung(self, op: str, limit_s: float) -> Wedge:
        """`op` did not return within limit_s: the connection is given up (the call still inside
        it closes it when it returns), counted, said once."""
        with self._lock:
            was = self.wedged
            if was is not None:
                since, since_text = was.since, was.since_text
            else:
                since, since_text = time.monotonic() - limit_s, _iso(time.time() - limit_s)
            wedge = self.wedged = Wedge(op, limit_s, since, since_text)
            self._handle = None
            self.last_error = wedge.text()
            self.lost_at = self._clock()
        self.count_hang(op, limit_s)
        return wedge

    def count_hang(self, op: str, limit_s: float) -> None:
        """Say and count a call that did not return within limit_s (the diag's own watchdog too)."""
        log.warning(
            "DCGM host engine at %s not answering: %s past %g s; its call is left waiting and no other "
            "is made on this connection until it returns",
            self.address,
            op,
            limit_s,
        )
        if self.on_hang is not None:
            self.on_hang(op)

    def _close_given_up(self, handle: Any) -> None:
        """A call given up on has returned: close its connection, which frees what we made on the
        engine with it (groups, watches); a later call reconnects."""
        with self._lock:
            if self._handle is handle:
                self._handle = None
        handle.Shutdown()

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


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _shut_down(handle: Any) -> None:
    """A connect given up on that still connected: close that connection."""
    if handle is not None:
        handle.Shutdown()

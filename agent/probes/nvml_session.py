"""One NVML initialisation kept across reads, shared by every NVML reader of the agent; and the one
place NVML's return codes are named and its errors mapped (`code`, `describe`, `status_text`,
`init_failure`; `optional`: a getter's failure is "not answered", or the GPU is lost).

nvmlInit plus attaching a GPU (its first nvmlDeviceGetHandleByIndex) cost most of an NVML read
(31 ms of CPU per read on an H100, 4.7 ms with the session kept open). So NVML is initialised once
and the handles kept, and started again only when the session can no longer be trusted:
NVML_ERROR_UNINITIALIZED from a call (the read is then tried once more on a fresh session), a
driver reload (the boot id or the driver version differs from the session's), a read that found a
GPU lost or asking for a reset (the next read attaches afresh), or a read that timed out.

A read that timed out may still be inside the library. Its session is dropped at once (the next
read initialises a new one) but never shut down under the stuck call: nvmlInit/nvmlShutdown are
reference-counted, so the stuck read's own thread releases its session's reference if the call
ever returns, and if it never does the reference is left alone. The state lock is never held
across an NVML call, so a caller giving up on a hung read never waits for the library. A read
stuck in nvmlInit itself (or in the driver-version check) holds the initialisation lock: the other
NVML readers then wait for it in their own worker threads, and their callers time out in turn (one
parked thread per kind of read at most, as before).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from agent.probes.bounded import Bounded, StillStuck, TimedOut
from agent.probes.nvsmi_errors import NvmlUnavailable, ProbeTimeout, ToolReportedFailure

T = TypeVar("T")

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

# NVML return codes (stable C enum values; pynvml exposes the same numbers).
UNINITIALIZED = 1
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
UNKNOWN = 999


def code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ calls into the library
        text = ""
    return text or f"NVML error {code(exc)}"


def text(value: object) -> str | None:
    """An NVML string (bytes or str) with its whitespace folded; None when empty."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    folded = " ".join(str(value).split())
    return folded or None


def init_failure(exc: BaseException) -> ToolReportedFailure | NvmlUnavailable:
    why, c = describe(exc), code(exc)
    if c == DRIVER_NOT_LOADED:
        return ToolReportedFailure(f"NVML: the NVIDIA kernel driver is not loaded ({why})")
    if c == LIB_RM_VERSION_MISMATCH:
        return ToolReportedFailure(
            f"NVML: driver/library version mismatch; the driver was upgraded without a reboot ({why})"
        )
    if c == LIBRARY_NOT_FOUND:
        return NvmlUnavailable(f"NVML: libnvidia-ml.so was not found ({why})")
    if c == UNINITIALIZED:
        return ToolReportedFailure(f"NVML: library not initialised ({why})")
    return ToolReportedFailure(f"NVML: initialisation failed ({why})")


def status_text(nv: ModuleType, value: int) -> str:
    """NVML's words for a return code that came as a number (a struct's status field)."""
    try:
        return describe(nv.NVMLError(value))
    except Exception:
        return f"NVML error {value}"


class GpuLost(Exception):
    """The GPU stopped answering in the middle of being read."""


def optional(nv: ModuleType, fn: Callable[..., Any] | None, *args: Any, basic: bool = False) -> Any:
    """Call an NVML getter: its value, or None when not supported / not readable.

    GPU_IS_LOST and RESET_REQUIRED always mean the GPU is gone (raise GpuLost); UNKNOWN does too
    on the basic identity queries, where nvidia-smi reports the same GPU as lost.
    """
    if fn is None:
        return None
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        check_session(exc)
        c = code(exc)
        if c in (GPU_IS_LOST, RESET_REQUIRED) or (basic and c == UNKNOWN):
            raise GpuLost(f"{getattr(fn, '__name__', 'NVML call')}: {describe(exc)}") from None
        return None


class SessionGone(Exception):
    """NVML answered UNINITIALIZED: the session behind this read is no longer there."""


def check_session(exc: BaseException) -> None:
    """Readers call this on every NVMLError they would otherwise swallow."""
    if code(exc) == UNINITIALIZED:
        raise SessionGone(describe(exc)) from None


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"NVML: the pynvml module (nvidia-ml-py) is not installed ({exc})") from None
    module: ModuleType = pynvml
    return module


class Opened:
    """One initialisation of NVML: the module, the handles attached so far, and what is fixed for
    the driver load (`cache`: names, NVLink remote ends, PCIe ancestors). `retire()` asks for a
    fresh session after the current read."""

    def __init__(self, nv: ModuleType, driver: str | None, boot: str | None, owner: NvmlSession) -> None:
        self.nv = nv
        self.driver_version = driver
        self.boot_id = boot
        self.cache: dict[Any, Any] = {}
        self._handles: dict[int, Any] = {}
        self._owner = owner
        self.users = 0
        self.retired = False
        self.owes_shutdown = False

    def handle(self, index: int) -> Any:
        """The GPU's handle, attached on first use (raises the NVMLError of the attach)."""
        got = self._handles.get(index)
        if got is None:
            got = self.nv.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = got
            self._owner.count_attach()
        return got

    def retire(self) -> None:
        self.retired = True

    def share(self) -> None:
        """One more user (a worker reading one GPU): see NvmlSession.share."""
        self._owner.share(self)

    def release(self) -> None:
        self._owner.release(self)


@dataclass
class Ticket:
    """One read's claim on a session, so that the caller giving up can drop that very session."""

    opened: Opened | None = None
    timed_out: bool = False


class NvmlSession:
    """The process's NVML session. `inits`, `attaches`, `shutdowns` count the library calls made."""

    def __init__(self, boot_id_path: Path = BOOT_ID) -> None:
        self.boot_id_path = boot_id_path
        self._state = threading.Lock()  # never held across an NVML call
        self._init = threading.Lock()  # one initialiser at a time (may be held by a hung call)
        self._current: Opened | None = None
        self.inits = 0
        self.attaches = 0
        self.shutdowns = 0

    def count_attach(self) -> None:
        with self._state:
            self.attaches += 1

    def _boot_id(self) -> str | None:
        try:
            return self.boot_id_path.read_text().strip() or None
        except OSError:
            return None

    def read(self, reader: Callable[[Opened], T], ticket: Ticket | None = None) -> T:
        """reader(opened) on the kept session; once more on a fresh one if NVML says UNINITIALIZED."""
        ticket = ticket or Ticket()
        for attempt in (1, 2):
            opened = self._acquire(ticket)
            try:
                return reader(opened)
            except SessionGone:
                opened.retire()
                if attempt == 2:
                    raise ToolReportedFailure("NVML: the library lost its initialisation twice") from None
            except opened.nv.NVMLError as exc:
                if code(exc) != UNINITIALIZED or attempt == 2:
                    raise
                opened.retire()
            finally:
                self._release(opened)
        raise AssertionError("unreachable")

    def _acquire(self, ticket: Ticket) -> Opened:
        nv = _import_pynvml()
        boot = self._boot_id()
        with self._init:
            with self._state:
                cur = self._current
            if cur is not None and (cur.nv is not nv or cur.retired or not self._same_driver(cur, boot)):
                self._drop(cur, shutdown=cur.nv is nv)
                cur = None
            if cur is None:
                cur = self._start(nv, boot)
            with self._state:
                cur.users += 1
                ticket.opened = cur
                if ticket.timed_out:  # the caller gave up while this read was starting NVML
                    self._abandon_locked(cur)
        return cur

    def _same_driver(self, cur: Opened, boot: str | None) -> bool:
        if boot != cur.boot_id:
            return False
        try:
            return text(cur.nv.nvmlSystemGetDriverVersion()) == cur.driver_version
        except cur.nv.NVMLError:
            return False

    def _start(self, nv: ModuleType, boot: str | None) -> Opened:
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise init_failure(exc) from None
        try:
            driver = text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = None
        opened = Opened(nv, driver, boot, self)
        with self._state:
            self.inits += 1
            self._current = opened
        return opened

    def share(self, opened: Opened) -> None:
        """One more user of `opened` (a worker reading one GPU for the read that holds it): it is
        shut down only after this one's release too, even if the read gave up waiting for it."""
        with self._state:
            opened.users += 1

    def release(self, opened: Opened) -> None:
        self._release(opened)

    def _release(self, opened: Opened) -> None:
        with self._state:
            opened.users -= 1
            if opened.retired and self._current is opened:
                self._current = None
                opened.owes_shutdown = True
            shut = opened.owes_shutdown and opened.users == 0
            if shut:
                opened.owes_shutdown = False
        if shut:
            self._shutdown(opened)

    def _drop(self, opened: Opened, *, shutdown: bool) -> None:
        with self._state:
            if self._current is opened:
                self._current = None
            opened.retired = True
            shut = shutdown and opened.users == 0
            if shutdown and not shut:
                opened.owes_shutdown = True  # the last reader out shuts it down
        if shut:
            self._shutdown(opened)

    def _shutdown(self, opened: Opened) -> None:
        with contextlib.suppress(opened.nv.NVMLError):
            opened.nv.nvmlShutdown()
        with self._state:
            self.shutdowns += 1

    def abandon(self, ticket: Ticket) -> None:
        """The caller gave up on the read holding `ticket` (it may be stuck inside NVML): its
        session is handed out no more and is shut down only by its last reader, if that returns."""
        with self._state:
            ticket.timed_out = True
            if ticket.opened is not None:
                self._abandon_locked(ticket.opened)

    def _abandon_locked(self, opened: Opened) -> None:
        if self._current is opened:
            self._current = None
        opened.retired = True
        opened.owes_shutdown = True

    def close(self) -> None:
        """Shut the kept session down (when no read is using it), e.g. at the agent's exit."""
        with self._state:
            cur = self._current
        if cur is not None:
            self._drop(cur, shutdown=True)


SESSION = NvmlSession()


def bounded_read(
    watchdog: Bounded, key: str, reader: Callable[[Opened], T], timeout_s: float, *, what: str, thread: str
) -> T:
    """reader on the shared session, in a worker thread the caller waits for at most timeout_s.
    Raises ProbeTimeout (hung now, or an earlier read still hung), NvmlUnavailable,
    ToolReportedFailure."""
    ticket = Ticket()
    try:
        return watchdog.run(key, lambda: SESSION.read(reader, ticket), timeout_s, thread_name=thread)
    except StillStuck as stuck:
        raise ProbeTimeout(
            f"an earlier {what} is still hung in the driver ({stuck.count} stuck call(s)); "
            "not calling NVML again until it returns"
        ) from None
    except TimedOut:
        SESSION.abandon(ticket)
        raise ProbeTimeout(
            f"NVML did not answer within {timeout_s:g} s (a GPU or the driver is hung)"
        ) from None

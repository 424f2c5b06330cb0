"""Reads bounded in time: a reader runs in a daemon thread and its caller waits at most a limit.

A read stuck in the kernel or a driver (a sysfs read of a dying device, an NVML call on a hung GPU)
cannot be killed. Its thread is parked, and while it is still stuck no other read under the same
key is started: stuck threads never pile up, and the caller hears at once that it cannot look.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class TimedOut(Exception):
    """The read did not finish within its limit; its thread is parked."""


class StillStuck(Exception):
    """An earlier read under this key is still stuck: no new one was started."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} stuck read(s)")
        self.count = count


class Bounded:
    """Runs reads within a time limit; remembers, per key, the threads parked after a timeout."""

    def __init__(self) -> None:
        self._parked: dict[str, list[threading.Thread]] = {}
        self._lock = threading.Lock()

    def parked(self, key: str) -> list[threading.Thread]:
        """The threads of earlier reads under `key` that are still stuck."""
        with self._lock:
            return self._alive(key)

    def _alive(self, key: str) -> list[threading.Thread]:
        alive = [t for t in self._parked.get(key, ()) if t.is_alive()]
        if alive:
            self._parked[key] = alive
        else:
            self._parked.pop(key, None)
        return alive

    def run(self, key: str, reader: Callable[[], T], limit_s: float, *, thread_name: str) -> T:
        """reader() within limit_s. Raises StillStuck (not started), TimedOut (thread parked), or
        whatever reader raised, in the caller's thread."""
        with self._lock:
            stuck = self._alive(key)
            if stuck:
                raise StillStuck(len(stuck))
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = reader()
            except BaseException as exc:  # handed to the caller's thread below
                box["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=work, name=thread_name, daemon=True)
        worker.start()
        if not done.wait(limit_s):
            with self._lock:
                self._parked.setdefault(key, []).append(worker)
            raise TimedOut(f"{thread_name} did not finish in {limit_s:g} s")
        if "error" in box:
            raise box["error"]
        value: T = box["value"]
        return value

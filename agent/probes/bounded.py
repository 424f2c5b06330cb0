"""Reads bounded in time: a reader runs in a daemon thread and its caller waits at most a limit.

A read stuck in the kernel or a driver (a sysfs read of a dying device, an NVML call on a hung GPU)
cannot be killed. Its thread is parked, and while it is still stuck no other read under the same
key is started: stuck threads never pile up, and the caller hears at once that it cannot look.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
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

    def run_each(
        self, readers: Mapping[str, Callable[[], T]], limit_s: float, *, thread_prefix: str
    ) -> dict[str, T | BaseException]:
        """Every reader at once, each in its own worker, all waited for until one deadline (limit_s
        from now). Per key: its value, or what it raised, or StillStuck (not started: an earlier
        read under that key is stuck), or TimedOut (its thread parked). One slow reader costs the
        others nothing."""
        deadline = time.monotonic() + limit_s
        out: dict[str, T | BaseException] = {}
        running: dict[str, tuple[threading.Thread, threading.Event, dict[str, Any]]] = {}
        with self._lock:
            stuck = {key: len(self._alive(key)) for key in readers}
        for key, reader in readers.items():
            if stuck[key]:
                out[key] = StillStuck(stuck[key])
                continue
            box: dict[str, Any] = {}
            done = threading.Event()

            def work(
                reader: Callable[[], T] = reader, box: dict[str, Any] = box, done: threading.Event = done
            ) -> None:
                try:
                    box["value"] = reader()
                except BaseException as exc:  # handed to the caller below
                    box["error"] = exc
                finally:
                    done.set()

            worker = threading.Thread(target=work, name=f"{thread_prefix}-{key}", daemon=True)
            worker.start()
            running[key] = (worker, done, box)
        for key, (worker, done, box) in running.items():
            if not done.wait(max(0.0, deadline - time.monotonic())):
                with self._lock:
                    self._parked.setdefault(key, []).append(worker)
                out[key] = TimedOut(f"{worker.name} did not finish in {limit_s:g} s")
            else:
                out[key] = box["error"] if "error" in box else box["value"]
        return {key: out[key] for key in readers}

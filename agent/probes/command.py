"""Run a node tool with a hard timeout. A hung tool (nvidia-smi on a dying GPU) is killed with its
whole process group and reaped, so the agent never leaks zombies or blocks a loop."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from agent.core.probed import ProbeError, ProbeErrorKind


@dataclass(frozen=True)
class CommandOutput:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


# Children that would not die (uninterruptible sleep): reaped on later calls, never left as zombies.
_UNREAPED: list[subprocess.Popen[bytes]] = []


def _reap_stragglers() -> None:
    _UNREAPED[:] = [p for p in _UNREAPED if p.poll() is None]


def run_command(
    argv: list[str], timeout_s: float, *, max_bytes: int = 64 * 1024 * 1024
) -> CommandOutput | ProbeError:
    """Run argv; return its output, or a ProbeError (UNAVAILABLE if missing, TIMEOUT if it hung).

    A non-zero exit is returned as output: nvidia-smi prints useful text (lost GPUs) with exit != 0.
    """
    _reap_stragglers()
    name = " ".join(argv)
    exe = shutil.which(argv[0])
    if exe is None:
        return ProbeError(name, ProbeErrorKind.UNAVAILABLE, f"{argv[0]} not found on PATH")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: the kill reaches its children too
        )
    except OSError as exc:
        return ProbeError(name, ProbeErrorKind.UNAVAILABLE, f"cannot start: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return ProbeError(name, ProbeErrorKind.TIMEOUT, f"no answer after {timeout_s:g} s; killed")
    seconds = time.monotonic() - started
    return CommandOutput(
        argv=tuple(argv),
        returncode=proc.returncode,
        stdout=out[:max_bytes].decode("utf-8", errors="replace"),
        stderr=err[:max_bytes].decode("utf-8", errors="replace"),
        seconds=seconds,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.communicate(timeout=5)  # reap: no zombie, pipes closed
    except subprocess.TimeoutExpired:
        # A process stuck in uninterruptible sleep (D state) cannot die yet: reap it later.
        _UNREAPED.append(proc)

"""Fail closed in half an install: the agent writes nothing to its Node while RBAC marks it to be
fenced but the fence does not hold it (the policy or its binding deleted, a cluster without
ValidatingAdmissionPolicy).

The admission policy is what keeps a marked identity to its own Node and keys; with the policy or
its binding gone (a `helm uninstall` or `kubectl delete` half done, a binding applied before its
policy) the API server would take anything the agent's RBAC allows. The start-up proof
(reporters/fence.py) tells; this guard stands between the agent loop and the Node writer and holds
every write while the proof says so, asking again at most every REPROVE_S while it holds (and the
wiring asks again on every config reload), so writes resume once the fence is back. An identity
RBAC does not mark (a cluster-admin kubeconfig, an install without the mark) only gets the alert.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.core.marks import Marks
from agent.reporters.fence import FenceProof, FenceResult

WAIT_S = 30.0  # the first write waits this long for the start-up proof (its requests time out)
REPROVE_S = 30.0


@dataclass(frozen=True)
class Held:
    """A write not sent (the loop retries it like a failed one)."""

    error: str
    ok: bool = False
    brake_open: bool = False


class FenceGuard:
    def __init__(
        self,
        prove: Callable[[], FenceProof],
        on_proof: Callable[[FenceProof], None],
        *,
        wait_s: float = WAIT_S,
        reprove_s: float = REPROVE_S,
    ) -> None:
        """prove(): the fence proof (never raises); on_proof: log and metric of each new answer."""
        self._prove, self._on_proof = prove, on_proof
        self.wait_s, self.reprove_s = wait_s, reprove_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.proof: FenceProof | None = None
        self._at = 0.0

    def prove_now(self) -> FenceProof:
        """Ask the API server again; report the answer when it differs from the last."""
        proof = self._prove()
        with self._lock:
            old, self.proof, self._at = self.proof, proof, time.monotonic()
        self._done.set()
        if old is None or (old.result, old.marked) != (proof.result, proof.marked):
            self._on_proof(proof)
        return proof

    def start(self) -> threading.Thread:
        """The start-up proof, in the background (the first write waits for it)."""
        thread = threading.Thread(target=self.prove_now, name="fence-proof", daemon=True)
        thread.start()
        return thread

    def hold(self) -> str | None:
        """Why no write may go out now, or None."""
        if not self._done.wait(self.wait_s):
            return "the start-up proof of the admission fence has not answered yet"
        proof = self.proof
        if proof is not None and proof.holds_writes and time.monotonic() - self._at >= self.reprove_s:
            proof = self.prove_now()
        if proof is None or not proof.holds_writes:
            return None
        return f"unfenced although marked to be fenced, every Node write held (fail closed): {proof.detail}"

    @property
    def result(self) -> FenceResult | None:
        return self.proof.result if self.proof is not None else None


class GuardedWriter:
    """The Node writer behind the guard (the agent loop's Writer)."""

    def __init__(self, writer: Any, guard: FenceGuard) -> None:
        self.writer, self.guard = writer, guard

    def apply(self, marks: Marks) -> Any:
        why = self.guard.hold()
        return Held(why) if why is not None else self.writer.apply(marks)

    def read_results(self) -> dict[str, Any] | None:
        return self.writer.read_results()  # type: ignore[no-any-return]

    def start(self) -> None:
        self.writer.start()

    def stop(self) -> None:
        self.writer.stop()


__all__ = ["FenceGuard", "GuardedWriter", "Held"]

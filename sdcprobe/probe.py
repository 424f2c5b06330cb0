"""One SDC probe run: attempt 1 on every GPU; on any disagreement an immediate attempt 2 with the
same inputs on every GPU; a versioned JSON report of every attempt.

Inputs are generated once from the fixed seed on the host and handed to each device, so every GPU
computes the same thing; each output is reduced to the SHA-256 of its bytes per (kernel, precision).
The devices run side by side (a thread each: the compute releases the interpreter). The report
holds the digests, the GPUs whose digest differs from the majority of their siblings' (for a
reader; the agent's check derives its verdict from the digests itself), the durations, the
precisions each device ran and each device's error. Who is odd is judged by the agent
(agent/core/sdc_report.py), never here.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sdcprobe import REPORT_VERSION
from sdcprobe.backend import KERNELS, PRECISIONS, Backend, Device

SEED = 20240607  # fixed: every run of every node computes the same inputs


@dataclass(frozen=True)
class Plan:
    seed: int = SEED
    size: int = 16
    kernels: tuple[str, ...] = KERNELS
    precisions: tuple[str, ...] = PRECISIONS


def _key(kernel: str, precision: str) -> str:
    return f"{kernel}/{precision}"


def _one(backend: Backend, dev: Device, kernel: str, precision: str, inputs: Any) -> tuple[str, float]:
    """(the output's digest, or the error as "!" + text; the seconds it took)."""
    started = time.monotonic()
    try:
        out = backend.compute(dev, kernel, precision, inputs)
        return hashlib.sha256(out).hexdigest(), time.monotonic() - started
    except Exception as exc:  # this GPU could not run it: its error, never a mismatch
        return f"!{type(exc).__name__}: {exc}", time.monotonic() - started


def differed(digests: dict[str, dict[str, str]]) -> tuple[dict[str, list[str]], list[str]]:
    """(device → the keys where its digest is not its siblings' majority, the keys with more than
    one digest and no majority of more than half)."""
    keys = sorted({k for d in digests.values() for k in d})
    odd: dict[str, list[str]] = {}
    split: list[str] = []
    for key in keys:
        seen = {dev: d[key] for dev, d in digests.items() if key in d}
        top, n = Counter(seen.values()).most_common(1)[0]
        if n == len(seen):
            continue
        if len(seen) < 3 or n * 2 <= len(seen):
            split.append(key)
            continue
        for dev, digest in seen.items():
            if digest != top:
                odd.setdefault(dev, []).append(key)
    return odd, split


def attempt(backend: Backend, devices: list[Device], plan: Plan, inputs: Any, number: int) -> dict[str, Any]:
    """One attempt: each (precision, kernel) on every GPU at once (one precision at a time: a
    backend's precision switches, TF32 on or off, are process-wide), a GPU that errored left out of
    the rest."""
    digests: dict[str, dict[str, str]] = {str(d.index): {} for d in devices}
    seconds = dict.fromkeys(digests, 0.0)
    errors: dict[str, str] = {}
    have = {str(d.index): backend.precisions(d) for d in devices}
    with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        for precision in plan.precisions:
            for kernel in plan.kernels:
                on = [d for d in devices if str(d.index) not in errors and precision in have[str(d.index)]]

                def run(d: Device, kernel: str = kernel, precision: str = precision) -> tuple[str, float]:
                    return _one(backend, d, kernel, precision, inputs)

                for d, (digest, took) in zip(on, pool.map(run, on), strict=True):
                    seconds[str(d.index)] += took
                    if digest.startswith("!"):
                        errors[str(d.index)] = f"{_key(kernel, precision)}: {digest[1:]}"
                    else:
                        digests[str(d.index)][_key(kernel, precision)] = digest
    odd, split = differed(digests)
    return {
        "attempt": number,
        "digests": digests,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "errors": errors,
        "differed": odd,
        "split": split,
    }


def run_probe(backend: Backend, plan: Plan) -> dict[str, Any]:
    """The whole run: attempt 1; attempt 2 at once where any (kernel, precision) disagreed."""
    started, t0 = datetime.now(timezone.utc), time.monotonic()
    devices = backend.devices()
    inputs = backend.inputs(plan.seed, plan.size)  # once, on the host: every GPU gets the same
    attempts = [attempt(backend, devices, plan, inputs, 1)]
    if attempts[0]["differed"] or attempts[0]["split"]:
        attempts.append(attempt(backend, devices, plan, inputs, 2))
    return {
        "version": REPORT_VERSION,
        "backend": backend.name,
        "seed": plan.seed,
        "size": plan.size,
        "startedAt": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(time.monotonic() - t0, 3),
        "devices": [
            {
                "index": d.index,
                "uuid": d.uuid,
                "pciBusId": d.pci_bus_id,
                "name": d.name,
                "precisions": [p for p in plan.precisions if p in backend.precisions(d)],
            }
            for d in devices
        ],
        "attempts": attempts,
    }


__all__ = ["SEED", "Plan", "attempt", "differed", "run_probe"]

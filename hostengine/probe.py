"""Readiness/liveness probe: a real DCGM connection that lists the GPUs (`python -m hostengine.probe`).

Exit 0 when the engine answers and sees at least one GPU (or --allow-no-gpu), 1 otherwise; one line
on stdout says what it saw. A TCP probe alone passes for an engine that accepts but cannot serve.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from agent.probes.dcgm.bindings import DCGM_FE_GPU
from agent.probes.dcgm.client import DcgmClient, EngineUnavailable


def probe(address: str, timeout_s: float = 5.0, allow_no_gpu: bool = False) -> tuple[bool, str]:
    client = DcgmClient(address, timeout_s, grace_s=0.0)
    try:
        gpus = client.call(
            "dcgmGetEntityGroupEntities",
            lambda h: list(h.GetSystem().discovery.GetEntityGroupEntities(DCGM_FE_GPU, True)),
        )
    except EngineUnavailable as exc:
        return False, str(exc)
    except Exception as exc:
        return False, f"DCGM host engine at {address} answered with an error: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    if not gpus and not allow_no_gpu:
        return False, f"DCGM host engine at {address} sees no GPU"
    return True, f"DCGM host engine at {address} ok: {len(gpus)} GPU(s) {gpus}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hostengine.probe")
    p.add_argument("--address", default=os.environ.get("HOSTENGINE_PROBE_ADDRESS", "127.0.0.1:5555"))
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--allow-no-gpu", action="store_true")
    a = p.parse_args(argv)
    ok, msg = probe(a.address, a.timeout, a.allow_no_gpu)
    print(msg, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

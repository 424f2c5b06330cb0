"""Every check, in report order, with the inputs it reads (so `--only` probes no more than needed)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from agent.checks import CheckFn, dcgm, efa, gpu, nvlink, topology, xid
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult


@dataclass(frozen=True)
class CheckSpec:
    name: str
    fn: CheckFn
    inputs: tuple[Input, ...]
    tier: str  # the agent tier that runs it: gpu, xid, efa, topology


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("gpu.responsive", gpu.check_responsive, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.count", gpu.check_count, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.ecc", gpu.check_ecc, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.row-remap", gpu.check_row_remap, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.retired-pages", gpu.check_retired_pages, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.recovery-action", gpu.check_recovery_action, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.throttle", gpu.check_throttle, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.pcie", gpu.check_pcie, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.persistence", gpu.check_persistence, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.fabric", gpu.check_fabric, (Input.GPUS,), "gpu"),
    CheckSpec("gpu.allocatable", gpu.check_allocatable, (Input.GPUS, Input.NODE), "gpu"),
    CheckSpec("xid", xid.check_xid, (Input.KERNEL, Input.GPUS), "xid"),
    CheckSpec("nvlink", nvlink.check_nvlink, (Input.NVLINK,), "topology"),
    CheckSpec("topology", topology.check_topology, (Input.TOPO,), "topology"),
    CheckSpec("efa", efa.check_efa, (Input.RDMA,), "efa"),
    CheckSpec("dcgm-health", dcgm.check_dcgm_health, (Input.DCGM_HEALTH,), "dcgm-health"),
    CheckSpec("dcgm-diag", dcgm.check_dcgm_diag, (Input.DCGM_DIAG,), "dcgm-diag"),
)
BY_NAME = {spec.name: spec for spec in CHECKS}


def select(only: Iterable[str] | None, cfg: Config) -> list[CheckSpec]:
    """Checks to run: `only` entries may be names ("gpu.ecc") or prefixes ("gpu"); disabled ones drop out."""
    specs = [s for s in CHECKS if cfg.enabled(s.name)]
    if not only:
        return specs
    wanted = list(only)
    unknown = [w for w in wanted if not any(s.name == w or s.name.startswith(w + ".") for s in CHECKS)]
    if unknown:
        raise KeyError(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [s for s in specs if any(s.name == w or s.name.startswith(w + ".") for w in wanted)]


def needed_inputs(specs: Iterable[CheckSpec]) -> set[Input]:
    return {i for s in specs for i in s.inputs}


def run_checks(specs: Iterable[CheckSpec], facts: NodeFacts, cfg: Config) -> list[CheckResult]:
    """Run each check; a bug in one check becomes that check's `unknown`, never a crash of the rest."""
    results = []
    for spec in specs:
        started = time.perf_counter()
        try:
            result = spec.fn(facts, cfg)
        except Exception as exc:  # a check is pure code: an exception is our bug, not the GPU's
            result = CheckResult(spec.name, unknown=f"internal error in check: {type(exc).__name__}: {exc}")
        results.append(replace(result, duration_ms=(time.perf_counter() - started) * 1000.0))
    return results

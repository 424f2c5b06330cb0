"""The host around the GPUs: CPUs offline, NUMA nodes missing, a GPU power limit lowered by hand.

CPUs: "possible" counts hotplug slots that may never hold a CPU (a VM's maximum, firmware's
table), so a CPU is judged offline when it is present and not online; possible-but-absent CPUs are
noted. NUMA: the nodes with CPUs are counted (Grace Hopper's GPU memory shows as CPU-less nodes).
Power: the enforced limit below the default one means someone (nvidia-smi -pl, a DCGM policy, a
power-capping daemon) capped the GPU; the GPU's own brake (HW power brake) is gpu.throttle's.
"""

from __future__ import annotations

from agent.checks import CheckSpec, per_gpu, rule_finding, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult
from agent.core.gpu import Gpu
from agent.core.host import HostInfo
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.text import id_ranges

CPUS, NUMA, POWER = "host.cpus", "host.numa", "host.power-cap"

CPUS_OFFLINE = Rule("host.cpus.offline", Severity.MONITOR, "a present CPU is offline")
NUMA_COUNT = Rule("host.numa.count", Severity.ISOLATE, "NUMA nodes with CPUs differ from the profile")
POWER_CAPPED = Rule("host.power-cap.capped", Severity.MONITOR, "a GPU's power limit set below its default")


def check_cpus(facts: NodeFacts, cfg: Config) -> CheckResult:
    host = typed_input(CPUS, facts.host, HostInfo)
    if isinstance(host, CheckResult):
        return host
    if host.cpus_online is None or host.cpus_present is None:
        return CheckResult(CPUS, unknown="cpu/online or cpu/present unreadable")
    offline = tuple(sorted(set(host.cpus_present) - set(host.cpus_online)))
    notes = [f"{len(host.cpus_online)} of {len(host.cpus_present)} present CPU(s) online"]
    absent = set(host.cpus_possible or ()) - set(host.cpus_present)
    if absent:
        notes.append(f"{len(absent)} possible CPU slot(s) not present (not judged)")
    if not offline:
        return CheckResult(CPUS, note="; ".join(notes))
    msg = f"{len(offline)} present CPU(s) offline: {id_ranges(offline)}"
    return CheckResult(CPUS, findings=(rule_finding(cfg, CPUS, CPUS_OFFLINE, msg),), note="; ".join(notes))


def check_numa(facts: NodeFacts, cfg: Config) -> CheckResult:
    host = typed_input(NUMA, facts.host, HostInfo)
    if isinstance(host, CheckResult):
        return host
    nodes = host.numa_with_cpu if host.numa_with_cpu is not None else host.numa_online
    if nodes is None:
        return CheckResult(NUMA, skipped="no NUMA information (kernel without CONFIG_NUMA)")
    prof = facts.profile
    note = f"{len(nodes)} NUMA node(s) with CPUs ({id_ranges(nodes)})"
    if prof is None or prof.numa_nodes is None:
        what = prof.instance_type if prof is not None else "an unknown instance type"
        return CheckResult(NUMA, note=f"{note}; no NUMA node count in the profile of {what}")
    if len(nodes) == prof.numa_nodes:
        return CheckResult(NUMA, note=note)
    msg = f"{len(nodes)} NUMA node(s) with CPUs, {prof.instance_type} has {prof.numa_nodes}"
    return CheckResult(NUMA, findings=(rule_finding(cfg, NUMA, NUMA_COUNT, msg),), note=note)


def _power(gpu: Gpu) -> list[tuple[Rule, str]]:
    enforced, default = gpu.power.enforced_limit_w, gpu.power.default_limit_w
    if enforced is None or default is None or enforced >= default:
        return []
    return [(POWER_CAPPED, f"power limit {enforced:g} W enforced, default {default:g} W")]


def check_power(facts: NodeFacts, cfg: Config) -> CheckResult:
    return per_gpu(
        POWER,
        facts,
        cfg,
        _power,
        applies=lambda g: g.power.enforced_limit_w is not None and g.power.default_limit_w is not None,
        not_applicable="no GPU reports its power limits",
        ok="power limits at their defaults",
    )


CHECKS = (
    CheckSpec(CPUS, check_cpus, (Input.HOST,), "topology", (CPUS_OFFLINE,)),
    CheckSpec(NUMA, check_numa, (Input.HOST,), "topology", (NUMA_COUNT,)),
    CheckSpec(POWER, check_power, (Input.GPUS,), "gpu", (POWER_CAPPED,)),
)

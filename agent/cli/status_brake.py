"""`status`'s BRAKE section: the cap, and what counts against it, by name (core/brake_count.py).

An on-call reading "3 nodes would be tainted (3 tainted)" cannot tell that the three tainted nodes
and the three that would be are different sets. This section names them: the cap and the total it
is taken of (from the live ConfigMap), the nodes holding a slot, the nodes tainted without one (they
count: an older version's, or by hand), the slots that count for nothing (a stolen token's, a slot
an older agent never freed), the nodes the brake holds back, and our taint on a node whose agent
does not want it. Shown while any of them is there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from agent.cli.status_node import NodeStatus
from agent.config import Config, load_config_dir, parse_config
from agent.core.brake_count import Ticket, occupants, void
from agent.core.node_keys import TRUE, Keys
from agent.reporters.brake_rule import brake_cap
from agent.reporters.brake_slots import Slots
from agent.reporters.gpu_total import DEFAULT_SERVICE_ACCOUNT, daemonset_total
from agent.reporters.kube_rest import KubeRest, api_status

CONFIGMAP = "gpu-healthcheck-config"  # manifests/20-configmap.yaml


def brake_lines(
    nodes: Sequence[Mapping[str, Any]],
    statuses: Sequence[NodeStatus],
    tickets: Sequence[Ticket],
    *,
    cap: int,
    total: int,
    limit: str,
    prefix: str,
    now: float,
) -> list[str]:
    """Pure: the section's lines ([] when nothing is tainted, held or holding a slot)."""
    keys = Keys(prefix)
    labels = {str(n["metadata"]["name"]): (n["metadata"].get("labels") or {}) for n in nodes}
    tainted = {n for n, lab in labels.items() if lab.get(keys.tainted) == TRUE}
    claimers = {n for n, lab in labels.items() if lab.get(keys.brake_slot) or lab.get(keys.status) == "fail"}
    counted = occupants(tickets, claimers, tainted, asker="", now=now)
    bad = void(tickets, claimers, tainted, now)
    holders = {t.holder: t for t in tickets if t not in bad}
    by_name = {s.node: s for s in statuses}
    held = sorted(
        s.node
        for s in statuses
        if s.taint is None and s.rollout is not None and s.rollout.mode == "taint" and s.rollout.wouldTaint
    )
    unwanted = sorted(
        n for n in tainted if (s := by_name.get(n)) is not None and s.status != "fail"
    )  # our taint, and the agent's verdict wants none
    if not (counted or held or tickets):
        return []
    over = ": OVER THE CAP" if len(counted) > cap else ""
    out = [f"BRAKE (cap {cap} of {total} GPU nodes, {limit}; {len(counted)} count{over})"]
    if holders:
        out.append("  holding a slot: " + ", ".join(f"{n} ({t.name})" for n, t in sorted(holders.items())))
    unslotted = sorted(tainted - set(holders))
    if unslotted:
        out.append(
            "  tainted without a slot (they count: an older version's, or by hand): " + ", ".join(unslotted)
        )
    if bad:
        out.append(
            "  slots that count for nothing (a holder that claims none, or its extra slots): "
            + ", ".join(f"{t.name} ({t.holder or '?'})" for t in bad)
        )
    if held:
        out.append("  held back by the brake (would be tainted): " + ", ".join(held))
    if unwanted:
        out.append("  WARNING our taint on a node whose agent does not want it: " + ", ".join(unwanted))
    return out


def live_config(rest: KubeRest, namespace: str) -> tuple[Config, str]:
    """The agents' ConfigMap (else the shipped config) and which it is."""
    try:
        doc = rest.json("GET", f"/api/v1/namespaces/{namespace}/configmaps/{CONFIGMAP}")
        return parse_config(
            yaml.safe_load((doc.get("data") or {}).get("config.yaml") or "") or {}
        ), "ConfigMap"
    except Exception:  # unreadable or invalid: say which config the cap is from
        return load_config_dir(shipped_only=True), "shipped config"


def brake_section(
    core: Any, nodes: Sequence[Mapping[str, Any]], statuses: Sequence[NodeStatus], namespace: str, prefix: str
) -> str:
    """The section as text ("" when there is nothing to show, or the slots cannot be listed)."""
    rest = KubeRest.of(core)
    try:
        tickets = Slots(rest, namespace, prefix).tickets()
    except Exception as exc:
        if api_status(exc) in (401, 403, 404):
            return ""
        raise
    cfg, source = live_config(rest, namespace)
    n = cfg.node
    total = daemonset_total(rest, namespace, DEFAULT_SERVICE_ACCOUNT) or len(nodes)
    cap = brake_cap(total, n.max_tainted_fraction, n.max_tainted_nodes)
    limit = f"maxTaintedFraction {n.max_tainted_fraction:g}" + (
        f", maxTaintedNodes {n.max_tainted_nodes}" if n.max_tainted_nodes > 0 else ""
    )
    lines = brake_lines(
        nodes,
        statuses,
        tickets,
        cap=cap,
        total=total,
        limit=f"{limit}, {source}",
        prefix=prefix,
        now=time.time(),
    )
    return "".join(f"\n{lines[0]}\n" if i == 0 else f"{line}\n" for i, line in enumerate(lines))


__all__ = ["brake_lines", "brake_section", "live_config"]

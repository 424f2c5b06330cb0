"""`gpu-healthcheck status`: one line per GPU node from what the agents wrote on the Nodes and the
state of their pods (DESIGN.md §4).

It reads the Nodes (labels, taints, the results annotation) and the agent pods (one list each), so
it works from any laptop with a kubeconfig and needs no access to the agents themselves.

The age of the last check costs the agents no write: the results annotation changes only when the
verdict does (its `checkedAt` is the last *change*; the last check is at or after it), and an agent
is Ready only while it checked within its `staleAfterSeconds` (also in the annotation). So a node
whose agent is Ready was checked less than staleAfterSeconds plus the readiness probe's lag ago, or
less than the age of `checkedAt` when that is shorter; a node without a Ready agent shows only the
latter, and its AGENT column says why. WARN counts the GPUs with a warning before a fault (a trend
that predicts a failing GPU, checks/trends.py) out of the GPUs the agent listed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from typing import Any

import yaml

from agent.cli import status_rollout as rollout_view
from agent.cli.status_clear import clear_lines, clear_pending, cleared_by_hand
from agent.cli.status_diag import diag_lines, diag_pending, last_diag
from agent.cli.status_findings import gpu_warnings, next_step, severity_of, worst_finding
from agent.cli.status_gpus import degraded_lines, driver_taints, fleet_rules, in_service
from agent.cli.status_node import AGENT_UNKNOWN, NO_AGENT, NOT_READY, READY, NodeStatus
from agent.cli.status_time import age, human, seconds_since
from agent.cli.status_validating import validating, validating_lines
from agent.core.gpu_nodes import DEFAULT_GPU_NODE_SELECTORS
from agent.core.node_keys import DEFAULT_PREFIX, TRACK_LABEL, Keys
from agent.core.results_doc import STALE_AFTER_FIELD, decode_results
from agent.core.severity import Status
from agent.reporters.device_taint_rules import node_label
from agent.reporters.kube_rest import KubeRest, api_status

AGENT_SELECTOR = "app.kubernetes.io/name=gpu-healthcheck-agent"  # the agent DaemonSet's pod label
HEADER = (
    "NODE",
    "STATUS",
    "SEVERITY",
    "LAST CHECK",
    "AGENT",
    "WARN",
    "GPUS",
    "DEVICE TAINTS",
    "NEXT STEP",
    "WORST FINDING",
)
ROLLOUT = (*rollout_view.WOULD_HEADER, *rollout_view.CONFIG_HEADER)
WIDE_HEADER = (*HEADER[:8], "TAINT", *ROLLOUT, "INSTANCE TYPE", "CHANGED", "VERSION", *HEADER[8:])
WOULD_TABLE_HEADER = (*HEADER[:8], *rollout_view.WOULD_HEADER, *HEADER[8:])  # a node in observe or label
# What each column says (docs/reference/status-columns.md is written from it: scripts/gen-docs.py).
COLUMNS = {
    "NODE": "the Node's name",
    "STATUS": "its status label: pass, warn, fail, unknown, degraded; `-` unmarked",
    "SEVERITY": "its severity label: none, monitor, reset, reboot, isolate",
    "LAST CHECK": "age of the last check: `<3m` with a Ready agent, `≤` the last change's age without",
    "AGENT": "its agent pod: ready, not-ready, none; `?` when the pods cannot be listed",
    "WARN": "GPUs with a warning before a fault, of the GPUs the agent listed (`2/8`)",
    "GPUS": "GPUs in service, of those listed (`7/8`; `0/8` under our node taint)",
    "DEVICE TAINTS": "taints on its DRA devices: ours (`gpu-3=reboot:NoExecute`) and the driver's",
    "TAINT": "our node taint, `severity:effect`",
    "WOULD TAINT": "in mode observe or label: the taint mode taint would add, before the brake",
    "WOULD MARK": "in mode observe or label: the remediation conditions mode taint would mark",
    "MODE": "node.mode in force on the node: observe, label, taint",
    "CONFIG": "the config in force: main, canary, last-good or shipped, and its digest",
    "INSTANCE TYPE": "the instance type the agent judged with",
    "CHANGED": "age of the last change of its verdict (the results annotation's checkedAt)",
    "VERSION": "the agent version that wrote it, `(canary)` on the image canary's pods",
    "NEXT STEP": "what to do about the worst finding (`when drained` on a degraded node)",
    "WORST FINDING": "the most severe finding: its rule and what it says",
}
FORMATS = ("table", "wide", "json", "yaml")
STATUS_ORDER = {"fail": 0, "degraded": 1, "unknown": 2, "warn": 3, "pass": 4}
REQUEST_TIMEOUT = (5, 60)  # not kube_rest's (5, 30): pages of 500 Nodes/Pods, slow on a big fleet
PROBE_PERIOD_DEFAULT, PROBE_FAILURES_DEFAULT = 10, 3  # the kubelet's readinessProbe defaults

# status's exit codes follow `check`'s: 0 every node pass/warn and freshly checked, 1 a node fails,
# 2 a node could not be judged (unknown, unmarked, or no Ready agent) and none fails; 64 usage;
# 69 (EX_UNAVAILABLE) the cluster could not be read.
EXIT_OK, EXIT_FAIL, EXIT_UNKNOWN, EXIT_UNAVAILABLE = 0, 1, 2, 69


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def readiness_lag_s(pod: Mapping[str, Any]) -> int:
    """How long the kubelet may still show Ready after /readyz turned false (period × failures)."""
    for c in (pod.get("spec") or {}).get("containers") or ():
        probe = c.get("readinessProbe")
        if probe:
            period = int(probe.get("periodSeconds") or PROBE_PERIOD_DEFAULT)
            return period * int(probe.get("failureThreshold") or PROBE_FAILURES_DEFAULT)
    return PROBE_PERIOD_DEFAULT * PROBE_FAILURES_DEFAULT


def node_status(
    node: Mapping[str, Any], pod: Mapping[str, Any] | None, *, prefix: str, now: datetime, pods_known: bool
) -> NodeStatus:
    """Pure: a Node (API JSON) and its agent pod (None: none there) → what `status` shows."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    keys = Keys(prefix)
    results = decode_results((meta.get("annotations") or {}).get(keys.results)) or {}
    changed = results.get("checkedAt") if isinstance(results.get("checkedAt"), str) else None
    since_change = seconds_since(changed, now)
    bound = since_change
    if not pods_known:
        agent = AGENT_UNKNOWN
    elif pod is None:
        agent = NO_AGENT
    elif pod_ready(pod):
        agent = READY
        stale_after = results.get(STALE_AFTER_FIELD)
        if isinstance(stale_after, int) and stale_after > 0:
            ready_bound = stale_after + readiness_lag_s(pod)
            bound = ready_bound if bound is None else min(bound, ready_bound)
    else:
        agent = NOT_READY
    if agent == READY:
        last = "-" if bound is None else f"<{human(bound)}"
    else:
        last = "-" if bound is None else f"≤{human(bound)}"
    taint = next(
        (
            f"{t.get('value', '')}:{t.get('effect', '')}"
            for t in (node.get("spec") or {}).get("taints") or ()
            if t.get("key") == keys.taint
        ),
        None,
    )
    warned, listed, per_rule = gpu_warnings(results)
    rollout = rollout_view.rollout_of(results)
    step = next_step(results)
    return NodeStatus(
        node=str(meta.get("name", "?")),
        status=str(labels.get(keys.status) or results.get("status") or "-"),
        severity=str(labels.get(keys.severity) or results.get("severity") or "-"),
        worstFinding=worst_finding(results),
        nextStep=step + " when drained"
        if labels.get(keys.status) == Status.DEGRADED.value and step != "-"
        else step,
        lastCheck=last,
        lastCheckMaxSeconds=bound,
        agent=agent,
        agentPod=str((pod.get("metadata") or {}).get("name")) if pod is not None else None,
        changedAt=changed,
        taint=taint,
        instanceType=str(results["instanceType"]) if results.get("instanceType") else None,
        agentVersion=str(results["agentVersion"]) if results.get("agentVersion") else None,
        warnGpus=warned,
        gpus=listed,
        warnings=per_rule or None,
        clearedByHand=cleared_by_hand(results, now),
        clearPending=clear_pending(meta.get("annotations") or {}, keys),
        diagPending=diag_pending(meta.get("annotations") or {}, keys),
        lastDiag=last_diag(results, now),
        rollout=rollout,
        marked=rollout_view.mark_state(rollout, (node.get("status") or {}).get("conditions") or ()),
        validating=validating(node, results, keys, now),
        track=((pod.get("metadata") or {}).get("labels") or {}).get(TRACK_LABEL) if pod is not None else None,
        gpusInService=in_service(results, listed, taint is not None),
        deviceTaints=driver_taints(results),
        deviceTaintsOf=node_label(str(meta.get("name", "?"))),
    )


def status_list(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]] | None,
    *,
    prefix: str,
    now: datetime,
) -> list[NodeStatus]:
    """Pure: fail first, then unknown, warn, pass, unmarked; within one, most severe, then by name.
    *pods*: the agent pods (None: they could not be read)."""
    by_node: dict[str, Mapping[str, Any]] = {}
    for pod in pods or ():
        name = (pod.get("spec") or {}).get("nodeName")
        if name and (name not in by_node or pod_ready(pod)):
            by_node[name] = pod
    out = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", "?"))
        out.append(node_status(node, by_node.get(name), prefix=prefix, now=now, pods_known=pods is not None))
    out.sort(key=lambda s: (STATUS_ORDER.get(s.status, 5), -int(severity_of(s.severity)), s.node))
    return out


def rows_of(statuses: Sequence[NodeStatus], now: datetime, *, wide: bool = False) -> list[tuple[str, ...]]:
    """Table rows (header_of's columns)."""
    rows = []
    shadow = rollout_view.shows_would([s.rollout for s in statuses])
    for s in statuses:
        base = (
            s.node,
            s.status,
            s.severity,
            s.lastCheck,
            s.agent,
            s.warn,
            s.gpusInService,
            ", ".join(s.deviceTaints or ()) or "-",
        )
        would, config = s.rollout.cells if s.rollout else (("-", "-"), ("-", "-"))
        extra = (
            s.taint or "-",
            *would,
            *config,
            s.instanceType or "-",
            age(s.changedAt, now),
            s.version,
        )
        middle = extra if wide else would if shadow else ()
        rows.append((*base, *middle, s.nextStep, s.worstFinding))
    return rows


def header_of(statuses: Sequence[NodeStatus], *, wide: bool = False) -> tuple[str, ...]:
    """HEADER; WOULD_TABLE_HEADER while a node runs observe or label; WIDE_HEADER."""
    if wide:
        return WIDE_HEADER
    return WOULD_TABLE_HEADER if rollout_view.shows_would([s.rollout for s in statuses]) else HEADER


def status_rows(
    nodes: Sequence[Mapping[str, Any]],
    *,
    prefix: str,
    now: datetime,
    pods: Sequence[Mapping[str, Any]] | None = None,
    wide: bool = False,
) -> list[tuple[str, ...]]:
    """Pure: Node dicts and agent pods (API JSON) → table rows, in status_list's order."""
    return rows_of(status_list(nodes, pods, prefix=prefix, now=now), now, wide=wide)


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] = HEADER) -> str:
    table = [tuple(header), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines) + "\n"


def exit_code(statuses: Sequence[NodeStatus]) -> int:
    """The `check` convention over the fleet: any fail → 1; else anything not judged fresh → 2."""
    if any(s.status == "fail" for s in statuses):
        return EXIT_FAIL
    if any(s.status not in ("pass", "warn") or not s.fresh for s in statuses):
        return EXIT_UNKNOWN
    return EXIT_OK


def list_all(core: Any, path: str, selector: str) -> list[dict[str, Any]]:
    """Every object at *path* matching *selector* as API JSON (paged)."""
    rest = KubeRest.of(core)
    items: list[dict[str, Any]] = []
    cont: str | None = None
    while True:
        query = {"labelSelector": selector, "limit": 500, "continue": cont}
        doc = rest.json("GET", path, query=query, timeout=REQUEST_TIMEOUT)
        items.extend(doc.get("items") or ())
        cont = (doc.get("metadata") or {}).get("continue")
        if not cont:
            return items


def list_nodes(core: Any, selectors: Sequence[str]) -> list[dict[str, Any]]:
    """All Nodes matching any of *selectors* as API JSON (paged; each Node once)."""
    nodes: dict[str, dict[str, Any]] = {}
    for selector in selectors:
        for item in list_all(core, "/api/v1/nodes", selector):
            nodes.setdefault(str((item.get("metadata") or {}).get("name")), item)
    return list(nodes.values())


def list_agent_pods(core: Any, selector: str) -> list[dict[str, Any]] | None:
    """The agent pods in every namespace (kustomize may rename it); None when forbidden."""
    try:
        return list_all(core, "/api/v1/pods", selector)
    except Exception as exc:
        if api_status(exc) in (401, 403):
            return None
        raise


def version_lines(statuses: Sequence[NodeStatus], *, always: bool) -> list[str]:
    """ "agents: 0.2.0 on 40 nodes, 0.2.1 (canary) on 2 nodes": which agents run which version, while
    a rollout has more than one (*always*: -o wide says it anyway)."""
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.version] = counts.get(s.version, 0) + 1
    if len(counts) < 2 and not always:
        return []
    most = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ["agents: " + ", ".join(f"{v} on {k} node{'' if k == 1 else 's'}" for v, k in most)]


def render(statuses: Sequence[NodeStatus], fmt: str, now: datetime) -> str:
    """-o table | wide | json | yaml."""
    if fmt == "json":
        return json.dumps([asdict(s) for s in statuses], indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        return str(yaml.safe_dump([asdict(s) for s in statuses], sort_keys=False, allow_unicode=True))
    wide = fmt == "wide"
    out = format_table(rows_of(statuses, now, wide=wide), header_of(statuses, wide=wide))
    rollout = rollout_view.summary_lines([(s.rollout, s.taint is not None, s.marked) for s in statuses])
    rollout += version_lines(statuses, always=wide)
    rollout += degraded_lines([(s.node, s.status, s.gpusInService) for s in statuses])
    out += "".join(f"{line}\n" for line in rollout)
    waiting = validating_lines(statuses)
    if waiting:
        head = f"\nWAITING FOR VALIDATION (the startup taint; longest first: {len(waiting)} node(s))\n"
        out += head + "".join(f"  {line}\n" for line in waiting)
    cleared = clear_lines(statuses, now)
    if cleared:
        out += "\nLATCHES CLEARED BY HAND (last 24 h)\n" + "".join(f"  {line}\n" for line in cleared)
    diags = diag_lines(statuses, now)
    if diags:
        out += "\nDIAGS ASKED FOR (pending; started in the last 24 h)\n" + "".join(f"  {x}\n" for x in diags)
    return out


def render_status(
    core: Any,
    *,
    prefix: str = DEFAULT_PREFIX,
    selectors: Sequence[str] = DEFAULT_GPU_NODE_SELECTORS,
    agent_selector: str = AGENT_SELECTOR,
    fmt: str = "table",
    now: datetime | None = None,
    namespace: str = "gpu-healthcheck",
    node: str | None = None,
) -> tuple[str, int]:
    """The output and exit code for every node matching any of *selectors* (*node*: that one only).
    API errors propagate to the CLI (except a forbidden pod list: the AGENT column then says `?`)."""
    now = now or datetime.now(timezone.utc)
    nodes = [n for n in list_nodes(core, selectors) if node in (None, (n.get("metadata") or {}).get("name"))]
    pods = list_agent_pods(core, agent_selector)
    statuses = status_list(nodes, pods, prefix=prefix, now=now)
    if fmt in ("table", "wide"):  # our DeviceTaintRules, one LIST for the fleet (cli/status_gpus.py)
        rules = fleet_rules(core, prefix)
        statuses = [
            replace(s, deviceTaints=[*(rules or {}).get(s.deviceTaintsOf, ()), *(s.deviceTaints or ())])
            for s in statuses
        ]
    out = render(statuses, fmt, now)
    if fmt in ("table", "wide"):  # the brake's cap and counts, held nodes and releases
        from agent.cli.brake import brake_footer
        from agent.cli.status_brake import brake_section

        out += brake_section(core, nodes, statuses, namespace, prefix)
        out += brake_footer(core, nodes, namespace, prefix, now)
    if fmt in ("table", "wide") and node is not None:  # its per-GPU DeviceTaintRules (cli/status_devices.py)
        from agent.cli.status_devices import device_taint_lines, gpu_risk_lines

        lines = device_taint_lines(core, node, prefix, wide=fmt == "wide")
        out += "".join(f"\n{line}" for line in lines[:1]) + "".join(f"\n  {line}" for line in lines[1:])
        out += "\n" if lines else ""
        risk = [gpu_risk_lines(n, prefix) for n in nodes if (n.get("metadata") or {}).get("name") == node]
        out += "".join(f"\n{line}" for lines in risk for line in lines) + ("\n" if any(risk) else "")
    return out, exit_code(statuses)

"""`gpu-healthcheck uninstall`: take everything of ours off every Node, so that nothing acts on it
once the agents are gone.

Only an agent lifts what it put on: a Node left with `<prefix>/validating` takes no pod again, one
labelled `gpu-healthcheck/track=canary` gets no agent from a re-install, and a remediation condition
left unhealthy keeps a repair engine acting. So, per Node: every label and annotation under the
prefix (and the image canary's track label, whatever the prefix), every taint under it (unhealthy,
validating and testing, on every Node, tainted or not), and our conditions: the configured types
(node.conditionType and node.remediationConditions, read from the install's ConfigMaps while they
exist, else the shipped config) and any condition carrying a reason only we write. Nothing else is
touched.

The agents must be stopped first (an agent would put its marks back at its next cycle): with an
agent pod still listed it refuses, unless --force. The conditions go first (an engine stops seeing
an unhealthy node), then the labels, annotations and taints in one Node PATCH with the Node's
resourceVersion as precondition (a Node changed meanwhile is read again). --dry-run lists what it
would remove and writes nothing.

Exit codes: 0 done (or, --dry-run, listed); 1 refused: agent pods still run; 2 a Node could not be
cleaned (named; run it again); 64 usage; 69 the cluster cannot be read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.config import parse_config, yaml_safe
from agent.config.fence_view import condition_types
from agent.config.schema import ConfigError
from agent.core.node_keys import DEFAULT_CONDITION_TYPE, TRACK_LABEL, Keys
from agent.core.remediation_types import OUR_REMEDIATION_REASONS
from agent.reporters.kube_rest import (
    MERGE_PATCH,
    REQUEST_TIMEOUT,
    STRATEGIC_MERGE_PATCH,
    KubeRest,
    api_status,
    node_path,
)

EXIT_OK, EXIT_REFUSED, EXIT_PARTIAL = 0, 1, 2
CONFLICT_ATTEMPTS = 5
FIELD_MANAGER = "gpu-healthcheck-uninstall"
# The install's ConfigMaps (manifests/20-configmap.yaml; the canary's: docs/guides/day-2-config.md
# "The canary ConfigMap").
CONFIGMAPS = ("gpu-healthcheck-config", "gpu-healthcheck-config-canary")


@dataclass(frozen=True)
class Removal:
    """What of ours one Node carries."""

    node: str
    labels: tuple[str, ...] = ()
    annotations: tuple[str, ...] = ()
    taints: tuple[str, ...] = ()  # as kubectl writes them: key=value:effect
    conditions: tuple[str, ...] = ()  # types

    @property
    def empty(self) -> bool:
        return not (self.labels or self.annotations or self.taints or self.conditions)

    def describe(self) -> str:
        parts = [
            f"{what} {', '.join(keys)}"
            for what, keys in (
                ("labels", self.labels),
                ("annotations", self.annotations),
                ("taints", self.taints),
                ("conditions", self.conditions),
            )
            if keys
        ]
        return "; ".join(parts) or "nothing of ours"


def _taint_text(t: Mapping[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def _taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or ())


def ours_condition(cond: Mapping[str, Any], types: Sequence[str]) -> bool:
    """A condition we wrote: a configured type of ours, or a reason no other component writes."""
    return cond.get("type") in types or cond.get("reason") in OUR_REMEDIATION_REASONS


def plan(node: Mapping[str, Any], prefix: str, types: Sequence[str]) -> Removal:
    """Pure: what of ours *node* (API JSON) carries under *prefix* and the condition *types*."""
    keys = Keys(prefix)
    meta = node.get("metadata") or {}

    def ours(key: str) -> bool:
        return keys.ours(key) or key == TRACK_LABEL

    return Removal(
        node=str(meta.get("name")),
        labels=tuple(sorted(k for k in meta.get("labels") or {} if ours(k))),
        annotations=tuple(sorted(k for k in meta.get("annotations") or {} if ours(k))),
        taints=tuple(_taint_text(t) for t in _taints(node) if keys.ours(str(t.get("key")))),
        conditions=tuple(
            str(c.get("type"))
            for c in (node.get("status") or {}).get("conditions") or ()
            if ours_condition(c, types)
        ),
    )


def metadata_patch(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The merge patch that removes our labels, annotations and taints, with the Node's
    resourceVersion (the taints are a whole list: a taint added meanwhile must not be lost)."""
    removal = plan(node, prefix, ())
    meta: dict[str, Any] = {"resourceVersion": node["metadata"]["resourceVersion"]}
    if removal.labels:
        meta["labels"] = dict.fromkeys(removal.labels)
    if removal.annotations:
        meta["annotations"] = dict.fromkeys(removal.annotations)
    patch: dict[str, Any] = {"metadata": meta}
    if removal.taints:
        patch["spec"] = {"taints": [t for t in _taints(node) if not Keys(prefix).ours(str(t.get("key")))]}
    return patch


def status_patch(types: Sequence[str]) -> dict[str, Any]:
    """The strategic merge patch of nodes/status that deletes the conditions of *types*."""
    return {"status": {"conditions": [{"type": t, "$patch": "delete"} for t in types]}}


def configured_types(rest: KubeRest, namespace: str) -> tuple[str | None, list[str], str]:
    """The prefix and the condition types the install's ConfigMaps name (the main one's prefix; the
    types of both), and a line saying where they came from. A ConfigMap that is gone or unreadable
    counts as the shipped config (GPUHealthy); the reasons only we write still find the rest."""
    prefix: str | None = None
    types: list[str] = []
    seen: list[str] = []
    for name in CONFIGMAPS:
        try:
            path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
            cm = rest.json("GET", path, timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                continue
            if api_status(exc) == 403:
                seen.append(f"{name} (forbidden: skipped)")
                continue
            raise
        try:
            cfg = parse_config(yaml_safe.load(((cm.get("data") or {}).get("config.yaml")) or "") or {})
        except (ConfigError, ValueError) as exc:
            seen.append(f"{name} (unreadable: {exc}; skipped)")
            continue
        prefix = prefix or cfg.prefix
        types += [t for t in condition_types(cfg.node) if t not in types]
        seen.append(name)
    if not types:  # none read: the shipped config's
        types.append(DEFAULT_CONDITION_TYPE)
    where = f"{namespace}/{', '.join(seen)}" if seen else f"no ConfigMap in {namespace}: the shipped config"
    return prefix, types, where


def list_nodes(rest: KubeRest) -> Iterator[dict[str, Any]]:
    """Every Node, a page at a time."""
    token = ""
    while True:
        query = {"limit": 500, **({"continue": token} if token else {})}
        page = rest.json("GET", "/api/v1/nodes", query=query, timeout=REQUEST_TIMEOUT)
        yield from page.get("items") or ()
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return


def agent_pods(rest: KubeRest, selector: str) -> list[str]:
    """namespace/name of the agent pods still listed (any namespace)."""
    doc = rest.json("GET", "/api/v1/pods", query={"labelSelector": selector}, timeout=REQUEST_TIMEOUT)
    return sorted(
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
        for p in doc.get("items") or ()
    )


def clean_node(rest: KubeRest, name: str, prefix: str, types: Sequence[str]) -> Removal:
    """Remove our conditions, then our labels, annotations and taints, from Node *name*; what was
    removed. API errors propagate."""
    node = rest.json("GET", node_path(name), timeout=REQUEST_TIMEOUT)
    first = plan(node, prefix, types)
    if first.conditions:
        rest.json(
            "PATCH",
            node_path(name, "status"),
            body=status_patch(first.conditions),
            content_type=STRATEGIC_MERGE_PATCH,
            query={"fieldManager": FIELD_MANAGER},
            timeout=REQUEST_TIMEOUT,
        )
    for _ in range(CONFLICT_ATTEMPTS):
        removal = plan(node, prefix, ())
        if removal.empty:
            break
        try:
            rest.json(
                "PATCH",
                node_path(name),
                body=metadata_patch(node, prefix),
                content_type=MERGE_PATCH,
                query={"fieldManager": FIELD_MANAGER},
                timeout=REQUEST_TIMEOUT,
            )
            break
        except Exception as exc:
            if api_status(exc) != 409:
                raise
            node = rest.json("GET", node_path(name), timeout=REQUEST_TIMEOUT)  # changed meanwhile
    else:
        raise RuntimeError(f"kept changing ({CONFLICT_ATTEMPTS} attempts)")
    return Removal(name, removal.labels, removal.annotations, removal.taints, first.conditions)


def uninstall(
    rest: KubeRest,
    *,
    prefix: str | None,
    extra_types: Sequence[str],
    namespace: str,
    agent_selector: str,
    dry_run: bool,
    force: bool,
    say: Callable[[str], None],
) -> int:
    """Clean every Node (or, *dry_run*, say what it would remove); the exit code. Reading the
    cluster's Nodes propagates an error (exit 69 at the caller); a Node that cannot be written is
    named and the rest go on (exit 2)."""
    running = agent_pods(rest, agent_selector)
    if running:
        shown = ", ".join(running[:5]) + (" …" if len(running) > 5 else "")
        say(f"agent pods still run ({len(running)}: {shown}): they would put their marks back")
        if not force:
            say(
                'refused: stop the agents first (docs/guides/upgrade.md "Uninstall"), or --force; '
                + ("nothing listed" if not dry_run else "listing anyway")
            )
            if not dry_run:
                return EXIT_REFUSED
    configured_prefix, types, where = configured_types(rest, namespace)
    prefix = prefix or configured_prefix or Keys().prefix
    types = [*types, *(t for t in extra_types if t not in types)]
    say(f"prefix {prefix}/, conditions {', '.join(types)} and any with a reason of ours ({where})")
    verb = "would remove" if dry_run else "removed"
    marked = failed = total = 0
    for node in list_nodes(rest):
        total += 1
        name = str(node["metadata"]["name"])
        if dry_run:
            removal = plan(node, prefix, types)
        else:
            try:
                removal = clean_node(rest, name, prefix, types)
            except Exception as exc:
                failed += 1
                say(f"{name}: FAILED: {type(exc).__name__}: {exc}"[:500])
                continue
        marked += not removal.empty
        say(f"{name}: {verb} {removal.describe()}" if not removal.empty else f"{name}: nothing of ours")
    said = f"{'dry run: ' if dry_run else ''}{marked} of {total} Nodes carried marks of ours"
    if failed:
        say(f"{said}; {failed} could not be cleaned: run it again")
        return EXIT_PARTIAL
    say(said + ("" if dry_run else "; all removed"))
    return EXIT_REFUSED if running and not force else EXIT_OK


__all__ = [
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_REFUSED",
    "Removal",
    "clean_node",
    "metadata_patch",
    "ours_condition",
    "plan",
    "status_patch",
    "uninstall",
]

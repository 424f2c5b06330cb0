"""Early warnings on the device (docs/clusters/dra-only.md): a warning confined to GPUs (a GPU's own
memory or thermal trend, a GPU's counter at `monitor`: core/device_scope.warn_scope; mode taint)
shows on those DRA devices as `<prefix>/unhealthy=monitor` with effect None, where the API serves
that effect. It moves no pod and the brake does not count it; a GPU a taint holds keeps its taint's
rule. Pure but for *devices*, which may wait for the slice watch's first list."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.core.device_scope import ISOLATION_NODE, Scope, rule_name
from agent.reporters.device_taint_rules import NONE_EFFECT, Wanted


def warning_rules(
    scope: Scope | None,
    mode: str,
    disabled: bool,
    taints: Any,
    devices: Callable[[tuple[str, ...]], Any],
    taint_rules: Mapping[str, Wanted],
) -> dict[str, Wanted]:
    """Rules of effect None on the GPUs a warning is confined to (not those a taint holds). *taints*:
    the DeviceTaints (its API served, node and prefix); *devices*: GPUs (PCI) → slice devices or None."""
    api = taints.api
    if mode == ISOLATION_NODE or disabled or scope is None or scope.node_wide or not scope.gpus:
        return {}
    if api is None or not api.none_effect:
        return {}
    found = devices(scope.gpus)
    if found is None:
        return {}
    out = {}
    for d in found:
        name = rule_name(taints.node_name, d, taints.prefix)
        if name not in taint_rules:
            out[name] = Wanted(d, "monitor", NONE_EFFECT)
    return out


__all__ = ["warning_rules"]

"""`gpu-healthcheck status`'s rollout view: which config each node runs, and what mode `taint` would
do there (the results annotation's `config` and `would` fields, engine/rollout.py).

While nodes run mode observe or label, the table adds WOULD TAINT and WOULD MARK and a line per
mode under it ("observe: 3 nodes would be tainted, 2 would be marked for remediation"); `-o wide`
always shows them, with MODE and CONFIG (main or canary, and the digest of its files), and a line
counts the nodes per config so that a canary's spread is seen at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.core.node_keys import MODE_LABEL, MODE_OBSERVE, MODES
from agent.core.results_doc import CONFIG_FIELD, WOULD_FIELD

WOULD_HEADER = ("WOULD TAINT", "WOULD MARK")
CONFIG_HEADER = ("MODE", "CONFIG")
SHADOW_MODES = (MODE_OBSERVE, MODE_LABEL)  # modes in which "would" differs from "does"


@dataclass(frozen=True)
class Rollout:
    """One node's config in force and what mode `taint` would do there (its JSON form too)."""

    config: str  # main | canary | last-good | shipped
    configDigest: str
    mode: str  # observe | label | taint
    wouldTaint: str | None = None  # "reboot:NoExecute": mode taint's taint, before the brake
    wouldMark: list[str] = field(default_factory=list)  # remediation condition types it would mark

    @property
    def cells(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """(WOULD TAINT, WOULD MARK), (MODE, CONFIG)."""
        would = (self.wouldTaint or "-", ",".join(self.wouldMark) or "-")
        return would, (self.mode, f"{self.config}@{self.configDigest or '-'}")


def rollout_of(results: Mapping[str, Any] | None) -> Rollout | None:
    """From the results annotation; None when it has no `config` (an agent older than this field)."""
    cfg = (results or {}).get(CONFIG_FIELD)
    if not isinstance(cfg, Mapping):
        return None
    would = (results or {}).get(WOULD_FIELD)
    would = would if isinstance(would, Mapping) else {}
    mark = would.get("mark")
    return Rollout(
        config=str(cfg.get("source") or "-"),
        configDigest=str(cfg.get("digest") or ""),
        mode=str(cfg.get("mode") or "-"),
        wouldTaint=str(would["taint"]) if would.get("taint") else None,
        wouldMark=[str(m) for m in mark] if isinstance(mark, list) else [],
    )


def shows_would(rollouts: Sequence[Rollout | None]) -> bool:
    """The table adds the WOULD columns while any node runs a shadow mode."""
    return any(r is not None and r.mode in SHADOW_MODES for r in rollouts)


def _nodes(n: int) -> str:
    return f"{n} node{'' if n == 1 else 's'}"


def summary_lines(nodes: Sequence[tuple[Rollout | None, bool]]) -> list[str]:
    """Per mode: how many nodes would be tainted and marked for remediation (in mode taint, how many
    are tainted: the brake or `<prefix>/taint=disabled` holds back the rest); *nodes*: (rollout,
    carries our taint). Then the configs in force when they are not one and the same."""
    lines = []
    for mode in MODES:
        here = [(r, tainted) for r, tainted in nodes if r is not None and r.mode == mode]
        if not here:
            continue
        taint = sum(r.wouldTaint is not None for r, _ in here)
        mark = sum(bool(r.wouldMark) for r, _ in here)
        are = f" ({sum(t for _, t in here)} tainted)" if mode not in SHADOW_MODES else ""
        lines.append(
            f"{mode} ({_nodes(len(here))}): {_nodes(taint)} would be tainted{are}, "
            f"{mark} would be marked for remediation"
        )
    configs: dict[str, int] = {}
    for r, _ in nodes:
        if r is not None:
            key = f"{r.config}@{r.configDigest or '-'}"
            configs[key] = configs.get(key, 0) + 1
    if len(configs) > 1 or any(not k.startswith("main@") for k in configs):
        lines.append("configs: " + ", ".join(f"{k} on {_nodes(n)}" for k, n in sorted(configs.items())))
    return lines


__all__ = ["CONFIG_HEADER", "WOULD_HEADER", "Rollout", "rollout_of", "shows_would", "summary_lines"]

"""The results annotation's rollout view: which config a node runs, and what mode `taint` would do.

An SRE stages a rollout observe → label → taint → remediation (docs/guides/day-2-config.md) and, at
each step, `gpu-healthcheck status` counts what the next one would do. The engine settles the
taint's and each remediation condition's hysteresis in every mode (recovery.Recovery), so the answer
costs no read; both fields change only when the verdict does (or on a reload), so a healthy node in
steady state costs no write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.config import Config
from agent.config.canary import MAIN
from agent.core.results_doc import CONFIG_FIELD, WOULD_FIELD
from agent.engine.recovery import Recovery

MARK_MAX = 8  # condition types listed under would.mark; more are counted ("+3 more")


def config_document(cfg: Config) -> dict[str, Any]:
    """Which config is in force: its source (main, canary, last-good, shipped), the digest of its
    files and its mode."""
    return {"source": cfg.source or MAIN, "digest": cfg.digest, "mode": cfg.node.mode}


def would_document(taint: Recovery, remediation: Mapping[str, Recovery], effect: str) -> dict[str, Any]:
    """What mode `taint` does with this verdict, before the brake and `<prefix>/taint=disabled`: the
    taint ("reboot:NoExecute") and the remediation condition types marked unhealthy; {} = nothing."""
    doc: dict[str, Any] = {}
    if taint.wanted:
        doc["taint"] = f"{taint.severity.label}:{effect}"
    marked = sorted(t for t, rec in remediation.items() if rec.wanted)
    if marked:
        extra = [f"+{len(marked) - MARK_MAX} more"] if len(marked) > MARK_MAX else []
        doc["mark"] = marked[:MARK_MAX] + extra
    return doc


def rollout_fields(cfg: Config, taint: Recovery, remediation: Mapping[str, Recovery]) -> dict[str, Any]:
    """The annotation's CONFIG_FIELD, and WOULD_FIELD when there is anything to say."""
    would = would_document(taint, remediation, cfg.node.effect_for(taint.severity))
    return {CONFIG_FIELD: config_document(cfg), **({WOULD_FIELD: would} if would else {})}


__all__ = ["MARK_MAX", "config_document", "rollout_fields", "would_document"]

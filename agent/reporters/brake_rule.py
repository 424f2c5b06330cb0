"""The brake's rule, pure (its inequality: reporters/brake.py's docstring, which counts and asks
it): may one more node be tainted, who of the racing contenders goes first, and who yields after a
race. Agents that see the same lists reach the same answers, without a lock."""

from __future__ import annotations

import math
from fractions import Fraction


def brake_decision(tainted_now: int, total: int, max_fraction: float, max_nodes: int = 0) -> tuple[bool, str]:
    """Pure: may one more node be tainted? (see the module docstring for the inequality)."""
    total = max(total, 1)
    if max_nodes > 0 and tainted_now >= max_nodes:
        return False, f"{tainted_now} GPU nodes already tainted, at the limit maxTaintedNodes={max_nodes}"
    frac = Fraction(str(max_fraction))
    if frac < 1 and tainted_now >= frac * total:
        return False, (
            f"{tainted_now}/{total} GPU nodes already tainted, at or above maxTaintedFraction={max_fraction}"
        )
    return True, f"{tainted_now}/{total} GPU nodes tainted, below the limit"


def brake_cap(total: int, max_fraction: float, max_nodes: int = 0) -> int:
    """Pure: the most nodes brake_decision lets be tainted at once (its inequality, solved for the end
    state): a taint is allowed while the others are < fraction × total, so at most ceil(fraction × total)."""
    total = max(total, 1)
    frac = Fraction(str(max_fraction))
    cap = total if frac >= 1 else max(0, math.ceil(frac * total))  # exact: Fraction, no float error
    if max_nodes > 0:
        cap = min(cap, max_nodes)
    return cap


def rank_decision(
    node_name: str,
    tainted_now: int,
    total: int,
    contenders: list[str],
    max_fraction: float,
    max_nodes: int = 0,
) -> tuple[bool, str]:
    """Pure: brake_decision, then share the free slots among the failing, untainted nodes that want
    one (*contenders*, this node among them) in name order. Agents that see the same contenders
    agree on who goes first without a lock, so a fleet-wide fault fills the slots instead of every
    agent seeing "0 tainted" at once and tainting past the limit."""
    ok, reason = brake_decision(tainted_now, total, max_fraction, max_nodes)
    if not ok:
        return ok, reason
    free = brake_cap(total, max_fraction, max_nodes) - tainted_now
    rank = sorted(set(contenders) | {node_name}).index(node_name)
    if rank >= free:
        return False, (
            f"{tainted_now}/{total} GPU nodes tainted; {rank} failing nodes ahead of this one (by name) "
            f"want the {free} free slot(s) under maxTaintedFraction={max_fraction}"
        )
    return True, f"{tainted_now}/{total} GPU nodes tainted, below the limit ({free} free, this node's turn)"


def must_back_off(node_name: str, tainted: list[str], cap: int) -> bool:
    """Pure: after a race put more than `cap` taints on, which nodes yield? The names after the first
    `cap` in sorted order: every agent computes the same answer from the same list, without a lock."""
    ranked = sorted(set(tainted))
    return len(ranked) > cap and node_name in ranked[cap:]


__all__ = ["brake_cap", "brake_decision", "must_back_off", "rank_decision"]

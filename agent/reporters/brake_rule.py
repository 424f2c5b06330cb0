"""The brake's rule, pure (reporters/brake.py holds the slots it sizes): how many GPU nodes may carry
our taint at once. Agents that read the same total reach the same cap, without a lock."""

from __future__ import annotations

import math
from fractions import Fraction


def brake_cap(total: int, max_fraction: float, max_nodes: int = 0) -> int:
    """Pure: the most nodes that may hold our taint at once among *total* GPU nodes: ceil(fraction x
    total) (a taint is allowed while the others are fewer than fraction x total, so on a small pool
    the first failing node can always be tainted), at most max_nodes when it is > 0; the whole pool
    when the fraction is 1 or more, none when it is 0 or less. Exact: Fraction, no float error."""
    total = max(total, 1)
    frac = Fraction(str(max_fraction))
    cap = total if frac >= 1 else max(0, math.ceil(frac * total))
    if max_nodes > 0:
        cap = min(cap, max_nodes)
    return cap


__all__ = ["brake_cap"]

"""Which Nodes are GPU nodes: one answer for the DaemonSets, the brake's count and `status`.

No single label marks a GPU node everywhere (the GPU Operator's `nvidia.com/gpu.present` exists only
where the operator or GFD runs), and a label selector cannot say "or". So the selection is a list of
label selectors, any one of which makes a GPU node, exactly as a DaemonSet's `nodeSelectorTerms` are
ORed: the manifests carry the same list (tests/test_gpu_nodes.py holds them to it), the brake and
`gpu-healthcheck status` list each selector and take the union.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.core.node_keys import INSTANCE_TYPE_LABEL

# Any of these makes a GPU node. The instance types of the profiles are added to them
# (`selection`), so EKS nodes without the GPU Operator or Karpenter are found by their type.
DEFAULT_GPU_NODE_SELECTORS: tuple[str, ...] = (
    "nvidia.com/gpu.present=true",  # GPU Operator / GPU feature discovery; on-prem: label by hand
    "feature.node.kubernetes.io/pci-10de.present=true",  # NFD as the GPU Operator configures it
    "feature.node.kubernetes.io/pci-0302_10de.present=true",  # NFD's default: class 3D, NVIDIA
    "cloud.google.com/gke-accelerator",  # GKE GPU node pools
    "kubernetes.azure.com/accelerator",  # AKS GPU node pools
    "karpenter.k8s.aws/instance-gpu-manufacturer=nvidia",  # EKS with Karpenter
    "eks.amazonaws.com/instance-gpu-manufacturer=nvidia",  # EKS Auto Mode
)

_KEY = r"(?:[a-z0-9A-Z.\-]+/)?[A-Za-z0-9]([A-Za-z0-9._\-]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9]([A-Za-z0-9._\-]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    """One requirement of a label selector, in the API's nodeSelectorTerm vocabulary."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()


def _split(selector: str) -> list[str]:
    """Split on the commas that are not inside a set's parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_selector(selector: str) -> tuple[Requirement, ...]:
    """A label selector as the API server reads it; ValueError names what is wrong."""
    if not selector.strip():
        raise ValueError("an empty selector would select every Node")
    reqs: list[Requirement] = []
    for part in _split(selector):
        if m := _SET.match(part):
            values = tuple(sorted(v.strip() for v in m.group(4).split(",") if v.strip()))
            if not values:
                raise ValueError(f"{part.strip()!r}: a set needs at least one value")
            reqs.append(Requirement(m.group(1), "In" if m.group(3) == "in" else "NotIn", values))
        elif m := _EQ.match(part):
            op = "NotIn" if m.group(3) == "!=" else "In"
            reqs.append(Requirement(m.group(1), op, (m.group(4),)))
        elif m := _EXISTS.match(part):
            reqs.append(Requirement(m.group(2), "DoesNotExist" if m.group(1) else "Exists"))
        else:
            raise ValueError(f"{part.strip()!r} is not a label selector requirement")
    return tuple(reqs)


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Pure: does a Node with *labels* match *selector*, as the API server would decide?"""
    for r in parse_selector(selector):
        have = r.key in labels
        if r.operator == "Exists" and not have:
            return False
        if r.operator == "DoesNotExist" and have:
            return False
        if r.operator == "In" and labels.get(r.key) not in r.values:
            return False
        if r.operator == "NotIn" and have and labels[r.key] in r.values:
            return False
    return True


def selection(base: Sequence[str], instance_types: Iterable[str] = ()) -> tuple[str, ...]:
    """The GPU-node selectors: *base* and, when there are profiles, their instance types."""
    types = sorted(set(instance_types))
    extra = (f"{INSTANCE_TYPE_LABEL} in ({','.join(types)})",) if types else ()
    return tuple(dict.fromkeys((*base, *extra)))


def node_selector_terms(selectors: Sequence[str]) -> list[dict[str, object]]:
    """The selectors as a DaemonSet's requiredDuringScheduling nodeSelectorTerms (ORed)."""
    terms: list[dict[str, object]] = []
    for s in selectors:
        exprs: list[dict[str, object]] = []
        for r in parse_selector(s):
            expr: dict[str, object] = {"key": r.key, "operator": r.operator}
            if r.values:
                expr["values"] = list(r.values)
            exprs.append(expr)
        terms.append({"matchExpressions": exprs})
    return terms

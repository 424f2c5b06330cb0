"""What the DCGM engine looks at, against the GPUs NVML (or nvidia-smi) sees on this node.

An engine whose container sees fewer GPUs than the node has (none at all where the NVIDIA runtime
is not the container runtime's default: aws/eks-node-monitoring-agent#241) answers every health
check with "no incident" and passes a diag on what it tested: no evidence about the GPUs it does
not see. So dcgm-health is `unknown` while the engine watches fewer GPUs than NVML answers for,
naming the missing ones where the engine gave its GPUs' PCI addresses, and dcgm-diag is `unknown`
when a run tested fewer. Incidents and diag failures on the GPUs it does look at are reported as
ever. A GPU NVML lists as lost or hung is not expected of the engine (gpu.responsive judges it).
Pure functions of the reports and NodeFacts.
"""

from __future__ import annotations

from agent.core.dcgm_report import DiagReport, HealthReport
from agent.core.facts import NodeFacts
from agent.core.gpu import GpuInventory
from agent.core.pci import normalize_pci, short_pci
from agent.core.text import shorten

MAX_TEXT = 300


def _seer(inv: GpuInventory) -> str:
    return "NVML" if inv.source == "nvml" else "nvidia-smi"


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids)) or "none"


def health_coverage(report: HealthReport, facts: NodeFacts) -> str | None:
    """Why the engine's health watches cannot stand for every GPU (None: they cover the GPUs seen,
    or the report does not say what it watches)."""
    watched = report.gpus_watched
    if watched is None:
        return None
    inv = facts.gpus if isinstance(facts.gpus, GpuInventory) else None
    if inv is None:
        profile = facts.profile
        if profile is not None and len(watched) < profile.gpu_count:
            return (
                f"the DCGM engine watches {len(watched)} of the {profile.gpu_count} GPUs a "
                f"{profile.instance_type} has (no GPU inventory read to name them): its health checks say "
                "nothing of the others"
            )
        return "the DCGM engine watches no GPU" if not watched else None
    answering, seer = inv.gpus, _seer(inv)
    named = {normalize_pci(w.pci_bus_id) for w in watched if w.pci_bus_id}
    if watched and len(named) == len(watched):  # the engine named each GPU: by PCI address
        missing = [g for g in answering if normalize_pci(g.pci_bus_id) not in named]
        if not missing:
            return None
        listed = {normalize_pci(g.pci_bus_id) for g in answering} | set(inv.silent)
        alien = sorted(short_pci(p) for p in named - listed)
        extra = f"; it watches GPU(s) {seer} does not list: {', '.join(alien)}" if alien else ""
        words = (
            f"the DCGM engine watches {len(answering) - len(missing)} of the {len(answering)} GPUs "
            f"{seer} sees (not watched: {', '.join(g.label for g in missing)}){extra}"
        )
    elif len(watched) < len(answering):
        which = (
            " (which are missing is not known: the engine names no PCI address; it watches DCGM GPU "
            f"ids {_ids([w.id for w in watched])})"
            if watched
            else ""
        )
        words = f"the DCGM engine watches {len(watched)} of the {len(answering)} GPUs {seer} sees{which}"
    else:
        return None
    others = "the others" if watched else "them"
    return shorten(f"{words}: its health checks say nothing of {others}", MAX_TEXT)


def diag_coverage(report: DiagReport, facts: NodeFacts) -> str | None:
    """Why a diag run cannot pass for every GPU: it tested fewer GPUs than NVML answers for (None:
    as many, or the run names no GPU: a 3.x document's results cover all)."""
    tested = report.gpus()
    inv = facts.gpus if isinstance(facts.gpus, GpuInventory) else None
    if not tested or inv is None or len(tested) >= len(inv.gpus):
        return None
    ids = [int(t) for t in tested if t.isdigit()]
    return shorten(
        f"the DCGM diag tested {len(tested)} of the {len(inv.gpus)} GPUs {_seer(inv)} sees (DCGM GPU "
        f"ids {_ids(ids)}): it is no pass of the others",
        MAX_TEXT,
    )

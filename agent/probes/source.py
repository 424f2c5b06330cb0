"""Where NodeFacts come from: the two sources (a live node in agent.probes.live, a recorded node
snapshot in agent.probes.snapshot; what each reads per input is in agent.probes.inputs) and the one
place that turns inputs into NodeFacts (assemble_facts, for gather_facts and the engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from agent.config import Config
from agent.core import trend_history
from agent.core.facts import Input, NodeFacts
from agent.core.node import NodeObject
from agent.core.node_keys import INSTANCE_TYPE_LABEL, Keys
from agent.core.probed import Probed
from agent.core.results_doc import decode_results
from agent.probes.inputs import SPEC, source_readers
from agent.probes.live import LiveSource
from agent.probes.snapshot import SnapshotSource

Source = LiveSource | SnapshotSource  # each input's reader in each: probes/inputs.py


def resolve_instance_type(
    source: Source, cfg: Config, node: Probed[NodeObject], override: str | None
) -> tuple[str | None, str]:
    """--instance-type, then the config override, then the Node label, then the snapshot's file."""
    if override:
        return override, "--instance-type"
    configured = cfg.instance_type
    if configured:
        return configured, "config"
    if isinstance(node, NodeObject) and node.labels.get(INSTANCE_TYPE_LABEL):
        return node.labels[INSTANCE_TYPE_LABEL], "node label"
    recorded = source.instance_type()
    if recorded:
        return recorded, "instance-type file"
    return None, ""


def assemble_facts(
    source: Source,
    cfg: Config,
    inputs: Mapping[Input, Any],
    *,
    boot_id: str | None,
    instance_type: str | None = None,
    previous: Mapping[Input, Any] | None = None,
) -> NodeFacts:
    """NodeFacts from the inputs read (one not read stays NotCaptured) and the previous reads kept
    (those whose spec keeps one), with the instance type resolved (resolve_instance_type) and its
    profile."""
    read = {name.value: value for name, value in inputs.items()}
    kept = {SPEC[name].previous_field: v for name, v in (previous or {}).items() if SPEC[name].keep_previous}
    facts = NodeFacts(**read, **kept)
    itype, itype_source = resolve_instance_type(source, cfg, facts.node, instance_type)
    return replace(
        facts,
        instance_type=itype,
        instance_type_source=itype_source,
        profile=cfg.profiles.get(itype) if itype else None,
        boot_id=boot_id,
    )


def kept_trends(node: Probed[NodeObject], prefix: str) -> trend_history.TrendHistory:
    """The trend reads the agent kept in the Node's results annotation (none: an empty history)."""
    if not isinstance(node, NodeObject):
        return trend_history.TrendHistory()
    doc = decode_results(node.annotations.get(Keys(prefix).results))
    return trend_history.parse(doc.get(trend_history.TRENDS_FIELD)) if doc else trend_history.TrendHistory()


def gather_facts(
    source: Source,
    cfg: Config,
    *,
    instance_type: str | None = None,
    only: Callable[[Input], bool] = lambda _: True,
    now: float | None = None,
) -> NodeFacts:
    """Read every input the enabled checks need. `only(input)` lets callers skip unneeded probes.
    The trend checks judge this read with the reads the agent kept on the Node (node.json of a
    snapshot, the Node live), this one added when due (`now`: epoch seconds, default the clock)."""
    inputs = {name: read() for name, read in source_readers(source).items() if only(name)}
    node = inputs.get(Input.NODE)
    facts = assemble_facts(
        source,
        cfg,
        inputs,
        boot_id=source.boot_id() or (node.boot_id if isinstance(node, NodeObject) else None),
        instance_type=instance_type,
    )
    t = cfg.trends
    kept = kept_trends(facts.node, cfg.prefix)
    stamp = time.time() if now is None else now
    return with_read(facts, kept, stamp, t.read_spacing_s, t.keep_reads, t.clock_busy_percent)


def with_read(
    facts: NodeFacts,
    history: trend_history.TrendHistory,
    now: float,
    spacing_s: float,
    keep: int,
    busy_percent: float,
) -> NodeFacts:
    """NodeFacts carrying the history with this cycle's read in it (when due)."""
    read = trend_history.take_read(
        facts.gpus, facts.nvlink_errors, facts.pci, facts.boot_id, now, busy_percent
    )
    return replace(facts, trends=trend_history.advance(history, read, spacing_s, keep))

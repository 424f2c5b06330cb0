"""The repair budget's records as Leases: written, listed and read back (reporters/repair_budget.py
decides with them; core/repair_budget.py holds the pure rules).

Each record is its owner's alone: the admission policy gpu-healthcheck-own-records lets an agent
create `fail`, `mark` and `wave` records of its own node only (its token's node claim), never a
`release`, and never change or delete another node's record. So stale records go away by their owner or the
garbage collector, never by another agent:

- fail: one per node and finding key (a fixed name: a retry or a restarted agent finds it there),
  written before the node asks, owned by its Node (the garbage collector deletes it with the Node);
  it counts toward the key's wave while the Node carries `<prefix>/status=fail`, and its agent
  deletes it once its node no longer wants a mark.
- mark: one per new mark, written, then counted with every record written before it (the list not
  older than its own resourceVersion), as distinct nodes (a node's marks count once, however many
  its token wrote): beyond the limit, it deletes itself and the node is held.
  Marks count for the window whether or not their Node still exists (no owner: a repaired Node
  must not free budget); each is labelled with its window's bucket (writer's clock // window), so
  an ask lists those that can still count; past the window they no longer count, and their agent
  deletes them at its next ask; those of Nodes that are gone are deleted by `gpu-healthcheck brake
  sweep`.
- release: `gpu-healthcheck brake release` (cli/brake.py), an operator's: records before it no
  longer count.
- wave: a marker left by the node whose full count found a wave on a key (labelled with the key's
  slug), owned by its Node; it holds the rest of the wave with small lists (the markers, and the
  key's fail records up to a bound: its quorum, WaveQuorum), and its node deletes it when the wave
  has ended or the node recovers. Any agent may write a marker of its own node: without its quorum
  of distinct failing nodes it holds back only that node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agent.core.record_kind import RecordKind
from agent.core.repair_budget import Record, RecordKeys, key_slug, quorum_met
from agent.reporters.kube_rest import KubeRest, api_status, describe_error
from agent.reporters.lease_records import LeaseRecords, parse
from agent.reporters.node_names import METADATA_LIST_ACCEPT

log = logging.getLogger(__name__)

QUORUM_BOUND = 2  # a wave marker's quorum is read from at most this many times minNodes fail records
BUDGET_KINDS = (RecordKind.FAIL, RecordKind.MARK, RecordKind.RELEASE, RecordKind.WAVE)
LEDGER = (RecordKind.FAIL, RecordKind.MARK, RecordKind.RELEASE)  # what a list reads unless told


def record_of(item: Mapping[str, Any], prefix: str) -> Record | None:
    """A listed (or created) Lease as a Record; None when it is not one of the budget's."""
    lease = parse(item, prefix)
    if lease.kind not in BUDGET_KINDS or lease.kind is None:
        return None
    keys, ann = RecordKeys(prefix), lease.annotations
    return Record(
        name=lease.name,
        kind=lease.kind,
        node=lease.node,
        key=str(ann.get(keys.key) or ""),
        pool=str(ann.get(keys.pool) or ""),
        at=lease.at,
        rv=lease.rv,
        by=str(ann.get(keys.by) or ""),
        reason=str(ann.get(keys.reason) or ""),
    )


def list_records(
    rest: KubeRest,
    namespace: str,
    prefix: str,
    min_rv: str | None = None,
    kinds: Sequence[RecordKind] = LEDGER,
    key: str | None = None,
    extra: str = "",
) -> list[Record]:
    """The records of *kinds* in *namespace* (of the finding *key* alone, when given: fail records
    and wave markers carry its slug as a label), metadata only, from the watch cache (not older
    than *min_rv* when given: every record written before it is seen)."""
    return list_page(rest, namespace, prefix, min_rv, kinds, key, extra)[0]


def list_page(
    rest: KubeRest,
    namespace: str,
    prefix: str,
    min_rv: str | None = None,
    kinds: Sequence[RecordKind] = LEDGER,
    key: str | None = None,
    extra: str = "",
    limit: int = 0,
) -> tuple[list[Record], bool]:
    """list_records, at most *limit* records when given (a bounded read, whatever the fleet), and
    whether the list is complete (no continue token: a server that ignores the limit lists all)."""
    keys = RecordKeys(prefix)
    selector = ",".join(([f"{keys.key_label}={key_slug(key)}"] if key else []) + ([extra] if extra else []))
    items, complete = LeaseRecords(rest, namespace, prefix).list(
        kinds, extra=selector, min_rv=min_rv, limit=limit, accept=METADATA_LIST_ACCEPT
    )
    return [r for r in (record_of(i, prefix) for i in items) if r is not None], complete


class WaveQuorum:
    """Whether the wave markers of a key stand on their quorum (core quorum_met; None: the full count
    decides), from the key's fail records listed up to QUORUM_BOUND times minNodes, metadata only:
    flat in the fleet's size; not older than the newest marker (the watch cache then honours the
    limit, which it ignores for resourceVersion 0). A quorum seen is kept for *keep_s* while the same
    markers stand: as long as a marker's own node takes to count its wave again and see it end. A
    list that fails keeps the markers' hold (an unreadable count never lifts one) and is not kept."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float]] = {}  # key -> (newest marker's rv, when seen met)

    def confirm(
        self,
        rest: KubeRest,
        namespace: str,
        prefix: str,
        key: str,
        *,
        after_rv: int,
        min_nodes: int,
        newest_rv: int,
        now: float,
        keep_s: float,
    ) -> bool | None:
        seen = self._seen.pop(key, None)
        if seen is not None and seen[0] == newest_rv and now - seen[1] < keep_s:
            self._seen[key] = seen
            return True
        limit = QUORUM_BOUND * min_nodes
        try:
            fails, complete = list_page(
                rest, namespace, prefix, str(newest_rv), (RecordKind.FAIL,), key, limit=limit
            )
        except Exception as exc:
            log.info("confirming the wave on %s failed, its markers hold: %s", key, describe_error(exc))
            return True
        quorum = quorum_met(fails, key, after_rv, min_nodes, complete)
        if quorum:
            self._seen[key] = (newest_rv, now)
        return quorum


def create_record(
    rest: KubeRest,
    namespace: str,
    prefix: str,
    kind: RecordKind,
    annotations: Mapping[str, str],
    *,
    name: str = "",
    holder: str = "",
    owner: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Record:
    """Write one record (a fixed *name*, else a generated one), owned by the Node *owner* when given
    (its metadata: the garbage collector deletes the record with it); a fixed name already there is
    answered by ApiException 409."""
    keys = RecordKeys(prefix)
    labels = dict(labels or {})
    if annotations.get(keys.key) and kind in (RecordKind.FAIL, RecordKind.WAVE):
        labels[keys.key_label] = key_slug(annotations[keys.key])  # lists of one key's records
    owner_meta = (owner or {}).get("metadata") or {}
    owner = owner if owner_meta.get("name") and owner_meta.get("uid") else None
    ann = {k: v for k, v in annotations.items() if k != keys.node}
    doc = LeaseRecords(rest, namespace, prefix).create(
        kind, str(annotations.get(keys.node) or ""), name=name, annotations=ann, labels=labels, owner=owner,
        holder=holder,
    )  # fmt: skip
    rec = record_of(doc, prefix)
    if rec is None:
        raise ValueError(f"the API server answered a record create with {str(doc)[:200]}")
    return rec


def create_fixed(
    rest: KubeRest,
    namespace: str,
    prefix: str,
    kind: RecordKind,
    annotations: Mapping[str, str],
    *,
    name: str,
    holder: str,
    owner: Mapping[str, Any],
) -> Record | None:
    """create_record of a fixed *name* owned by the Node *owner*; None when it is there already (a
    retry, or a restarted agent: the record is the same)."""
    try:
        return create_record(
            rest, namespace, prefix, kind, annotations, name=name, holder=holder, owner=owner
        )
    except Exception as exc:
        if api_status(exc) != 409:
            raise
        return None


__all__ = [
    "BUDGET_KINDS",
    "WaveQuorum",
    "create_fixed",
    "create_record",
    "list_page",
    "list_records",
    "record_of",
]

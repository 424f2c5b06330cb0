"""Names-only lists: which objects match a selector, without their bodies (the brake's fallback total
and its count outside the install, the repair budget's failing nodes and records).

Asked as a Table (names in rows) or as PartialObjectMetadata, always from the API server's watch
cache: a consistent read falls back to etcd under a fleet-wide burst, each a range over every object.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agent.reporters.kube_rest import REQUEST_TIMEOUT, KubeRest, api_status

log = logging.getLogger(__name__)

METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
NAMES_LIST_ACCEPT = "application/json;as=Table;g=meta.k8s.io;v=v1," + METADATA_LIST_ACCEPT


def names_in_list(doc: Mapping[str, Any]) -> list[str]:
    """Pure: the object names in a list response, whichever form the server chose: a Table (the
    column whose format is "name", else the first; or a row's object when one was included), a
    PartialObjectMetadataList or a plain list. Raises ValueError on anything else, so that a proxy
    answering with something unexpected is "could not count", never "0 tainted"."""
    kind = doc.get("kind")
    if kind == "Table":
        cols = doc.get("columnDefinitions") or []
        idx = next((i for i, c in enumerate(cols) if c.get("format") == "name"), 0)
        names = []
        for row in doc.get("rows") or ():
            obj = row.get("object") or {}
            name = (obj.get("metadata") or {}).get("name")
            if not name:
                cells = row.get("cells") or []
                name = cells[idx] if idx < len(cells) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"a Table row without a name: {str(row)[:200]}")
            names.append(name)
        return names
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items") or [], list):
        return [str((i.get("metadata") or {}).get("name", "")) for i in doc.get("items") or ()]
    raise ValueError(f"not a list response: kind={kind!r}")


def list_names_doc(
    rest: KubeRest, path: str, label_selector: str, *, min_rv: str | None = None, field_selector: str = ""
) -> dict[str, Any]:
    """The raw names-only list of *path*'s objects matching *label_selector*. Always from the watch
    cache: not older than *min_rv* (our own last write: every write that landed before it is seen),
    else as the cache has it. A cache more than ~3 s behind our write answers 504: then the cache as
    it is (the caller's next ask looks again)."""
    query = {"labelSelector": label_selector, "includeObject": "None", "resourceVersion": "0"}
    if field_selector:
        query["fieldSelector"] = field_selector
    if min_rv:
        fresh = {**query, "resourceVersion": min_rv, "resourceVersionMatch": "NotOlderThan"}
        try:
            return rest.json("GET", path, query=fresh, accept=NAMES_LIST_ACCEPT, timeout=REQUEST_TIMEOUT)
        except Exception as exc:
            if api_status(exc) != 504:
                raise
            log.info("the API server's cache is behind our write (%s); listing it as is", exc)
    return rest.json("GET", path, query=query, accept=NAMES_LIST_ACCEPT, timeout=REQUEST_TIMEOUT)


__all__ = ["METADATA_LIST_ACCEPT", "NAMES_LIST_ACCEPT", "list_names_doc", "names_in_list"]

"""Raw JSON requests to the Kubernetes API through the official client's `ApiClient`.

The agent reads and writes API JSON (merge patches, Table rows, its own Node as a dict), so the
generated `CoreV1Api` and its pydantic models buy it nothing, and importing them costs about 22 MiB
of RSS on every GPU node (bench/footprint.py). This keeps everything else of the official client:
kubeconfig and in-cluster configuration, token refresh, TLS, the connection pool, `ApiException`
(status, reason, body) for non-2xx answers, and `kubernetes.watch.Watch` for streams.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
REQUEST_TIMEOUT = (5, 30)

# Python-style keyword names (as `kubernetes.watch.Watch.stream` passes them) to query parameters.
_QUERY = {
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "watch": "watch",
    "limit": "limit",
    "_continue": "continue",
    "field_manager": "fieldManager",
}


def query_params(kwargs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Pure: keyword arguments (snake_case or the API's own names) as query parameters; None is left
    out, booleans are written the way the API server reads them."""
    out = []
    for key, value in kwargs.items():
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out.append((_QUERY.get(key, key), text))
    return out


def node_path(name: str, subresource: str = "") -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")


def api_status(exc: BaseException) -> int | None:
    """The HTTP status of an `ApiException` (None for anything else: a timeout, a refused connection)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def describe_error(exc: BaseException) -> str:
    """One short line for a log or an ApplyResult: the API's status and reason, else the exception."""
    status = api_status(exc)
    if status:
        return f"API error {status} {getattr(exc, 'reason', '') or ''}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]


class KubeRest:
    """One `ApiClient` (its configuration, auth and pool); every method answers with API JSON."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    @classmethod
    def of(cls, client: Any) -> KubeRest:
        """A KubeRest from a KubeRest, a generated API object (its `api_client`) or an ApiClient, so
        that callers holding a `CoreV1Api` (tests, tools) share its connection pool."""
        if isinstance(client, KubeRest):
            return client
        return cls(getattr(client, "api_client", client))

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: Any = REQUEST_TIMEOUT,
    ) -> Any:
        """The raw urllib3 response, unread (for streams). A non-2xx answer raises `ApiException`."""
        api = self.api_client
        headers: dict[str, str] = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        m, url, hdrs, data, post = api.param_serialize(
            method,
            path,
            query_params=query_params(query or {}),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = api.call_api(m, url, header_params=hdrs, body=data, post_params=post, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            from kubernetes.client.exceptions import ApiException

            resp.read()  # drains the connection and fills the exception's body
            resp.response.release_conn()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response

    def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The decoded JSON answer (the response is always drained: a half-read one would break the
        pooled connection). A body that is not a JSON object raises ValueError."""
        resp = self.request(method, path, **kwargs)
        try:
            raw = resp.data
        finally:
            resp.release_conn()
        doc = json.loads(raw) if raw else {}
        if not isinstance(doc, dict):
            raise ValueError(f"{method} {path}: the answer is not a JSON object: {str(doc)[:200]}")
        return doc

    def lister(self, path: str) -> Callable[..., Any]:
        """A list function for `kubernetes.watch.Watch.stream`: it has no model return type, so the
        watch yields events with the raw object and decodes nothing else."""

        def list_raw(**kwargs: Any) -> Any:
            timeout = kwargs.pop("_request_timeout", REQUEST_TIMEOUT)
            kwargs.pop("_preload_content", None)
            return self.request("GET", path, query=kwargs, timeout=timeout)

        return list_raw


__all__ = [
    "JSON",
    "MERGE_PATCH",
    "REQUEST_TIMEOUT",
    "STRATEGIC_MERGE_PATCH",
    "KubeRest",
    "api_status",
    "describe_error",
    "node_path",
    "query_params",
]

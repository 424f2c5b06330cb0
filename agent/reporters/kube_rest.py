"""Raw JSON requests to the Kubernetes API through the official client's transport.

The agent reads and writes API JSON (merge patches, Table rows, its own Node as a dict), so the
generated `CoreV1Api`, its pydantic models and the `ApiClient` that serializes them buy it nothing,
and importing them costs memory on every GPU node (bench/footprint.py). This keeps the official
client's transport: its `Configuration` (kubeconfig and in-cluster loading, the service-account
token's refresh, TLS settings), its `RESTClientObject` (the urllib3 pool, timeouts) and `ApiException`
(status, reason, body) for non-2xx answers. A watch is read here, one JSON event a line, as
`kubernetes.watch.Watch` reads it without a model to decode into.

`client_modules()` makes those parts importable without the `kubernetes` and `kubernetes.config`
packages' own __init__ modules, which import every part of the client the first time any part of it
is imported (the generated API machinery with pydantic, the dynamic client, streams, leader
election, informers, and kube_config with requests and oauthlib): about 17 MiB of RSS on an agent
that uses none of them. The package objects are the installed ones (their spec and path) with their
__init__ deferred until a name it defines is asked for (then it runs, and code that asks, e.g. for
`kubernetes.config.list_kube_config_contexts`, gets the whole client); nothing of the client is patched,
and a process that imported `kubernetes` already (tests, tools) keeps it as it is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

from agent import __version__

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
REQUEST_TIMEOUT = (5, 30)

USER_AGENT = f"gpu-healthcheck/{__version__}"  # who wrote, in the API server's audit log

# Python-style keyword names (as the generated API takes them) to query parameters.
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


API_MESSAGE_MAX = 600  # a fence's denial names the policy, the binding and the rule's message


def api_message(exc: BaseException) -> str:
    """The API server's own words in an `ApiException`: its Status `message` (the admission policy
    and rule that denied a write, the RBAC verb missing), else the body's text; "" when there are
    none. On one line, cut at API_MESSAGE_MAX characters."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    text = str(doc.get("message") or "") if isinstance(doc, dict) else body
    text = " ".join(text.split())
    return text if len(text) <= API_MESSAGE_MAX else text[: API_MESSAGE_MAX - 1] + "…"


def describe_error(exc: BaseException) -> str:
    """One short line for a log or an ApplyResult: the API's status, reason and the server's own
    message (a "403 Forbidden" alone sends an on-call to RBAC when a fence named its rule), else the
    exception as it is."""
    status = api_status(exc)
    if status:
        head = f"API error {status} {getattr(exc, 'reason', '') or ''}".strip()
        message = api_message(exc)
        return f"{head}: {message}" if message else head
    return f"{type(exc).__name__}: {exc}"[:300]


class _InitDeferred(types.ModuleType):
    """A package whose __init__ has not run: its submodules import as usual, and the first name asked
    of it that its __init__ defines (`kubernetes.__version__`, `kubernetes.config.load_kube_config`)
    runs that __init__ then, so code that wants the whole client still gets it."""

    def __getattr__(self, name: str) -> Any:
        object.__setattr__(self, "__class__", types.ModuleType)  # plain again, before __init__ runs
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(self)
        return getattr(self, name)


def client_modules() -> None:
    """Let the client's parts import without its packages' __init__ modules, which run only if a name
    they define is asked for (the module docstring says why). Call before the first import of
    anything under `kubernetes`; a process that imported it already keeps it as it is."""
    if "kubernetes" in sys.modules:
        return
    for name in ("kubernetes", "kubernetes.config"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None or spec.loader is None:
            return  # not installed (or not a package): the import that follows says so
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _InitDeferred
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def api_exception() -> Any:
    """The client's `ApiException` class (what its REST layer raises, and a non-2xx answer here)."""
    client_modules()
    from kubernetes.client.exceptions import ApiException

    return ApiException


class KubeRest:
    """One `Configuration` and its `RESTClientObject` (auth, TLS and the pool); every method answers
    with API JSON."""

    def __init__(self, client: Any) -> None:
        """*client*: a `Configuration` (a pool of its own), or an `ApiClient` or a generated API object
        holding one (tests, tools), whose configuration and pool are shared."""
        api = getattr(client, "api_client", client)
        if hasattr(api, "rest_client"):
            self.configuration, self.rest_client = api.configuration, api.rest_client
            return
        client_modules()
        from kubernetes.client.rest import RESTClientObject

        self.configuration, self.rest_client = client, RESTClientObject(client)

    @classmethod
    def of(cls, client: Any) -> KubeRest:
        """A KubeRest from a KubeRest (itself), or from what __init__ takes."""
        return client if isinstance(client, KubeRest) else cls(client)

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
        """The raw urllib3 response, unread (for streams). A non-2xx answer raises `ApiException`.
        The request is the one the generated client sends: the configured host and path, the query
        percent-encoded, the bearer token (refreshed by the configuration's hook) as `authorization`,
        a dict body as JSON."""
        cfg = self.configuration
        url = cfg.host + path
        params = query_params(query or {})
        if params:
            url += "?" + "&".join(f"{key}={quote(value)}" for key, value in params)
        headers: dict[str, str] = {"Accept": accept, "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type
        for auth in cfg.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        resp = self.rest_client.request(method, url, headers=headers, body=body, _request_timeout=timeout)
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

    def watch(self, path: str, *, query: Mapping[str, Any], timeout: Any) -> WatchStream:
        """A watch of *path* (a list path; `watch=true` is added): iterate it for its events."""
        return WatchStream(self, path, {**query, "watch": True}, timeout)


class WatchStream:
    """The events of one watch request, in order: {"type": ADDED|MODIFIED|DELETED|BOOKMARK, "object":
    the API JSON}. An ERROR event raises `ApiException` with its code (410 Gone: list again). It ends
    when the API server ends the request (its timeoutSeconds) or when stop() is called from another
    thread."""

    def __init__(self, rest: KubeRest, path: str, query: Mapping[str, Any], timeout: Any) -> None:
        self.rest, self.path, self.query, self.timeout = rest, path, query, timeout
        self._resp: Any = None
        self._stopped = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._stopped:
            return
        resp = self.rest.request("GET", self.path, query=self.query, timeout=self.timeout)
        self._resp = resp
        try:
            for line in _lines(resp):
                if self._stopped:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise api_exception()(
                        status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}"
                    )
                yield event
        except Exception:
            if self._stopped:
                return  # the read that stop() cut short
            raise
        finally:
            resp.close()
            resp.release_conn()

    def stop(self) -> None:
        """End the stream now: a blocked read returns (the socket is shut down, as Watch.stop does)."""
        self._stopped = True
        conn = getattr(self._resp, "connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _lines(resp: Any) -> Iterator[bytes]:
    """The response's lines as they arrive (a watch sends one event a line, chunk by chunk)."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from lines
    if buffer:
        yield buffer


__all__ = [
    "API_MESSAGE_MAX",
    "JSON",
    "MERGE_PATCH",
    "REQUEST_TIMEOUT",
    "STRATEGIC_MERGE_PATCH",
    "USER_AGENT",
    "KubeRest",
    "WatchStream",
    "api_exception",
    "api_message",
    "api_status",
    "client_modules",
    "describe_error",
    "node_path",
    "query_params",
]

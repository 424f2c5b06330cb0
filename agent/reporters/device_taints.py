"""The DeviceTaintRules of this node's own GPUs, in the version of the API the server serves: one
rule per GPU, selecting exactly that device in this node's pool.

Why it is built this way:
- Which version: DeviceTaintRules are `resource.k8s.io/v1` from Kubernetes 1.37 (GA, served by
  default), `v1beta2` in 1.36 (gate DRADeviceTaintRules and `--runtime-config` both off by default),
  `v1alpha3` before (alpha). `discover()` asks the API server's discovery documents, v1 first, at
  start, again after a 404 and after a config reload, never per cycle. The body is the same in the
  three but for its apiVersion; where the rule's `status` subresource is served (1.35 and later) the
  `None` effect is too (both came with 1.35), and a warning shows on a device with it (moves no pod).
- v1 refuses an update without a resourceVersion (optimistic concurrency, as for every new API):
  every update here carries the resourceVersion of the rule as last read, whatever the version; a
  409 means someone changed it: it is read again and written on the next apply.
- Ours is told by two marks, never by a name: the label `<prefix>/node=<node>` (a hash for names
  over 63 characters) and an ownerReference to this Node (kind Node, its name and uid). The garbage
  collector of kube-controller-manager deletes the rules with the Node, and a Node re-created with
  the same name (a new uid) inherits none. A rule with our label but without that owner is not ours
  (an admin's, or an older agent's): it is left alone and logged. The admission fence
  (manifests/30-admission-policy.yaml) holds the agent to the same two marks.
- A rule names one device by driver, pool and device (spec.deviceSelector): the scheduler skips the
  device for new claims (NoSchedule) and kube-controller-manager's device-taint-eviction controller
  deletes the pods whose allocated claims hold it (NoExecute) and writes the rule's status
  (condition EvictionInProgress), which `gpu-healthcheck status NODE` shows. The driver's
  ResourceSlice is never written: its own taints stand beside ours.
- The rules this writer holds are listed once at start (a restarted agent keeps or removes them);
  after that it writes only when the wanted set differs from what it holds, and reads nothing per
  cycle.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.device_scope import DRIVER, Device, rule_name
from agent.core.node_keys import DEFAULT_PREFIX
from agent.reporters.kube_rest import MERGE_PATCH, KubeRest, api_status, describe_error

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1alpha3")  # preferred first: GA (1.37), beta (1.36), alpha (1.33-1.35)
RESOURCE = "devicetaintrules"
TIMEOUT = (5, 15)
LABEL_VALUE_MAX = 63
NONE_EFFECT = "None"  # a device taint that shows and moves no pod (served with the rule's status)
FIELD_MANAGER = "gpu-healthcheck"


@dataclass(frozen=True)
class RuleApi:
    """The DeviceTaintRule API the server serves: its version, and whether the rule's status (and
    with it the `None` effect, both Kubernetes 1.35) is served."""

    version: str
    status: bool

    @property
    def path(self) -> str:
        return f"/apis/{GROUP}/{self.version}/{RESOURCE}"

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    @property
    def none_effect(self) -> bool:
        return self.status


def discover(rest: Any) -> RuleApi | None:
    """The DeviceTaintRule API served (v1, else v1beta2, else v1alpha3), from the discovery documents
    (one GET per version asked; open to every authenticated user); None when none serves it.
    Raises on API trouble other than a version that is not served (404)."""
    client = KubeRest.of(rest)
    for version in VERSIONS:
        try:
            doc = client.json("GET", f"/apis/{GROUP}/{version}", timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) == 404:
                continue
            raise
        names = {str(r.get("name") or "") for r in doc.get("resources") or ()}
        if RESOURCE in names:
            return RuleApi(version, f"{RESOURCE}/status" in names)
    return None


class Unavailable(RuntimeError):
    """The API server serves no version of DeviceTaintRules."""


@dataclass(frozen=True)
class Wanted:
    """One device taint: the device, and the taint's value (severity) and effect."""

    device: Device
    value: str
    effect: str  # NoSchedule | NoExecute | None (PreferNoSchedule is not a device taint effect)


def node_label(node_name: str) -> str:
    """The `<prefix>/node` label's value: the node's name, or a hash where it is too long."""
    if len(node_name) <= LABEL_VALUE_MAX:
        return node_name
    return "h-" + hashlib.sha256(node_name.encode()).hexdigest()[:40]


def device_effect(effect: str) -> str:
    """A node taint's effect as a device taint's: PreferNoSchedule has no device form (NoSchedule)."""
    return "NoExecute" if effect == "NoExecute" else "NoSchedule"


def taint_of(rule: Mapping[str, Any]) -> dict[str, Any]:
    return dict((rule.get("spec") or {}).get("taint") or {})


def selected_device(rule: Mapping[str, Any]) -> dict[str, str]:
    sel = (rule.get("spec") or {}).get("deviceSelector") or {}
    return {k: str(sel.get(k) or "") for k in ("driver", "pool", "device")}


def node_owner(rule: Mapping[str, Any], node_name: str) -> dict[str, Any] | None:
    """The rule's ownerReference to Node *node_name*, if it has one."""
    for ref in (rule.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("apiVersion") == "v1" and ref.get("kind") == "Node" and ref.get("name") == node_name:
            return dict(ref)
    return None


def eviction_status(rule: Mapping[str, Any]) -> dict[str, Any] | None:
    """The rule's EvictionInProgress condition (written by kube-controller-manager's
    device-taint-eviction controller), or None when there is none yet."""
    for cond in (rule.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "EvictionInProgress":
            return dict(cond)
    return None


def tainted_nodes(
    rest: Any, prefix: str = DEFAULT_PREFIX, *, api: Callable[[], RuleApi | None] | None = None
) -> set[str]:
    """The nodes whose GPUs carry our DeviceTaintRules of an effect that keeps work off (their pools:
    the driver names a pool after its node), for the brake's count. *api*: the discovered API (asked
    of the server here when not given). Asked only when the brake is (a new taint), never per cycle;
    an API server without DeviceTaintRules counts none, one that does not answer counts none (logged).
    A rule of effect None (an early warning) holds nothing back and is not counted."""
    try:
        served = api() if api is not None else discover(rest)
        if served is None:
            return set()
        doc = KubeRest.of(rest).json(
            "GET", served.path, query={"labelSelector": f"{prefix}/node"}, timeout=TIMEOUT
        )
    except Exception as exc:
        if api_status(exc) != 404:
            log.warning("brake: could not count the nodes with device taints: %s", exc)
        return set()
    return {
        selected_device(i)["pool"] for i in doc.get("items") or () if taint_of(i).get("effect") != NONE_EFFECT
    } - {""}


class DeviceTaints:
    """Keeps this node's DeviceTaintRules equal to a wanted set; API trouble raises to the caller,
    which keeps the node isolated by the Node taint meanwhile (reporters/device_isolation)."""

    def __init__(
        self,
        rest: Any,
        node_name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        dry_run: bool = False,
        on_write: Callable[[str, str], None] | None = None,
    ) -> None:
        self.rest = KubeRest.of(rest)
        self.node_name = node_name
        self.prefix = prefix
        self.dry_run = dry_run
        self._on_write = on_write
        self.api: RuleApi | None = None  # what discovery found (None: none served, or not asked yet)
        self.discovered = False  # discovery answered since start, the last 404 or reload
        self.node_uid = ""  # this Node's uid, for the ownerReference (set by the caller)
        self.held: dict[str, dict[str, Any]] | None = None  # rule name → the rule (None: not listed)
        self.foreign: list[str] = []  # rules with our label that are not ours (no owner: left alone)
        self.writes = 0
        self.reads = 0  # LISTs and discovery GETs (bench/ and tests: none per cycle)

    @property
    def label(self) -> str:
        return f"{self.prefix}/node"

    @property
    def taint_key(self) -> str:
        return f"{self.prefix}/unhealthy"

    def _note(self, outcome: str) -> None:
        if self._on_write is not None:
            try:
                self._on_write("devicetaintrule", outcome)
            except Exception:  # a metrics hook must not break writing
                log.exception("on_write hook failed")

    # -- discovery and the list ----------------------------------------------------------------------
    def forget(self) -> None:
        """Discover and list again at the next use (a 404, a config reload)."""
        self.discovered, self.held = False, None

    def discover(self) -> RuleApi | None:
        """Ask which DeviceTaintRule version the server serves (raises on API trouble)."""
        before = self.api if self.discovered else "unknown"
        self.api = discover(self.rest)
        self.discovered = True
        self.reads += 1
        if self.api != before:
            if self.api is None:
                log.warning(
                    "node %s: the API server serves no DeviceTaintRules (resource.k8s.io %s): per-GPU "
                    "isolation falls back to the node taint",
                    self.node_name,
                    "/".join(VERSIONS),
                )
            else:
                log.info(
                    "node %s: DeviceTaintRules served as %s (status %s)",
                    self.node_name,
                    self.api.api_version,
                    "served" if self.api.status else "not served",
                )
        return self.api

    def served(self) -> RuleApi | None:
        """The API discovered (asked now if it was not yet): the brake's count reads it."""
        return self.api if self.discovered else self.discover()

    def ensure(self) -> RuleApi | None:
        """Discovery and the list of our rules, once (at start, after a 404 or a reload)."""
        if not self.discovered:
            self.discover()
        if self.held is None:
            self.load()
        return self.api

    def load(self) -> dict[str, dict[str, Any]]:
        """The rules of this node that are ours (one LIST). Raises on API trouble; a server that
        serves no DeviceTaintRules holds none."""
        api = self.api if self.discovered else self.discover()
        if api is None:
            self.held, self.foreign = {}, []
            return self.held
        try:
            doc = self.rest.json(
                "GET",
                api.path,
                query={"labelSelector": f"{self.label}={node_label(self.node_name)}"},
                timeout=TIMEOUT,
            )
        except Exception as exc:
            if api_status(exc) == 404:  # the version went away: discover again next time
                self.forget()
            raise
        self.reads += 1
        held, foreign = {}, []
        for item in doc.get("items") or ():
            name = str(item["metadata"]["name"])
            if node_owner(item, self.node_name) is None:
                foreign.append(name)
            else:
                held[name] = item
        if foreign and foreign != self.foreign:
            log.warning(
                "node %s: DeviceTaintRule(s) %s carry our label but no ownerReference to this Node: "
                "not ours (an admin's, or an older agent's), left alone; delete them by hand if stale",
                self.node_name,
                ", ".join(sorted(foreign)),
            )
        self.held, self.foreign = held, foreign
        for name, rule in sorted(held.items()):
            cond = eviction_status(rule)
            if cond is not None:
                log.info(
                    "node %s: DeviceTaintRule %s: EvictionInProgress=%s (%s) %s",
                    self.node_name,
                    name,
                    cond.get("status"),
                    cond.get("reason"),
                    cond.get("message") or "",
                )
        return held

    def stale(self, name: str) -> bool:
        """A rule of ours owned by an earlier Node of this name (another uid): the garbage
        collector removes it with that Node; until then it is ours to remove, never to keep."""
        ref = node_owner((self.held or {}).get(name) or {}, self.node_name)
        return ref is None or bool(self.node_uid and ref.get("uid") != self.node_uid)

    def held_devices(self) -> list[str]:
        """The devices (names) our rules select now."""
        return sorted(selected_device(r)["device"] for r in (self.held or {}).values())

    # -- writing ---------------------------------------------------------------------------------------
    def owner(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_uid}

    def body(self, want: Wanted, api: RuleApi | None = None) -> dict[str, Any]:
        d = want.device
        served = api or self.api or RuleApi(VERSIONS[0], True)
        return {
            "apiVersion": served.api_version,
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": rule_name(self.node_name, d, self.prefix),
                "labels": {self.label: node_label(self.node_name), f"{self.prefix}/device": d.name},
                "ownerReferences": [self.owner()],
            },
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": d.pool, "device": d.name},
                "taint": {"key": self.taint_key, "value": want.value, "effect": want.effect},
            },
        }

    def in_place(self, wanted: Mapping[str, Wanted]) -> bool:
        """Every wanted rule is held as wanted (the server accepted it)."""
        return all(self._same(name, self.body(w)) for name, w in wanted.items())

    def _same(self, name: str, body: Mapping[str, Any]) -> bool:
        have = (self.held or {}).get(name)
        if have is None or self.stale(name):
            return False
        t, want = taint_of(have), body["spec"]["taint"]
        return (t.get("key"), t.get("value"), t.get("effect")) == (want["key"], want["value"], want["effect"])

    def sync(self, wanted: Mapping[str, Wanted]) -> int:
        """Make our rules equal *wanted* (rule name → Wanted). Returns the writes; raises on API
        trouble (what was written stays held, the caller applies again)."""
        return self.upsert(wanted) + self.prune(wanted)

    def upsert(self, wanted: Mapping[str, Wanted]) -> int:
        """Create or change the wanted rules. Raises `Unavailable` where no version is served, and on
        API trouble; returns only when every wanted rule is in place (a dry run: accepted)."""
        if not wanted:
            return 0
        api = self.ensure()
        if api is None:
            raise Unavailable("the API server serves no DeviceTaintRules")
        if not self.node_uid:
            raise RuntimeError("this Node's uid is not known yet (the rule's owner)")
        writes = 0
        for name, want in sorted(wanted.items()):
            if want.effect == NONE_EFFECT and not api.none_effect:
                raise Unavailable(f"{api.api_version} has no None effect (Kubernetes 1.35)")
            body = self.body(want, api)
            if not self._same(name, body):
                writes += self._write(api, name, body)
        return writes

    def prune(self, wanted: Mapping[str, Wanted]) -> int:
        """Delete our rules that are not wanted (ours only: listed by label, kept by owner)."""
        if self.held is None:
            self.ensure()
        writes = 0
        for name in sorted(set(self.held or {}) - set(wanted)):
            writes += self._delete(name)
        return writes

    def _write(self, api: RuleApi, name: str, body: dict[str, Any]) -> int:
        """Create or update one rule. A 409 (the eviction controller writes each rule's status, so
        its resourceVersion moves; or a rule of ours from before, not listed) reads that rule again
        and writes once more, if it is ours; a second refusal raises."""
        for attempt in (1, 2):
            have = (self.held or {}).get(name)
            try:
                got = self._send(api, name, body, have)
                break
            except Exception as exc:
                code = api_status(exc)
                self._note(f"error-{code or 'unreachable'}")
                if code == 404 and have is None:  # the collection itself: the version is gone
                    self.forget()
                    raise
                if code not in (404, 409) or attempt == 2:
                    if code in (404, 409):
                        self.held = None  # read the rules again at the next apply
                    raise
                self._reread(api, name)
        self._note("ok")
        self.writes += 1
        if not self.dry_run:
            assert self.held is not None
            self.held[name] = got
        taint = body["spec"]["taint"]
        log.warning(
            "node %s: device %s tainted %s=%s:%s (DeviceTaintRule %s, %s)",
            self.node_name,
            body["spec"]["deviceSelector"]["device"],
            taint["key"],
            taint["value"],
            taint["effect"],
            name,
            api.api_version,
        )
        return 1

    def _send(
        self, api: RuleApi, name: str, body: dict[str, Any], have: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        query = {"fieldManager": FIELD_MANAGER, **({"dryRun": "All"} if self.dry_run else {})}
        if have is None:
            return self.rest.json("POST", api.path, query=query, body=body, timeout=TIMEOUT)
        # Optimistic concurrency (v1 requires it): the resourceVersion we read, or a 409.
        meta = body["metadata"]
        patch = {
            "metadata": {
                "resourceVersion": str((have.get("metadata") or {}).get("resourceVersion") or ""),
                "labels": meta["labels"],
                "ownerReferences": meta["ownerReferences"],
            },
            "spec": {"taint": body["spec"]["taint"]},
        }
        return self.rest.json(
            "PATCH", f"{api.path}/{name}", query=query, body=patch, content_type=MERGE_PATCH, timeout=TIMEOUT
        )

    def _reread(self, api: RuleApi, name: str) -> None:
        """One rule as it is now: held if ours, forgotten if gone; raises if it is someone else's."""
        assert self.held is not None
        try:
            rule = self.rest.json("GET", f"{api.path}/{name}", timeout=TIMEOUT)
        except Exception as exc:
            if api_status(exc) != 404:
                raise
            self.held.pop(name, None)
            return
        self.reads += 1
        labels = (rule.get("metadata") or {}).get("labels") or {}
        if node_owner(rule, self.node_name) is None or labels.get(self.label) != node_label(self.node_name):
            raise RuntimeError(f"DeviceTaintRule {name} exists and is not ours: left alone")
        self.held[name] = rule

    def _delete(self, name: str) -> int:
        api = self.api
        if api is None:  # none served: nothing can be held
            (self.held or {}).pop(name, None)
            return 0
        have = (self.held or {}).get(name) or {}
        query: dict[str, Any] = {"dryRun": "All"} if self.dry_run else {}
        uid = (have.get("metadata") or {}).get("uid")
        body = {"preconditions": {"uid": uid}} if uid else None  # that rule, not a new one of its name
        try:
            self.rest.json("DELETE", f"{api.path}/{name}", query=query, body=body, timeout=TIMEOUT)
        except Exception as exc:
            code = api_status(exc)
            if code == 409:  # a precondition failed: another rule of that name now; read again
                self.held = None
            if code != 404:
                self._note(f"error-{code or 'unreachable'}")
                raise
        self._note("ok")
        self.writes += 1
        if not self.dry_run and self.held is not None:
            self.held.pop(name, None)
        log.info("node %s: DeviceTaintRule %s removed", self.node_name, name)
        return 1


def describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, Unavailable) else describe_error(exc)


__all__ = [
    "GROUP",
    "NONE_EFFECT",
    "VERSIONS",
    "DeviceTaints",
    "RuleApi",
    "Unavailable",
    "Wanted",
    "describe",
    "device_effect",
    "discover",
    "eviction_status",
    "node_label",
    "node_owner",
    "selected_device",
    "taint_of",
    "tainted_nodes",
]

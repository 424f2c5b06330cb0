"""Does the admission fence let the agent write the condition types of a config? Asked before the
agent adopts one, at start and on every reload, as a dry run that writes nothing.

The policy of manifests/30-admission-policy.yaml lists the condition types the agent may write (no
parameter object: docs/install.md "The fence" says why). A ConfigMap edited to write another type, with the
policy not updated, would have every status write refused while the Node's conditions go stale.
So the agent asks the real fence first: a dry-run status PATCH of its own Node that sets every type
the new config writes, with one of our reasons. Refused, the config is rejected like an invalid one
(ConfigRejected Event with the API server's message, metric, the last good config kept). An answer
that is no refusal (the API server unreachable, a 5xx) does not block a config: it is logged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from agent.config import Config
from agent.config.fence_view import condition_types
from agent.core.remediation_types import RemediationReason
from agent.reporters.kube_rest import STRATEGIC_MERGE_PATCH, KubeRest, api_status, describe_error, node_path

log = logging.getLogger(__name__)

FIELD_MANAGER = "gpu-healthcheck-config-proof"
REASON = RemediationReason.COULD_NOT_CHECK  # one of ours (the fence lets us remove ours)
TIMEOUT = (5, 15)  # not kube_rest's (5, 30): one dry-run PATCH before adopting a config


def server_message(exc: BaseException) -> str:
    """The API server's own words for a refusal (its Status message names the policy and the rule)."""
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else describe_error(exc)


def fence_refusal(core: Any, node_name: str, types: list[str]) -> str | None:
    """The API server's refusal (403) of a dry-run status PATCH of *node_name* that sets a condition
    of every type in *types*; None when it would accept it, or could not be asked (logged)."""
    stamp = time.time_ns()  # a message unlike the Node's: the PATCH is never a no-op
    conditions = [
        {"type": t, "status": "Unknown", "reason": REASON, "message": f"config proof {stamp} (dry run)"}
        for t in types
    ]
    try:
        KubeRest.of(core).json(
            "PATCH",
            node_path(node_name, "status"),
            query={"dryRun": "All", "fieldManager": FIELD_MANAGER},
            body={"status": {"conditions": conditions}},
            content_type=STRATEGIC_MERGE_PATCH,
            timeout=TIMEOUT,
        )
    except Exception as exc:
        if api_status(exc) == 403:
            return server_message(exc)
        log.warning(
            f"config proof: could not ask whether the admission fence allows {', '.join(types)}: "
            f"{describe_error(exc)}; the config is not held back for it",
            extra={"event": "config"},
        )
    return None


def config_vetter(core: Any, node_name: str) -> Callable[[Config], str | None]:
    """vet(cfg): why the fence refuses *cfg*'s condition types, or None."""

    def vet(cfg: Config) -> str | None:
        types = condition_types(cfg.node)
        refusal = fence_refusal(core, node_name, types)
        if refusal is None:
            return None
        return (
            f"the admission fence refuses the condition types this config writes ({', '.join(types)}): "
            f"{refusal} (update the policy with the config: scripts/gen-configmap.py or helm upgrade)"
        )

    return vet


__all__ = ["config_vetter", "fence_refusal", "server_message"]

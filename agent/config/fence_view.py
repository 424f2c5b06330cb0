"""What the admission fence reads out of config.yaml: the condition types the agent may write.

The fence (manifests/30-admission-policy.yaml) takes the agent's ConfigMap as its parameter object,
so the ConfigMap stays the one place that says which NodeConditions the agent writes, and an edit
takes effect at the API server at once. CEL cannot parse YAML, so the policy finds the types with
the regular expressions below (scripts/gen-configmap.py writes them into the policy): the
`conditionType:` line, else the default GPUHealthy, and every `type:` line (the entries of
node.remediationConditions, the only `type` key in config.yaml). The agent reads the same text the
same way and rejects a config.yaml whose types the fence would read otherwise (an entry in flow
style, `- {type: X}`, or a type inside a multi-line string), so the fence and the agent never
disagree about what is allowed.
"""

from __future__ import annotations

import re

from agent.config.schema import ConfigError
from agent.core.contract import DEFAULT_CONDITION_TYPE

_NAME = "[\"']?[A-Za-z0-9][-A-Za-z0-9_./]*[\"']?"
# Patterns for RE2 (CEL) and Python alike: no backreferences, no named groups.
CONDITION_TYPE_LINE = r"(?m)^[ \t]+conditionType:[ \t]+" + _NAME
REMEDIATION_TYPE_LINE = r"(?m)^[ \t]*(?:-[ \t]+)?type:[ \t]+" + _NAME


def _value(match: str) -> str:
    """The name on a matched line, as the policy's CEL takes it: after the first colon, trimmed,
    without quotes."""
    return match[match.index(":") + 1 :].strip().replace('"', "").replace("'", "")


def fence_types(text: str) -> tuple[list[str], list[str]]:
    """(the conditionType values, the remediation types) the fence finds in config.yaml's text."""
    own = [_value(m) for m in re.findall(CONDITION_TYPE_LINE, text)]
    return own, [_value(m) for m in re.findall(REMEDIATION_TYPE_LINE, text)]


def allowed_types(text: str) -> list[str]:
    """Every condition type the fence lets the agent write under this config.yaml."""
    own, remediation = fence_types(text)
    return (own or [DEFAULT_CONDITION_TYPE]) + remediation


def check_fence_view(text: str, condition_type: str, remediation: list[str]) -> None:
    """Raise ConfigError unless the fence reads exactly the configured types out of *text*."""
    own, found = fence_types(text)
    if (own or [DEFAULT_CONDITION_TYPE]) != [condition_type]:
        raise ConfigError(
            f"node.conditionType: the admission fence reads {own or [DEFAULT_CONDITION_TYPE]} out of "
            f"config.yaml, the config says {condition_type}: write `conditionType: {condition_type}` "
            "once, on its own line under `node:`"
        )
    if sorted(found) != sorted(remediation):
        raise ConfigError(
            f"node.remediationConditions: the admission fence reads the types {found} out of "
            f"config.yaml, the config says {remediation}: write each entry in block style, with "
            "`- type: NAME` (or `type: NAME`) on a line of its own, and no `type:` line elsewhere"
        )


__all__ = [
    "CONDITION_TYPE_LINE",
    "REMEDIATION_TYPE_LINE",
    "allowed_types",
    "check_fence_view",
    "fence_types",
]

"""The condition types the agent writes under a config: what the admission fence must allow it.

The fence (manifests/30-admission-policy.yaml) takes no parameter object: a binding's param that is
missing (a deleted ConfigMap, its namespace gone, a re-created one the API server never resolves
again, kubernetes/kubernetes#133827) makes a ValidatingAdmissionPolicy refuse every Node write in the
cluster, not only ours. So the types are written into the policy: by scripts/gen-configmap.py from
config/ for manifests/, and by the Helm chart from the config it renders. The agent asks the API
server, as a dry run, whether the fence lets it write these types before it adopts a config
(agent/reporters/config_proof.py), so a ConfigMap and a policy that disagree are refused at once.
"""

from __future__ import annotations

from agent.config.settings import NodeSettings


def condition_types(node: NodeSettings) -> list[str]:
    """node.conditionType, then the types of node.remediationConditions, in config order."""
    return [node.condition_type, *(c.type for c in node.remediation_conditions)]


__all__ = ["condition_types"]

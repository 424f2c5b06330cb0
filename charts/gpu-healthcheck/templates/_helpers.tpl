{{- /*
config.yaml as the chart renders it: the shipped file (files/config.yaml, a copy of config/), the
engine's address and the values' shortcuts (mode, isolation, taintMinSeverity, taintEffectBySeverity,
remediationConditions) written into its text, then `config` merged in key by key (a map into a map,
anything else replaces the value; false and 0 too). Without `config` the text keeps its comments;
with it the document is written anew (keys sorted, comments gone).
*/}}
{{- define "gpu-healthcheck.configYaml" -}}
{{- $cfg := .Files.Get "files/config.yaml" }}
{{- $addr := printf "nvidia-dcgm.%s.svc:5555" .Release.Namespace }}
{{- if eq .Values.dcgm.engine "operator-standalone" }}{{ $addr = .Values.dcgm.operatorAddress }}{{ end }}
{{- $cfg = regexReplaceAll "(?m)^  address: nvidia-dcgm\\.gpu-healthcheck\\.svc:5555" $cfg (printf "  address: %s" $addr) }}
{{- with .Values.mode }}{{ $cfg = regexReplaceAll "(?m)^  mode: \\S+" $cfg (printf "  mode: %s" .) }}{{ end }}
{{- with .Values.isolation }}{{ $cfg = regexReplaceAll "(?m)^  isolation: \\S+" $cfg (printf "  isolation: %s" .) }}{{ end }}
{{- with .Values.taintMinSeverity }}{{ $cfg = regexReplaceAll "(?m)^  taintMinSeverity: \\S+" $cfg (printf "  taintMinSeverity: %s" .) }}{{ end }}
{{- with .Values.remediationConditions }}{{ $cfg = regexReplaceAll "(?m)^  remediationConditions: \\[\\]" $cfg (printf "  remediationConditions:\n%s" (toYaml . | indent 4 | trimSuffix "\n")) }}{{ end }}
{{- with .Values.taintEffectBySeverity }}{{ $cfg = regexReplaceAll "(?m)^  taintEffectBySeverity: \\{\\}" $cfg (printf "  taintEffectBySeverity: %s" (toJson .)) }}{{ end }}
{{- if .Values.config }}
{{- $cfg = include "gpu-healthcheck.merge" (dict "dst" (fromYaml $cfg) "src" .Values.config) }}
{{- end }}
{{- $cfg }}
{{- end }}

{{- /* toYaml of .dst with .src merged in: maps key by key, every other value replaced. (Sprig's
mergeOverwrite keeps the old value where the new one is false, 0 or "".) */}}
{{- define "gpu-healthcheck.merge" -}}
{{- $out := deepCopy .dst }}
{{- range $k, $v := .src }}
{{- $old := get $out $k }}
{{- if and (kindIs "map" $v) (kindIs "map" $old) }}
{{- $_ := set $out $k (fromYaml (include "gpu-healthcheck.merge" (dict "dst" $old "src" $v))) }}
{{- else }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- /*
The admission fence's list of the condition types the agent may write, as a CEL list: node.conditionType
(GPUHealthy when unset, agent/core/node_keys.py) and node.remediationConditions[].type of the rendered
config.yaml, so the policy always allows what the ConfigMap says. A name that cannot be a condition
type (the agent would reject it too) fails the render.
*/}}
{{- define "gpu-healthcheck.conditionTypes" -}}
{{- $doc := fromYaml (include "gpu-healthcheck.configYaml" .) }}
{{- if hasKey $doc "Error" }}{{ fail (printf "config.yaml does not parse: %s" $doc.Error) }}{{ end }}
{{- $node := $doc.node | default dict }}
{{- $types := list ($node.conditionType | default "GPUHealthy") }}
{{- range ($node.remediationConditions | default list) }}{{ $types = append $types (get . "type") }}{{ end }}
{{- $names := list }}
{{- range $types }}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" (toString .)) }}
{{- fail (printf "config.node: %q is not a condition type" (toString .)) }}
{{- end }}
{{- $names = append $names (printf "'%s'" .) }}
{{- end }}
{{- printf "[%s]" (join ", " $names) }}
{{- end }}

{{- /* config.yaml's `prefix` (the keys on the Nodes: the alerts' taint key follows it). */}}
{{- define "gpu-healthcheck.prefix" -}}
{{- $doc := fromYaml (include "gpu-healthcheck.configYaml" .) }}
{{- toString ($doc.prefix | default "gpu-healthcheck") }}
{{- end }}

{{- /* config.yaml's `prefix` and a slash, as a CEL string: the fence's key prefix follows the config. */}}
{{- define "gpu-healthcheck.prefixCel" -}}
{{- $doc := fromYaml (include "gpu-healthcheck.configYaml" .) }}
{{- $prefix := toString ($doc.prefix | default "gpu-healthcheck") }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" $prefix) }}
{{- fail (printf "config.prefix: %q is not a label key prefix (a DNS subdomain)" $prefix) }}
{{- end }}
{{- printf "'%s/'" $prefix }}
{{- end }}

{{- /*
The agent's `scheduling` when the values set it: as given, its required node affinity's every term
ANDed with "not on the image canary's nodes" (gpu-healthcheck/track NotIn canary; a term of that
alone where none is given), as scripts/gen-configmap.py writes the default. The canary DaemonSet
(61-agent-canary.yaml) turns that expression into In.
*/}}
{{- define "gpu-healthcheck.agentScheduling" -}}
{{- $s := deepCopy .Values.scheduling }}
{{- $notCanary := dict "key" "gpu-healthcheck/track" "operator" "NotIn" "values" (list "canary") }}
{{- $affinity := get $s "affinity" | default dict }}
{{- $node := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := list }}
{{- range (get $required "nodeSelectorTerms" | default (list dict)) }}
{{- $exprs := append (get . "matchExpressions" | default list) (deepCopy $notCanary) }}
{{- $terms = append $terms (set (deepCopy .) "matchExpressions" $exprs) }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ = set $affinity "nodeAffinity" $node }}
{{- $_ = set $s "affinity" $affinity }}
{{- toYaml $s }}
{{- end }}

{{/* Name prefix of every object: the release name, with "-orchard" unless it already says orchard. */}}
{{- define "orchard.fullname" -}}
{{- if contains "orchard" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-orchard" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries (objects with a selector add the selector's labels). */}}
{{- define "orchard.baseLabels" -}}
app.kubernetes.io/part-of: orchard
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "orchard.labels" -}}
{{ include "orchard.baseLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels that select the service pods; the backend lets exactly these pods reach the agents. */}}
{{- define "orchard.serviceSelector" -}}
app.kubernetes.io/name: orchard-env
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: service
{{- end -}}

{{/* The same labels as ORCHARD_KUBE_SERVICE_LABELS wants them: k=v,k=v. */}}
{{- define "orchard.serviceSelectorString" -}}
{{- $pairs := list -}}
{{- range $k, $v := (include "orchard.serviceSelector" . | fromYaml) -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* Labels that select the Redis pod (deliberately not the service's name label). */}}
{{- define "orchard.redisSelector" -}}
app.kubernetes.io/name: orchard-redis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end -}}

{{/* Label every sandbox pod carries (set by the backend). */}}
{{- define "orchard.sandboxSelector" -}}
app.kubernetes.io/managed-by: orchard
{{- end -}}

{{/* Names of Secrets: made by the chart unless the values name an existing one. */}}
{{- define "orchard.apiKeysSecret" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "orchard.fullname" .)) -}}
{{- end -}}

{{- define "orchard.redisSecret" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "orchard.fullname" .)) -}}
{{- else -}}
{{- .Values.redis.external.existingSecret | default (printf "%s-redis" (include "orchard.fullname" .)) -}}
{{- end -}}
{{- end -}}

{{- define "orchard.redisHost" -}}
{{- printf "%s-redis.%s.svc" (include "orchard.fullname" .) .Values.namespaces.service -}}
{{- end -}}

{{/* The Redis password: the given one, else the one already in the cluster, else a new one. */}}
{{- define "orchard.redisPassword" -}}
{{- if .Values.redis.password -}}
{{- .Values.redis.password -}}
{{- else -}}
{{- $old := lookup "v1" "Secret" .Values.namespaces.service (include "orchard.redisSecret" .) -}}
{{- if and $old $old.data (index $old.data "redis-password") -}}
{{- index $old.data "redis-password" | b64dec -}}
{{- else -}}
{{- randAlphaNum 32 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Join a list or a map (k=v) with commas, as the service's list settings read them. */}}
{{- define "orchard.csv" -}}
{{- if kindIs "map" . -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}{{- $pairs = append $pairs (printf "%s=%s" $k (toString $v)) -}}{{- end -}}
{{- join "," $pairs -}}
{{- else -}}
{{- join "," . -}}
{{- end -}}
{{- end -}}

{{/* Every plain ORCHARD_* variable of the service, as a map (env wins over first-class values). */}}
{{- define "orchard.settingsEnv" -}}
{{- $s := .Values.settings -}}
{{- $k := .Values.kube -}}
{{- $env := dict
  "ORCHARD_HOST" "0.0.0.0"
  "ORCHARD_PORT" "8080"
  "ORCHARD_BACKEND" "kubernetes"
  "ORCHARD_STORE" "redis"
  "ORCHARD_STATE_DIR" "/var/lib/orchard"
  "ORCHARD_NAMESPACE" .Values.namespaces.sandbox
  "ORCHARD_DEFAULT_CPU" (toString $s.defaultCpu)
  "ORCHARD_DEFAULT_MEMORY" (toString $s.defaultMemory)
  "ORCHARD_DEFAULT_DISK" (toString $s.defaultDisk)
  "ORCHARD_TTL_SECONDS" (toString $s.ttlSeconds)
  "ORCHARD_MAX_SANDBOXES" (toString $s.maxSandboxes)
  "ORCHARD_MAX_PENDING_CREATES" (toString $s.maxPendingCreates)
  "ORCHARD_CREATE_CONCURRENCY" (toString $s.createConcurrency)
  "ORCHARD_MAX_CONCURRENT_EXECS" (toString $s.maxConcurrentExecs)
  "ORCHARD_LEASE_SECONDS" (toString $s.leaseSeconds)
  "ORCHARD_REDIS_PREFIX" (toString $s.redisPrefix)
  "ORCHARD_KUBE_NAMESPACE" .Values.namespaces.sandbox
  "ORCHARD_KUBE_SERVICE_NAMESPACE" .Values.namespaces.service
  "ORCHARD_KUBE_SERVICE_LABELS" (include "orchard.serviceSelectorString" .)
  "ORCHARD_KUBE_AGENT_IMAGE" $k.agentImage
  "ORCHARD_KUBE_HOST_IMAGE" $k.hostImage
  "ORCHARD_KUBE_AGENT_PORT" (toString $k.agentPort)
  "ORCHARD_KUBE_AGENT_POOL" (toString $k.agentPool)
-}}
{{- if $k.blockedCidrs }}{{ $_ := set $env "ORCHARD_KUBE_BLOCKED_CIDRS" (include "orchard.csv" $k.blockedCidrs) }}{{ end -}}
{{- if $k.imagePullSecrets }}{{ $_ := set $env "ORCHARD_KUBE_IMAGE_PULL_SECRETS" (include "orchard.csv" $k.imagePullSecrets) }}{{ end -}}
{{- if $k.runtimeClass }}{{ $_ := set $env "ORCHARD_KUBE_RUNTIME_CLASS" $k.runtimeClass }}{{ end -}}
{{- if $k.nodeSelector }}{{ $_ := set $env "ORCHARD_KUBE_NODE_SELECTOR" (include "orchard.csv" $k.nodeSelector) }}{{ end -}}
{{- range $name, $value := .Values.env -}}
{{- if has $name (list "ORCHARD_API_KEYS" "ORCHARD_ADMIN_KEYS" "ORCHARD_REDIS_URL" "ORCHARD_REPLICA_ID" "ORCHARD_NO_AUTH") -}}
{{- fail (printf "env: %s is set by the chart (API keys: apiKeys; Redis: redis; replica id: the pod name; auth cannot be switched off)" $name) -}}
{{- end -}}
{{- $_ := set $env $name (toString $value) -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

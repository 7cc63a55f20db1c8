{{/*
Names. With the release called "agentrun" (as deploy/operator.yaml is rendered) every object
keeps the name it had before the chart: agentrun-operator, agentrun-postgres, ...
*/}}
{{- define "agentrun.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agentrun.operatorName" -}}
{{- printf "%s-operator" (include "agentrun.fullname" .) -}}
{{- end -}}

{{- define "agentrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentrun.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Labels. No app.kubernetes.io/managed-by: the operator puts
app.kubernetes.io/managed-by=agentrun-operator on the runner pods it creates and watches pods
by that label, so the chart keeps the key off its own objects rather than give it a second
meaning.
*/}}
{{- define "agentrun.operatorSelectorLabels" -}}
app.kubernetes.io/name: agentrun-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentrun.operatorPodLabels" -}}
{{ include "agentrun.operatorSelectorLabels" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: agentrun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "agentrun.operatorLabels" -}}
{{ include "agentrun.operatorPodLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "agentrun.userRoleLabels" -}}
app.kubernetes.io/name: agentrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: rbac
app.kubernetes.io/part-of: agentrun
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of a dev store part; call with (dict "root" $ "name" "postgres"). */}}
{{- define "agentrun.devStoreSelectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ printf "%s-dev-store" .root.Release.Name }}
{{- end -}}

{{- define "agentrun.devStoreLabels" -}}
{{ include "agentrun.devStoreSelectorLabels" . }}
app.kubernetes.io/component: store
app.kubernetes.io/part-of: agentrun
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* "repository:tag" or "repository@digest"; call with (dict "image" <values> "default" <values> "appVersion" <string>). */}}
{{- define "agentrun.image" -}}
{{- $repository := default .default.repository .image.repository -}}
{{- $digest := default .default.digest .image.digest -}}
{{- $tag := default (default .appVersion .default.tag) .image.tag -}}
{{- if $digest -}}
{{- printf "%s@%s" $repository $digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "agentrun.operatorImage" -}}
{{- include "agentrun.image" (dict "image" .Values.image "default" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- define "agentrun.runnerImage" -}}
{{- include "agentrun.image" (dict "image" .Values.runner.image "default" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/*
The operator's rules on namespaced resources: exactly what its code calls (the callers of
operator/agentrun_operator/kube.py, plus kopf's own watching). deploy/README.md gives one
line of why per rule; tests/chart asserts this list, so a wider grant changes a test on
purpose.
*/}}
{{- define "agentrun.namespacedRules" -}}
# kopf watches AgentRuns (list, watch; no finalizer, no annotations: the operator never
# writes an AgentRun's metadata or spec); the reconciler re-reads each run under its lock
# (get); a finished run past spec.ttlSecondsAfterFinished is deleted (delete). No create,
# patch or update.
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, list, watch, delete]
# The operator is the only writer of AgentRun status, always as a merge patch.
- apiGroups: [agentrun.dev]
  resources: [agentruns/status]
  verbs: [patch]
# Runner pods carry an ownerReference with blockOwnerDeletion: true; API servers with the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters) only
# allow that to whoever may update the owner's finalizers. No endpoint behind it for CRDs.
- apiGroups: [agentrun.dev]
  resources: [agentruns/finalizers]
  verbs: [update]
# One pod per attempt: created (create), watched by kopf to react at once and to classify how
# it ended from memory (list, watch; kopf applies the managed-by label filter client-side),
# read by name only after a create that found the pod there already (get),
# listed by run label and deleted when the AgentRun is deleted, and deleted on a forced
# stop, a lost node or a pod stuck on a configuration error (list, delete).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# The store Secret named by each AgentRun (default store.defaultSecretName) and the Secrets a
# run's pod references: read by name once (get), then kept current by a watch (list, watch)
# instead of a read per reconcile; a password rotated in the Secret reaches the operator with
# its watch event. The watch delivers every Secret of the namespaces served: the operator keeps
# only the Secrets a run names, and of those only the labels and the postgresDsn/redisUrl keys.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch]
# One core/v1 Event per phase transition. kopf's own event posting is disabled and no
# Event is ever patched (each transition is a new Event), so create is all.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* The dev store's URLs, as runner pods in any namespace reach them. */}}
{{- define "agentrun.devStorePostgresDsn" -}}
{{- printf "postgresql://postgres@%s-postgres.%s.svc.cluster.local:5432/agentrun" (include "agentrun.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "agentrun.devStoreRedisUrl" -}}
{{- printf "redis://%s-redis.%s.svc.cluster.local:6379/0" (include "agentrun.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The history server (templates/history.yaml). */}}
{{- define "agentrun.historyName" -}}
{{- printf "%s-history" (include "agentrun.fullname" .) -}}
{{- end -}}

{{- define "agentrun.historySelectorLabels" -}}
app.kubernetes.io/name: agentrun-history
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentrun.historyLabels" -}}
{{ include "agentrun.historySelectorLabels" . }}
app.kubernetes.io/component: history
app.kubernetes.io/part-of: agentrun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Names, labels and the images of the release. */}}

{{- define "stalledpolicy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stalledpolicy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "stalledpolicy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stalledpolicy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stalledpolicy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "stalledpolicy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stalledpolicy
{{- end -}}

{{- define "stalledpolicy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stalledpolicy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "stalledpolicy.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "stalledpolicy.sweeperImage" -}}
{{- default (include "stalledpolicy.image" .) .Values.sweeperImage -}}
{{- end -}}

{{/* True (non-empty) when the operator watches every namespace. */}}
{{- define "stalledpolicy.clusterWide" -}}
{{- if not .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/*
The operator's rules on the resources of the namespaces it watches (a
ClusterRole when cluster-wide, a Role per namespace otherwise). Kept in step
with tests/kube/operator_harness.py (OPERATOR_RULES), which the operator's own
tests run with.
*/}}
{{- define "stalledpolicy.namespacedRules" -}}
# The policies: watched, annotated by kopf (progress, last handled spec).
- apiGroups: [queues.emq.dev]
  resources: [stalledpolicies]
  verbs: [get, list, watch, patch]
# Status is written by the operator only (patched, never read through the subresource).
- apiGroups: [queues.emq.dev]
  resources: [stalledpolicies/status]
  verbs: [patch]
# A sweeper's owner reference blocks its policy's deletion until it is gone
# (blockOwnerDeletion); clusters with OwnerReferencesPermissionEnforcement ask for this.
- apiGroups: [queues.emq.dev]
  resources: [stalledpolicies/finalizers]
  verbs: [update]
# The sweepers: server-side applied (create + patch), watched for availability.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
# The Redis URL of spec.redis.secretRef, read by name (never listed or watched).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# Events on the policies, core/v1 only (ours and kopf's): created, and patched
# when a repeat is counted on the same Event. Nothing posts events.k8s.io.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* kopf's own cluster-scoped needs: noticing the CRD come and go. */}}
{{- define "stalledpolicy.discoveryRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end -}}

{{/* Leader election (leaderElection.enabled): the release's Lease, in the release
namespace. create cannot be limited to a name (the object does not exist yet). */}}
{{- define "stalledpolicy.leaseRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ include "stalledpolicy.fullname" . }}]
  verbs: [get, update]
{{- end -}}

{{/* Namespaced mode: kopf follows the watched namespaces as they come and go (it lists
namespaces when given names; cluster-wide it does not). */}}
{{- define "stalledpolicy.namespaceRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end -}}

{{/*
A Prometheus duration (values.schema.json's pattern: 1h30m, 500ms, 0) in
milliseconds, to compare two of them; units y (365 d), w, d, h, m, s, ms.
*/}}
{{- define "stalledpolicy.durationMillis" -}}
{{- $units := dict "y" 31536000000 "w" 604800000 "d" 86400000 "h" 3600000 "m" 60000 "s" 1000 "ms" 1 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|y|w|d|h|m|s)" . -1 -}}
{{- $number := regexFind "^[0-9]+" . -}}
{{- $total = add $total (mul (atoi $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* Chart name. */}}
{{- define "moe-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "moe-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "moe-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "moe-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: moe-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels selecting the operator pod. */}}
{{- define "moe-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "moe-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of monitoring objects (Prometheus operator selection). */}}
{{- define "moe-operator.monitoringLabels" -}}
{{ include "moe-operator.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "moe-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "moe-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The webhook + metrics Service; the API server calls <service>.<namespace>.svc. */}}
{{- define "moe-operator.serviceName" -}}
{{- printf "%s-webhook" (include "moe-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "moe-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "moe-operator.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtimeImage.repository (default .Chart.AppVersion .Values.runtimeImage.tag) }}
{{- end }}

{{/* The kopf peering object(s) replicas elect the active operator through (`run --peering`). */}}
{{- define "moe-operator.peeringName" -}}
{{- include "moe-operator.fullname" . }}
{{- end }}

{{/* The Secret that holds the generated webhook CA and certificate all replicas serve. */}}
{{- define "moe-operator.webhookCertSecretName" -}}
{{- printf "%s-webhook-certs" (include "moe-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

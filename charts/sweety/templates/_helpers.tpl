{{/* Chart name. */}}
{{- define "sweety.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix. */}}
{{- define "sweety.fullname" -}}
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

{{/* Labels selecting the pods (also the controller's --dataplane-selector). */}}
{{- define "sweety.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sweety.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "sweety.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sweety.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The image: repository:tag, or repository[:tag]@digest when a digest is given. */}}
{{- define "sweety.image" -}}
{{- if .Values.image.digest -}}
{{- if .Values.image.tag -}}
{{- printf "%s:%s@%s" .Values.image.repository .Values.image.tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- end -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret (release namespace) of the self-signed default certificate the controller makes once
and every replica serves, without controller.defaultCertificateSecret. */}}
{{- define "sweety.generatedDefaultCertificate" -}}
{{- printf "%s-default-certificate" (include "sweety.fullname" .) -}}
{{- end -}}

{{- define "sweety.leaseName" -}}
{{- default (printf "%s-controller" (include "sweety.fullname" .)) .Values.controller.leaseName -}}
{{- end -}}

{{/* Pod securityContext: the chart's, with .Values.podSecurityContext merged over it. */}}
{{- define "sweety.podSecurityContext" -}}
{{- $base := dict "runAsNonRoot" true "runAsUser" (int .Values.runAsUser) "runAsGroup" (int .Values.runAsUser) "fsGroup" (int .Values.runAsUser) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $base (deepCopy .Values.podSecurityContext)) -}}
{{- end -}}

{{/* Container securityContext: the chart's, with .Values.containerSecurityContext merged over it. */}}
{{- define "sweety.containerSecurityContext" -}}
{{- $base := dict "runAsNonRoot" true "runAsUser" (int .Values.runAsUser) "runAsGroup" (int .Values.runAsUser) "readOnlyRootFilesystem" true "allowPrivilegeEscalation" false "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $base (deepCopy .Values.containerSecurityContext)) -}}
{{- end -}}

{{/* The environment both containers get; called with the container's values (.Values.controller
or .Values.dataplane): the pod's namespace and name, RUST_LOG from logLevel, then extraEnv. */}}
{{- define "sweety.containerEnv" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef: {fieldPath: metadata.namespace}
- name: POD_NAME
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
- name: RUST_LOG
  value: {{ .logLevel | quote }}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The mounts both containers get (the shared run directory, /tmp), then the container's
extraVolumeMounts; called with the container's values. */}}
{{- define "sweety.containerVolumeMounts" -}}
- name: run
  mountPath: /var/run/sweety
- name: tmp
  mountPath: /tmp
{{- with .extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Startup, liveness and readiness probes on a named container port serving /healthz and
/readyz (the controller's metrics port, the dataplane's admin port; the dataplane is not ready
until the controller has pushed a config). */}}
{{- define "sweety.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: {{ . }}}
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet: {path: /healthz, port: {{ . }}}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: {{ . }}}
  periodSeconds: 5
  failureThreshold: 3
{{- end -}}

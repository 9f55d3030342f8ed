{{- define "shardsrv.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shardsrv.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "shardsrv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardsrv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shardsrv.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "shardsrv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "shardsrv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shardsrv.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* A byte size for a SHARDSRV_ variable: a string with its unit (1.5Gi, 512MiB) as written, a
number as a whole number (YAML numbers arrive as floats, which would print as 1.6e+09). */ -}}
{{- define "shardsrv.bytes" -}}
{{- if kindIs "string" . -}}{{ . | quote }}{{- else -}}{{ . | int64 | quote }}{{- end -}}
{{- end -}}

{{- /* The Secret holding the TLS key pair: the given one, or the one the chart's Certificate fills. */ -}}
{{- define "shardsrv.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "shardsrv.fullname" .)) -}}
{{- end -}}

{{- /* The name replicas check each other's certificates for (--peer-server-name): tls.peerServerName,
or the Service's name the chart's Certificate carries; none with an existing Secret left unnamed, whose
chain alone then admits a peer. */ -}}
{{- define "shardsrv.peerServerName" -}}
{{- if .Values.tls.peerServerName -}}
{{- .Values.tls.peerServerName -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- include "shardsrv.fullname" . }}.{{ .Release.Namespace }}.svc
{{- end -}}
{{- end -}}

{{- define "shardsrv.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

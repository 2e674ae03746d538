{{/* Common labels on every object of the release. */}}
{{- define "modelplane.labels" -}}
app.kubernetes.io/part-of: modelplane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "modelplane.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{- define "modelplane.workerSelector" -}}
app.kubernetes.io/part-of=modelplane,app.kubernetes.io/component=worker
{{- end -}}

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

{{/* workers.gpu.mode, checked: a typo must not silently give pods no GPU. */}}
{{- define "modelplane.gpuMode" -}}
{{- if hasKey .Values.workers "gpusPerPod" -}}
{{- fail "workers.gpusPerPod is now workers.gpu.count, with workers.gpu.mode (dra, devicePlugin or none): see values.yaml" -}}
{{- end -}}
{{- $mode := .Values.workers.gpu.mode -}}
{{- if not (has $mode (list "dra" "devicePlugin" "none")) -}}
{{- fail (printf "workers.gpu.mode must be dra, devicePlugin or none, not %q" $mode) -}}
{{- end -}}
{{- if and (eq $mode "dra") (lt (int .Values.workers.gpu.count) 1) -}}
{{- fail "workers.gpu.count must be at least 1 with workers.gpu.mode dra (use mode none for CPU-only pods)" -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* The ResourceClaimTemplate every worker pod claims its GPUs from (gpu.mode dra). */}}
{{- define "modelplane.gpuClaimTemplate" -}}
modelplane-worker-gpu
{{- end -}}

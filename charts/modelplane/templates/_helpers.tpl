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

{{/* Whether modelplane serves every namespace (watchNamespaces: ["*"]). */}}
{{- define "modelplane.allNamespaces" -}}
{{- if has "*" .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* The namespaces served, as a JSON list: the release's own, then watchNamespaces. */}}
{{- define "modelplane.namespaces" -}}
{{- $list := list .Release.Namespace -}}
{{- range .Values.watchNamespaces -}}
{{- if not (has . $list) -}}{{- $list = append $list . -}}{{- end -}}
{{- end -}}
{{- toJson $list -}}
{{- end -}}

{{/* The operator's rules, the same in a Role per namespace or in the ClusterRole. */}}
{{- define "modelplane.operatorRules" -}}
# Watch ServedModels; patch finalizers and kopf's bookkeeping annotations.
- apiGroups: [modelplane.io]
  resources: [servedmodels]
  verbs: [get, list, watch, patch]
- apiGroups: [modelplane.io]
  resources: [servedmodels/status]
  verbs: [get, patch]
# Pools: created per pool namespace, their operator-owned fields applied, their size set through
# the scale subresource (as the HPA does), their status written.
- apiGroups: [modelplane.io]
  resources: [workerpools]
  verbs: [get, list, watch, create, patch]
- apiGroups: [modelplane.io]
  resources: [workerpools/status, workerpools/scale]
  verbs: [get, patch]
# Quotas: read, and their use written to their status.
- apiGroups: [modelplane.io]
  resources: [modelquotas]
  verbs: [get, list, watch]
- apiGroups: [modelplane.io]
  resources: [modelquotas/status]
  verbs: [get, patch]
# Dedicated instance groups and the shared pools (server-side apply: create + patch);
# delete when a model moves from dedicated to shared.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
# The workers' model store. create cannot be limited by name; the rest can.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create]
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [modelplane-models]
  verbs: [get, patch]
# Find the worker pods whose /status reports a model's copies; annotate them when the model
# store changes (their kubelet then refreshes the mounted ConfigMap at once), and when one is
# drained before its pool shrinks (drain mark, pod-deletion-cost).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The router's rules: read worker pods and ServedModels; annotate a ServedModel whose request
     waits for a pod to start (its one write). */}}
{{- define "modelplane.routerRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [modelplane.io]
  resources: [servedmodels]
  verbs: [get, list, watch, patch]
{{- end -}}

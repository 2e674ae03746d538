{{/* Common labels on every object of the release. */}}
{{- define "hotset.labels" -}}
app.kubernetes.io/part-of: hotset
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "hotset.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}

{{- define "hotset.workerSelector" -}}
app.kubernetes.io/part-of=hotset,app.kubernetes.io/component=worker
{{- end -}}

{{/* workers.gpu.mode, checked: a typo must not silently give pods no GPU. */}}
{{- define "hotset.gpuMode" -}}
{{- if hasKey .Values.workers "gpusPerPod" -}}
{{- fail "workers.gpusPerPod is now workers.gpu.count, with workers.gpu.mode (dra, devicePlugin or none): see values.yaml" -}}
{{- end -}}
{{- $mode := .Values.workers.gpu.mode -}}
{{- if not (has $mode (list "dra" "devicePlugin" "none")) -}}
{{- fail (printf "workers.gpu.mode must be dra, devicePlugin or none, not %q" $mode) -}}
{{- end -}}
{{- if and (ne $mode "none") (lt (int .Values.workers.gpu.count) 1) -}}
{{- fail (printf "workers.gpu.count must be at least 1 with workers.gpu.mode %s (use mode none for CPU-only pods)" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* A pod spec's scheduling fields from a values block (operator.scheduling, router.scheduling):
     nodeSelector, tolerations, affinity, topologySpreadConstraints, priorityClassName; only those set. */}}
{{- define "hotset.scheduling" -}}
{{- $known := list "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" -}}
{{- range $key, $_ := . -}}
{{- if not (has $key $known) -}}
{{- fail (printf "scheduling.%s is not a scheduling field; use one of %s" $key (join ", " $known)) -}}
{{- end -}}
{{- end -}}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- if kindIs "slice" .tolerations }}
tolerations: {{- toYaml .tolerations | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* workers.triton.sidecar, checked. */}}
{{- define "hotset.tritonSidecar" -}}
{{- $mode := .Values.workers.triton.sidecar -}}
{{- if not (has $mode (list "auto" "always" "never")) -}}
{{- fail (printf "workers.triton.sidecar must be auto, always or never, not %q" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* The ResourceClaimTemplate every worker pod claims its GPUs from (gpu.mode dra). */}}
{{- define "hotset.gpuClaimTemplate" -}}
hotset-worker-gpu
{{- end -}}

{{/* Whether hotset serves every namespace (watchNamespaces: ["*"]). */}}
{{- define "hotset.allNamespaces" -}}
{{- if has "*" .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* The namespaces served, as a JSON list: the release's own, then watchNamespaces. */}}
{{- define "hotset.namespaces" -}}
{{- $list := list .Release.Namespace -}}
{{- range .Values.watchNamespaces -}}
{{- if not (has . $list) -}}{{- $list = append $list . -}}{{- end -}}
{{- end -}}
{{- toJson $list -}}
{{- end -}}

{{/* The workers' ServiceAccount outside the release namespace (where the chart's own is not the
     operator's to change): the operator makes it where it runs worker pods, so the kubelet can
     project their identity tokens (docs/security.md, "Workers that prove who they are"). */}}
{{- define "hotset.operatorWorkerAccountRule" -}}
- apiGroups: [""]
  resources: [serviceaccounts]
  resourceNames: [hotset-worker]
  verbs: [patch]
{{- end -}}

{{/* security.workerToken is retired: fail a render that still sets it, naming what replaced it. */}}
{{- define "hotset.noSharedToken" -}}
{{- if hasKey (.Values.security | default dict) "workerToken" -}}
{{- fail "security.workerToken is retired: worker pods and their callers now prove who they are with ServiceAccount tokens of their own, projected by the kubelet (docs/security.md, \"Workers that prove who they are\"); remove the value" -}}
{{- end -}}
{{- end -}}

{{/* The operator's rules, the same in a Role per namespace or in the ClusterRole. */}}
{{- define "hotset.operatorRules" -}}
# Watch ServedModels; patch finalizers and kopf's bookkeeping annotations.
- apiGroups: [hotset.io]
  resources: [servedmodels]
  verbs: [get, list, watch, patch]
- apiGroups: [hotset.io]
  resources: [servedmodels/status]
  verbs: [get, patch]
# Pools: created per pool namespace, their operator-owned fields applied, their size set through
# the scale subresource (as the HPA does), their status written.
- apiGroups: [hotset.io]
  resources: [workerpools]
  verbs: [get, list, watch, create, patch]
- apiGroups: [hotset.io]
  resources: [workerpools/status, workerpools/scale]
  verbs: [get, patch]
# Quotas: read, and their use written to their status.
- apiGroups: [hotset.io]
  resources: [modelquotas]
  verbs: [get, list, watch]
- apiGroups: [hotset.io]
  resources: [modelquotas/status]
  verbs: [get, patch]
# Dedicated instance groups and the shared pools (server-side apply: create + patch);
# delete when a model moves from dedicated to shared; watched (kopf index) for their sizes.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# Which ReplicaSet owns a labelled pod, and which Deployment owns that ReplicaSet: only pods of
# the operator's own Deployments are asked for reports and given the token (kopf index, read only).
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list, watch]
# Worker identity (docs/security.md, "Workers that prove who they are"): the workers' ServiceAccount
# where the operator runs worker pods outside the release namespace (create cannot be limited by
# name; patch only it: operatorWorkerAccountRule), and the cluster's public ServiceAccount keys,
# copied into one ConfigMap per namespace with worker pods, which they verify callers with.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create]
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [hotset-issuer-keys]
  verbs: [patch]
# At most one pod of a pool away at a time (the shared pool's and each dedicated group's budget).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
# Each worker Deployment's NetworkPolicy (the chart's worker network rules beside it).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
{{- if .Values.inferencePool.endpointPicker }}
# Each dedicated vllm group's InferencePool (inferencePool; the Inference Extension's CRD):
# server-side apply, and delete when the model leaves vllm or its group.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch, delete]
{{- end }}
# Source credentials (docs/frameworks.md, "Credentials"): read the Secrets ServedModels name, and
# write the one Secret per pool namespace that worker pods mount (create cannot be limited by name).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [{{ .Values.workers.sources.credentialsSecret | quote }}]
  verbs: [patch]
# Watch the worker pods (kopf index) whose /status reports a model's copies; annotate one that
# is drained before its pool shrinks (drain mark, pod-deletion-cost).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The router's rules: read worker pods, ServedModels and ModelQuotas; annotate a ServedModel
     whose request waits for a pod to start (its one write). */}}
{{- define "hotset.routerRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# A labelled pod gets traffic only when the operator's Deployment owns it (through its
# ReplicaSet): the router watches the worker-labelled ReplicaSets and the operator's Deployments.
- apiGroups: [apps]
  resources: [replicasets, deployments]
  verbs: [list, watch]
- apiGroups: [hotset.io]
  resources: [servedmodels]
  verbs: [get, list, watch, patch]
# Each namespace's request rate (a ModelQuota's requestsPerSecond): read only.
- apiGroups: [hotset.io]
  resources: [modelquotas]
  verbs: [get, list, watch]
{{- end -}}

{{/* The projected ServiceAccount token the router and the operator present to worker pods
     (audience hotset-worker, hotset_common.worker_identity): a volume and its mount. */}}
{{- define "hotset.workerCallerTokenVolume" -}}
- name: worker-caller-token
  projected:
    sources:
      - serviceAccountToken: {audience: hotset-worker, expirationSeconds: 600, path: worker-caller}
{{- end -}}
{{- define "hotset.workerCallerTokenMount" -}}
- {name: worker-caller-token, mountPath: /var/run/secrets/hotset, readOnly: true}
{{- end -}}

{{/* The worker pods' network rules (docs/security.md, "Network"), rendered once: security.yaml's
     NetworkPolicy holds them for the release namespace, and the operator (as JSON,
     HOTSET_OPERATOR_WORKER_NETWORK_RULES) writes them beside every worker Deployment it runs. Their
     own peers name the release namespace, so they mean the same in any namespace. */}}
{{- define "hotset.workerNetworkRules" -}}
{{- $home := .Release.Namespace -}}
ingress:
  - from:
      {{- range $component := list "router" "operator" }}
      - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: {{ $home }}}}
        podSelector: {matchLabels: {app.kubernetes.io/part-of: hotset, app.kubernetes.io/component: {{ $component }}}}
      {{- end }}
    ports:
      - {port: {{ .Values.workers.port }}, protocol: TCP}
      {{- if .Values.workers.grpcPort }}
      - {port: {{ .Values.workers.grpcPort }}, protocol: TCP}
      {{- end }}
  {{- if and .Values.inferencePool.endpointPicker .Values.inferencePool.gatewayFrom }}
  # An Inference Extension gateway and its endpoint picker: the gateway port of dedicated vllm
  # groups' pods (the OpenAI routes and /metrics, no caller check; no other pod listens there).
  - from: {{- toYaml .Values.inferencePool.gatewayFrom | nindent 6 }}
    ports:
      - {port: {{ .Values.inferencePool.gatewayPort }}, protocol: TCP}
  {{- end }}
  {{- with .Values.networkPolicy.metricsFrom }}
  - from: {{- toYaml . | nindent 6 }}
    ports:
      - {port: {{ $.Values.workers.port }}, protocol: TCP}
      - {port: 8002, protocol: TCP}
  {{- end }}
{{- with .Values.networkPolicy.workerEgress }}
{{- if .enabled }}
egress:
  - to: {{- toYaml .dns | nindent 6 }}
    ports:
      - {port: 53, protocol: UDP}
      - {port: 53, protocol: TCP}
  # The catalog feed every worker pod follows (the operator's Service, port catalog).
  - to:
      - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: {{ $home }}}}
        podSelector: {matchLabels: {app.kubernetes.io/part-of: hotset, app.kubernetes.io/component: operator}}
    ports:
      - {port: {{ $.Values.operator.catalogPort }}, protocol: TCP}
  {{- with .modelStores }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A per-model alert expression with the model's owner and on-call contact as labels (from the
     operator's hotset_model_info), so the alert says whom to call; a model without that series
     (the operator not scraped) still alerts, without them. */}}
{{- define "hotset.withContacts" -}}
({{ . }}) * on (model) group_left (owner, oncall) max by (model, owner, oncall) (hotset_model_info) or (({{ . }}) unless on (model) hotset_model_info)
{{- end -}}

{{/* The router's AuthenticationConfiguration (Kubernetes' own format) from router.auth.jwt. */}}
{{- define "hotset.routerAuthConfig" -}}
apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt: {{- toYaml .Values.router.auth.jwt | nindent 2 }}
{{- end }}

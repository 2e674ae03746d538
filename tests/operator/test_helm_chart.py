"""The Helm chart lints, renders objects the real API server accepts, and grants the
operator exactly what it needs: it works under its own ServiceAccount and can do nothing more."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hotset_common import worker_identity as identity
from hotset_common.budget import BudgetMode
from hotset_common.worker_identity import WorkerIdentity
from hotset_common.model_series import DEFAULT_MAX_MODEL_SERIES, DEFAULT_SERIES_IDLE_S
from hotset_operator import workloads
from hotset_operator.config import ENV_PREFIX, OperatorConfig
from hotset_router import main as router_main
from hotset_worker import main as worker_main
from hotset_testing import chart
from hotset_testing.chart import CHART
from hotset_testing.kube_cluster import KubeCluster
from hotset_testing.operator_harness import (Cluster, catalog_models, operator_config, running_operator, served_model,
                                              service_account_kubeconfig, wait_for)


def _render(cluster: Cluster, *extra: str) -> str:
    return chart.template(cluster.kube, "--include-crds", *extra, namespace=cluster.namespace)


def test_helm_lint_passes(kube_cluster: KubeCluster) -> None:
    result = chart.helm(kube_cluster, "lint", str(CHART), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr


SCHEDULING = ('{"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "dedicated", "operator": "Equal", '
              '"value": "ops", "effect": "NoSchedule"}], "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnored'
              'DuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", '
              '"values": ["a"]}]}}]}}, "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": '
              '"topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}], "priorityClassName": "p"}')


@pytest.mark.parametrize("gpu_mode", ["devicePlugin", "dra"])
def test_rendered_chart_passes_server_side_dry_run(cluster: Cluster, gpu_mode: str) -> None:
    manifest = _render(cluster, "--set", "workers.modelClaims={models,extra}", "--set", "router.adminToken.existingSecret=tok",
                       "--set", "router.extraEnv[0].name=EXTRA,router.extraEnv[0].value=1", "--set", f"workers.gpu.mode={gpu_mode}",
                       "--set-json", f"operator.scheduling={SCHEDULING}", "--set-json", f"router.scheduling={SCHEDULING}")
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert result.returncode == 0, result.stderr
    created = result.stdout
    for name in ("deployment.apps/hotset-operator", "deployment.apps/hotset-router",
                 "service/hotset-router", "service/hotset-operator", "role.rbac.authorization.k8s.io/hotset-operator",
                 "serviceaccount/hotset-worker", "customresourcedefinition.apiextensions.k8s.io/servedmodels.hotset.io"):
        assert name in created, created
    assert ("resourceclaimtemplate.resource.k8s.io/hotset-worker-gpu" in created) is (gpu_mode == "dra"), created
    for deployment in (d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == "p" and pod["nodeSelector"] == {"pool": "system"}, deployment["metadata"]["name"]
        assert pod["tolerations"][0]["key"] == "dedicated" and pod["topologySpreadConstraints"] and pod["affinity"]


def _can(cluster: Cluster, account: str, *args: str, namespace: str | None = None) -> bool:
    """Whether the chart's `account` (of the release namespace) may do `args` in `namespace` (the
    release's by default; "*": across the cluster). An ``-n`` in `args` wins: it comes last."""
    who = f"system:serviceaccount:{cluster.namespace}:{account}"
    where = ["-A"] if namespace == "*" else ["-n", namespace or cluster.namespace]
    answer = cluster.kube.kubectl("auth", "can-i", *where, *args, "--as", who, check=False).stdout.strip()
    return answer == "yes"


@pytest.fixture
def installed(cluster: Cluster) -> Cluster:
    manifest = _render(cluster)
    cluster.kubectl("apply", "-f", "-", input=manifest)
    return cluster


OPERATOR_NEEDS = [
    ("watch", "servedmodels.hotset.io"), ("patch", "servedmodels.hotset.io"),
    ("patch", "servedmodels.hotset.io", "--subresource=status"), ("create", "deployments.apps"),
    ("patch", "deployments.apps"), ("delete", "deployments.apps"), ("watch", "deployments.apps"), ("list", "pods"),
    ("watch", "pods"), ("create", "events"),
    ("watch", "workerpools.hotset.io"), ("create", "workerpools.hotset.io"),
    ("patch", "workerpools.hotset.io", "--subresource=scale"),
    ("patch", "workerpools.hotset.io", "--subresource=status"), ("watch", "modelquotas.hotset.io"),
    ("patch", "modelquotas.hotset.io", "--subresource=status"), ("patch", "pods"),
    # Source credentials: the Secrets ServedModels name, read one by one, and the pool's copy of them.
    ("get", "secrets"), ("create", "secrets"), ("patch", "secrets/hotset-source-credentials"),
    ("get", "namespaces"),
    ("create", "subjectaccessreviews.authorization.k8s.io"),  # checking an approval (test_approvals.py)
    # each worker Deployment's NetworkPolicy (test_worker_network_policy.py)
    ("create", "networkpolicies.networking.k8s.io"), ("patch", "networkpolicies.networking.k8s.io"),
    # which ReplicaSet owns a labelled pod (only pods of its own Deployments are workers)
    ("list", "replicasets.apps"), ("watch", "replicasets.apps"),
    # worker identity: pods' tokens reviewed, the workers' account made elsewhere, the cluster's keys copied
    ("create", "tokenreviews.authentication.k8s.io"), ("create", "serviceaccounts"), ("create", "configmaps"),
    ("patch", "configmaps/hotset-issuer-keys"), ("get", "/openid/v1/jwks"), ("get", "/.well-known/openid-configuration"),
]
OPERATOR_MUST_NOT = [
    ("list", "secrets"), ("watch", "secrets"), ("delete", "secrets"),
    ("create", "pods"), ("delete", "pods"),
    ("delete", "servedmodels.hotset.io"), ("patch", "configmaps/kube-root-ca.crt"), ("delete", "configmaps"),
    # the chart's accounts are not the operator's to change, nor to mint tokens of
    ("patch", "serviceaccounts/hotset-worker"), ("patch", "serviceaccounts/hotset-router"),
    ("create", "serviceaccounts/hotset-router", "--subresource=token"),
    ("create", "serviceaccounts/hotset-worker", "--subresource=token"), ("delete", "serviceaccounts"),
    ("create", "roles.rbac.authorization.k8s.io"), ("list", "nodes"), ("delete", "namespaces"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "deployments.apps", "-n", "default"), ("patch", "modelquotas.hotset.io"),
    ("delete", "workerpools.hotset.io"),
    ("update", "servedmodels.hotset.io", "--subresource=approval"),  # approving is people's job
    ("delete", "networkpolicies.networking.k8s.io"),  # they go with their owners
]


def test_operator_account_may_do_its_job_and_nothing_else(installed: Cluster) -> None:
    missing = [args for args in OPERATOR_NEEDS if not _can(installed, "hotset-operator", *args)]
    excess = [args for args in OPERATOR_MUST_NOT if _can(installed, "hotset-operator", *args)]
    assert (missing, excess) == ([], [])


def test_router_and_worker_accounts_are_read_only_or_nothing(installed: Cluster) -> None:
    assert _can(installed, "hotset-router", "watch", "pods")
    # who owns a labelled pod: only pods of the operator's Deployments get traffic (read only)
    assert _can(installed, "hotset-router", "watch", "replicasets.apps")
    assert _can(installed, "hotset-router", "list", "deployments.apps")
    assert not _can(installed, "hotset-router", "patch", "deployments.apps")
    assert _can(installed, "hotset-router", "list", "servedmodels.hotset.io")
    assert _can(installed, "hotset-router", "watch", "modelquotas.hotset.io")  # each namespace's request rate
    assert not _can(installed, "hotset-router", "patch", "modelquotas.hotset.io")
    # its one write: the annotation that asks the operator for a pod of a model a request waits for
    assert _can(installed, "hotset-router", "patch", "servedmodels.hotset.io")
    assert not _can(installed, "hotset-router", "patch", "servedmodels.hotset.io", "--subresource=status")
    assert not _can(installed, "hotset-router", "delete", "servedmodels.hotset.io")
    assert not _can(installed, "hotset-router", "update", "servedmodels.hotset.io", "--subresource=approval")
    assert not _can(installed, "hotset-router", "patch", "pods")
    assert not _can(installed, "hotset-router", "get", "secrets")
    # callers are checked by the cluster (the chart's default): it asks, and reads nothing more
    assert _can(installed, "hotset-router", "create", "tokenreviews.authentication.k8s.io")
    assert _can(installed, "hotset-router", "create", "subjectaccessreviews.authorization.k8s.io")
    assert not _can(installed, "hotset-router", "create", "servedmodels.hotset.io", "--subresource=predict")
    assert not _can(installed, "hotset-router", "create", "serviceaccounts", "--subresource=token")
    # workers verify their callers' tokens offline: no API access at all, not even a TokenReview
    assert not _can(installed, "hotset-worker", "list", "pods")
    assert not _can(installed, "hotset-worker", "create", "tokenreviews.authentication.k8s.io")
    assert not _can(installed, "hotset-worker", "get", "configmaps")


def test_operator_works_under_its_own_service_account(installed: Cluster, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = service_account_kubeconfig(installed.kube, installed.namespace, "hotset-operator",
                                            tmp_path / "operator.kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    rendered = chart.document(chart.render(installed.kube, namespace=installed.namespace), "Deployment", "hotset-operator")
    rules = OperatorConfig.from_env(chart.env_values(rendered), namespace="ml").worker_network_rules
    config = operator_config(installed.namespace, worker_service_account="hotset-worker", worker_network_rules=rules,
                             worker_identity="pod-token")
    with running_operator(config):
        installed.apply(served_model("rbac-check", placement="dedicated", replicas={"min": 1, "max": 1}))
        wait_for(lambda: (installed.condition("rbac-check", "Accepted") or {}).get("status") == "True", "Accepted")
        deployment = wait_for(lambda: installed.get("deployment", "rbac-check-dedicated"), "the dedicated Deployment")
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "hotset-worker"
        policy = wait_for(lambda: installed.get("networkpolicy", "rbac-check-dedicated"), "its NetworkPolicy")
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        # the cluster's keys, read from the discovery endpoints under its own account
        keys = wait_for(lambda: installed.get("configmap", "hotset-issuer-keys"), "the keys ConfigMap")
        assert json.loads(keys["data"]["jwks.json"])["keys"]
        # its catalog, to its own pod's catalog token (reviewed under the operator's account)
        pod = wait_for(lambda: installed.items("pods", "hotset.io/servedmodel=rbac-check"), "its pod")[0]["metadata"]["name"]
        token = installed.kubectl("create", "token", "hotset-worker", "--audience", "hotset-catalog",
                                  "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()
        wait_for(lambda: catalog_models(config, installed.namespace, "rbac-check", token=token) == ["rbac-check"],
                 "its catalog served")
        installed.kubectl("delete", "servedmodel", "rbac-check", "--timeout=30s")


def test_chart_settings_are_ones_the_operator_reads(kube_cluster: KubeCluster) -> None:
    documents = chart.render(kube_cluster, "--set", "workers.gpu.mode=devicePlugin",
                             "--set", "workers.gpu.count=2", "--set", "workers.gpu.tritonCount=1",
                             "--set", "workers.memoryBudget=40Gi", "--set", "workers.modelClaims={models,extra}",
                             "--set", "workers.budgetMode=hard", "--set", "workers.gpu.sharedMemory=4Gi")
    operator = chart.document(documents, "Deployment", "hotset-operator")
    names = [e["name"] for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert sorted({n for n in names if names.count(n) > 1}) == [], "each setting once"
    env = chart.env_values(operator)
    unknown = [k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() not in OperatorConfig.model_fields]
    assert unknown == []
    config = OperatorConfig.from_env(env, namespace="ml")
    assert (config.gpus_per_pod, config.pod_memory_budget, config.model_claims) == (2, 40 * 2**30, ("models", "extra"))
    assert (config.gpu_mode.value, config.triton_gpus) == ("devicePlugin", 1)
    assert not [d for d in documents if d["kind"] == "ResourceClaimTemplate"]
    assert config.worker_service_account == "hotset-worker"
    assert config.pod_budget_mode is BudgetMode.HARD
    assert config.gpu_shared_memory == 4 * 2**30
    assert config.worker_identity is WorkerIdentity.POD_TOKEN  # the chart's only way: no shared token


def _worker_settings_from_chart(kube: KubeCluster, *sets: str) -> worker_main.Settings:
    """What a worker pod of this install runs with: chart values -> the operator's env -> its
    config -> the worker container it writes -> the worker's own option parser."""
    documents = chart.render(kube, *[arg for value in sets for arg in ("--set", value)])
    config = OperatorConfig.from_env(chart.env_values(chart.document(documents, "Deployment", "hotset-operator")),
                                     namespace="ml")
    container = workloads.build_worker_container(config, [])
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return worker_main.parse_settings([], env)


def test_worker_metric_limits_reach_every_worker_pod(kube_cluster: KubeCluster) -> None:
    """At thousands of models a platform raises the workers' per-model series limit from the chart."""
    defaults = _worker_settings_from_chart(kube_cluster)
    assert (defaults.max_model_series, defaults.model_series_idle_s) == (DEFAULT_MAX_MODEL_SERIES, DEFAULT_SERIES_IDLE_S)
    raised = _worker_settings_from_chart(kube_cluster, "workers.metrics.maxModelSeries=2000",
                                         "workers.metrics.modelSeriesIdleSeconds=60")
    assert (raised.max_model_series, raised.model_series_idle_s) == (2000, 60.0)


def _router_env(kube: KubeCluster, *sets: str) -> list[dict]:
    router = chart.document(chart.render(kube, *[arg for value in sets for arg in ("--set", value)]),
                            "Deployment", "hotset-router")
    return router["spec"]["template"]["spec"]["containers"][0]["env"]


def test_router_values_land_in_the_router_env_and_the_router_reads_them(kube_cluster: KubeCluster,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    env = _router_env(kube_cluster, "router.churnGuardSeconds=0", "router.replication.rpsPerCopy=2.5",
                      "router.replication.idleCopySeconds=3600", "router.syncIntervalSeconds=0.5",
                      "router.maxBodyBytes=8Mi", "router.logLevel=debug",
                      "router.adminToken.existingSecret=admin,router.adminToken.key=secret-token")
    values = {e["name"]: e["value"] for e in env if "value" in e}
    read_by_router = set(re.findall(r'env\("([A-Z_]+)"', Path(router_main.__file__).read_text()))
    assert sorted(set(values) - read_by_router) == []
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    args = router_main.parse_args([])
    assert (args.churn_guard_seconds, args.replicate_rps_per_copy, args.idle_copy_seconds) == (0, 2.5, 3600)
    assert (args.sync_interval, args.max_body_bytes, args.log_level, args.cluster) == (0.5, "8Mi", "debug", True)
    # the chart's default: callers checked by the cluster, tokens made for hotset
    assert (args.auth, args.auth_audiences, args.auth_cache_seconds) == ("kubernetes", "hotset", 30)
    # worker pods prove which pod they are, and the router presents its own projected token to them
    assert args.worker_identity == "pod-token" and args.worker_token == ""
    token = next(e for e in env if e["name"] == "HOTSET_ADMIN_TOKEN")
    assert token["valueFrom"] == {"secretKeyRef": {"name": "admin", "key": "secret-token"}}


def test_oidc_issuers_reach_the_router_in_kubernetes_format_and_roll_it_when_they_change(
        kube_cluster: KubeCluster, tmp_path: Path) -> None:
    from hotset_router import jwt_issuers

    def rendered(audience: str) -> list[dict]:
        entry = {"issuer": {"url": "https://idp.example.test", "audiences": [audience]},
                 "claimMappings": {"username": {"claim": "email", "prefix": "idp:"}}}
        return chart.render(kube_cluster, "--set-json", f"router.auth.jwt=[{json.dumps(entry)}]")

    documents = rendered("hotset")
    router = chart.document(documents, "Deployment", "hotset-router")
    path = chart.env_values(router)["HOTSET_ROUTER_AUTH_CONFIG"]
    (mount,) = [m for m in router["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                if m["name"] == "auth-config"]
    assert path.startswith(mount["mountPath"] + "/")
    config = chart.document(documents, "ConfigMap", "hotset-router-auth")["data"][Path(path).name]
    (read,) = jwt_issuers.load_configuration(_written(tmp_path, config))  # what the router reads, it accepts
    assert read.issuer.audiences == ["hotset"] and read.claim_mappings.username.prefix == "idp:"
    rolled = chart.document(rendered("other"), "Deployment", "hotset-router")
    annotation = "hotset.io/auth-config"
    assert rolled["spec"]["template"]["metadata"]["annotations"][annotation] != \
        router["spec"]["template"]["metadata"]["annotations"][annotation]

    default = chart.render(kube_cluster)  # no issuers: no file, no variable
    assert "HOTSET_ROUTER_AUTH_CONFIG" not in chart.env_values(chart.document(default, "Deployment", "hotset-router"))
    assert not [d for d in default if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hotset-router-auth"]


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "authentication.yaml"
    path.write_text(text)
    return path


def test_router_has_no_admin_token_unless_a_secret_is_named(kube_cluster: KubeCluster) -> None:
    env = _router_env(kube_cluster, "router.extraEnv[0].name=HTTPS_PROXY,router.extraEnv[0].value=http://proxy:3128")
    assert "HOTSET_ADMIN_TOKEN" not in {e["name"] for e in env}
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in env


@pytest.mark.parametrize("values, words", [
    (["workers.gpusPerPod=1"], "workers.gpusPerPod is now workers.gpu.count"),
    (["workers.gpu.mode=gpus"], 'workers.gpu.mode must be dra, devicePlugin or none, not "gpus"'),
    (["workers.gpu.count=0"], "workers.gpu.count must be at least 1 with workers.gpu.mode devicePlugin"),
    (["workers.gpu.count=0", "workers.gpu.mode=dra"], "workers.gpu.count must be at least 1 with workers.gpu.mode dra"),
])
def test_gpu_values_that_would_give_pods_no_gpu_fail_the_render(kube_cluster: KubeCluster, values: list[str],
                                                                words: str) -> None:
    result = chart.helm(kube_cluster, "template", chart.RELEASE, str(CHART), *[a for v in values for a in ("--set", v)])
    assert result.returncode != 0 and words in result.stderr, result.stderr


def test_worker_pods_answer_only_the_router_and_the_operator(kube_cluster: KubeCluster) -> None:
    """A NetworkPolicy in front of the workers, no shared token (no Secret holds one: the router and
    the operator each present a ServiceAccount token of their own, projected for the workers'
    audience, where their variables say), and a disruption budget for the routers."""
    documents = chart.render(kube_cluster)
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    peers = [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in policy["spec"]["ingress"][0]["from"]]
    assert sorted(peers) == ["operator", "router"]
    assert not [d for d in documents if d["kind"] == "Secret"]
    files = {"hotset-router": "HOTSET_WORKER_TOKEN_FILE", "hotset-operator": "HOTSET_OPERATOR_WORKER_TOKEN_FILE"}
    for name, variable in files.items():
        pod = chart.document(documents, "Deployment", name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in container["env"]), name
        (volume,) = [v for v in pod["volumes"] if v["name"] == "worker-caller-token"]
        (source,) = volume["projected"]["sources"]
        token = source["serviceAccountToken"]
        assert (token["audience"], token["expirationSeconds"]) == (identity.CALLER_AUDIENCE, identity.TOKEN_SECONDS)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "worker-caller-token"]
        path = f"{mount['mountPath']}/{token['path']}"
        assert chart.env_values(chart.document(documents, "Deployment", name))[variable] == path == \
            f"{identity.TOKENS_DIR}/{identity.CALLER_TOKEN_FILE}"
        assert pod["serviceAccountName"] == name
    assert any(d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "hotset-router" for d in documents)
    # the router reviews workers' identity tokens whether or not it checks its callers
    for mode, rules in (("kubernetes", {"tokenreviews", "subjectaccessreviews"}), ("none", {"tokenreviews"})):
        reviews = chart.document(chart.render(kube_cluster, "--set", f"router.auth.mode={mode}"), "ClusterRole",
                                 "hotset-router-callers-default")
        assert {r for rule in reviews["rules"] for r in rule["resources"]} == rules, mode


def test_the_retired_shared_token_fails_the_render_naming_what_replaced_it(kube_cluster: KubeCluster) -> None:
    for value in ("security.workerToken.value=t", "security.workerToken.existingSecret=mine"):
        result = chart.helm(kube_cluster, "template", chart.RELEASE, str(CHART), "--set", value)
        assert result.returncode != 0 and "security.workerToken is retired" in result.stderr, result.stderr
        assert "ServiceAccount tokens of their own" in result.stderr


def test_grpc_ports_are_on_by_default_and_named_for_clients_and_meshes(kube_cluster: KubeCluster) -> None:
    """OIP v2 over gRPC: the router Service's `grpc` port (appProtocol grpc) to the router's container
    port, the worker pods' port through the operator, and the NetworkPolicy admitting it; 0 turns each off."""
    def documents(*sets: str) -> list[dict]:
        return chart.render(kube_cluster, *[a for s in sets for a in ("--set", s)])

    def router_parts(docs: list[dict]) -> tuple[dict, dict, dict]:
        service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "hotset-router")
        router = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "hotset-router")
        operator = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "hotset-operator")
        return service, router["spec"]["template"]["spec"]["containers"][0], \
            operator["spec"]["template"]["spec"]["containers"][0]

    docs = documents()
    service, router, operator = router_parts(docs)
    assert {"name": "grpc", "port": 8081, "targetPort": "grpc", "appProtocol": "grpc"} in service["spec"]["ports"]
    assert {"name": "grpc", "containerPort": 8081} in router["ports"]
    router_env = {e["name"]: e.get("value") for e in router["env"]}
    assert router_env["HOTSET_ROUTER_GRPC_PORT"] == "8081"
    operator_env = {e["name"]: e["value"] for e in operator["env"] if "value" in e}
    assert OperatorConfig.from_env(operator_env, namespace="ml").worker_grpc_port == 8081
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert {"port": 8081, "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]
    service, router, operator = router_parts(documents("router.service.grpcPort=0", "workers.grpcPort=0"))
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
    assert "HOTSET_ROUTER_GRPC_PORT" not in {e["name"] for e in router["env"]}
    operator_env = {e["name"]: e["value"] for e in operator["env"] if "value" in e}
    assert OperatorConfig.from_env(operator_env, namespace="ml").worker_grpc_port == 0


def test_operator_may_keep_its_worker_accounts_but_not_the_charts_own(kube_cluster: KubeCluster) -> None:
    """Worker pods outside the release namespace run as a copy of the workers' ServiceAccount the
    operator makes there (test_namespaces_and_quotas.py); the chart's own account stays out of its
    reach, except where RBAC cannot leave one namespace out (watchNamespaces ["*"])."""
    def account_rules(*values: str) -> dict[str, bool]:
        roles = [d for d in chart.render(kube_cluster, *values, namespace="hotset")
                 if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"].startswith("hotset-operator")]
        return {d["metadata"].get("namespace", "*"): any(r.get("resourceNames") == ["hotset-worker"]
                                                         and r["verbs"] == ["patch"] for r in d["rules"])
                for d in roles if any("serviceaccounts" in r.get("resources", []) for r in d["rules"])}

    assert account_rules() == {"hotset": False}
    assert account_rules("--set", "watchNamespaces={team-a,team-b}") == {"hotset": False, "team-a": True, "team-b": True}
    assert account_rules("--set", "watchNamespaces={*}") == {"*": True}

"""What a worker pod gets for remote sources: one source cache both containers mount (Triton reads
cached models in place), the pool's source settings, the credentials Secret, and an image volume
per oci:// source (in both containers, at the path the worker reads)."""
from __future__ import annotations

from hotset_common import sources as locations
from hotset_common.spec import ModelSpec
from hotset_operator import credentials, workloads
from hotset_operator.config import OperatorConfig


def _containers(template: dict) -> dict[str, dict]:
    return {c["name"]: c for c in template["spec"]["containers"]}


def _volumes(template: dict) -> dict[str, dict]:
    return {v["name"]: v for v in template["spec"]["volumes"]}


def test_the_source_cache_is_shared_by_the_worker_and_triton() -> None:
    config = OperatorConfig(source_cache_bytes="8Gi", s3_endpoint="http://minio.storage:9000", hf_endpoint="https://hub.internal")
    template = workloads.build_worker_pod_template(config, None, [])
    worker, triton = _containers(template)["hotset-worker"], _containers(template)["triton"]
    assert {"name": "source-cache", "mountPath": workloads.SOURCE_CACHE} in worker["volumeMounts"]
    assert {"name": "source-cache", "mountPath": workloads.SOURCE_CACHE, "readOnly": True} in triton["volumeMounts"]
    assert _volumes(template)["source-cache"] == {"name": "source-cache", "emptyDir": {"sizeLimit": str(10 * 2**30)}}
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["HOTSET_SOURCE_CACHE"] == workloads.SOURCE_CACHE and env["HOTSET_SOURCE_CACHE_BYTES"] == str(8 * 2**30)
    assert env["HOTSET_S3_ENDPOINT"] == "http://minio.storage:9000" and env["HF_ENDPOINT"] == "https://hub.internal"
    assert env["HOTSET_SOURCE_CREDENTIALS"] == workloads.SOURCE_CREDENTIALS
    secret = _volumes(template)["source-credentials"]["secret"]
    assert secret["secretName"] == "hotset-source-credentials" and secret["optional"] is True


def test_a_node_cache_is_a_host_path() -> None:
    template = workloads.build_worker_pod_template(OperatorConfig(source_cache_host_path="/var/lib/hotset/sources"), None, [])
    assert _volumes(template)["source-cache"]["hostPath"] == {"path": "/var/lib/hotset/sources", "type": "DirectoryOrCreate"}


def test_oci_sources_become_image_volumes_in_both_containers() -> None:
    specs = [ModelSpec(id="iris", framework="triton", source="oci://registry.local:5000/models/iris:1"),
             ModelSpec(id="iris-copy", framework="triton", source="oci://registry.local:5000/models/iris:1"),
             ModelSpec(id="other", framework="triton", source="s3://models/other")]
    images = workloads.oci_images(specs)
    assert [image.reference for image in images] == ["registry.local:5000/models/iris:1"]  # once
    deployment = workloads.build_pool_deployment(OperatorConfig(), 1, images=images)
    template = deployment["spec"]["template"]
    name = locations.oci_mount_name(images[0])
    assert _volumes(template)[name]["image"] == {"reference": "registry.local:5000/models/iris:1",
                                                 "pullPolicy": "IfNotPresent"}
    for container in _containers(template).values():
        assert {"name": name, "mountPath": f"{workloads.OCI_ROOT}/{name}", "readOnly": True} in container["volumeMounts"]
    dedicated = ModelSpec(id="iris", framework="triton", source="oci://registry.local:5000/models/iris:1",
                          placement="dedicated")
    body = {"metadata": {"name": "iris", "namespace": "ml", "uid": "u"}}
    assert name in _volumes(workloads.build_dedicated_deployment(dedicated, body, OperatorConfig())["spec"]["template"])


def test_without_image_volumes_the_workers_are_told_to_pull_and_which_registries_speak_http() -> None:
    images = [locations.OciImage("registry.local:5000", "models/iris", tag="1")]
    config = OperatorConfig(image_volumes=False, source_endpoints="http://registry.local:5000,*.example.com")
    template = workloads.build_pool_deployment(config, 1, images=images)["spec"]["template"]
    assert locations.oci_mount_name(images[0]) not in _volumes(template)  # the worker pulls it into its cache
    env = {e["name"]: e.get("value") for e in _containers(template)["hotset-worker"]["env"]}
    assert env["HOTSET_OCI_IMAGE_VOLUMES"] == "off"
    assert env["HOTSET_OCI_PLAIN_HTTP"] == "registry.local:5000"


class _Reader:
    """The API server's answers as a test needs them (the real one is tested in test_source_credentials_on_a_cluster)."""

    def __init__(self, secrets: dict[tuple[str, str], dict[str, str]], annotations: dict[str, dict[str, str]]) -> None:
        self.secrets, self.annotations, self.reads = secrets, annotations, 0

    def secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        self.reads += 1
        return self.secrets.get((namespace, name))

    def namespace_annotations(self, namespace: str) -> dict[str, str]:
        return self.annotations.get(namespace, {})


def test_credentials_are_gathered_per_namespace_with_only_the_keys_sources_read() -> None:
    reader = _Reader({("team-a", "s3-keys"): {"AWS_ACCESS_KEY_ID": "YQ==", "AWS_SECRET_ACCESS_KEY": "Yg==", "other": "eA=="},
                      ("team-b", "default-keys"): {"HF_TOKEN": "dA=="}},
                     {"team-b": {locations.NAMESPACE_SECRET_ANNOTATION: "default-keys"}})
    specs = [ModelSpec.from_served_model({"metadata": {"name": "a", "namespace": "team-a"}, "spec": {
                 "framework": "triton", "source": {"uri": "s3://models/a", "secretName": "s3-keys"}}}),
             ModelSpec.from_served_model({"metadata": {"name": "b", "namespace": "team-b"}, "spec": {
                 "framework": "transformers", "source": {"uri": "hf://org/b"}}}),
             ModelSpec.from_served_model({"metadata": {"name": "c", "namespace": "team-c"}, "spec": {
                 "framework": "triton", "source": {"uri": "pvc://models/c"}}})]
    gatherer = credentials.CredentialGatherer(reader)
    data = gatherer.data(specs)
    assert data == {"team-a.s3-keys.AWS_ACCESS_KEY_ID": "YQ==", "team-a.s3-keys.AWS_SECRET_ACCESS_KEY": "Yg==",
                    "team-b._namespace.HF_TOKEN": "dA=="}
    reads = reader.reads
    gatherer.data(specs)
    assert reader.reads == reads  # within the TTL: no new reads
    secret = credentials.build_credentials_secret(OperatorConfig(), "hotset", data)
    assert secret["metadata"]["name"] == "hotset-source-credentials" and secret["data"] == data


def test_a_model_cannot_name_another_namespaces_secret() -> None:
    spec = ModelSpec.from_served_model({"metadata": {"name": "a", "namespace": "team-a"}, "spec": {
        "framework": "triton", "source": {"uri": "s3://models/a", "secretName": "keys", "namespace": "team-b"}}})
    assert spec.source_options.namespace == "team-a"  # its own, whatever the body says
    assert credentials.referenced([spec]) == [("team-a", "keys")]

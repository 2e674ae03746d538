"""What a pool's pods need from its models, kept as models are published (pool_contents.py): the
Triton sidecar decision moves with the first Triton model in and the last out, image volumes with
the oci:// set, and the credentials are gathered again only when a model naming them changes."""
from __future__ import annotations

from hotset_common.spec import ModelSpec
from hotset_operator import workloads
from hotset_operator.config import OperatorConfig
from hotset_operator.pool_contents import PoolContents


def _spec(name: str, framework: str = "transformers", source: str | None = None, **fields) -> ModelSpec:
    return ModelSpec(id=name, framework=framework, source=source or f"pvc://models/{name}", memory="1Gi", **fields)


def _sidecar(contents: PoolContents, namespace: str = "ml") -> bool:
    manifest = workloads.build_pool_deployment(OperatorConfig(namespace=namespace), 1, namespace=namespace,
                                               serves_triton_models=contents.serves_triton(namespace),
                                               images=contents.images(namespace))
    return workloads.TRITON_CONTAINER in [c["name"] for c in manifest["spec"]["template"]["spec"]["containers"]]


def test_the_sidecar_comes_with_the_first_triton_model_and_goes_with_the_last() -> None:
    contents = PoolContents()
    contents.put("ml", "a", _spec("a"), shared=True)
    assert not _sidecar(contents)
    contents.put("ml", "b", _spec("b", "triton"), shared=True)
    contents.put("ml", "c", _spec("c", "triton"), shared=True)
    assert _sidecar(contents)
    contents.remove("ml", "b")
    assert _sidecar(contents)
    contents.put("ml", "c", _spec("c"), shared=True)  # an edit to another framework is the last one leaving
    assert not _sidecar(contents)
    contents.put("ml", "d", _spec("d", "triton"), shared=False)  # a dedicated model has its own pods
    assert not _sidecar(contents) and not contents.serves_triton("other")


def test_image_volumes_follow_the_pools_oci_sources() -> None:
    contents = PoolContents()
    contents.put("ml", "a", _spec("a", source="oci://registry.example/models/a:1"), shared=True)
    contents.put("ml", "d", _spec("d", source="oci://registry.example/models/d:1"), shared=False)
    assert [image.reference for image in contents.images("ml")] == ["registry.example/models/a:1"]
    contents.put("ml", "a", _spec("a"), shared=True)
    assert contents.images("ml") == []


def test_credentials_are_gathered_again_only_when_a_model_naming_them_changes() -> None:
    contents = PoolContents()
    contents.put("ml", "plain", _spec("plain"), shared=True)
    assert contents.version("ml") == 0 and contents.credential_specs("ml") == []
    remote = _spec("remote", source="s3://bucket/remote", source_options={"secret_name": "keys", "namespace": "team"})
    contents.put("ml", "remote", remote, shared=True)
    after = contents.version("ml")
    assert after > 0 and [s.id for s in contents.credential_specs("ml")] == ["remote"]
    contents.put("ml", "other", _spec("other"), shared=True)
    contents.put("ml", "remote", remote, shared=True)  # the same spec again
    assert contents.version("ml") == after
    contents.remove("ml", "remote")
    assert contents.version("ml") > after and contents.credential_specs("ml") == []

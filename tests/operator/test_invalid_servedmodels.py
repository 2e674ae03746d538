"""Invalid ServedModels are refused by the API server, or marked Accepted=False by
the operator, with a message that names the field; valid neighbours are unaffected."""
from __future__ import annotations

from pathlib import Path

import pytest

from hotset_testing.operator_harness import Cluster, catalog_models, served_model, wait_for


def _without(field: str) -> dict:
    body = served_model(f"no-{field}")
    del body["spec"][field]
    return body


@pytest.mark.parametrize("manifest, field, words", [
    (_without("framework"), "spec.framework", "Required value"),
    (_without("memory"), "spec.memory", "Required value"),  # it counted as 0 bytes everywhere
    (served_model("zero-memory", memory=0), "spec.memory", "more than 0 bytes"),
    (served_model("unknown-framework", framework="onnx"), "spec.framework", 'Unsupported value: "onnx"'),
    (served_model("min-over-max", replicas={"min": 3, "max": 1}), "spec.replicas",
     "spec.replicas.min must not exceed spec.replicas.max"),
    (served_model("traversal", source={"uri": "pvc://models/../secrets"}), "spec.source.uri", "'..'"),
    (served_model("bad-scheme", source={"uri": "ftp://example.com/m"}), "spec.source.uri", "should match"),
    (served_model("no-checksum", source={"uri": "https://example.com/m.tar.gz"}), "spec.source",
     "spec.source.sha256 is required for an https:// archive"),
    (served_model("bad-digest", source={"uri": "https://example.com/m.tar.gz", "sha256": "abc"}), "spec.source.sha256",
     "should match"),
    (served_model("bad-memory", memory="lots"), "spec.memory", "should match"),
    (served_model("bad-class", latencyClass="urgent"), "spec.latencyClass", 'Unsupported value: "urgent"'),
    (served_model("too-high", priority=5000), "spec.priority", "less than or equal to 1000"),
])
def test_api_server_refuses_what_the_schema_forbids(cluster: Cluster, manifest: dict, field: str, words: str) -> None:
    result = cluster.apply(manifest, check=False)
    assert result.returncode != 0
    assert field in result.stderr and words in result.stderr, result.stderr
    assert cluster.get("servedmodel", manifest["metadata"]["name"]) is None


def test_operator_marks_what_only_it_can_judge(cluster: Cluster, operator) -> None:
    config, _ = operator
    cluster.apply(served_model("too-big", memory="64Gi"))
    cluster.apply(served_model("too-many", replicas={"min": 5, "max": 5}))
    cluster.apply(served_model("fine", memory="1Gi"))

    too_big = wait_for(lambda: (c := cluster.condition("too-big", "Accepted")) and c, "Accepted on too-big")
    assert (too_big["status"], too_big["reason"]) == ("False", "InvalidSpec")
    assert "spec.memory" in too_big["message"] and "4.0Gi" in too_big["message"]
    too_many = wait_for(lambda: (c := cluster.condition("too-many", "Accepted")) and c, "Accepted on too-many")
    assert too_many["status"] == "False" and "spec.replicas.min" in too_many["message"]
    assert "the shared pool may grow to 4" in too_many["message"]
    wait_for(lambda: "InvalidSpec" in {e["reason"] for e in cluster.events("too-big")}, "a warning event")

    fine = wait_for(lambda: (c := cluster.condition("fine", "Accepted")) and c, "Accepted on fine")
    assert fine["status"] == "True"

    # Fixing the spec is enough: the operator accepts it on the update.
    cluster.kubectl("patch", "servedmodel", "too-big", "--type=merge", "-p", '{"spec": {"memory": "2Gi"}}')
    wait_for(lambda: (cluster.condition("too-big", "Accepted") or {}).get("status") == "True", "Accepted after the fix")
    # Only accepted models reach the catalog the pool's workers follow.
    wait_for(lambda: catalog_models(config, cluster.namespace) == ["fine", "too-big"], "too-big in the pool's catalog")


def test_a_model_without_memory_from_an_older_crd_is_refused_naming_the_field() -> None:
    """Objects created before the CRD required spec.memory (helm never upgrades CRDs) are
    refused by the operator, not counted as 0 bytes."""
    from hotset_operator import validation
    from hotset_testing.operator_harness import operator_config

    body = served_model("unsized")
    del body["spec"]["memory"]
    verdict = validation.validate(body, operator_config("default"))
    assert not verdict.accepted and verdict.message().startswith("spec.memory: required")


def test_the_samples_are_valid(cluster: Cluster) -> None:
    samples = Path(__file__).resolve().parents[2] / "crds" / "samples"
    for sample in sorted(samples.glob("*.yaml")):
        result = cluster.kubectl("apply", "--dry-run=server", "-f", str(sample), check=False)
        assert result.returncode == 0, f"{sample.name}: {result.stderr}"

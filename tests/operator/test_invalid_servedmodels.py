"""Invalid ServedModels are refused by the API server, or marked Accepted=False by
the operator, with a message that names the field; valid neighbours are unaffected."""
from __future__ import annotations

from pathlib import Path

import pytest

from modelplane_testing.operator_harness import Cluster, served_model, wait_for


def _without_framework() -> dict:
    body = served_model("no-framework")
    del body["spec"]["framework"]
    return body


@pytest.mark.parametrize("manifest, field, words", [
    (_without_framework(), "spec.framework", "Required value"),
    (served_model("unknown-framework", framework="onnx"), "spec.framework", 'Unsupported value: "onnx"'),
    (served_model("min-over-max", replicas={"min": 3, "max": 1}), "spec.replicas",
     "spec.replicas.min must not exceed spec.replicas.max"),
    (served_model("traversal", source={"uri": "pvc://models/../secrets"}), "spec.source.uri", "'..'"),
    (served_model("bad-scheme", source={"uri": "http://example.com/m"}), "spec.source.uri", "should match"),
    (served_model("bad-memory", memory="lots"), "spec.memory", "should match"),
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
    # Only accepted models reach the workers' model store.
    store = wait_for(lambda: '"too-big"' in (data := ((cluster.get("configmap", config.model_store_configmap) or {})
                                                    .get("data") or {}).get("models.json", "")) and data, "too-big in the store")
    assert '"too-big"' in store and '"fine"' in store and '"too-many"' not in store


def test_the_samples_are_valid(cluster: Cluster) -> None:
    samples = Path(__file__).resolve().parents[2] / "crds" / "samples"
    for sample in sorted(samples.glob("*.yaml")):
        result = cluster.kubectl("apply", "--dry-run=server", "-f", str(sample), check=False)
        assert result.returncode == 0, f"{sample.name}: {result.stderr}"

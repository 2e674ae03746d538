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


def _vllm(name: str, engine_args: dict) -> dict:
    return served_model(name, framework="vllm", task="text-generation", memory="2Gi", engineArgs=engine_args)


def test_engine_arguments_the_pinned_vllm_or_hotset_refuses_are_refused_at_admission_by_name(
        cluster: Cluster, operator) -> None:
    """The CRD keeps engineArgs' unknown fields, so the API server takes any key; the operator checks
    each against the pinned vLLM's own flags (hotset_common.vllm_flags, generated from its parser)
    and the project's list, and refuses the model naming the key, before any pod starts an engine."""
    cluster.apply(_vllm("swap", {"swap_space": 4, "max_model_len": 2048}))  # vLLM 0.32 dropped --swap-space
    cluster.apply(_vllm("remote-code", {"trust_remote_code": True}))  # vLLM has it; hotset does not pass it
    cluster.apply(_vllm("typo", {"max_model_length": 2048}))
    cluster.apply(_vllm("bad-dtype", {"dtype": "float33"}))
    cluster.apply(_vllm("own-port", {"port": 9000}))
    cluster.apply(_vllm("good", {"max_model_len": "8k", "enable_prefix_caching": False, "dtype": "float32"}))

    def refusal(name: str) -> str:
        condition = wait_for(lambda: (c := cluster.condition(name, "Accepted")) and c, f"Accepted on {name}")
        assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec"), condition
        return condition["message"]

    swap = refusal("swap")
    assert "spec.engineArgs.swap_space" in swap and "vLLM 0.32.0 has no --swap-space" in swap, swap
    assert "max_model_len" not in swap  # only what is wrong is named
    remote = refusal("remote-code")
    assert "spec.engineArgs.trust_remote_code" in remote and "hotset does not pass" in remote, remote
    typo = refusal("typo")
    assert "--max-model-length" in typo and "did you mean max_model_len?" in typo, typo
    dtype = refusal("bad-dtype")
    assert "spec.engineArgs.dtype" in dtype and "float32" in dtype and "'float33'" in dtype, dtype
    assert "set by the worker" in refusal("own-port")
    good = wait_for(lambda: (c := cluster.condition("good", "Accepted")) and c, "Accepted on good")
    assert good["status"] == "True", good
    wait_for(lambda: "InvalidSpec" in {e["reason"] for e in cluster.events("swap")}, "a warning event on swap")

    # Fixing the spec is enough.
    cluster.kubectl("patch", "servedmodel", "swap", "--type=json",
                    "-p", '[{"op": "remove", "path": "/spec/engineArgs/swap_space"}]')
    wait_for(lambda: (cluster.condition("swap", "Accepted") or {}).get("status") == "True", "Accepted after the fix")

"""The pool's source policy, refused at admission by the operator (Accepted=False naming the field):
endpoints outside the allowlist, plain http unless spelled out, registries the workers pull oci:// from, an
archive without its sha256."""
from __future__ import annotations

import pytest

from hotset_operator import validation
from hotset_operator.config import OperatorConfig


def _body(uri: str, **source: object) -> dict:
    return {"metadata": {"name": "m", "namespace": "team-a", "uid": "1"},
            "spec": {"framework": "triton", "memory": "100Mi", "source": {"uri": uri, **source}}}


def _problems(body: dict, **config: object) -> list[str]:
    return [str(p) for p in validation.validate(body, OperatorConfig(**config)).problems]


@pytest.mark.parametrize("uri, source", [
    ("s3://models/iris", {}),                                      # AWS over https: allowed by an empty list
    ("s3://models/iris", {"endpoint": "https://minio.example.com"}),
    ("gs://models/iris", {}),
    ("hf://org/iris@v1", {}),
    ("oci://registry.example.com/models/iris:1", {}),
    ("https://files.example.com/iris.tar.gz", {"sha256": "a" * 64}),
    ("pvc://models/iris", {}),
])
def test_sources_within_the_default_policy_are_accepted(uri, source) -> None:
    assert _problems(_body(uri, **source)) == []


def test_plain_http_is_refused_unless_the_policy_spells_it_out() -> None:
    body = _body("s3://models/iris", endpoint="http://minio.storage.svc:9000")
    (problem,) = _problems(body)
    assert problem.startswith("spec.source.endpoint: http://minio.storage.svc:9000 is not allowed: plain http")
    assert _problems(body, source_endpoints="http://minio.storage.svc:9000") == []
    assert _problems(body, source_endpoints="minio.storage.svc:9000") != []  # a bare host means https only
    archive = _body("http://files.example.com/iris.tar.gz", sha256="b" * 64)
    assert "plain http" in _problems(archive)[0]


def test_an_allowlist_refuses_every_other_endpoint_but_the_pools_own() -> None:
    policy = {"source_endpoints": "*.storage.example.com,hub-mirror.example.com"}
    assert _problems(_body("s3://models/iris", endpoint="https://eu.storage.example.com"), **policy) == []
    (problem,) = _problems(_body("s3://models/iris", endpoint="https://elsewhere.example.org"), **policy)
    assert "spec.source.endpoint: https://elsewhere.example.org is not allowed" in problem
    (problem,) = _problems(_body("s3://models/iris"), **policy)  # AWS, not listed
    assert problem.startswith("spec.source.uri: https://s3.amazonaws.com is not allowed")
    # The pool's own settings are the admin's choice: always allowed.
    assert _problems(_body("s3://models/iris"), **policy, s3_endpoint="http://minio.hotset.svc:9000") == []
    assert _problems(_body("hf://org/iris"), **policy, hf_endpoint="http://hub.internal:8080") == []
    (problem,) = _problems(_body("https://cdn.example.net/iris.zip", sha256="c" * 64), **policy)
    assert "https://cdn.example.net is not allowed" in problem


def test_oci_sources_without_image_volumes_meet_the_policy_as_the_workers_pull_them() -> None:
    assert _problems(_body("oci://registry.example.com/models/iris:1"), image_volumes=False) == []  # https
    policy = {"image_volumes": False, "source_endpoints": "*.example.com,http://registry.internal:5000"}
    assert _problems(_body("oci://registry.example.com/models/iris:1"), **policy) == []
    assert _problems(_body("oci://registry.internal:5000/models/iris:1"), **policy) == []  # spelled-out http
    (problem,) = _problems(_body("oci://ghcr.io/models/iris:1"), **policy)
    assert problem.startswith("spec.source.uri: registry https://ghcr.io is not allowed")
    # With image volumes on the kubelet pulls, so the pods' policy does not apply.
    assert _problems(_body("oci://ghcr.io/models/iris:1"), source_endpoints="*.example.com") == []


def test_a_canarys_source_meets_the_same_policy() -> None:
    body = _body("s3://models/iris")
    body["spec"]["version"] = "1"
    body["spec"]["rollout"] = {"canary": {"version": "2", "weight": 10,
                                          "source": {"uri": "s3://models/iris-2", "endpoint": "http://plain:9000"}}}
    (problem,) = _problems(body)
    assert problem.startswith("spec.rollout.canary.source.endpoint: http://plain:9000 is not allowed")


@pytest.mark.parametrize("uri, source, named", [
    ("https://files.example.com/iris.tar.gz", {}, "source.sha256 (its 64 hex digits) is required"),
    ("s3://Bad_Bucket/iris", {}, "not a valid bucket name"),
    ("hf://org/iris@", {}, "is not a branch, tag or commit"),
    ("oci://registry.example.com/models/iris", {}, "names no tag or digest"),
    ("oci://registry.example.com/models/iris@sha256:abc", {}, "is not sha256:<64 hex digits>"),
    ("https://user:pw@files.example.com/iris.tar.gz", {"sha256": "d" * 64}, "carries credentials"),
    ("s3://models/iris", {"endpoint": "ftp://x"}, "must be http(s)://host[:port]"),
    ("ftp://files.example.com/iris", {}, "not supported"),
])
def test_malformed_sources_are_refused_naming_the_problem(uri, source, named) -> None:
    problems = _problems(_body(uri, **source))
    assert problems and any(named in p for p in problems), problems
    assert all(p.startswith("spec.source") or p.startswith("spec:") for p in problems), problems

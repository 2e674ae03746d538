"""The CRD's schema and hotset_common.spec.ModelSpec describe the same fields."""
from __future__ import annotations

from pathlib import Path

import yaml

from hotset_common import spec as spec_module
from hotset_common.spec import Framework, LatencyClass, ModelSpec, Placement, Task

CRD = Path(__file__).resolve().parents[2] / "crds" / "servedmodel.yaml"


def _version() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["group"] == spec_module.GROUP
    assert crd["spec"]["names"]["kind"] == spec_module.KIND
    assert crd["spec"]["names"]["plural"] == spec_module.PLURAL
    assert spec_module.SHORT_NAME in crd["spec"]["names"]["shortNames"]
    return next(v for v in crd["spec"]["versions"] if v["name"] == spec_module.VERSION)


def _spec_schema() -> dict:
    return _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_every_spec_field_is_in_the_schema_and_back() -> None:
    # id is metadata.name; memory_bytes is written `memory`; source is an object {uri, <source options>};
    # variant_of and variant_weight exist only on a canary's derived spec (ModelSpec.canary_variant),
    # static_adapter only on a static LoRA adapter's (ModelSpec.static_adapters).
    model_fields = {(f.alias or name) for name, f in ModelSpec.model_fields.items()} - {
        "id", "variant_of", "variant_weight", "sourceOptions", "static_adapter"}
    assert set(_spec_schema()["properties"]) == model_fields


def test_source_options_are_the_source_objects_fields_for_the_model_and_its_canary() -> None:
    from hotset_common.spec import SourceOptions

    # namespace is the ServedModel's own (ModelSpec.from_served_model), never written in the spec.
    options = {(f.alias or name) for name, f in SourceOptions.model_fields.items()} - {"namespace"}
    props = _spec_schema()["properties"]
    assert set(props["source"]["properties"]) == {"uri", *options}
    canary = props["rollout"]["properties"]["canary"]["properties"]["source"]
    assert set(canary["properties"]) == {"uri", *options}
    adapter = props["loraAdapters"]["items"]["properties"]
    assert set(adapter) == {"name", "source"} and set(adapter["source"]["properties"]) == {"uri", *options}


def test_enums_agree() -> None:
    props = _spec_schema()["properties"]
    assert props["framework"]["enum"] == [f.value for f in Framework]
    assert props["task"]["enum"] == [t.value for t in Task]
    assert props["placement"]["enum"] == [p.value for p in Placement]
    assert props["latencyClass"]["enum"] == [c.value for c in LatencyClass]


def test_defaults_agree() -> None:
    props = _spec_schema()["properties"]
    defaults = ModelSpec(id="m", framework="triton", source="file:///m")
    assert props["task"]["default"] == defaults.task.value
    assert props["placement"]["default"] == defaults.placement.value
    assert props["latencyClass"]["default"] == defaults.latency_class.value
    assert props["priority"]["default"] == defaults.priority
    assert props["version"]["default"] == defaults.version
    assert props["replicas"]["default"] == defaults.replicas.model_dump(by_alias=True)
    replicas = props["replicas"]["properties"]
    assert replicas["idleSeconds"]["default"] == defaults.replicas.idle_seconds


def test_required_fields_and_source_schemes_agree() -> None:
    schema = _spec_schema()
    # memory is required of a ServedModel (the operator refuses one without it too: validation.py);
    # a standalone worker's JSON store may leave it out (the worker measures what it loads).
    assert set(schema["required"]) == {"framework", "source", "memory"}
    pattern = schema["properties"]["source"]["properties"]["uri"]["pattern"]
    assert all(f"{scheme}" in pattern for scheme in spec_module.SOURCE_SCHEMES)


def test_status_and_printer_columns() -> None:
    version = _version()
    assert version["subresources"] == {"status": {}}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"conditions", "readyReplicas", "copies", "observedGeneration"} <= set(status)
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Framework"] == ".spec.framework"
    assert columns["Class"] == ".spec.latencyClass"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_the_crd_refuses_exactly_the_names_the_operator_refuses() -> None:
    import ast
    import re

    rules = _version()["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    (rule,) = [r["rule"] for r in rules if "metadata.name" in r["rule"]]
    listed = ast.literal_eval(re.search(r"\[[^\]]*\]", rule).group(0))
    assert sorted(listed) == sorted(spec_module.RESERVED_NAMES)


def test_limits_and_bounds_agree() -> None:
    props = _spec_schema()["properties"]
    assert props["maxConcurrency"]["minimum"] == 1
    assert props["maxConcurrency"]["maximum"] == spec_module.MAX_CONCURRENCY
    assert props["timeoutSeconds"]["maximum"] == spec_module.MAX_TIMEOUT_SECONDS
    assert props["loadTimeoutSeconds"]["maximum"] == spec_module.MAX_LOAD_TIMEOUT_SECONDS
    assert props["loadTimeoutSeconds"]["exclusiveMinimum"] is True and props["loadTimeoutSeconds"]["minimum"] == 0
    assert (props["priority"]["minimum"], props["priority"]["maximum"]) == (spec_module.MIN_PRIORITY, spec_module.MAX_PRIORITY)
    assert props["description"]["maxLength"] == spec_module.MAX_DESCRIPTION
    assert props["labels"]["maxProperties"] == spec_module.MAX_LABELS
    assert props["labels"]["additionalProperties"]["maxLength"] == spec_module.MAX_LABEL_VALUE
    assert str(spec_module.MAX_LABEL_KEY) in props["labels"]["x-kubernetes-validations"][0]["rule"]


def test_per_model_limits_reach_the_workers_model_store() -> None:
    from hotset_common import model_store

    spec = ModelSpec.from_served_model({"metadata": {"name": "m"}, "spec": {
        "framework": "triton", "source": {"uri": "pvc://c/m"}, "maxConcurrency": 2, "timeoutSeconds": 1.5, "priority": 7}})
    read_back = model_store.parse_entry(model_store.store_entry(spec), "the catalog")
    assert (read_back.max_concurrency, read_back.timeout_seconds, read_back.priority) == (2, 1.5, 7)


def test_the_canary_schema_agrees() -> None:
    canary = _spec_schema()["properties"]["rollout"]["properties"]["canary"]
    fields = {(f.alias or name) for name, f in spec_module.Canary.model_fields.items()} - {"sourceOptions"}
    assert set(canary["properties"]) == fields and set(canary["required"]) == {"version", "source", "weight"}
    assert (canary["properties"]["weight"]["minimum"], canary["properties"]["weight"]["maximum"]) == (0, 100)

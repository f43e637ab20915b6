"""The KubeRay manifest (``configs/kuberay/raycluster.yaml``) against the RayCluster
CRD's OpenAPI schema (vendored: ``tests/data/kuberay/``), strictly: like
``kubectl apply --validate=strict``, a field the schema does not name is an
error (a CRD's structural schema alone lets the API server drop it silently)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "configs" / "kuberay" / "raycluster.yaml"
SCHEMA = ROOT / "tests" / "data" / "kuberay" / "raycluster-v1.schema.json"


def strict(node: Any) -> Any:
    """``node`` with every object that lists its properties closed to others
    (unless Kubernetes keeps unknown fields there)."""
    if isinstance(node, dict):
        node = {key: strict(value) for key, value in node.items()}
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [strict(value) for value in node]
    return node


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = strict(json.loads(SCHEMA.read_text()))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


@pytest.fixture
def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return loaded


def errors(validator: jsonschema.protocols.Validator, doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


def test_the_manifest_is_a_valid_raycluster(validator: jsonschema.protocols.Validator,
                                            manifest: dict[str, Any]) -> None:
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayCluster")
    assert errors(validator, manifest) == []


def test_the_manifest_says_what_reverie_needs(manifest: dict[str, Any]) -> None:
    spec = manifest["spec"]
    assert spec["authOptions"]["mode"] == "token" and spec["authOptions"]["secretName"]
    assert spec["tlsOptions"] == {"enabled": True}
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"owners", "jobs"}
    offered = {name: json.loads(json.loads(g["rayStartParams"]["resources"]))
               for name, g in groups.items()}
    assert offered == {"owners": {"reverie_owners": 1}, "jobs": {"reverie_jobs": 2}}
    for template in [spec["headGroupSpec"]["template"]] + [g["template"] for g in groups.values()]:
        volumes = template["spec"]["volumes"]
        mounts = [m["mountPath"] for c in template["spec"]["containers"]
                  for m in c.get("volumeMounts", [])]
        assert volumes and "/var/lib/reverie" in mounts  # a volume per node for stores
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"


@pytest.mark.parametrize("spoil, where", [
    (lambda m: m["spec"].update(authOptions={"mode": "tokens"}), "spec/authOptions/mode"),
    (lambda m: m["spec"]["workerGroupSpecs"][0].update(replicas="two"),
     "spec/workerGroupSpecs/0/replicas"),
    (lambda m: m["spec"]["headGroupSpec"].update(rayStartParam={}), "spec/headGroupSpec"),
    (lambda m: m["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]
     .update(imagePullPolicy=3), "spec/workerGroupSpecs/1/template/spec/containers/0"),
    (lambda m: m["spec"]["tlsOptions"].update(enable=True), "spec/tlsOptions"),
])
def test_a_spoiled_manifest_is_refused(validator: jsonschema.protocols.Validator,
                                       manifest: dict[str, Any], spoil: Any,
                                       where: str) -> None:
    spoiled = copy.deepcopy(manifest)
    spoil(spoiled)
    found = errors(validator, spoiled)
    assert any(e.startswith(where) for e in found), found

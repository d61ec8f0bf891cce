"""Issue 36: the Kubernetes manifests — rendered from one set of values, checked in as rendered, and valid against
the Kubernetes schemas (kubernetes-validate); the shard layout comes from the replica count alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.kubernetes.render import HERE, VALUES, ValuesError, load_values, main, render, to_yaml

KUBERNETES_VERSION = "1.33"  # the pod-index label the shards read is there from 1.28


def documents(**changes: Any) -> list[dict[str, Any]]:
    values = load_values(VALUES)
    return render(values.model_copy(update=changes))


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(doc for doc in docs if doc["kind"] == kind)


def test_the_checked_in_manifests_are_the_rendered_values() -> None:
    rendered = to_yaml(render(load_values(VALUES)))
    assert (HERE / "impyard.yaml").read_text(encoding="utf-8") == rendered, (
        "deploy/kubernetes/impyard.yaml is stale: python deploy/kubernetes/render.py --out deploy/kubernetes/impyard.yaml"
    )


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    docs = list(yaml.safe_load_all((HERE / "impyard.yaml").read_text(encoding="utf-8")))
    assert {doc["kind"] for doc in docs} == {
        "Namespace", "ServiceAccount", "ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget", "Deployment",
    }  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(
            doc, KUBERNETES_VERSION, strict=True
        )  # raises on any unknown or wrong field
    broken = by_kind(docs, "StatefulSet")
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_shard_count_is_the_replica_count() -> None:
    for shards in (1, 3):
        serve = by_kind(documents(shards=shards), "StatefulSet")
        assert serve["spec"]["replicas"] == shards
        container = serve["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        assert args[:3] == ["serve", "--shard", f"$(SHARD_INDEX)/{shards}"]
        index = next(e for e in container["env"] if e["name"] == "SHARD_INDEX")
        assert (
            index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
        )


def test_probes_grace_and_disruption_budget() -> None:
    docs = documents()
    pod = by_kind(docs, "StatefulSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "--metrics-port" in container["args"] and "9464" in container["args"]
    assert pod["terminationGracePeriodSeconds"] == 150
    assert by_kind(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_credentials_come_from_the_secret_and_never_from_the_values() -> None:
    docs = documents()
    assert not [doc for doc in docs if doc["kind"] == "Secret"]
    env = by_kind(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["env"]
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["key"]
        for e in env
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert secrets == {
        "IMPYARD_DATABASE_URL": "database-url", "OPENAI_API_KEY": "openai-api-key",
        "OPENAI_BASE_URL": "openai-base-url", "IMPYARD_DISCORD_TOKEN_PIP": "discord-token-pip",
    }  # fmt: skip
    console = by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert console["args"][1:3] == ["--host", "127.0.0.1"]  # loopback: kubectl port-forward only


def test_every_shard_gets_the_same_imp_files() -> None:
    data = by_kind(documents(), "ConfigMap")["data"]
    assert data["pip.imp.toml"] == (HERE / "imps" / "pip" / "imp.toml").read_text()
    assert data["pip.persona.md"] == (HERE / "imps" / "pip" / "persona.md").read_text()


def test_bad_values_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "values.toml"
    bad.write_text(VALUES.read_text().replace("shards = 2", "shards = 0"))
    assert main(["--values", str(bad)]) == 2
    assert "shards: Input should be greater than or equal to 1" in capsys.readouterr().err
    bad.write_text(VALUES.read_text().replace('imps = ["pip"]', 'imps = ["nobody"]'))
    with pytest.raises(ValuesError, match="nobody has no"):
        render(load_values(bad), HERE / "imps")

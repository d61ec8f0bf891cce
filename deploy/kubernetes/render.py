"""Render impyard's Kubernetes manifests from one set of values (issue 36; docs/kubernetes.md).

    python deploy/kubernetes/render.py [--values deploy/kubernetes/values.toml] > deploy/kubernetes/impyard.yaml

What it makes, in ``values.namespace``: a StatefulSet of ``impyard serve`` shards (pod ordinal = shard index, N =
the replica count, so the two never disagree), its headless Service (the metrics port, for Prometheus), a
PodDisruptionBudget (one shard down at a time), a ConfigMap with the imps' files (every shard runs the same imps),
a ServiceAccount that holds no API credential, and — when ``console.enabled`` — the console as one pod on loopback,
reached with ``kubectl port-forward``. The Secret is never rendered. ``tests/test_kubernetes.py`` renders these
values, compares the result with the checked-in ``impyard.yaml`` and validates every document against the
Kubernetes schemas (kubernetes-validate).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

HERE = Path(__file__).resolve().parent
VALUES = HERE / "values.toml"
APP = "impyard"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
IMP_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
MAX_IMP_FILE_BYTES = 256 * 1024


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(Strict):
    cpu_request: str = "250m"
    memory_request: str = "512Mi"
    memory_limit: str = "1Gi"


class Console(Strict):
    enabled: bool = True
    port: int = Field(default=8787, ge=1024, le=65535)


class Values(Strict):
    namespace: str = Field(default="impyard", pattern=DNS_LABEL)
    image: str = Field(min_length=1)
    image_pull_policy: str = Field(default="IfNotPresent", pattern="^(Always|IfNotPresent|Never)$")
    shards: int = Field(default=1, ge=1, le=1024)
    supervise: bool = True
    termination_grace_s: int = Field(default=150, ge=30, le=3600)
    metrics_port: int = Field(default=9464, ge=1024, le=65535)
    imps: list[str] = Field(min_length=1)
    secret: str = Field(default="impyard", pattern=DNS_LABEL)
    docker_socket: str = Field(default="/var/run/docker.sock", pattern="^/")
    state_root: str = Field(default="/var/lib/impyard/state", pattern="^/")
    resources: Resources = Resources()
    console: Console = Console()


class ValuesError(ValueError):
    """Values that cannot be rendered: one line naming the key."""


def load_values(path: Path) -> Values:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        values = Values.model_validate(raw)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValuesError(f"{path}: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValuesError(f"{path}: {where}: {first['msg']}") from None
    import re

    for imp in values.imps:
        if not re.match(IMP_NAME, imp):
            raise ValuesError(
                f"{path}: imps: {imp!r} is not an imp name (lowercase letters, digits, - and _)"
            )
    return values


def imp_files(imps_dir: Path, imps: list[str]) -> dict[str, str]:
    """ConfigMap data: ``<imp>.<file>`` → text, for every file of each imp's directory."""
    data: dict[str, str] = {}
    for imp in imps:
        directory = imps_dir / imp
        if not (directory / "imp.toml").is_file():
            raise ValuesError(f"imps: {imp} has no {directory / 'imp.toml'}")
        for file in sorted(p for p in directory.iterdir() if p.is_file()):
            if file.stat().st_size > MAX_IMP_FILE_BYTES:
                raise ValuesError(
                    f"{file} is larger than {MAX_IMP_FILE_BYTES} bytes: a ConfigMap holds 1 MiB in all"
                )
            data[f"{imp}.{file.name}"] = file.read_text(encoding="utf-8")
    return data


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component}


def _meta(name: str, values: Values, component: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": values.namespace, "labels": _labels(component), **extra}


def _secret_env(name: str, values: Values, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": values.secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _home_init(values: Values, files: dict[str, str]) -> dict[str, Any]:
    """Copies the imps' files from the ConfigMap into the pod's home (imps/<name>/<file>), writable there."""
    copies = " && ".join(
        f"mkdir -p /home/impyard/imps/{key.split('.', 1)[0]} && "
        f"cp /imps/{key} /home/impyard/imps/{key.split('.', 1)[0]}/{key.split('.', 1)[1]}"
        for key in files
    )
    return {
        "name": "imps",
        "image": values.image,
        "imagePullPolicy": values.image_pull_policy,
        "command": ["sh", "-c", copies],
        "volumeMounts": [
            {"name": "home", "mountPath": "/home/impyard"},
            {"name": "imps", "mountPath": "/imps"},
        ],
        "securityContext": _container_security(),
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _probes(values: Values) -> dict[str, Any]:
    def get(path: str, **timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "metrics"}, **timing}

    return {
        "startupProbe": get("/healthz", periodSeconds=5, failureThreshold=60),
        "livenessProbe": get("/healthz", periodSeconds=10, timeoutSeconds=5, failureThreshold=3),
        "readinessProbe": get("/readyz", periodSeconds=10, timeoutSeconds=5, failureThreshold=3),
    }


def serve_statefulset(values: Values, files: dict[str, str]) -> dict[str, Any]:
    args = ["serve", "--shard", f"$(SHARD_INDEX)/{values.shards}", "--log-json",
            "--metrics-host", "0.0.0.0", "--metrics-port", str(values.metrics_port)]  # fmt: skip
    if values.supervise:
        args.append("--supervise")
    env = [
        # The pod's ordinal (Kubernetes 1.28+ labels every StatefulSet pod with it): the shard index.
        {"name": "SHARD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "IMPYARD_HOME", "value": "/home/impyard"},
        {"name": "IMPYARD_STATE_ROOT", "value": f"{values.state_root}/$(POD_NAME)"},
        _secret_env("IMPYARD_DATABASE_URL", values, "database-url"),
        _secret_env("OPENAI_API_KEY", values, "openai-api-key"),
        _secret_env("OPENAI_BASE_URL", values, "openai-base-url", optional=True),
        *(_secret_env(f"IMPYARD_DISCORD_TOKEN_{imp.upper().replace('-', '_')}", values, f"discord-token-{imp}") for imp in values.imps),
    ]  # fmt: skip
    container = {
        "name": "serve",
        "image": values.image,
        "imagePullPolicy": values.image_pull_policy,
        "args": args,
        "env": env,
        "ports": [{"name": "metrics", "containerPort": values.metrics_port}],
        **_probes(values),
        "resources": {
            "requests": {"cpu": values.resources.cpu_request, "memory": values.resources.memory_request},
            "limits": {"memory": values.resources.memory_limit},
        },
        "volumeMounts": [
            {"name": "home", "mountPath": "/home/impyard"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "docker", "mountPath": values.docker_socket},
            {
                "name": "state",
                "mountPath": values.state_root,
            },  # the same path as on the node: the engine mounts it
        ],
        "securityContext": _container_security(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta("impyard-serve", values, "serve"),
        "spec": {
            "serviceName": "impyard-serve",
            "replicas": values.shards,
            "podManagementPolicy": "Parallel",  # shards are independent: start and stop them together
            "selector": {"matchLabels": _labels("serve")},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": _labels("serve")},
                "spec": {
                    "serviceAccountName": "impyard",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": values.termination_grace_s,
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": _labels("serve")},
                                    },
                                }
                            ]
                        }
                    },  # fmt: skip
                    "initContainers": [_home_init(values, files)],
                    "containers": [container],
                    "volumes": [
                        {"name": "home", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "imps", "configMap": {"name": "impyard-imps"}},
                        {"name": "docker", "hostPath": {"path": values.docker_socket, "type": "Socket"}},
                        {
                            "name": "state",
                            "hostPath": {"path": values.state_root, "type": "DirectoryOrCreate"},
                        },
                    ],
                },
            },
        },
    }


def console_deployment(values: Values, files: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("impyard-console", values, "console"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _labels("console")},
            "template": {
                "metadata": {"labels": _labels("console")},
                "spec": {
                    "serviceAccountName": "impyard",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },  # fmt: skip
                    "initContainers": [_home_init(values, files)],
                    "containers": [
                        {
                            "name": "console",
                            "image": values.image,
                            "imagePullPolicy": values.image_pull_policy,
                            # On the pod's loopback: only `kubectl port-forward` reaches it (the console answers
                            # loopback names only); its token comes from the Secret.
                            "args": [
                                "console",
                                "--host",
                                "127.0.0.1",
                                "--port",
                                str(values.console.port),
                                "--metrics-host",
                                "0.0.0.0",
                                "--metrics-port",
                                str(values.metrics_port),
                            ],
                            "env": [
                                {"name": "IMPYARD_HOME", "value": "/home/impyard"},
                                _secret_env("IMPYARD_DATABASE_URL", values, "database-url"),
                                _secret_env("IMPYARD_CONSOLE_TOKEN", values, "console-token"),
                            ],
                            "ports": [{"name": "metrics", "containerPort": values.metrics_port}],
                            **_probes(values),
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "volumeMounts": [
                                {"name": "home", "mountPath": "/home/impyard"},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                            "securityContext": _container_security(),
                        }
                    ],  # fmt: skip
                    "volumes": [
                        {"name": "home", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "imps", "configMap": {"name": "impyard-imps"}},
                    ],
                },
            },
        },
    }


def render(values: Values, imps_dir: Path = HERE / "imps") -> list[dict[str, Any]]:
    """Every manifest, in the order ``kubectl apply`` creates them."""
    files = imp_files(imps_dir, values.imps)
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": values.namespace,
                "labels": {
                    "app.kubernetes.io/name": APP,
                    # The hosts mount the node's Docker socket and a hostPath: privileged by Pod Security's standards.
                    "pod-security.kubernetes.io/enforce": "privileged",
                },
            },
        },  # fmt: skip
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta("impyard", values, "serve"),
            "automountServiceAccountToken": False,
        },  # fmt: skip
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta("impyard-imps", values, "serve"),
            "data": files,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta("impyard-serve", values, "serve"),
            "spec": {
                "clusterIP": "None",
                "selector": _labels("serve"),
                "ports": [{"name": "metrics", "port": values.metrics_port, "targetPort": "metrics"}],
            },  # fmt: skip
        },
        serve_statefulset(values, files),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta("impyard-serve", values, "serve"),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _labels("serve")}},
        },
    ]
    if values.console.enabled:
        documents.append(console_deployment(values, files))
    return documents


HEADER = """\
# Rendered by `python deploy/kubernetes/render.py` from deploy/kubernetes/values.toml: do not edit by hand.
# tests/test_kubernetes.py fails when this file is stale or a manifest does not validate.
"""


def to_yaml(documents: list[dict[str, Any]]) -> str:
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no types; kubernetes-validate brings it

    class Dumper(yaml.SafeDumper):
        """Multi-line text (an imp's files) as literal blocks, readable in review."""

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value and not value.endswith((" ", "\t")) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return HEADER + "".join(
        "---\n" + yaml.dump(document, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=120)
        for document in documents
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render impyard's Kubernetes manifests from values.")
    parser.add_argument("--values", type=Path, default=VALUES)
    parser.add_argument("--out", type=Path, default=None, help="Write here instead of stdout.")
    args = parser.parse_args(argv)
    try:
        text = to_yaml(render(load_values(args.values), args.values.parent / "imps"))
    except ValuesError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

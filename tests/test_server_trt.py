"""The server's TensorRT backend on the stand-in TensorRT and cuda-bindings (tests/trt_stand_in.py): the
backend, the runner and the server are real; only what needs an NVIDIA GPU is a stand-in."""

from __future__ import annotations

import numpy as np
import pytest
from trt_stand_in import fake_trt_export

from server.backends import BackendUnavailable, create_backend, dummy_batch
from server.model_spec import load_export_spec
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

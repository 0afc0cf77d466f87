"""Run a TensorRT engine from an export directory: `TRTRunner(dir).run(input_ids, attention_mask, token_type_ids)`.

Torch-free: device buffers, the stream and the copies go through the CUDA runtime's own bindings
(`export.trt.cuda`, cuda-bindings), so the server's ``gpu`` extra serves engines without torch.
Tensors are bound by address with `set_tensor_address` and run with `execute_async_v3` on the runner's
own stream (the name-based API of TensorRT 10 and 11). Each call sets the three input shapes, so one
engine serves any batch x sequence in its optimisation profile; batches below the profile's minimum are
padded up and cut back. Calls are serialised by a lock (one execution context).

Before deserialising, the TensorRT version that built the engine (export.json `trt.version`) is compared
with the installed one: a plan only loads on the release that built it, and TensorRT's own failure is a
bare None.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from qa_core.contract import INDEX_OUTPUTS, INPUT_NAMES, PAD_ID, SEG_ID_PAD
from qa_core.runtime.backends import TRT
from qa_core.runtime.gpu import gpu_stack_problem
from qa_core.runtime.gpu_stacks import tensorrt_version_problem
from qa_core.runtime.runner import Feeds, Runner
from qa_core.runtime.sidecar import Sidecar

PER_TOKEN_OUTPUTS = ("start_logits", "end_logits")
PAD_VALUES = {"input_ids": PAD_ID, "attention_mask": 0, "token_type_ids": SEG_ID_PAD}
# tensorrt.DataType member name -> numpy dtype (BF16/FP8/INT4/FP4 have no numpy type and never reach I/O here).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "FLOAT": np.dtype(np.float32),
    "HALF": np.dtype(np.float16),
    "INT8": np.dtype(np.int8),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
}


def numpy_dtype(trt_dtype: Any) -> np.dtype:
    """The numpy dtype of a ``tensorrt.DataType`` (looked up by member name, so no TensorRT import)."""
    name = getattr(trt_dtype, "name", None) or str(trt_dtype).rsplit(".", 1)[-1]
    if name not in NUMPY_DTYPES:
        raise RuntimeError(f"unsupported TensorRT I/O tensor type {name} (supported: {sorted(NUMPY_DTYPES)})")
    return NUMPY_DTYPES[name]


class TRTRunner:
    """A deserialised engine + execution context; outputs come back as numpy, named as in the sidecar."""

    def __init__(self, engine_dir: str | os.PathLike, device: int = 0) -> None:
        self.dir = Path(engine_dir)
        self.sidecar = Sidecar.load(self.dir)
        if self.sidecar.backend != TRT:
            raise ValueError(f"{self.dir}: backend is {self.sidecar.backend!r}, not {TRT!r}")
        assert self.sidecar.trt is not None  # validation requires it of a TensorRT sidecar
        problem = gpu_stack_problem()
        if problem:
            raise RuntimeError(problem)
        import tensorrt as trt

        from export.trt.cuda import CudaDevice

        built = str(self.sidecar.trt.get("version") or "")
        mismatch = tensorrt_version_problem(built, trt.__version__) if built else None
        if mismatch:
            raise RuntimeError(f"{self.dir}: {mismatch}")
        self.min_shape = tuple(self.sidecar.trt["min_shape"])
        self.max_shape = tuple(self.sidecar.trt["max_shape"])
        self._lock = threading.Lock()
        self.cuda = CudaDevice(device)
        try:
            self._load(trt)
        except BaseException:
            self.cuda.close()
            raise

    def _load(self, trt: Any) -> None:
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(self.sidecar.model_path(self.dir).read_bytes())
        if self.engine is None:
            raise RuntimeError(
                f"{self.dir}: TensorRT {trt.__version__} cannot deserialise this engine on {self.cuda.name} "
                "(see the TensorRT log above); engines only run on the TensorRT version and GPU model that "
                "built them: rebuild it with python -m export.trt"
            )
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeError(f"{self.dir}: TensorRT could not create an execution context (GPU memory?)")
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.dtypes: dict[str, np.dtype] = {}
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            self.dtypes[name] = numpy_dtype(self.engine.get_tensor_dtype(name))
            is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(name)
        if sorted(self.inputs) != sorted(INPUT_NAMES) or sorted(self.outputs) != sorted(self.sidecar.outputs):
            raise RuntimeError(
                f"{self.dir}: engine tensors {self.inputs} -> {self.outputs} do not match export.json "
                f"{list(INPUT_NAMES)} -> {self.sidecar.outputs}"
            )

    @property
    def device_name(self) -> str:
        return str(self.cuda.name)

    def run(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray
    ) -> dict[str, np.ndarray]:
        """One forward pass on [batch, sequence] integer arrays; returns {output name: numpy array}."""
        arrays = dict(zip(INPUT_NAMES, (input_ids, attention_mask, token_type_ids), strict=True))
        shape = check_profile(arrays, self.max_shape)
        padded = pad_to(arrays, (max(shape[0], self.min_shape[0]), max(shape[1], self.min_shape[1])))
        with self._lock:
            outputs = self._execute(padded)
        return {name: _cut(name, outputs[name], shape) for name in self.sidecar.outputs}

    __call__ = run

    def _execute(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not hasattr(self, "context"):
            raise RuntimeError(f"{self.dir}: this TRTRunner is closed")
        cuda, context = self.cuda, self.context
        cuda.activate()  # the current device is per thread; the server calls from a thread pool
        hosts = []  # host inputs must live until the stream has copied them
        for name, array in arrays.items():
            host = np.ascontiguousarray(array, dtype=self.dtypes[name])
            hosts.append(host)
            if not context.set_input_shape(name, host.shape):
                raise RuntimeError(f"TensorRT rejected shape {list(host.shape)} for input {name}")
            if not context.set_tensor_address(name, cuda.to_device(name, host)):
                raise RuntimeError(f"TensorRT rejected the device address of input {name}")
        outputs: dict[str, tuple[int, np.ndarray]] = {}
        for name in self.outputs:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(f"output {name} has an unresolved shape {shape}")
            host = np.empty(shape, dtype=self.dtypes[name])
            pointer = cuda.buffer(name, host.nbytes)
            if not context.set_tensor_address(name, pointer):
                raise RuntimeError(f"TensorRT rejected the device address of output {name}")
            outputs[name] = (pointer, host)
        if not context.execute_async_v3(cuda.stream_handle):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log above)")
        for name, (pointer, host) in outputs.items():
            cuda.to_host(name, pointer, host)
        cuda.synchronize()
        return {name: _to_numpy(name, host) for name, (_, host) in outputs.items()}

    def runner(self) -> Runner:
        """As an `qa_core.runtime.runner.Runner` (feeds -> outputs in sidecar order)."""

        def run_feeds(feeds: Feeds) -> list[np.ndarray]:
            out = self.run(*(feeds[n] for n in INPUT_NAMES))
            return [out[n] for n in self.sidecar.outputs]

        return run_feeds

    def io_dtypes(self) -> dict[str, str]:
        """Tensor name -> numpy dtype name as the engine declares it (Triton's config needs these)."""
        return {name: dtype.name for name, dtype in self.dtypes.items()}

    def close(self) -> None:
        """Release the context, the engine and the device memory (the server calls this at shutdown)."""
        with self._lock:
            for attr in ("context", "engine", "runtime"):
                if hasattr(self, attr):
                    delattr(self, attr)
            self.cuda.close()

    def __del__(self) -> None:
        try:
            if hasattr(self, "cuda"):
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: CUDA may already be gone
            pass


def check_profile(arrays: Mapping[str, np.ndarray], max_shape: tuple[int, ...]) -> tuple[int, int]:
    """The common [batch, sequence] of the three inputs; ValueError if they differ or exceed the profile."""
    shapes = [tuple(np.shape(a)) for a in arrays.values()]
    shape = shapes[0]
    if len(shape) != 2 or any(s != shape for s in shapes):
        raise ValueError(f"inputs must share one [batch, sequence] shape, got {shapes}")
    if shape[0] > max_shape[0] or shape[1] > max_shape[1]:
        raise ValueError(f"input shape {list(shape)} is outside the engine's profile (max {list(max_shape)})")
    return int(shape[0]), int(shape[1])


def pad_to(arrays: Mapping[str, np.ndarray], shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Right-pad [batch, sequence] inputs with masked padding up to `shape` (real outputs do not change)."""
    b, t = np.shape(arrays["input_ids"])
    if (b, t) == tuple(shape):
        return dict(arrays)
    out = {}
    for name, array in arrays.items():
        grown = np.full(shape, PAD_VALUES[name], dtype=np.int64)
        grown[:b, :t] = array
        out[name] = grown
    return out


def _cut(name: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Drop padding rows, and the padding positions of per-token outputs."""
    array = array[: shape[0]]
    return array[:, : shape[1]] if name in PER_TOKEN_OUTPUTS else array


def _to_numpy(name: str, array: np.ndarray) -> np.ndarray:
    """Index outputs as int64 (TensorRT may compute TopK indices in int32), scores as float32."""
    return array.astype(np.int64) if name in INDEX_OUTPUTS else array.astype(np.float32)

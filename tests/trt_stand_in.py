"""Stand-ins for TensorRT and NVIDIA's cuda-bindings, which need an NVIDIA GPU: enough of both for
`export.trt_runtime.TRTRunner` (and what serves through it) to run for real on a CPU.

Device memory is host memory (ctypes buffers), so the runner's copies really move bytes, and the engine
computes simple functions of its inputs, so what comes back is checkable after padding and cutting.
The ``stand_in_stack`` fixture (tests/conftest.py) installs them for one test.
"""

from __future__ import annotations

import ctypes
import enum
import sys
import types
from typing import Any

import numpy as np
import pytest

from export import cuda_runtime, trt_runtime
from export.gpu_versions import TENSORRT_VERSION
from train.contract import INPUT_NAMES


class StandInStream:
    def __int__(self) -> int:
        return 7


class StandInCudart:
    """cuda-bindings' runtime as the runner uses it: every call returns (cudaError_t, values...); device
    memory is host memory here (ctypes buffers), so copies really move bytes."""

    class cudaError_t(enum.IntEnum):  # noqa: N801 - the binding's name
        cudaSuccess = 0
        cudaErrorInvalidValue = 1

    class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    def __init__(self, fail: str | None = None) -> None:
        self.memory: dict[int, Any] = {}
        self.calls: list[str] = []
        self.fail = fail

    def _result(self, call: str, *values: Any) -> tuple[Any, ...]:
        self.calls.append(call)
        if call == self.fail:
            return (self.cudaError_t.cudaErrorInvalidValue, *(None for _ in values))
        return (self.cudaError_t.cudaSuccess, *values)

    def cudaGetErrorString(self, err: Any) -> tuple[Any, bytes]:  # noqa: N802
        return (self.cudaError_t.cudaSuccess, b"invalid argument")

    def cudaSetDevice(self, device: int) -> tuple[Any, ...]:  # noqa: N802
        return self._result("cudaSetDevice")

    def cudaGetDeviceProperties(self, device: int) -> tuple[Any, ...]:  # noqa: N802
        return self._result("cudaGetDeviceProperties", types.SimpleNamespace(name=b"Stand-in GPU\0\0\0"))

    def cudaStreamCreate(self) -> tuple[Any, ...]:  # noqa: N802
        return self._result("cudaStreamCreate", StandInStream())

    def cudaStreamDestroy(self, stream: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._result("cudaStreamDestroy")

    def cudaMalloc(self, nbytes: int) -> tuple[Any, ...]:  # noqa: N802
        buffer = ctypes.create_string_buffer(nbytes)
        self.memory[ctypes.addressof(buffer)] = buffer
        return self._result("cudaMalloc", ctypes.addressof(buffer))

    def cudaFree(self, pointer: int) -> tuple[Any, ...]:  # noqa: N802
        del self.memory[pointer]
        return self._result("cudaFree")

    def cudaMemcpyAsync(self, dst: int, src: int, nbytes: int, kind: Any, stream: Any) -> tuple[Any, ...]:  # noqa: N802
        assert isinstance(stream, StandInStream) and isinstance(dst, int) and isinstance(src, int)
        device = dst if kind == self.cudaMemcpyKind.cudaMemcpyHostToDevice else src
        assert device in self.memory and nbytes <= len(self.memory[device])
        result = self._result(f"cudaMemcpyAsync {kind.name}")
        if result[0] == self.cudaError_t.cudaSuccess:
            ctypes.memmove(dst, src, nbytes)
        return result

    def cudaStreamSynchronize(self, stream: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._result("cudaStreamSynchronize")


# The stand-in engine: shallow head, input_ids as int32 and start_logits as fp16 (conversions both ways).
ENGINE_TENSORS = {
    "input_ids": ("INPUT", "INT32"),
    "attention_mask": ("INPUT", "INT64"),
    "token_type_ids": ("INPUT", "INT64"),
    "start_logits": ("OUTPUT", "HALF"),
    "end_logits": ("OUTPUT", "FLOAT"),
    "cls_logits": ("OUTPUT", "FLOAT"),
}


class StandInContext:
    """start = input_ids, end = 2 x mask + segment, cls = sum of the unmasked ids: easy to check after pad/cut."""

    def __init__(self, cudart: StandInCudart) -> None:
        self.cudart = cudart
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executed: list[tuple[int, ...]] = []

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        batch, seq = self.shapes["input_ids"]
        return (batch,) if name == "cls_logits" else (batch, seq)

    def set_tensor_address(self, name: str, pointer: int) -> bool:
        self.addresses[name] = pointer
        return True

    def _array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        dtype = trt_runtime.NUMPY_DTYPES[ENGINE_TENSORS[name][1]]
        return np.frombuffer(self.cudart.memory[self.addresses[name]], dtype, int(np.prod(shape))).reshape(
            shape
        )

    def execute_async_v3(self, stream_handle: int) -> bool:
        assert stream_handle == 7
        shape = self.shapes["input_ids"]
        self.executed.append(shape)
        ids, mask, seg = (self._array(n, shape) for n in INPUT_NAMES)
        self._array("start_logits", shape)[:] = ids
        self._array("end_logits", shape)[:] = 2 * mask + seg
        self._array("cls_logits", shape[:1])[:] = (ids * mask).sum(axis=1)
        return True


class StandInEngine:
    def __init__(self, cudart: StandInCudart) -> None:
        self.names = list(ENGINE_TENSORS)
        self.num_io_tensors = len(self.names)
        self.context = StandInContext(cudart)

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_dtype(self, name: str) -> Any:
        return types.SimpleNamespace(name=ENGINE_TENSORS[name][1])

    def get_tensor_mode(self, name: str) -> str:
        return ENGINE_TENSORS[name][0]

    def create_execution_context(self) -> StandInContext:
        return self.context


def stand_in_tensorrt(version: str, engine: Any) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    runtime = type(
        "Runtime",
        (),
        {"__init__": lambda self, logger: None, "deserialize_cuda_engine": lambda self, data: engine},
    )
    trt.Runtime = runtime
    return trt


def install(
    monkeypatch: pytest.MonkeyPatch, version: str = TENSORRT_VERSION, fail: str | None = None
) -> tuple[StandInCudart, StandInEngine]:
    """TensorRT, cuda-bindings and a GPU, as far as TRTRunner can tell (undone with ``monkeypatch``)."""
    cudart = StandInCudart(fail)
    engine = StandInEngine(cudart)
    monkeypatch.setitem(sys.modules, "tensorrt", stand_in_tensorrt(version, engine))
    monkeypatch.setattr(trt_runtime, "gpu_stack_problem", lambda: None)
    monkeypatch.setattr(cuda_runtime, "import_cudart", lambda: cudart)
    return cudart, engine

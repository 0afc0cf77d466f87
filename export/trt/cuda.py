"""The few CUDA runtime calls the TensorRT runner needs, through NVIDIA's ``cuda-bindings`` (no torch).

The ``gpu`` extra serves TensorRT engines without torch, so device memory, the stream and the copies go
through the CUDA runtime's own Python bindings. Every cuda-bindings call returns a tuple whose first item
is a ``cudaError_t``; :func:`check` turns anything but ``cudaSuccess`` into a :class:`CudaError` naming the
call and CUDA's own description. Host arrays are plain numpy arrays (copies from pageable memory are
staged by the driver; at these tensor sizes, a few hundred KiB, pinning buys little).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qa_core.runtime.gpu import INSTALL_HINT, error_string, import_cudart
from qa_core.runtime.gpu_stacks import STACKS


class CudaError(RuntimeError):
    """A CUDA runtime call failed; the message names the call, the error code and CUDA's description."""


def load_cudart() -> Any:
    """The CUDA runtime module of cuda-bindings (12.8+ layout, else the older cuda-python one)."""
    cudart = import_cudart()
    if cudart is None:
        raise CudaError(
            "the TensorRT runner needs NVIDIA's CUDA runtime bindings ("
            + ", ".join(f"{s.cuda_bindings} with the {s.extra} extra" for s in STACKS)
            + f"), which are not installed: {INSTALL_HINT}"
        )
    return cudart


def check(cudart: Any, call: str, result: Any) -> tuple[Any, ...]:
    """The values after the error code of a cuda-bindings call's result; CudaError if it failed."""
    values = result if isinstance(result, tuple) else (result,)
    err = values[0]
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise CudaError(f"CUDA {call} failed: {name} ({int(err)}): {error_string(cudart, err)}")
    return tuple(values[1:])


def device_name(device: int = 0, cudart: Any = None) -> str:
    """The GPU's marketing name ("NVIDIA H100 80GB HBM3"), from cudaGetDeviceProperties."""
    cudart = cudart or load_cudart()
    (prop,) = check(cudart, f"cudaGetDeviceProperties({device})", cudart.cudaGetDeviceProperties(device))
    name = prop.name
    if isinstance(name, bytes | bytearray):
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
    return str(name)


class CudaDevice:
    """One GPU's stream and named device buffers; buffers only grow, so steady serving never reallocates.

    Not thread-safe: the caller serialises use (TRTRunner holds a lock), and calls :meth:`activate` in
    each calling thread, because the current device is per host thread.
    """

    def __init__(self, device: int = 0, cudart: Any = None) -> None:
        self.cudart = cudart or load_cudart()
        self.device = device
        self._buffers: dict[str, tuple[int, int]] = {}  # key -> (device pointer, capacity in bytes)
        self.stream: Any = None
        self.activate()
        self.name = device_name(device, self.cudart)
        (self.stream,) = self._call("cudaStreamCreate", self.cudart.cudaStreamCreate())

    def _call(self, call: str, result: Any) -> tuple[Any, ...]:
        return check(self.cudart, call, result)

    def activate(self) -> None:
        """Make this device current for the calling thread."""
        self._call(f"cudaSetDevice({self.device})", self.cudart.cudaSetDevice(self.device))

    @property
    def stream_handle(self) -> int:
        """The stream as the integer handle TensorRT's execute_async_v3 takes."""
        return int(self.stream)

    def buffer(self, key: str, nbytes: int) -> int:
        """A device pointer with room for ``nbytes`` under ``key``, reused while large enough."""
        pointer, capacity = self._buffers.get(key, (0, 0))
        if nbytes <= capacity:
            return pointer
        if pointer:
            self._call("cudaFree", self.cudart.cudaFree(pointer))
            del self._buffers[key]
        (pointer,) = self._call(f"cudaMalloc({nbytes}) for {key}", self.cudart.cudaMalloc(max(nbytes, 1)))
        self._buffers[key] = (int(pointer), max(nbytes, 1))
        return int(pointer)

    def to_device(self, key: str, array: np.ndarray) -> int:
        """Queue a copy of a C-contiguous host array into the ``key`` buffer; returns the device pointer.

        The host array must stay alive until :meth:`synchronize`.
        """
        if not array.flags.c_contiguous:
            raise ValueError(f"{key}: host array must be C-contiguous")
        pointer = self.buffer(key, array.nbytes)
        if array.nbytes:
            kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            result = self.cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, kind, self.stream)
            self._call(f"cudaMemcpyAsync host->device for {key}", result)
        return pointer

    def to_host(self, key: str, pointer: int, array: np.ndarray) -> None:
        """Queue a copy from a device pointer into a C-contiguous host array (valid after synchronize)."""
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"{key}: host array must be C-contiguous and writeable")
        if array.nbytes:
            kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
            result = self.cudart.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, kind, self.stream)
            self._call(f"cudaMemcpyAsync device->host for {key}", result)

    def synchronize(self) -> None:
        """Wait for everything queued on the stream (errors of earlier kernels surface here)."""
        self._call("cudaStreamSynchronize", self.cudart.cudaStreamSynchronize(self.stream))

    def close(self) -> None:
        """Free the buffers and destroy the stream (idempotent)."""
        buffers, self._buffers = self._buffers, {}
        stream, self.stream = self.stream, None
        if not buffers and stream is None:
            return
        self.activate()
        for pointer, _ in buffers.values():
            self._call("cudaFree", self.cudart.cudaFree(pointer))
        if stream is not None:
            self._call("cudaStreamDestroy", self.cudart.cudaStreamDestroy(stream))

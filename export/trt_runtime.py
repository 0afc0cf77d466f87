"""Run a TensorRT engine from an export directory: `TRTRunner(dir).run(input_ids, attention_mask, token_type_ids)`.

Device buffers are torch CUDA tensors (torch is on every GPU machine we serve from), bound by address with
`set_tensor_address` and run with `execute_async_v3` on the runner's own CUDA stream (the name-based API of
TensorRT 10 and 11). Each call sets the three input shapes, so one engine serves any batch x sequence in
its optimisation profile; batches below the profile's minimum are padded up and cut back. Calls are
serialised by a lock (one execution context).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from export.gpu import gpu_stack_problem
from export.sidecar import Sidecar
from export.verify import Feeds, Runner
from train.contract import INDEX_OUTPUTS, INPUT_NAMES, PAD_ID, SEG_ID_PAD

PER_TOKEN_OUTPUTS = ("start_logits", "end_logits")
PAD_VALUES = {"input_ids": PAD_ID, "attention_mask": 0, "token_type_ids": SEG_ID_PAD}


class TRTRunner:
    """A deserialised engine + execution context; outputs come back as numpy, named as in the sidecar."""

    def __init__(self, engine_dir: str | os.PathLike, device: int = 0) -> None:
        problem = gpu_stack_problem()
        if problem:
            raise RuntimeError(problem)
        import tensorrt as trt
        import torch

        self.torch = torch
        self.dir = Path(engine_dir)
        self.sidecar = Sidecar.load(self.dir)
        if self.sidecar.backend != "tensorrt":
            raise ValueError(f"{self.dir}: backend is {self.sidecar.backend!r}, not 'tensorrt'")
        self.device = torch.device("cuda", device)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        with torch.cuda.device(self.device):
            self.engine = self.runtime.deserialize_cuda_engine(self.sidecar.model_path(self.dir).read_bytes())
            if self.engine is None:
                raise RuntimeError(
                    f"{self.dir}: TensorRT {trt.__version__} cannot deserialise this engine; engines only run on the "
                    "TensorRT version and GPU model that built them (rebuild it with python -m export.trt)"
                )
            self.context = self.engine.create_execution_context()
            self.stream = torch.cuda.Stream(self.device)
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.dtypes = {}
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            self.dtypes[name] = _torch_dtype(trt, torch, self.engine.get_tensor_dtype(name))
            is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(name)
        if sorted(self.inputs) != sorted(INPUT_NAMES) or sorted(self.outputs) != sorted(self.sidecar.outputs):
            raise RuntimeError(
                f"{self.dir}: engine tensors {self.inputs} -> {self.outputs} do not match export.json "
                f"{list(INPUT_NAMES)} -> {self.sidecar.outputs}"
            )
        assert self.sidecar.trt is not None  # validation requires it of a 'tensorrt' sidecar
        self.min_shape = tuple(self.sidecar.trt["min_shape"])
        self.max_shape = tuple(self.sidecar.trt["max_shape"])
        self._lock = threading.Lock()

    def run(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray
    ) -> dict[str, np.ndarray]:
        """One forward pass on [batch, sequence] integer arrays; returns {output name: numpy array}."""
        arrays = dict(zip(INPUT_NAMES, (input_ids, attention_mask, token_type_ids), strict=True))
        shape = tuple(np.shape(input_ids))
        if len(shape) != 2 or any(np.shape(a) != shape for a in arrays.values()):
            shapes = [np.shape(a) for a in arrays.values()]
            raise ValueError(f"inputs must share one [batch, sequence] shape, got {shapes}")
        if shape[0] > self.max_shape[0] or shape[1] > self.max_shape[1]:
            raise ValueError(
                f"input shape {list(shape)} is outside the engine's profile (max {list(self.max_shape)})"
            )
        padded = pad_to(arrays, (max(shape[0], self.min_shape[0]), max(shape[1], self.min_shape[1])))
        with self._lock:
            outputs = self._execute(padded)
        return {name: _cut(name, outputs[name], shape) for name in self.sidecar.outputs}

    __call__ = run

    def _execute(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            inputs = {}  # device inputs must live until the stream is done with them
            for name, array in arrays.items():
                tensor = torch.from_numpy(np.ascontiguousarray(array)).to(
                    self.device, dtype=self.dtypes[name]
                )
                inputs[name] = tensor
                if not self.context.set_input_shape(name, tuple(tensor.shape)):
                    raise RuntimeError(f"TensorRT rejected shape {list(tensor.shape)} for input {name}")
                self.context.set_tensor_address(name, tensor.data_ptr())
            outputs = {}
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise RuntimeError(f"output {name} has an unresolved shape {shape}")
                outputs[name] = torch.empty(shape, dtype=self.dtypes[name], device=self.device)
                self.context.set_tensor_address(name, outputs[name].data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log above)")
            self.stream.synchronize()
            return {name: _to_numpy(name, tensor) for name, tensor in outputs.items()}

    def runner(self) -> Runner:
        """As an `export.verify.Runner` (feeds -> outputs in sidecar order)."""

        def run_feeds(feeds: Feeds) -> list[np.ndarray]:
            out = self.run(*(feeds[n] for n in INPUT_NAMES))
            return [out[n] for n in self.sidecar.outputs]

        return run_feeds

    def io_dtypes(self) -> dict[str, str]:
        """Tensor name -> numpy dtype name as the engine declares it (Triton's config needs these)."""
        return {name: str(dtype).replace("torch.", "") for name, dtype in self.dtypes.items()}


def pad_to(arrays: dict[str, np.ndarray], shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Right-pad [batch, sequence] inputs with masked padding up to `shape` (real outputs do not change)."""
    b, t = np.shape(arrays["input_ids"])
    if (b, t) == tuple(shape):
        return arrays
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


def _torch_dtype(trt, torch, dtype):
    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.INT32: torch.int32,
        trt.DataType.INT8: torch.int8,
        trt.DataType.BOOL: torch.bool,
    }
    for name, torch_type in (("INT64", torch.int64), ("BF16", torch.bfloat16), ("UINT8", torch.uint8)):
        if hasattr(trt.DataType, name):
            table[getattr(trt.DataType, name)] = torch_type
    if dtype not in table:
        raise RuntimeError(f"unsupported TensorRT tensor type {dtype}")
    return table[dtype]


def _to_numpy(name: str, tensor) -> np.ndarray:
    """Index outputs as int64 (TensorRT may compute TopK indices in int32), scores as float32."""
    array = tensor.cpu().numpy()
    return array.astype(np.int64) if name in INDEX_OUTPUTS else array.astype(np.float32)

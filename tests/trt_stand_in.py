"""Stand-ins for TensorRT and NVIDIA's cuda-bindings, which need an NVIDIA GPU: enough of both for
qa_core.runtime.gpu's stack checks, export.trt's build and `export.trt.runtime.TRTRunner` (and the server that
serves through it) to run for real on a CPU.

Device memory is host memory (ctypes buffers), so the runner's copies really move bytes, and the engine
computes simple functions of its inputs, so what comes back is checkable after padding and cutting.
The ``stand_in_stack`` fixture (tests/conftest.py) installs them for one test; a subprocess gets them
from ``trt_stand_in_site/sitecustomize.py`` on its PYTHONPATH.
"""

from __future__ import annotations

import ctypes
import enum
import gc
import shutil
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from export.trt import runtime as trt_runtime
from qa_core.contract import INPUT_NAMES
from qa_core.runtime.gpu_stacks import TENSORRT_VERSION
from qa_core.runtime.sidecar import TOKENIZER_FILES, Sidecar


class StandInStream:
    def __int__(self) -> int:
        return 7


class StandInCudart:
    """cuda-bindings' runtime as the runner and qa_core.runtime.gpu use it: every call returns (cudaError_t,
    values...); ``devices`` GPUs named "Stand-in GPU <ordinal>", or cudaGetDeviceCount failing with
    ``count_error``; versions as CUDA encodes them (12090 = 12.9). Device memory is host memory here
    (ctypes buffers), so copies really move bytes; ``set_devices`` records every cudaSetDevice."""

    class cudaError_t(enum.IntEnum):  # noqa: N801 - the binding's name
        cudaSuccess = 0
        cudaErrorInvalidValue = 1
        cudaErrorInsufficientDriver = 35
        cudaErrorNoDevice = 100
        cudaErrorInvalidDevice = 101

    # CUDA's own descriptions (cudaGetErrorString)
    DESCRIPTIONS = {
        0: b"no error",
        1: b"invalid argument",
        35: b"CUDA driver version is insufficient for CUDA runtime version",
        100: b"no CUDA-capable device is detected",
        101: b"invalid device ordinal",
    }

    class cudaMemcpyKind(enum.IntEnum):  # noqa: N801
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    def __init__(
        self,
        fail: str | None = None,
        *,
        devices: int = 1,
        count_error: str | None = None,
        driver_version: int = 12090,
        runtime_version: int = 12090,
    ) -> None:
        self.memory: dict[int, Any] = {}
        self.calls: list[str] = []
        self.set_devices: list[int] = []
        self.fail = fail
        self.devices, self.count_error = devices, count_error
        self.driver_version, self.runtime_version = driver_version, runtime_version

    def _result(self, call: str, *values: Any) -> tuple[Any, ...]:
        self.calls.append(call)
        if call == self.fail:
            return (self.cudaError_t.cudaErrorInvalidValue, *(None for _ in values))
        return (self.cudaError_t.cudaSuccess, *values)

    def cudaGetErrorString(self, err: Any) -> tuple[Any, bytes]:  # noqa: N802
        return (self.cudaError_t.cudaSuccess, self.DESCRIPTIONS.get(int(err), b"unknown error"))

    def cudaGetDeviceCount(self) -> tuple[Any, int]:  # noqa: N802
        if self.count_error is not None:
            return (self.cudaError_t[self.count_error], 0)
        return (self.cudaError_t.cudaSuccess, self.devices)

    def cudaDriverGetVersion(self) -> tuple[Any, int]:  # noqa: N802
        return (self.cudaError_t.cudaSuccess, self.driver_version)

    def cudaRuntimeGetVersion(self) -> tuple[Any, int]:  # noqa: N802
        return (self.cudaError_t.cudaSuccess, self.runtime_version)

    def cudaSetDevice(self, device: int) -> tuple[Any, ...]:  # noqa: N802
        self.set_devices.append(device)
        if not 0 <= device < self.devices:
            self.calls.append("cudaSetDevice")
            return (self.cudaError_t.cudaErrorInvalidDevice,)
        return self._result("cudaSetDevice")

    def cudaGetDeviceProperties(self, device: int) -> tuple[Any, ...]:  # noqa: N802
        name = f"Stand-in GPU {device}".encode() + b"\0\0\0"
        return self._result("cudaGetDeviceProperties", types.SimpleNamespace(name=name))

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
    """start = input_ids, end = input_ids x mask + segment, cls = -(sum of the unmasked ids): easy to check
    after pad/cut, and a QA head's outputs the server decodes into an answer: one paragraph token (the
    highest id; paragraph tokens have segment 0), answerable (a very negative cls logit)."""

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
        self._array("end_logits", shape)[:] = ids * mask + seg
        self._array("cls_logits", shape[:1])[:] = -(ids * mask).sum(axis=1)
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


class StandInTimingCache:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def serialize(self) -> bytes:
        return self.data + b"+tuned"


class StandInBuilderConfig:
    """IBuilderConfig as export.trt uses it. A serialized timing cache whose header does not match this
    TensorRT/GPU (anything but b"" and ``accepts``) is refused by set_timing_cache (False); ``unreadable``
    bytes give no cache at all. Like TensorRT's config, it does not own the cache it is given (the C++
    config keeps a pointer; the cache must outlive the build): it keeps a weak reference only."""

    def __init__(self, accepts: bytes = b"", unreadable: bytes = b"garbage") -> None:
        self.accepts, self.unreadable = accepts, unreadable
        self._cache: weakref.ref[StandInTimingCache] | None = None
        self.no_cache_after_build = False
        self.flags: set[str] = set()
        self.cleared: set[str] = set()
        self.pools: dict[str, int] = {}
        self.profiles: list[StandInProfile] = []

    @property
    def attached(self) -> StandInTimingCache | None:
        """The attached timing cache, if it is still alive."""
        return self._cache() if self._cache is not None else None

    def create_timing_cache(self, data: bytes) -> StandInTimingCache | None:
        return None if bytes(data) == self.unreadable else StandInTimingCache(bytes(data))

    def set_timing_cache(self, cache: StandInTimingCache, ignore_mismatch: bool) -> bool:
        if cache.data not in (b"", self.accepts) and not ignore_mismatch:
            return False
        self._cache = weakref.ref(cache)
        return True

    def get_timing_cache(self) -> StandInTimingCache | None:
        return None if self.no_cache_after_build else self.attached

    def set_memory_pool_limit(self, pool: str, size: int) -> None:
        self.pools[pool] = size

    def set_flag(self, flag: str) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: str) -> None:
        self.cleared.add(flag)

    def add_optimization_profile(self, profile: StandInProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class StandInProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

    def set_shape(self, name: str, low: tuple[int, ...], opt: tuple[int, ...], high: tuple[int, ...]) -> None:
        self.shapes[name] = (tuple(low), tuple(opt), tuple(high))


class StandInNetwork:
    """A network the parser filled from an ONNX file: its layers are not modelled (none to constrain)."""

    num_layers = 0

    def __init__(self, flags: int) -> None:
        self.flags = flags
        self.parsed: Any = None  # the onnx.ModelProto read
        self.parsed_file = ""


class StandInParser:
    """Reads the ONNX file for real (the network keeps the model), reports no errors."""

    num_errors = 0

    def __init__(self, network: StandInNetwork, logger: Any) -> None:
        self.network = network

    def parse_from_file(self, path: str) -> bool:
        import onnx  # not at import time: a server process imports this module, and needs no onnx

        self.network.parsed = onnx.load(path)
        self.network.parsed_file = Path(path).name
        return True


class StandInBuilder:
    """Records what each build was given, and whether the config's timing cache was still alive then;
    every builder made is in ``made`` (the module's ``builders``)."""

    made: list[StandInBuilder] = []

    def __init__(self, logger: Any) -> None:
        self.builds: list[dict[str, Any]] = []
        self.made.append(self)

    def create_network(self, flags: int) -> StandInNetwork:
        return StandInNetwork(flags)

    def create_builder_config(self) -> StandInBuilderConfig:
        return StandInBuilderConfig()

    def create_optimization_profile(self) -> StandInProfile:
        return StandInProfile()

    def build_serialized_network(self, network: StandInNetwork, config: StandInBuilderConfig) -> bytes:
        gc.collect()  # a cache nothing holds is gone by now, whatever the interpreter
        self.builds.append(
            {
                "network_flags": network.flags,
                "graph": network.parsed,
                "graph_file": network.parsed_file,
                "config_flags": set(config.flags),
                "timing_cache_alive": config.attached is not None,
            }
        )
        return b"serialized engine stand-in"


def stand_in_tensorrt(version: str, engine: Any) -> types.ModuleType:
    """A ``tensorrt`` module: the builder API export.trt uses and the runtime TRTRunner uses, whose
    ``deserialize_cuda_engine`` gives ``engine`` whatever the bytes."""
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
    trt.builders = []
    trt.Builder = type("Builder", (StandInBuilder,), {"made": trt.builders})
    trt.OnnxParser = StandInParser
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=STRONGLY_TYPED)
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    flags = ["TF32", "PREFER_PRECISION_CONSTRAINTS"] + (["FP16"] if version.startswith("10.") else [])
    trt.BuilderFlag = types.SimpleNamespace(**{f: f for f in flags})  # 11.x has no FP16 flag
    trt.float32, trt.float16 = "float32", "float16"
    return trt


STRONGLY_TYPED = 1  # NetworkDefinitionCreationFlag.STRONGLY_TYPED's value in TensorRT 10


def install(
    set_module: Callable[[str, Any], None],
    version: str = TENSORRT_VERSION,
    fail: str | None = None,
    **cudart_options: Any,
) -> tuple[StandInCudart, StandInEngine]:
    """TensorRT, cuda-bindings and GPUs, as far as qa_core.runtime.gpu and TRTRunner can tell: the stand-ins are
    imported as ``tensorrt`` and ``cuda.bindings.runtime`` (``set_module(name, module)`` puts them in
    sys.modules), so the stack checks run for real against them."""
    cudart = StandInCudart(fail, **cudart_options)
    engine = StandInEngine(cudart)
    set_module("tensorrt", stand_in_tensorrt(version, engine))
    for package in ("cuda", "cuda.bindings"):
        module = types.ModuleType(package)
        module.__path__ = []
        set_module(package, module)
    set_module("cuda.bindings.runtime", cudart)
    return cudart, engine


def fake_trt_export(
    directory: Path, version: str = TENSORRT_VERSION, *, tokenizer: Path | None = None, **trt: Any
) -> Path:
    """A TensorRT export directory with stand-in engine bytes (shallow head, profile 2x8 .. 4x64) and the
    tokenizer of ``tokenizer`` (a servable directory), else stand-in tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.engine").write_bytes(b"serialized engine stand-in")
    for name in TOKENIZER_FILES:
        if tokenizer is None:
            (directory / name).write_bytes(b"stand-in")
        else:
            shutil.copyfile(tokenizer / name, directory / name)
    shapes = {"min_shape": [2, 8], "opt_shape": [2, 32], "max_shape": [4, 64], "version": version} | trt
    fields = dict(model_file="model.engine", head="shallow", d_model=32, n_layer=2, vocab_size=100)
    fields |= dict(backend="tensorrt", precision="fp32", max_seq_len=64, max_query_len=16, doc_stride=32)
    Sidecar.from_dict({**fields, "trt": shapes}).save(directory)
    return directory


def fake_nvidia_smi(directory: Path, driver: str) -> Path:
    """An ``nvidia-smi`` answering the driver-version query for two GPUs, as the real one prints it."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = "--query-gpu=driver_version" ] && [ "$2" = "--format=csv,noheader" ] || exit 9\n'
        f"printf '{driver}\\n{driver}\\n'\n"
    )
    script.chmod(0o755)
    return directory

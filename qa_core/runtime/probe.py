"""Which onnxruntime execution providers really run here, and, when one does not, the likely reason.

``get_available_providers()`` lists the providers compiled into the wheel. A GPU provider whose CUDA,
cuDNN or TensorRT libraries do not load, or that finds no GPU, is dropped at session creation and the
session runs on the CPU, 20-100x slower, with one warning in onnxruntime's log. So this module

- loads the NVIDIA libraries a pip install brings before any GPU session (:func:`preload_gpu_libraries`:
  ``onnxruntime.preload_dlls()`` for the CUDA/cuDNN wheels, ``tensorrt_libs`` for TensorRT), because the
  loader path of a running process cannot be changed and these wheels are not on it. onnxruntime looks
  only beside itself; where it lives elsewhere (``pip install --target``, ``PYTHONPATH``) than the wheels
  (brought by torch, say), the other ``nvidia/`` directories on ``sys.path`` are handed to it too;
- opens a real tiny session per provider and reads back what it got (:func:`probe`);
- names the most likely cause when the first provider asked for is not the first one running
  (:func:`why_inactive`, :func:`fallback_problem`).

Torch-free (the server's GPU install has no torch).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import site
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qa_core.runtime.gpu import cuda_device_count, cuda_device_problem, installed_stack
from qa_core.runtime.gpu_stacks import TENSORRT_VERSION, GpuStack, stack_for_cuda
from qa_core.runtime.providers import (
    CUDA,
    GPU_PROVIDERS,
    TENSORRT,
    ProviderEntry,
    install_problem,
    installed_onnxruntime_wheels,
    provider_names,
)

# onnxruntime's own provider libraries, beside its Python extension (``onnxruntime/capi``).
PROVIDER_LIBRARIES = {
    CUDA: "libonnxruntime_providers_cuda.so",
    TENSORRT: "libonnxruntime_providers_tensorrt.so",
}
# The TensorRT libraries the provider opens by name; the tensorrt-cu12-libs wheel keeps them in
# ``tensorrt_libs/``, which is not on the loader path.
TENSORRT_LIBRARIES = ("libnvinfer.so", "libnvinfer_plugin.so", "libnvonnxparser.so")
# Where NVIDIA's pip wheels put their libraries under a site directory: CUDA 13 gathers the toolkit's
# libraries in nvidia/cu13/lib, CUDA 12 has one directory per component; cuDNN keeps nvidia/cudnn/lib.
CUDA12_COMPONENTS = ("cublas", "cuda_runtime", "cuda_nvrtc", "curand", "cufft")
DRIVER_LIBRARY = "libcuda.so.1"  # installed with the NVIDIA driver, never by a wheel
UNKNOWN = "onnxruntime could not create it here"
ORT_DEFAULT_LOG_SEVERITY = 2  # onnxruntime's default logger: warnings and up
ORT_QUIET = 4  # fatal only: the probe reports the reason itself, in one line


def onnxruntime_stack() -> GpuStack:
    """The pinned stack of the installed onnxruntime: the CUDA version it was built for
    (``onnxruntime.capi.build_and_package_info.cuda_version``), else its version's pin, else the default."""
    try:
        from onnxruntime.capi import build_and_package_info as info
    except ImportError:
        return installed_stack(None)
    major = str(getattr(info, "cuda_version", "") or "").split(".")[0]
    return stack_for_cuda(int(major) if major.isdigit() else None) or installed_stack(None)


def library_hint(provider: str) -> str:
    """What installs the libraries ``provider`` of the installed onnxruntime-gpu needs."""
    stack = onnxruntime_stack()
    cuda = stack.cuda_major
    if provider == TENSORRT:
        return (
            f"the TensorRT provider needs TensorRT {TENSORRT_VERSION} ({stack.tensorrt_package}, libnvinfer.so.10) "
            f"and the CUDA {cuda} libraries: make gpu-venv-tensorrt, or put TensorRT's lib directory on "
            "LD_LIBRARY_PATH"
        )
    return (
        f"this onnxruntime-gpu is built for CUDA {cuda} and needs the CUDA {cuda} and cuDNN 9 libraries: "
        f"pip install '.[{stack.extra}]' (make gpu-venv), or install CUDA {cuda} + cuDNN 9 system-wide and "
        "put them on LD_LIBRARY_PATH"
    )


def nvidia_library_dirs(cuda_major: int, paths: Iterable[str] | None = None) -> list[Path]:
    """The directories of NVIDIA's CUDA ``cuda_major`` and cuDNN wheels under the site directories in
    ``paths`` (default: ``sys.path`` and the site-packages of this interpreter), in that order."""
    if paths is None:
        paths = [*sys.path, *site.getsitepackages(), site.getusersitepackages()]
    names = [f"cu{cuda_major}"] if cuda_major >= 13 else list(CUDA12_COMPONENTS)
    found: list[Path] = []
    for entry in dict.fromkeys(paths):
        base = Path(entry or ".") / "nvidia"
        for name in [*names, "cudnn"]:
            lib = base / name / "lib"
            if lib.is_dir() and lib.resolve() not in {f.resolve() for f in found}:
                found.append(lib)
    return found


@dataclass
class Probe:
    """What onnxruntime gave for a provider list: the providers the session runs on, or the error."""

    requested: list[str]
    active: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The first provider asked for is the first one running."""
        return bool(self.active) and self.active[0] == self.requested[0]


def _quietly(call: Any, *args: Any, **kwargs: Any) -> tuple[Any, str]:
    """Run ``call`` with its ``print`` output captured (onnxruntime's preload helpers print failures)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = call(*args, **kwargs)
    return result, out.getvalue()


def tensorrt_library_dir() -> Path | None:
    """The ``tensorrt_libs`` package directory of the tensorrt-cu12-libs wheel, if installed."""
    spec = importlib.util.find_spec("tensorrt_libs")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def preload_tensorrt_libraries(directory: Path | None = None) -> list[str]:
    """Load libnvinfer & co. from the TensorRT wheel, so the provider's ``dlopen("libnvinfer.so.10")``
    finds them already loaded (the loader matches loaded libraries by soname). Returns problems."""
    directory = directory or tensorrt_library_dir()
    if directory is None:
        return []
    problems = []
    for stem in TENSORRT_LIBRARIES:
        candidates = sorted(directory.glob(stem + ".*"), key=lambda p: len(p.name))
        if not candidates:
            continue
        try:
            ctypes.CDLL(str(candidates[0]), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            problems.append(f"{candidates[0]}: {exc}")
    return problems


def preload_gpu_libraries(providers: Sequence[str]) -> list[str]:
    """Load what a pip install of the NVIDIA runtime wheels brings, for the GPU providers in ``providers``;
    returns one line per library that did not load (empty when nothing was needed or all loaded)."""
    if not any(p in GPU_PROVIDERS for p in providers):
        return []
    import onnxruntime as ort

    problems: list[str] = []
    if TENSORRT in providers:
        problems += preload_tensorrt_libraries()
    if hasattr(ort, "preload_dlls"):  # onnxruntime 1.21+
        problems += _preload_cuda_wheels(ort)
    return problems


def _preload_failures(ort: Any, **kwargs: Any) -> list[str]:
    """``onnxruntime.preload_dlls(**kwargs)``: the libraries it could not load, one line each."""
    try:
        _, printed = _quietly(ort.preload_dlls, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a preload problem is reported, the session decides
        printed = f"Failed to preload: {exc}"
    return [line.strip() for line in printed.splitlines() if line.startswith("Failed to")]


def _preload_cuda_wheels(ort: Any) -> list[str]:
    """onnxruntime's own search (the site directory it is installed in, then the loader path); where
    that misses libraries, each other NVIDIA wheel directory on sys.path in turn, then what is still
    missing by name (a library already loaded from a directory is found by its soname)."""
    failed = _preload_failures(ort)
    if not failed:
        return []
    for directory in nvidia_library_dirs(onnxruntime_stack().cuda_major):
        _preload_failures(ort, directory=str(directory))
    return _preload_failures(ort)


def provider_library_problem(provider: str) -> str | None:
    """The first library onnxruntime's provider library cannot find (``libcublasLt.so.13: cannot open
    shared object file``), by loading it as onnxruntime would; None when it loads."""
    import onnxruntime

    name = PROVIDER_LIBRARIES.get(provider)
    if name is None:
        return None
    path = Path(onnxruntime.__file__).parent / "capi" / name
    if not path.is_file():
        return f"{path.name} is not in this onnxruntime wheel"
    try:
        ctypes.CDLL(str(path))
    except OSError as exc:
        text = str(exc)
        if "undefined symbol" in text:  # its libraries were found; onnxruntime provides these symbols
            return None
        return f"{path.name} cannot load: {text.replace(str(path) + ': ', '')}"
    return None


def probe(entries: Sequence[ProviderEntry], model: str | Path | None = None, *, quiet: bool = True) -> Probe:
    """Open a real session on a tiny model with ``entries`` (names or (name, options)), with onnxruntime's
    own retry-on-another-provider switched off, and run it once: the providers it really got."""
    import numpy as np
    import onnxruntime as ort

    requested = provider_names(entries)
    compiled = set(ort.get_available_providers())
    entries = [e for e in entries if provider_names([e])[0] in compiled]  # no "not available" warnings
    if model is None:
        from onnxruntime.datasets import get_example

        model = get_example("sigmoid.onnx")  # shipped in every onnxruntime wheel
    if quiet:
        ort.set_default_logger_severity(ORT_QUIET)
    try:
        options = ort.SessionOptions()
        options.log_severity_level = ORT_QUIET if quiet else ORT_DEFAULT_LOG_SEVERITY
        session = ort.InferenceSession(str(model), options, providers=list(entries), enable_fallback=0)
        feeds = {
            i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
            for i in session.get_inputs()
        }
        session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types; the message is the fact
        return Probe(requested, error=first_line(exc))
    finally:
        if quiet:  # onnxruntime has no getter for it: back to its default, which nothing here changes
            ort.set_default_logger_severity(ORT_DEFAULT_LOG_SEVERITY)
    return Probe(requested, active=list(session.get_providers()))


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (onnxruntime's messages run to many lines, or none)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else repr(exc)


def why_inactive(provider: str, device_id: int = 0) -> str:
    """The most likely reason onnxruntime did not run ``provider``: the wrong wheel, a library that does
    not load, no usable GPU, in that order."""
    import onnxruntime as ort

    wheel = install_problem([provider], ort.get_available_providers(), installed_onnxruntime_wheels())
    if wheel:
        return wheel
    missing = provider_library_problem(provider)
    if missing and DRIVER_LIBRARY in missing:
        stack = onnxruntime_stack()
        return (
            f"{missing}; {DRIVER_LIBRARY} comes with the NVIDIA driver, and none is installed here "
            f"(this onnxruntime-gpu needs {stack.needed_driver})"
        )
    if missing:
        return f"{missing}; {library_hint(provider)}"
    if provider == TENSORRT:
        trt_missing = _tensorrt_library_problem()
        if trt_missing:
            return f"{trt_missing}; {library_hint(TENSORRT)}"
    device = cuda_device_problem() if provider in GPU_PROVIDERS else None
    if device:  # no GPU, or a driver too old for the CUDA runtime (and which)
        return device
    count = cuda_device_count() if provider in GPU_PROVIDERS else 0
    if provider in GPU_PROVIDERS and device_id >= count:
        return f"--device-id {device_id}, but this machine has {count} CUDA device(s), numbered from 0"
    return f"{UNKNOWN} (python -m export.stack_report --verbose shows onnxruntime's own log)"


def _tensorrt_library_problem() -> str | None:
    try:
        ctypes.CDLL("libnvinfer.so.10")
    except OSError as exc:
        return f"TensorRT does not load ({exc})"
    return None


def fallback_problem(result: Probe, advice: str = "", device_id: int = 0) -> str | None:
    """One line when the session does not run on the first provider asked for; None when it does."""
    if result.ok:
        return None
    asked = result.requested[0]
    cause = why_inactive(asked, device_id)
    if result.error is None:
        got = f"the session runs on {', '.join(result.active) or 'nothing'}"
    else:  # onnxruntime's message names its source file first; the cause says it better unless unknown
        got = f"the session failed ({result.error})" if cause.startswith(UNKNOWN) else "the session failed"
    line = f"onnxruntime was asked for {asked} but {got}: {cause}"
    return f"{line}; {advice}" if advice else line

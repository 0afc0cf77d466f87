"""Which onnxruntime is installed, which execution providers a session gets, with what options, and
which graph file they load. Torch-free: the server's ONNX backend and the GPU smoke script use it.

- Two wheels own the ``onnxruntime`` import package: ``onnxruntime`` (CPU) and ``onnxruntime-gpu``.
  With both installed the last one installed wins, and if that is the CPU one the CUDA and TensorRT
  providers silently vanish. :func:`install_problem` says so in one line, with the fix.
- ``auto`` means CUDA when onnxruntime-gpu sees a GPU, else CPU. The TensorRT provider only when asked
  for: it builds an engine per input-shape range, so it needs caches and a profile to serve well
  (:func:`tensorrt_options`).
- GPU providers load the export's portable graph: the offline-optimised ``model.onnx`` holds
  onnxruntime CPU contrib ops (``com.microsoft.FusedGemm``) that fall back to the CPU on a GPU provider
  and split the TensorRT provider's graph.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qa_core.contract import INPUT_NAMES

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)
# Short names a user may type (flags, env, config); full names pass through, any case.
PROVIDER_ALIASES = {"cpu": CPU, "cuda": CUDA, "tensorrt": TENSORRT, "trt": TENSORRT}
KNOWN_PROVIDERS = (CPU, CUDA, TENSORRT)
KNOWN_PROVIDERS_FASTEST_FIRST = (TENSORRT, CUDA, CPU)
ONNXRUNTIME_WHEELS = ("onnxruntime", "onnxruntime-gpu")
GPU_WHEEL = "onnxruntime-gpu"

ProviderEntry = str | tuple[str, dict[str, str]]
REINSTALL_GPU_WHEEL = (
    f"pip uninstall -y onnxruntime onnxruntime-gpu && pip install {GPU_WHEEL} (or: make gpu-venv)"
)
INT8_CPU_ONLY = "an int8 export runs on the CPU provider only (its quantized MatMuls have no GPU kernels)"


def canonical_provider(name: str) -> str:
    """``cuda`` / ``CUDA`` / ``CUDAExecutionProvider`` -> ``CUDAExecutionProvider``; ValueError naming
    the accepted spellings for anything else (a typo must not silently become "auto")."""
    key = name.strip().lower()
    if key in PROVIDER_ALIASES:
        return PROVIDER_ALIASES[key]
    for full in KNOWN_PROVIDERS:
        if key == full.lower():
            return full
    known = ", ".join([*PROVIDER_ALIASES, *KNOWN_PROVIDERS])
    raise ValueError(f"unknown onnxruntime provider {name.strip()!r}; use one of: {known}")


def parse_providers(text: str) -> list[str] | None:
    """A comma-separated provider list in full or short names, de-duplicated in order; None for ``auto``."""
    if text.strip().lower() == "auto":
        return None
    names = list(dict.fromkeys(canonical_provider(p) for p in text.split(",") if p.strip()))
    if not names:
        raise ValueError("no onnxruntime provider named (use 'auto', or e.g. 'cuda' or 'tensorrt,cuda')")
    order = [KNOWN_PROVIDERS_FASTEST_FIRST.index(n) for n in names]
    if order != sorted(order):  # onnxruntime gives each node to the first provider that takes it
        best = ",".join(sorted(names, key=KNOWN_PROVIDERS_FASTEST_FIRST.index))
        raise ValueError(
            f"providers {','.join(names)}: onnxruntime gives each node to the first provider that takes it, "
            f"so a faster one listed later gets (almost) nothing; list them fastest first: {best}"
        )
    return names


def installed_onnxruntime_wheels(distributions: Iterable[Any] | None = None) -> dict[str, str]:
    """Installed wheels that provide the ``onnxruntime`` package: {name: version}."""
    found: dict[str, str] = {}
    for dist in distributions if distributions is not None else importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in ONNXRUNTIME_WHEELS:
            found[name] = dist.version
    return found


def wheel_clash(wheels: Mapping[str, str]) -> str | None:
    """One line when both onnxruntime wheels are installed (whichever came last owns the package)."""
    if len(wheels) < 2:
        return None
    versions = ", ".join(f"{k} {v}" for k, v in sorted(wheels.items()))
    return (
        f"both {versions} are installed and share one import package, so the one installed last decides "
        f"which providers exist; {REINSTALL_GPU_WHEEL}"
    )


def install_problem(wanted: Sequence[str], available: Sequence[str], wheels: Mapping[str, str]) -> str | None:
    """One line on why the providers in ``wanted`` are not ``available``, naming the fix; None if all are."""
    missing = [p for p in wanted if p not in available]
    if not missing:
        return None
    gpu_missing = [p for p in missing if p in GPU_PROVIDERS]
    clash = wheel_clash(wheels)
    if gpu_missing and clash:
        return f"onnxruntime providers {missing} are missing (here: providers {list(available)}): {clash}"
    if gpu_missing and GPU_WHEEL not in wheels:
        return (
            f"onnxruntime providers {missing} need the {GPU_WHEEL} wheel, but this environment has "
            f"{', '.join(sorted(wheels)) or 'no onnxruntime wheel'} (providers {list(available)}); "
            f"{REINSTALL_GPU_WHEEL}"
        )
    return (
        f"onnxruntime providers {missing} are not available (have {list(available)}); for CUDA/TensorRT the "
        "NVIDIA driver, CUDA 12 and cuDNN/TensorRT libraries must load (onnxruntime logs why at session start)"
    )


@dataclass(frozen=True)
class ProfileShapes:
    """The TensorRT provider's optimisation profile for ``[batch, sequence]`` inputs."""

    max_batch: int
    max_seq_len: int
    opt_batch: int | None = None
    min_seq_len: int = 1  # qa_core.contract.shortest_sequence: k for the beam head's in-graph top-k

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_seq_len < 1:
            raise ValueError(f"profile max shape must be positive, got {self.max_batch}x{self.max_seq_len}")
        if not 1 <= self.min_seq_len <= self.max_seq_len:
            raise ValueError(f"profile min sequence {self.min_seq_len} must be in [1, {self.max_seq_len}]")
        if self.opt_batch is not None and not 1 <= self.opt_batch <= self.max_batch:
            raise ValueError(f"profile opt batch {self.opt_batch} must be in [1, {self.max_batch}]")

    def option(self, batch: int, seq: int) -> str:
        """``input_ids:BxT,attention_mask:BxT,token_type_ids:BxT`` (the provider's profile syntax)."""
        return ",".join(f"{name}:{batch}x{seq}" for name in INPUT_NAMES)


def tensorrt_options(
    profile: ProfileShapes, cache_dir: Path | None, fp16: bool, device_id: int = 0
) -> dict[str, str]:
    """TensorRT provider options for serving: one profile covering every batch the server forms (so no
    engine rebuild mid-serving), and engine + timing caches on disk (so no build at every start)."""
    opt_batch = profile.opt_batch or profile.max_batch
    options = {
        "device_id": str(device_id),
        "trt_fp16_enable": str(fp16),
        "trt_profile_min_shapes": profile.option(1, profile.min_seq_len),
        "trt_profile_opt_shapes": profile.option(opt_batch, profile.max_seq_len),
        "trt_profile_max_shapes": profile.option(profile.max_batch, profile.max_seq_len),
    }
    if cache_dir is not None:
        path = str(Path(cache_dir).resolve())
        options |= {
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": path,
            "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": path,
        }
    return options


def choose_providers(
    available: Sequence[str],
    requested: Sequence[str] | None,
    *,
    profile: ProfileShapes,
    trt_cache_dir: Path | None = None,
    trt_fp16: bool = False,
    device_id: int = 0,
    precision: str = "fp32",
    wheels: Mapping[str, str] | None = None,
    allow_fallback: bool = False,
) -> list[ProviderEntry]:
    """Providers (with options) for a session; raises ValueError with :func:`install_problem`'s line.

    ``requested`` None = auto: CUDA when available, else CPU. TensorRT only when named; CUDA and CPU
    are appended after it so the nodes TensorRT does not take still run. An int8 export (dynamic
    quantization: onnxruntime CPU kernels only) stays on the CPU under auto and is refused on a GPU.
    With ``allow_fallback`` the providers this wheel lacks are dropped (CPU last) instead of refused.
    """
    int8 = precision == "int8"
    if requested:
        if int8 and any(p in GPU_PROVIDERS for p in requested):
            gpu = [p for p in requested if p in GPU_PROVIDERS]
            raise ValueError(f"{INT8_CPU_ONLY}; export fp16 or fp32 for {gpu}")
        if wheels is None:
            wheels = installed_onnxruntime_wheels()
        problem = install_problem(requested, available, wheels)
        if problem and not allow_fallback:
            raise ValueError(problem)
        names = [p for p in dict.fromkeys(requested) if p in available] or [CPU]
        if TENSORRT in names:
            names += [p for p in (CUDA, CPU) if p in available and p not in names]
    else:
        names = [CUDA, CPU] if CUDA in available and not int8 else [CPU]
    entries: list[ProviderEntry] = []
    for name in names:
        if name == TENSORRT:
            entries.append((name, tensorrt_options(profile, trt_cache_dir, trt_fp16, device_id)))
        elif name == CUDA:
            entries.append((name, {"device_id": str(device_id)}))
        else:
            entries.append(name)
    return entries


def provider_names(entries: Sequence[ProviderEntry]) -> list[str]:
    return [e if isinstance(e, str) else e[0] for e in entries]


def gpu_graph(model_file: str, portable_model_file: str | None, precision: str) -> str:
    """The graph a GPU runtime (onnxruntime's GPU providers, Triton GPU instances) loads: the portable
    (standard-ops) one where the export has it; ValueError for an int8 export."""
    if precision == "int8":
        raise ValueError(INT8_CPU_ONLY)
    return portable_model_file or model_file


def graph_for(
    entries: Sequence[ProviderEntry],
    model_file: str,
    portable_model_file: str | None,
    precision: str = "fp32",
) -> str:
    """The graph file to load: :func:`gpu_graph` when a GPU provider leads, else ``model_file``."""
    names = provider_names(entries)
    if names and names[0] in GPU_PROVIDERS:
        return gpu_graph(model_file, portable_model_file, precision)
    return model_file

"""``python -m export.stack_report [--require-gpu] [--json]``: what this environment can run on.

Prints the onnxruntime wheels installed, the providers they have compiled in and, for each, whether it
really *runs* here: a tiny real session is opened per provider (after loading the NVIDIA pip wheels'
libraries, as the server does) and its active providers read back, because a compiled-in GPU provider
whose libraries or GPU are missing silently runs on the CPU. Also the CUDA version onnxruntime-gpu is
built for, the NVIDIA driver and the extra it needs, the NVIDIA library wheels found, TensorRT and CUDA
devices, next to the versions this project pins, and one line per problem. With ``--require-gpu`` any problem is exit 1
(``make gpu-venv-tensorrt`` ends with it, so a broken GPU install fails where it is made); ``--verbose``
lets onnxruntime's own log through. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence
from typing import Any

from qa_core.runtime.gpu import cuda_device_count, cuda_device_problem, nvidia_driver_version
from qa_core.runtime.gpu_stacks import (
    STACKS,
    TENSORRT_VERSION,
    driver_advice,
    stack_for_driver,
    tensorrt_version_problem,
)
from qa_core.runtime.providers import (
    CUDA,
    GPU_PROVIDERS,
    GPU_WHEEL,
    TENSORRT,
    install_problem,
    installed_onnxruntime_wheels,
    wheel_clash,
)

PROG = "python -m export.stack_report"


def _tensorrt_version() -> str | None:
    try:
        import tensorrt
    except (ImportError, OSError):
        return None
    return str(tensorrt.__version__)


def _onnxruntime() -> tuple[str | None, list[str]]:
    try:
        import onnxruntime as ort
    except ImportError:
        return None, []
    return str(ort.__version__), list(ort.get_available_providers())


def _onnxruntime_cuda() -> str | None:
    """The CUDA version the installed onnxruntime is built for ("13.0"); None for a CPU build."""
    try:
        from onnxruntime.capi import build_and_package_info as info
    except ImportError:
        return None
    return str(getattr(info, "cuda_version", "") or "") or None


def _nvidia_wheels() -> list[str]:
    """The NVIDIA library directories of the onnxruntime build's CUDA version found on sys.path."""
    from qa_core.runtime.probe import nvidia_library_dirs, onnxruntime_stack

    return [str(d) for d in nvidia_library_dirs(onnxruntime_stack().cuda_major)]


def provider_runs(providers: list[str], quiet: bool = True) -> dict[str, str | None]:
    """For each compiled-in GPU provider: None when a real tiny session runs on it, else why not."""
    from qa_core.runtime.probe import preload_gpu_libraries, probe, why_inactive
    from qa_core.runtime.providers import CPU

    found: dict[str, str | None] = {}
    for provider in (p for p in providers if p in GPU_PROVIDERS):
        preload_gpu_libraries([provider])
        result = probe([provider, CPU], quiet=quiet)
        found[provider] = None if result.ok else why_inactive(provider)
    return found


def collect(quiet: bool = True) -> dict[str, Any]:
    """The facts, as JSON-ready values."""
    ort_version, providers = _onnxruntime()
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "onnxruntime_wheels": installed_onnxruntime_wheels(),
        "onnxruntime": ort_version,
        "providers": providers,
        "gpu_providers_not_running": {k: v for k, v in provider_runs(providers, quiet).items() if v},
        "onnxruntime_cuda": _onnxruntime_cuda(),
        "nvidia_library_dirs": _nvidia_wheels() if GPU_WHEEL in installed_onnxruntime_wheels() else [],
        "driver": nvidia_driver_version(),
        "tensorrt": _tensorrt_version(),
        "cuda_devices": cuda_device_count(),
        "cuda_device_problem": cuda_device_problem(),
        "pinned": pinned(),
    }


def pinned() -> dict[str, Any]:
    """This project's pins, per GPU extra (qa_core/runtime/gpu_stacks.py)."""
    stacks = {
        s.extra: {
            "cuda": s.cuda_major,
            "onnxruntime-gpu": s.onnxruntime_gpu,
            "cuda-bindings": s.cuda_bindings,
            "tensorrt": s.tensorrt_wheel,
            "driver_minimum": s.driver_minimum,
        }
        for s in STACKS
    }
    return {"stacks": stacks, "tensorrt": TENSORRT_VERSION}


def running_gpu_providers(report: dict[str, Any]) -> list[str]:
    """Compiled-in GPU providers that really ran a session here."""
    broken = report.get("gpu_providers_not_running", {})
    return [p for p in report["providers"] if p in GPU_PROVIDERS and p not in broken]


def driver_mismatch(report: dict[str, Any]) -> str | None:
    """One line when onnxruntime-gpu is built for a newer CUDA than the NVIDIA driver here runs."""
    driver, built = report.get("driver"), report.get("onnxruntime_cuda")
    if not driver or not built or GPU_WHEEL not in report["onnxruntime_wheels"]:
        return None
    runs = stack_for_driver(driver)
    if runs is not None and int(built.split(".")[0]) <= runs.cuda_major:
        return None
    return f"{GPU_WHEEL} {report['onnxruntime_wheels'][GPU_WHEEL]} is built for CUDA {built}, but {driver_advice(driver)}"


def problems(report: dict[str, Any], require_gpu: bool) -> list[str]:
    """One line per thing that would break a GPU deployment (only the wheel clash and a driver too old
    for the onnxruntime-gpu build without --require-gpu)."""
    wheels: dict[str, str] = report["onnxruntime_wheels"]
    clash = wheel_clash(wheels)
    found: list[str] = [clash] if clash else []
    mismatch = driver_mismatch(report)
    if mismatch:
        found.append(mismatch)
    if not require_gpu:
        return found
    device = report.get("cuda_device_problem")
    if device or report["cuda_devices"] == 0:
        found.append(device or "no CUDA GPU is visible")
    line = install_problem([CUDA, TENSORRT], report["providers"], wheels)
    if line and not clash:  # with a clash, that line already says what install_problem would
        found.append(line)
    for provider, why in report.get("gpu_providers_not_running", {}).items():
        found.append(f"{provider} is compiled in but does not run here: {why}")
    pinned = report["pinned"]
    if report["tensorrt"] is None:
        found.append(f"TensorRT is not importable (pinned: TensorRT {pinned['tensorrt']})")
    elif tensorrt_version_problem(pinned["tensorrt"], report["tensorrt"]):
        found.append(f"TensorRT {report['tensorrt']} is not the pinned {pinned['tensorrt']}")
    pins = {extra: stack["onnxruntime-gpu"] for extra, stack in pinned["stacks"].items()}
    if wheels.get(GPU_WHEEL) not in (None, *pins.values()):
        named = ", ".join(f"{v} ({k})" for k, v in pins.items())
        found.append(f"{GPU_WHEEL} {wheels[GPU_WHEEL]} is not a pinned version: {named}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description="Report the onnxruntime / TensorRT / CUDA stack here.")
    p.add_argument("--require-gpu", action="store_true", help="exit 1 unless the GPU stack is complete")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", action="store_true", help="let onnxruntime's own log through while probing")
    args = p.parse_args(argv)
    report = collect(quiet=not args.verbose)
    found = problems(report, args.require_gpu)
    if args.json:
        print(json.dumps({**report, "problems": found}, indent=2))
    else:
        wheels = ", ".join(f"{k} {v}" for k, v in sorted(report["onnxruntime_wheels"].items())) or "none"
        print(f"python {report['python']} ({report['machine']})")
        print(
            f"onnxruntime wheels: {wheels}; compiled-in providers: {', '.join(report['providers']) or 'none'}"
        )
        running = running_gpu_providers(report)
        if running:
            print(f"GPU providers that run a session here: {', '.join(running)}")
        else:
            print("no onnxruntime provider runs on a GPU here: sessions get the CPU")
        for provider, why in report["gpu_providers_not_running"].items():
            print(f"  {provider}: compiled in, does not run: {why}")
        if report["onnxruntime_cuda"]:
            print(f"onnxruntime is built for CUDA {report['onnxruntime_cuda']}")
        if GPU_WHEEL in report["onnxruntime_wheels"]:
            dirs = report["nvidia_library_dirs"]
            print(f"NVIDIA library wheels: {', '.join(dirs) if dirs else 'none on sys.path'}")
        driver = report["driver"]
        print(
            driver_advice(driver)
            if driver
            else "NVIDIA driver: none (nvidia-smi, /proc/driver/nvidia/version)"
        )
        print(f"tensorrt: {report['tensorrt'] or 'not installed'}; CUDA devices: {report['cuda_devices']}")
        if report["cuda_device_problem"]:
            print(f"CUDA device: {report['cuda_device_problem']}")
        pinned = report["pinned"]
        stacks = "; ".join(
            f"{extra}: onnxruntime-gpu {s['onnxruntime-gpu']} (CUDA {s['cuda']}, driver >= {s['driver_minimum']})"
            for extra, s in pinned["stacks"].items()
        )
        print(f"pinned for GPUs: {stacks}; tensorrt {pinned['tensorrt']}")
        for line in found:
            print(f"PROBLEM: {line}", file=sys.stderr)
    return 1 if found and (args.require_gpu or len(report["onnxruntime_wheels"]) > 1) else 0


if __name__ == "__main__":
    sys.exit(main())

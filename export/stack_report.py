"""``python -m export.stack_report [--require-gpu] [--json]``: what this environment can run on.

Prints the onnxruntime wheels installed, the providers they have compiled in and, for each, whether it
really *runs* here: a tiny real session is opened per provider (after loading the NVIDIA pip wheels'
libraries, as the server does) and its active providers read back, because a compiled-in GPU provider
whose libraries or GPU are missing silently runs on the CPU. Also TensorRT and CUDA devices, next to the
versions this project pins, and one line per problem. With ``--require-gpu`` any problem is exit 1
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

from export.gpu_versions import ONNXRUNTIME_GPU_VERSION, TENSORRT_VERSION, tensorrt_version_problem
from export.runtime.gpu import cuda_device_count, cuda_device_problem
from export.runtime.providers import (
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


def provider_runs(providers: list[str], quiet: bool = True) -> dict[str, str | None]:
    """For each compiled-in GPU provider: None when a real tiny session runs on it, else why not."""
    from export.runtime.probe import preload_gpu_libraries, probe, why_inactive
    from export.runtime.providers import CPU

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
        "tensorrt": _tensorrt_version(),
        "cuda_devices": cuda_device_count(),
        "cuda_device_problem": cuda_device_problem(),
        "pinned": {"onnxruntime-gpu": ONNXRUNTIME_GPU_VERSION, "tensorrt": TENSORRT_VERSION},
    }


def running_gpu_providers(report: dict[str, Any]) -> list[str]:
    """Compiled-in GPU providers that really ran a session here."""
    broken = report.get("gpu_providers_not_running", {})
    return [p for p in report["providers"] if p in GPU_PROVIDERS and p not in broken]


def problems(report: dict[str, Any], require_gpu: bool) -> list[str]:
    """One line per thing that would break a GPU deployment (only the wheel clash without --require-gpu)."""
    wheels: dict[str, str] = report["onnxruntime_wheels"]
    clash = wheel_clash(wheels)
    found: list[str] = [clash] if clash else []
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
        found.append(f"TensorRT is not importable (pinned: tensorrt-cu12 {pinned['tensorrt']})")
    elif tensorrt_version_problem(pinned["tensorrt"], report["tensorrt"]):
        found.append(f"TensorRT {report['tensorrt']} is not the pinned {pinned['tensorrt']}")
    if wheels.get(GPU_WHEEL) not in (None, pinned["onnxruntime-gpu"]):
        found.append(f"{GPU_WHEEL} {wheels[GPU_WHEEL]} is not the pinned {pinned['onnxruntime-gpu']}")
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
        print(f"tensorrt: {report['tensorrt'] or 'not installed'}; CUDA devices: {report['cuda_devices']}")
        pinned = report["pinned"]
        print(f"pinned for GPUs: onnxruntime-gpu {pinned['onnxruntime-gpu']}, tensorrt {pinned['tensorrt']}")
        for line in found:
            print(f"PROBLEM: {line}", file=sys.stderr)
    return 1 if found and (args.require_gpu or len(report["onnxruntime_wheels"]) > 1) else 0


if __name__ == "__main__":
    sys.exit(main())

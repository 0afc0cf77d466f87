"""Write a Triton Inference Server model repository entry for an ONNX or TensorRT export.

The library behind ``python -m export.triton`` (`export.triton.cli` is its command line), callable without
argparse: ``write_repository(TritonOptions(onnx=..., out=...))``. Layout::

    REPO/<name>/config.pbtxt         platform onnxruntime_onnx | tensorrt_plan, dynamic batching
    REPO/<name>/1/model.onnx         (or 1/model.plan: the TensorRT engine)
    REPO/<name>/export.json          the export's sidecar (model_file "1/model.onnx"), for clients
    REPO/<name>/spiece.model, tokenizer_config.json

Triton owns the batch dimension (`max_batch_size`), so `dims` leave it out: per-token tensors are
`[-1]`, top-k outputs have their fixed k, and the per-example `cls_logits` ([batch] in the model) is
exposed as `[1]` with `reshape { shape: [] }`. The dynamic batcher only merges requests of equal
sequence length: clients should pad to `max_seq_len` (or to a few fixed lengths). Torch-free.

A TensorRT plan only loads on the TensorRT release that built it, so the plan's `trt.version` must match
the TensorRT inside the Triton container (`--triton-tensorrt`, default the version this project pins,
`qa_core.runtime.gpu_stacks`). Triton serves the plan's optimisation profile as it is: a request outside it is
rejected, not padded, so a plan whose profile starts above batch 1 or above the shortest sequence the
graph accepts is refused here.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.triton import pbtxt
from export.trt.profile import min_sequence
from qa_core.contract import INDEX_OUTPUTS, INPUT_NAMES
from qa_core.runtime.backends import ONNX, TRT
from qa_core.runtime.gpu_stacks import (
    TENSORRT_VERSION,
    TRITON_GUIDANCE,
    release_problem,
    tensorrt_version_problem,
)
from qa_core.runtime.providers import gpu_graph
from qa_core.runtime.sidecar import SIDECAR_FILE, TOKENIZER_FILES, Sidecar
from train.common.atomic_dir import atomic_directory
from train.common.dataclass_flags import flag

PLATFORMS = {ONNX: ("onnxruntime_onnx", "model.onnx"), TRT: ("tensorrt_plan", "model.plan")}
TRITON_TYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
CONFIG_FILE = "config.pbtxt"
DEFAULT_PREFERRED = (4, 8, 16)
INSTANCE_KINDS = ("gpu", "cpu")

Report = Callable[[str], None]


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 4,8,16, got {text!r}")
    return values


def tensorrt_version(text: str) -> str:
    if problem := release_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


@dataclass(frozen=True)
class TritonOptions:
    """Which export to serve and how Triton batches it; checked on construction (what needs the export's
    sidecar is checked when the repository is written). Each field is a flag of ``python -m export.triton``
    (:mod:`train.common.dataclass_flags`); paths are kept as given, so messages quote them as typed.

    `trt`: a TensorRT export built from `onnx`, served instead of the ONNX graph. `preferred_batch` None:
    4, 8, 16 up to `max_batch_size`. `triton_tensorrt`: the TensorRT version of the Triton container that
    serves a `trt` plan (it must match the plan's).
    """

    onnx: str | os.PathLike[str] = flag(help="ONNX export directory (python -m export.onnx)")
    out: str | os.PathLike[str] = flag(help="model repository directory")
    trt: str | os.PathLike[str] | None = flag(
        None, help="TensorRT export directory (python -m export.trt): serve the engine instead"
    )
    name: str = flag("xlnet_qa", help="model name in the repository")
    max_batch_size: int = flag(32)
    preferred_batch: Sequence[int] | None = flag(
        None, parse=int_list, help="comma-separated batch sizes (default: 4,8,16 up to the max)"
    )
    max_queue_delay_us: int = flag(500, help="dynamic batcher wait (microseconds)")
    instances: int = flag(1, help="model instances (instance_group count)")
    instance_kind: str = flag("gpu", choices=INSTANCE_KINDS)
    triton_tensorrt: str = flag(
        TENSORRT_VERSION,
        parse=tensorrt_version,
        metavar="VERSION",
        help="TensorRT version of the Triton container that serves a --trt plan (must match the plan's)",
    )

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"--name {self.name!r}: must be a plain directory name")
        for option, value in (("--max-batch-size", self.max_batch_size), ("--instances", self.instances)):
            if value < 1:
                raise ValueError(f"{option} must be >= 1, got {value}")
        if self.max_queue_delay_us < 0:
            raise ValueError("--max-queue-delay-us must be >= 0")
        if self.instance_kind not in INSTANCE_KINDS:
            raise ValueError(f"--instance-kind must be one of {INSTANCE_KINDS}, got {self.instance_kind!r}")
        if problem := release_problem(self.triton_tensorrt):
            raise ValueError(f"--triton-tensorrt: {problem}")
        preferred = self.preferred_batch
        if preferred is None:
            preferred = [b for b in DEFAULT_PREFERRED if b <= self.max_batch_size] or [self.max_batch_size]
        object.__setattr__(self, "preferred_batch", tuple(preferred))
        too_big = [b for b in preferred if b > self.max_batch_size]
        if too_big:
            raise ValueError(f"--preferred-batch {too_big} exceed --max-batch-size {self.max_batch_size}")

    @property
    def preferred(self) -> list[int]:
        """The preferred batch sizes (their default resolved)."""
        return list(self.preferred_batch or ())


def tensor_dims(name: str, sidecar: Sidecar) -> tuple[list[int], dict[str, Any] | None]:
    """Per-example dims (batch excluded) and an optional reshape for one model tensor."""
    if name in INPUT_NAMES or name in ("start_logits", "end_logits"):
        return [-1], None
    if name.startswith("start_top_"):
        return [sidecar.serving.start_n_top], None
    if name.startswith("end_top_"):
        return [sidecar.serving.start_n_top * sidecar.serving.end_n_top], None
    if name == "cls_logits":
        return [1], {"shape": []}
    raise ValueError(f"unknown tensor {name!r}")


def tensor_type(name: str, sidecar: Sidecar) -> pbtxt.Enum:
    """Triton data type: the engine's own I/O types when export.trt recorded them, else the ONNX contract."""
    recorded = ((sidecar.trt or {}).get("io_dtypes") or {}).get(name)
    if recorded:
        return pbtxt.Enum(TRITON_TYPES[recorded])
    return pbtxt.Enum("TYPE_INT64" if name in INPUT_NAMES or name in INDEX_OUTPUTS else "TYPE_FP32")


def model_config(sidecar: Sidecar, options: TritonOptions) -> dict[str, Any]:
    platform, _ = PLATFORMS[sidecar.backend]

    def tensor(name: str) -> dict[str, Any]:
        dims, reshape = tensor_dims(name, sidecar)
        entry: dict[str, Any] = {"name": name, "data_type": tensor_type(name, sidecar), "dims": dims}
        if reshape is not None:
            entry["reshape"] = reshape
        return entry

    return {
        "name": options.name,
        "platform": platform,
        "max_batch_size": options.max_batch_size,
        "input": [tensor(n) for n in INPUT_NAMES],
        "output": [tensor(n) for n in sidecar.outputs],
        "dynamic_batching": {
            "preferred_batch_size": options.preferred,
            "max_queue_delay_microseconds": options.max_queue_delay_us,
        },
        "instance_group": [
            {"count": options.instances, "kind": pbtxt.Enum(f"KIND_{options.instance_kind.upper()}")}
        ],
    }


def check_served(options: TritonOptions, sidecar: Sidecar) -> None:
    """The options against the export they serve: its graph on the instances, an engine's profile and TensorRT."""
    graph_file(sidecar, options)  # an int8 export on GPU instances is refused before anything is written
    if sidecar.backend == TRT:
        if options.instance_kind != "gpu":
            raise ValueError("a TensorRT engine runs on the GPU: --instance-kind must be gpu")
        engine_max = sidecar.max_batch_size or 0
        if options.max_batch_size > engine_max:
            raise ValueError(
                f"--max-batch-size {options.max_batch_size} exceeds the engine's profile ({engine_max}); rebuild "
                f"with a larger --max-shape or lower --max-batch-size"
            )
        check_plan(options, sidecar)


def check_plan(options: TritonOptions, sidecar: Sidecar) -> None:
    """A TensorRT plan Triton can load (same TensorRT release) and serve at every size (profile from 1)."""
    trt = sidecar.trt or {}
    built = str(trt.get("version") or "")
    if not built:
        raise ValueError(
            f"--trt {options.trt}: export.json records no trt.version, so the plan cannot be matched with Triton's "
            "TensorRT; rebuild it with python -m export.trt"
        )
    problem = tensorrt_version_problem(built, options.triton_tensorrt, where="Triton (--triton-tensorrt)")
    if problem:
        raise ValueError(f"--trt {options.trt}: {problem}")
    lo, need = trt["min_shape"], min_sequence(sidecar)
    if lo[0] > 1 or lo[1] > need:
        raise ValueError(
            f"--trt {options.trt}: the engine's profile starts at {lo[0]}x{lo[1]} and Triton rejects (does not pad) "
            f"smaller requests; rebuild it with python -m export.trt --min-shape 1x{need}"
        )


def graph_file(sidecar: Sidecar, options: TritonOptions) -> str:
    """The file Triton loads: on GPU instances an ONNX export's portable (standard-ops) graph, because the
    offline-optimised one holds onnxruntime CPU contrib ops that would run on the CPU there."""
    if sidecar.backend != "onnx" or options.instance_kind != "gpu":
        return sidecar.model_file
    try:
        return gpu_graph(sidecar.model_file, sidecar.portable_model_file, sidecar.precision)
    except ValueError as exc:
        raise ValueError(f"{exc}: use --instance-kind cpu, or export fp16/fp32 for GPU instances") from None


def served_export(options: TritonOptions) -> tuple[Path, Sidecar]:
    """The export directory Triton serves (the engine with `trt`, else the ONNX graph) and its sidecar."""
    onnx_sidecar = Sidecar.load(options.onnx)
    if onnx_sidecar.backend != "onnx":
        raise ValueError(f"--onnx {options.onnx}: is a {onnx_sidecar.backend!r} export")
    if not options.trt:
        return Path(options.onnx), onnx_sidecar
    sidecar = Sidecar.load(options.trt)
    if sidecar.backend != TRT:
        raise ValueError(f"--trt {options.trt}: is a {sidecar.backend!r} export")
    if (sidecar.head, sidecar.outputs) != (onnx_sidecar.head, onnx_sidecar.outputs):
        raise ValueError(
            f"--trt {options.trt} ({sidecar.head} head) was not built from --onnx ({onnx_sidecar.head})"
        )
    return Path(options.trt), sidecar


def write_repository(options: TritonOptions, report: Report = print) -> Path:
    """Write `out`/`name` (whole or not at all) and return it; ValueError when the export cannot be served."""
    source, sidecar = served_export(options)
    check_served(options, sidecar)
    platform, file_name = PLATFORMS[sidecar.backend]
    model_dir = Path(options.out) / options.name
    with atomic_directory(model_dir) as tmp:
        (tmp / "1").mkdir()
        shutil.copyfile(source / graph_file(sidecar, options), tmp / "1" / file_name)
        for name in TOKENIZER_FILES:
            shutil.copyfile(source / name, tmp / name)
        (tmp / CONFIG_FILE).write_text(pbtxt.dumps(model_config(sidecar, options)), encoding="utf-8")
        data = sidecar.to_dict()
        data.update(model_file=f"1/{file_name}", portable_model_file=None)
        served = Sidecar.from_dict(data)
        served.extra["triton"] = {
            "name": options.name,
            "platform": platform,
            "version": 1,
            "source_export": str(source.resolve()),
            "source_graph": graph_file(sidecar, options),
        }
        if sidecar.backend == TRT:
            served.extra["triton"]["tensorrt"] = options.triton_tensorrt
        served.save(tmp)
    report(f"wrote {model_dir}/: {CONFIG_FILE} ({platform}), 1/{file_name}, {SIDECAR_FILE}, tokenizer")
    if sidecar.backend == TRT:
        report(f"the plan was built with TensorRT {(sidecar.trt or {}).get('version')}: {TRITON_GUIDANCE}")
    return model_dir

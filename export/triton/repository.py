"""Write a Triton Inference Server model repository entry for an ONNX or TensorRT export.

    python -m export.triton --onnx exports/onnx [--trt exports/trt] --out triton_repo [--name xlnet_qa] \\
        [--max-batch-size 32] [--preferred-batch 4,8,16] [--max-queue-delay-us 500] [--instances 1] \\
        [--triton-tensorrt 10.14.1]

Layout::

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
`export.gpu_versions`). Triton serves the plan's optimisation profile as it is: a request outside it is
rejected, not padded, so a plan whose profile starts above batch 1 or above the shortest sequence the
graph accepts is refused here.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from export.gpu_versions import TENSORRT_VERSION, TRITON_GUIDANCE, tensorrt_release, tensorrt_version_problem
from export.runtime.providers import gpu_graph
from export.runtime.sidecar import SIDECAR_FILE, TOKENIZER_FILES, Sidecar
from export.triton import pbtxt
from export.trt.profile import min_sequence
from train.common.atomic_dir import atomic_directory
from train.common.cli import Parser, run
from train.common.contract import INDEX_OUTPUTS, INPUT_NAMES

PROG = "python -m export.triton"
PLATFORMS = {"onnx": ("onnxruntime_onnx", "model.onnx"), "tensorrt": ("tensorrt_plan", "model.plan")}
TRITON_TYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
CONFIG_FILE = "config.pbtxt"
DEFAULT_PREFERRED = (4, 8, 16)


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 4,8,16, got {text!r}")
    return values


def tensorrt_version(text: str) -> str:
    if tensorrt_release(text) is None:
        raise argparse.ArgumentTypeError(
            f"expected a TensorRT version MAJOR.MINOR.PATCH like 10.14.1, got {text!r}"
        )
    return text


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Write a Triton model repository entry for an export.")
    p.add_argument("--onnx", required=True, help="ONNX export directory (python -m export.onnx)")
    p.add_argument("--trt", help="TensorRT export directory (python -m export.trt): serve the engine instead")
    p.add_argument("--out", required=True, help="model repository directory")
    p.add_argument("--name", default="xlnet_qa", help="model name in the repository")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument(
        "--preferred-batch", type=int_list, help="comma-separated batch sizes (default: 4,8,16 up to the max)"
    )
    p.add_argument("--max-queue-delay-us", type=int, default=500, help="dynamic batcher wait (microseconds)")
    p.add_argument("--instances", type=int, default=1, help="model instances (instance_group count)")
    p.add_argument("--instance-kind", choices=("gpu", "cpu"), default="gpu")
    p.add_argument(
        "--triton-tensorrt",
        type=tensorrt_version,
        default=TENSORRT_VERSION,
        metavar="VERSION",
        help="TensorRT version of the Triton container that serves a --trt plan (must match the plan's)",
    )
    return p


def tensor_dims(name: str, sidecar: Sidecar) -> tuple[list[int], dict[str, Any] | None]:
    """Per-example dims (batch excluded) and an optional reshape for one model tensor."""
    if name in INPUT_NAMES or name in ("start_logits", "end_logits"):
        return [-1], None
    if name.startswith("start_top_"):
        return [sidecar.start_n_top], None
    if name.startswith("end_top_"):
        return [sidecar.start_n_top * sidecar.end_n_top], None
    if name == "cls_logits":
        return [1], {"shape": []}
    raise ValueError(f"unknown tensor {name!r}")


def tensor_type(name: str, sidecar: Sidecar) -> pbtxt.Enum:
    """Triton data type: the engine's own I/O types when export.trt recorded them, else the ONNX contract."""
    recorded = ((sidecar.trt or {}).get("io_dtypes") or {}).get(name)
    if recorded:
        return pbtxt.Enum(TRITON_TYPES[recorded])
    return pbtxt.Enum("TYPE_INT64" if name in INPUT_NAMES or name in INDEX_OUTPUTS else "TYPE_FP32")


def model_config(sidecar: Sidecar, args: argparse.Namespace) -> dict[str, Any]:
    platform, _ = PLATFORMS[sidecar.backend]

    def tensor(name: str) -> dict[str, Any]:
        dims, reshape = tensor_dims(name, sidecar)
        entry: dict[str, Any] = {"name": name, "data_type": tensor_type(name, sidecar), "dims": dims}
        if reshape is not None:
            entry["reshape"] = reshape
        return entry

    return {
        "name": args.name,
        "platform": platform,
        "max_batch_size": args.max_batch_size,
        "input": [tensor(n) for n in INPUT_NAMES],
        "output": [tensor(n) for n in sidecar.outputs],
        "dynamic_batching": {
            "preferred_batch_size": list(args.preferred_batch),
            "max_queue_delay_microseconds": args.max_queue_delay_us,
        },
        "instance_group": [
            {"count": args.instances, "kind": pbtxt.Enum(f"KIND_{args.instance_kind.upper()}")}
        ],
    }


def check_args(args: argparse.Namespace, sidecar: Sidecar) -> None:
    if not args.name or "/" in args.name or args.name.startswith("."):
        raise ValueError(f"--name {args.name!r}: must be a plain directory name")
    for flag, value in (("--max-batch-size", args.max_batch_size), ("--instances", args.instances)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.max_queue_delay_us < 0:
        raise ValueError("--max-queue-delay-us must be >= 0")
    if args.preferred_batch is None:
        args.preferred_batch = [b for b in DEFAULT_PREFERRED if b <= args.max_batch_size] or [
            args.max_batch_size
        ]
    too_big = [b for b in args.preferred_batch if b > args.max_batch_size]
    if too_big:
        raise ValueError(f"--preferred-batch {too_big} exceed --max-batch-size {args.max_batch_size}")
    graph_file(sidecar, args)  # an int8 export on GPU instances is refused before anything is written
    if sidecar.backend == "tensorrt":
        if args.instance_kind != "gpu":
            raise ValueError("a TensorRT engine runs on the GPU: --instance-kind must be gpu")
        engine_max = sidecar.max_batch_size or 0
        if args.max_batch_size > engine_max:
            raise ValueError(
                f"--max-batch-size {args.max_batch_size} exceeds the engine's profile ({engine_max}); rebuild with "
                f"a larger --max-shape or lower --max-batch-size"
            )
        check_plan(args, sidecar)


def check_plan(args: argparse.Namespace, sidecar: Sidecar) -> None:
    """A TensorRT plan Triton can load (same TensorRT release) and serve at every size (profile from 1)."""
    trt = sidecar.trt or {}
    built = str(trt.get("version") or "")
    if not built:
        raise ValueError(
            f"--trt {args.trt}: export.json records no trt.version, so the plan cannot be matched with Triton's "
            "TensorRT; rebuild it with python -m export.trt"
        )
    problem = tensorrt_version_problem(built, args.triton_tensorrt, where="Triton (--triton-tensorrt)")
    if problem:
        raise ValueError(f"--trt {args.trt}: {problem}")
    lo, need = trt["min_shape"], min_sequence(sidecar)
    if lo[0] > 1 or lo[1] > need:
        raise ValueError(
            f"--trt {args.trt}: the engine's profile starts at {lo[0]}x{lo[1]} and Triton rejects (does not pad) "
            f"smaller requests; rebuild it with python -m export.trt --min-shape 1x{need}"
        )


def graph_file(sidecar: Sidecar, args: argparse.Namespace) -> str:
    """The file Triton loads: on GPU instances an ONNX export's portable (standard-ops) graph, because the
    offline-optimised one holds onnxruntime CPU contrib ops that would run on the CPU there."""
    if sidecar.backend != "onnx" or args.instance_kind != "gpu":
        return sidecar.model_file
    try:
        return gpu_graph(sidecar.model_file, sidecar.portable_model_file, sidecar.precision)
    except ValueError as exc:
        raise ValueError(f"{exc}: use --instance-kind cpu, or export fp16/fp32 for GPU instances") from None


def write_repository(args: argparse.Namespace) -> int:
    onnx_sidecar = Sidecar.load(args.onnx)
    if onnx_sidecar.backend != "onnx":
        raise ValueError(f"--onnx {args.onnx}: is a {onnx_sidecar.backend!r} export")
    source, sidecar = Path(args.onnx), onnx_sidecar
    if args.trt:
        source, sidecar = Path(args.trt), Sidecar.load(args.trt)
        if sidecar.backend != "tensorrt":
            raise ValueError(f"--trt {args.trt}: is a {sidecar.backend!r} export")
        if (sidecar.head, sidecar.outputs) != (onnx_sidecar.head, onnx_sidecar.outputs):
            raise ValueError(
                f"--trt {args.trt} ({sidecar.head} head) was not built from --onnx ({onnx_sidecar.head})"
            )
    check_args(args, sidecar)
    platform, file_name = PLATFORMS[sidecar.backend]
    model_dir = Path(args.out) / args.name
    with atomic_directory(model_dir) as tmp:
        (tmp / "1").mkdir()
        shutil.copyfile(source / graph_file(sidecar, args), tmp / "1" / file_name)
        for name in TOKENIZER_FILES:
            shutil.copyfile(source / name, tmp / name)
        (tmp / CONFIG_FILE).write_text(pbtxt.dumps(model_config(sidecar, args)), encoding="utf-8")
        data = sidecar.to_dict()
        data.update(model_file=f"1/{file_name}", portable_model_file=None)
        served = Sidecar.from_dict(data)
        served.extra["triton"] = {
            "name": args.name,
            "platform": platform,
            "version": 1,
            "source_export": str(source.resolve()),
            "source_graph": graph_file(sidecar, args),
        }
        if sidecar.backend == "tensorrt":
            served.extra["triton"]["tensorrt"] = args.triton_tensorrt
        served.save(tmp)
    print(f"wrote {model_dir}/: {CONFIG_FILE} ({platform}), 1/{file_name}, {SIDECAR_FILE}, tokenizer")
    if sidecar.backend == "tensorrt":
        print(f"the plan was built with TensorRT {(sidecar.trt or {}).get('version')}: {TRITON_GUIDANCE}")
    return 0


def _main(argv: Sequence[str] | None) -> int:
    return write_repository(build_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: user errors -> one line and exit 2."""
    return run(_main, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())

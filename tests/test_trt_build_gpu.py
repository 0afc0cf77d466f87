"""The TensorRT build on an NVIDIA machine (marked gpu: skipped without one, and an error under
XLNETQA_REQUIRE_GPU=1): engines built from every head's fp32 and fp16 exports match PyTorch within the
tolerance of their precision. What can run on a CPU is in ``test_trt_build.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpu_mode import require_tensorrt

from export.onnx.verify import compare
from export.trt.cli import main
from export.trt.profile import min_sequence
from qa_core.contract import INPUT_NAMES
from qa_core.runtime.sidecar import Sidecar

# --- on an NVIDIA machine ------------------------------------------------------------------------------------
FP16_INDEX_AGREEMENT = 0.9  # fraction of beam top-k indices an fp16 engine must share with PyTorch fp32
LOGIT_SCALE = 8.0  # trained-like margins between the best spans (see harness.tiny_models.tiny_qa_checkpoint)


@pytest.fixture(scope="module")
def gpu_exports(tmp_path_factory, spm_dir):
    require_tensorrt()
    from harness.tiny_models import tiny_onnx_export

    root = tmp_path_factory.mktemp("trt")
    kw = {"logit_scale": LOGIT_SCALE}
    return {
        head: {
            "fp32": tiny_onnx_export(root / f"{head}-fp32", spm_dir, head, **kw),
            "fp16": tiny_onnx_export(
                root / f"{head}-fp16", spm_dir, head, export={"precision": "fp16"}, **kw
            ),
        }
        for head in ("shallow", "beam")
    }


def pytorch_reference(onnx_dir: Path, batches: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """PyTorch fp32 (QAInference) on the checkpoint the export was made from: the truth for every engine."""
    from export.onnx.torch_export import load_qa_checkpoint, torch_runner
    from export.onnx.verify import run_all
    from train.model.inference import QAInference

    loaded = load_qa_checkpoint(onnx_dir.with_name(onnx_dir.name + "-checkpoint"), None, print)
    reference = run_all(torch_runner(QAInference(loaded.model).eval()), batches)
    assert all(np.isfinite(x).all() for outs in reference for x in outs if x.dtype.kind == "f")
    return reference


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["shallow", "beam"])
@pytest.mark.parametrize(
    ("source", "flag", "tolerance"), [("fp32", False, 1e-3), ("fp32", True, 5e-2), ("fp16", False, 5e-2)]
)
def test_engine_matches_pytorch(gpu_exports, tmp_path, capsys, head, source, flag, tolerance):
    from export.onnx.verify import run_all, sample_batches
    from export.trt.runtime import TRTRunner
    from qa_core.tokenizer import XLNetTokenizer

    onnx_dir = gpu_exports[head][source]
    out, cache = tmp_path / "engine", tmp_path / "timing.cache"
    args = ["--onnx", str(onnx_dir), "--out", str(out), "--min-shape", "2x16", "--opt-shape", "2x64"]
    args += ["--max-shape", "4x384", "--timing-cache", str(cache), *(["--fp16"] if flag else [])]
    assert main(args) == 0
    printed = capsys.readouterr()
    assert "timing cache written" in printed.out and "sinusoid nodes matched" not in printed.err
    side = Sidecar.load(out)
    assert ("no sinusoid nodes in the graph" in printed.out) == (side.trt["path"] == "fp16-flag")
    assert side.backend == "trt" and side.verification["passed"] and cache.stat().st_size > 0
    assert side.precision == ("fp16" if flag or source == "fp16" else "fp32")
    assert side.trt["path"] in ("fp32", "fp16-flag", "strongly-typed") and side.trt["version"]
    assert side.trt["position_limit"] == 512 and side.trt["device"]
    engine = TRTRunner(out)
    batches = sample_batches(XLNetTokenizer.from_dir(out), [(1, 16), (3, 100), (4, 384)], seed=5)
    exact = side.precision == "fp32"
    got = run_all(engine.runner(), batches)
    result = compare(
        side.outputs, pytorch_reference(onnx_dir, batches), got, tolerance, exact_indices=exact, relative=True
    )
    print("\n".join(result.lines()))
    assert result.passed and not result.problems, result.problems  # relative: tolerance x max(1, |ref|)
    for name, fraction in result.fraction_equal.items():  # the beam head's top-k indices
        assert fraction >= (1.0 if exact else FP16_INDEX_AGREEMENT), (name, fraction)
    out_arrays = engine.run(*(batches[1][n] for n in INPUT_NAMES))
    assert list(out_arrays) == side.outputs and all(isinstance(v, np.ndarray) for v in out_arrays.values())
    short = {n: batches[0][n][:, :9] for n in INPUT_NAMES}  # below the profile's 2x16: padded, then cut
    short_result = compare(
        side.outputs,
        pytorch_reference(onnx_dir, [short]),
        run_all(engine.runner(), [short]),
        tolerance,
        exact_indices=exact,
        relative=True,
    )
    assert short_result.passed, short_result.problems
    with pytest.raises(ValueError, match="outside the engine's profile"):
        engine.run(*(np.ones((8, 16), dtype=np.int64) for _ in range(3)))
    engine.close()
    again = tmp_path / "again"  # the saved timing cache is loaded and reused; the default profile starts at 1
    args = ["--onnx", str(onnx_dir), "--out", str(again), "--opt-shape", "2x64", "--max-shape", "4x384"]
    assert main([*args, "--timing-cache", str(cache), *(["--fp16"] if flag else [])]) == 0
    printed = capsys.readouterr().out
    assert "timing cache loaded" in printed and "timing cache updated" in printed
    assert Sidecar.load(again).trt["min_shape"] == [1, min_sequence(side)]


# The onnxruntime GPU providers' tests (every node on the GPU, CPU-equal outputs): test_onnx_providers.py

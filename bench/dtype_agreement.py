"""``python -m bench.dtype_agreement``: do half-precision weights give the same answers as fp32?

The torch backend serves fp16 and bf16 (``--torch-dtype``, with or without CUDA graphs); logits that
differ by 0.1 say little about answers. This decodes real SQuAD questions with a trained checkpoint
in fp32 and in each half dtype (weights and activations cast, the server's cast, same device), both
decided by the checkpoint's own answerability rule and re-ranker, and reports the export agreement's
answer-level figures: identical answers (and where either answers), identical best spans, the same
no-answer decision, how many changed best spans were near-ties of fp32, the largest logit differences.

    python -m bench.dtype_agreement --checkpoint CKPT --data dev.json [--device cuda] [--dtypes fp16,bf16]

On a CPU fp16 and bf16 run (slowly; bf16 natively where the CPU has AVX-512 BF16); on a GPU they are
what the GPU rows of BENCHMARKS.md serve.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dtype_agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a fine-tuned QA checkpoint directory")
    p.add_argument("--data", type=Path, required=True, help="a SQuAD 2.0 json file of questions")
    p.add_argument("--dtypes", default="bf16,fp16", help="comma-separated: fp16, bf16")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--max-questions", type=int, default=0, help="the first N questions (0: all)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, help="also write the reports here")
    args = p.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if bad := [d for d in dtypes if d not in ("fp16", "bf16")]:
        p.error(f"--dtypes: unknown {bad}; choose fp16, bf16")
    if not args.data.is_file():
        p.error(f"--data {args.data}: no such file")

    import torch

    from bench.common import machine_line
    from bench.gpu_paths import cast_model
    from export.onnx.agreement import agreement
    from qa_core.contract import INPUT_NAMES, ModelSettings
    from qa_core.squad.answerability import from_metadata
    from server.backends.torch import torch_device_problem
    from train.model import checkpoint as ckpt_io
    from train.model.inference import QAInference

    if problem := torch_device_problem(args.device, flag="--device"):
        p.error(problem)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    try:
        loaded = ckpt_io.load(args.checkpoint)
    except (OSError, ValueError) as exc:
        p.error(f"--checkpoint {args.checkpoint}: {exc}")
    if not loaded.kind.startswith("qa:"):
        p.error(f"--checkpoint {args.checkpoint}: a {loaded.kind!r} model, not a fine-tuned QA model")
    reference = QAInference(loaded.model).to(device)
    settings = ModelSettings.from_metadata(loaded.metadata)
    decision = from_metadata(loaded.metadata)

    def runner(module: torch.nn.Module):
        @torch.inference_mode()
        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            outs = module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device) for n in INPUT_NAMES))
            return [o.float().cpu().numpy() if o.is_floating_point() else o.cpu().numpy() for o in outs]

        return run

    reports: dict[str, Any] = {"machine": machine_line(args.threads), "device": str(device)}
    reports["checkpoint"], reports["data"] = str(args.checkpoint), str(args.data)
    for dtype in dtypes:
        rep = agreement(
            str(args.data),
            loaded.tokenizer,
            reference.head,
            reference.names,
            runner(reference),
            runner(cast_model(reference, dtype)),
            settings,
            max_questions=args.max_questions or None,
            batch_size=args.batch_size,
            answerability=decision,
        )
        reports[dtype] = rep
        either = rep["identical_answers_where_either_answers"]
        print(
            f"{dtype} vs fp32 on {rep['questions']} questions ({rep['features']} windows, {device}): identical "
            f"answers {rep['identical_answers']:.4f} (where either answers, {rep['either_answered']}: "
            f"{either if either is None else round(either, 4)}), best span {rep['identical_best_span']:.4f} "
            f"({rep['best_span_changes']} changed, {rep['best_span_changes_at_near_ties']} at fp32 near-ties), "
            f"same decision {rep['identical_no_answer_decision']:.4f}; max |diff| "
            + ", ".join(f"{k} {v:.3g}" for k, v in rep["max_abs_diff"].items())
        )
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""QA inference glue shared by fine-tuning, evaluation and the torch server backend.

features -> padded batches -> model outputs -> `train.squad` decoding -> official metrics. The
decoding and featurisation are the torch-free ones the server uses, so what is measured offline is
what is served.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from train.contract import DEFAULTS
from train.squad import (
    Feature,
    Prediction,
    SquadExample,
    answers_and_na_probs,
    decode_all_head_outputs,
    evaluate,
    pad_batch,
    simple_null_logit,
)

DEFAULT_THRESHOLD = DEFAULTS.no_answer_threshold


@dataclass
class FeatureOutputs:
    """Per-feature model outputs in feature order (rows are numpy arrays of each feature's length)."""

    head: str
    start_logits: list[np.ndarray] = field(default_factory=list)
    end_logits: list[np.ndarray] = field(default_factory=list)
    cls_logits: list[float] = field(default_factory=list)
    start_top_log_probs: list[np.ndarray] = field(default_factory=list)
    start_top_index: list[np.ndarray] = field(default_factory=list)
    end_top_log_probs: list[np.ndarray] = field(default_factory=list)
    end_top_index: list[np.ndarray] = field(default_factory=list)


@torch.no_grad()
def predict_features(
    model,
    features: Sequence[Feature],
    *,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    progress: bool = False,
    precision: str = "fp32",
) -> FeatureOutputs:
    """Run the QA model over features in length-sorted batches (less padding), return per-feature rows."""
    from train.runtime import autocast

    model.eval()
    device = torch.device(device)
    head = model.head
    out = FeatureOutputs(head=head)
    order = sorted(range(len(features)), key=lambda i: len(features[i]))
    rows: dict[int, dict[str, Any]] = {}
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for idx in tqdm(batches, desc="predict", disable=not progress, dynamic_ncols=True):
        feats = [features[i] for i in idx]
        arrays = pad_batch(feats)
        tensors = {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}
        with autocast(precision, device):
            res = model(
                tensors["input_ids"],
                token_type_ids=tensors["token_type_ids"],
                attention_mask=tensors["attention_mask"],
                p_mask=tensors["p_mask"],
            )
        for j, i in enumerate(idx):
            n = len(features[i])
            if head == "beam":
                rows[i] = {
                    "stlp": res.start_top_log_probs[j].float().cpu().numpy(),
                    "sti": res.start_top_index[j].cpu().numpy(),
                    "etlp": res.end_top_log_probs[j].float().cpu().numpy(),
                    "eti": res.end_top_index[j].cpu().numpy(),
                    "cls": float(res.cls_logits[j]),
                }
            else:
                s = res.start_logits[j, :n].float().cpu().numpy()
                e = res.end_logits[j, :n].float().cpu().numpy()
                cls = (
                    float(res.cls_logits[j])
                    if res.cls_logits is not None
                    else simple_null_logit(s, e, features[i])
                )
                rows[i] = {"s": s, "e": e, "cls": cls}
    for i in range(len(features)):
        r = rows[i]
        out.cls_logits.append(r["cls"])
        if head == "beam":
            out.start_top_log_probs.append(r["stlp"])
            out.start_top_index.append(r["sti"])
            out.end_top_log_probs.append(r["etlp"])
            out.end_top_index.append(r["eti"])
        else:
            out.start_logits.append(r["s"])
            out.end_logits.append(r["e"])
    return out


def decode_outputs(
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    outputs: FeatureOutputs,
    *,
    n_best: int = DEFAULTS.n_best,
    max_answer_len: int = DEFAULTS.max_answer_len,
    threshold: float | None = None,
) -> dict[str, Prediction]:
    named: dict[str, Sequence[Any]] = {"cls_logits": outputs.cls_logits}
    if outputs.head == "beam":
        named |= {
            "start_top_log_probs": outputs.start_top_log_probs,
            "start_top_index": outputs.start_top_index,
            "end_top_log_probs": outputs.end_top_log_probs,
            "end_top_index": outputs.end_top_index,
        }
    else:
        named |= {"start_logits": outputs.start_logits, "end_logits": outputs.end_logits}
    kw: dict[str, Any] = {"n_best": n_best, "max_answer_len": max_answer_len, "threshold": threshold}
    return decode_all_head_outputs(outputs.head, examples, features, named, **kw)


@dataclass
class EvalResult:
    metrics: dict[str, float]
    predictions: dict[str, Prediction]
    threshold: float


def evaluate_predictions(
    examples: Sequence[SquadExample], predictions: dict[str, Prediction], threshold: float
) -> dict[str, float]:
    """Official SQuAD 2.0 numbers at `threshold` (exact/f1), plus best_exact/best_f1 from the na_probs."""
    best_spans, na_probs = answers_and_na_probs(predictions)
    scored = [ex for ex in examples if ex.qas_id in predictions]
    metrics = evaluate(scored, best_spans, na_probs, na_prob_thresh=threshold)
    metrics["threshold"] = threshold
    return metrics


def run_evaluation(
    model,
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    *,
    threshold: float | None = None,
    batch_size: int = 32,
    device="cpu",
    n_best: int = DEFAULTS.n_best,
    max_answer_len: int = DEFAULTS.max_answer_len,
    progress: bool = False,
) -> EvalResult:
    outputs = predict_features(model, features, batch_size=batch_size, device=device, progress=progress)
    thr = DEFAULT_THRESHOLD if threshold is None else threshold
    preds = decode_outputs(
        examples, features, outputs, n_best=n_best, max_answer_len=max_answer_len, threshold=thr
    )
    return EvalResult(metrics=evaluate_predictions(examples, preds, thr), predictions=preds, threshold=thr)


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False))
    os.replace(tmp, path)


def write_prediction_files(out_dir: Path, result: EvalResult) -> None:
    """predictions.json (id -> text, "" = no answer), na_probs.json, nbest.json, metrics.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    preds = result.predictions
    write_json_atomic(out_dir / "predictions.json", {q: p.text for q, p in preds.items()})
    write_json_atomic(out_dir / "na_probs.json", {q: p.no_answer_prob for q, p in preds.items()})
    nbest = {
        q: [
            {"text": e.text, "start": e.start, "end": e.end, "probability": e.probability, "score": e.score}
            for e in p.n_best
        ]
        for q, p in preds.items()
    }
    write_json_atomic(out_dir / "nbest.json", nbest)
    write_json_atomic(out_dir / "metrics.json", result.metrics)

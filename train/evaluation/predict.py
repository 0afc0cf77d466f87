"""QA inference glue shared by fine-tuning, evaluation, calibration and the experiments.

features -> padded batches -> model outputs -> `train.squad` decoding -> official metrics. The
decoding and featurisation are the torch-free ones the server uses, so what is measured offline is
what is served.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from qa_core.contract import TOKEN_OUTPUTS, WINDOW_AND_DECODING, ModelSettings
from qa_core.heads import head_spec
from qa_core.squad import (
    DEFAULT_DECODING,
    Answerability,
    Deciding,
    DecodeOptions,
    Feature,
    Prediction,
    SharedContextIndexes,
    SquadExample,
    answers_and_na_probs,
    decode_all_head_outputs,
    featurize_with,
    pad_batch,
    read_squad,
)
from qa_core.squad.answerability import from_metadata as answerability_from_metadata
from train.evaluation.options import EvaluationOptions
from train.model import checkpoint
from train.squad import evaluate
from train.squad.provenance import in_sample_warnings


@dataclass
class FeatureOutputs:
    """Per-feature model outputs in feature order, by the head's output names (the head registry's):
    per-token rows are numpy arrays of each feature's length, ``cls_logits`` floats."""

    head: str
    values: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in head_spec(self.head).outputs:
            self.values.setdefault(name, [])

    def __len__(self) -> int:
        return len(next(iter(self.values.values()), []))


def _feature_row(value: torch.Tensor, name: str, length: int) -> Any:
    """One feature's output as the decoder takes it: per-token rows cut to the feature's length."""
    if name == "cls_logits":
        return float(value)
    if name in TOKEN_OUTPUTS:
        value = value[:length]
    return value.float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()


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
    from train.engine.execution import autocast, to_tensors

    model.eval()
    device = torch.device(device)
    out = FeatureOutputs(head=model.head)
    names = tuple(out.values)
    order = sorted(range(len(features)), key=lambda i: len(features[i]))
    rows: dict[int, dict[str, Any]] = {}
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for idx in tqdm(batches, desc="predict", disable=not progress, dynamic_ncols=True):
        feats = [features[i] for i in idx]
        arrays = pad_batch(feats)
        tensors = to_tensors(arrays, device)
        with autocast(precision, device):
            res = model(
                tensors["input_ids"],
                token_type_ids=tensors["token_type_ids"],
                attention_mask=tensors["attention_mask"],
                p_mask=tensors["p_mask"],
            )
        for j, i in enumerate(idx):
            n = len(features[i])
            rows[i] = {name: _feature_row(getattr(res, name)[j], name, n) for name in names}
    for i in range(len(features)):
        for name in names:
            out.values[name].append(rows[i][name])
    return out


def decode_outputs(
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    outputs: FeatureOutputs,
    options: DecodeOptions = DEFAULT_DECODING,
) -> dict[str, Prediction]:
    named: Mapping[str, Sequence[Any]] = outputs.values
    return decode_all_head_outputs(outputs.head, examples, features, named, options)


def predict_checkpoint(
    loaded: Any, examples: Sequence[SquadExample], batch_size: int = 32, progress: bool = False
) -> dict[str, Prediction]:
    """A loaded fine-tuned checkpoint's predictions (``train.model.checkpoint.load``), with the windows and
    decoding its metadata records, decided by the default rule: the spans and scores that a stored or
    newly fitted answerability model then decides on."""
    return predict_ensemble([loaded], examples, batch_size, progress)


def average_outputs(members: Sequence[FeatureOutputs]) -> FeatureOutputs:
    """An ensemble's outputs: the members' start, end and cls logits averaged window by window (the
    members saw the same windows). The beam head keeps only top-k log-probabilities, which cannot be
    averaged across models, so it is refused."""
    if not members:
        raise ValueError("an ensemble needs at least one member")
    heads = {m.head for m in members}
    if len(heads) != 1 or not head_spec(members[0].head).averageable:
        raise ValueError(
            f"an ensemble averages start/end logits: one shallow or deep head, got {sorted(heads)}"
        )
    out = FeatureOutputs(head=members[0].head)
    for name, rows in out.values.items():
        for i in range(len(members[0])):
            if name == "cls_logits":
                rows.append(float(np.mean([m.values[name][i] for m in members])))
            else:
                rows.append(np.mean([m.values[name][i] for m in members], axis=0))
    return out


def predict_ensemble(
    members: Sequence[Any], examples: Sequence[SquadExample], batch_size: int = 32, progress: bool = False
) -> dict[str, Prediction]:
    """:func:`predict_checkpoint` for several fine-tuned checkpoints (seeds of one recipe) whose logits
    are averaged: they must share the tokenizer and the windows, so their windows line up."""
    first = members[0]
    settings = ModelSettings.from_metadata(first.metadata)
    for m in members[1:]:
        if m.tokenizer.fingerprint() != first.tokenizer.fingerprint():
            raise ValueError(f"{m.path}: another tokenizer than {first.path}'s; an ensemble shares one")
        if any(m.metadata.get(k) != first.metadata.get(k) for k in WINDOW_AND_DECODING):
            raise ValueError(f"{m.path}: other windows or decoding than {first.path}'s")
    features = featurize_with(examples, first.tokenizer, settings)
    outputs = [predict_features(m.model, features, batch_size=batch_size, progress=progress) for m in members]
    merged = outputs[0] if len(outputs) == 1 else average_outputs(outputs)
    return decode_outputs(examples, features, merged, DecodeOptions.of(settings))


@dataclass
class EvalResult:
    metrics: dict[str, Any]
    predictions: dict[str, Prediction]


def evaluate_predictions(examples: Sequence[SquadExample], predictions: Mapping[str, Prediction]) -> dict:
    """Official SQuAD 2.0 numbers of the decided answers (exact, f1, HasAns_*, NoAns_*), plus
    best_exact / best_f1 with the no-answer threshold searched on these very questions (an upper
    bound, as the original XLNet reports) and ``threshold``: the one the decisions used, when it was
    the same for every question (None under the expected-gain rule)."""
    scored = [ex for ex in examples if ex.qas_id in predictions]
    metrics: dict[str, Any] = evaluate(scored, {q: p.text for q, p in predictions.items()})
    best_spans, na_probs = answers_and_na_probs(predictions)
    searched = evaluate(scored, best_spans, na_probs)
    metrics |= {k: searched[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")}
    used = {p.threshold for p in predictions.values()}
    metrics["threshold"] = used.pop() if len(used) == 1 else None
    return metrics


def redecide(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    answerability: Answerability | None,
    threshold: float | None = None,
) -> dict[str, Prediction]:
    """The same spans decided under another answerability model or threshold (no model run)."""
    by_id = {ex.qas_id: ex for ex in examples}
    indexes = SharedContextIndexes(answerability)
    out = {}
    for q, p in predictions.items():
        ex = by_id[q]
        deciding = Deciding(answerability, ex.question, threshold, indexes(ex.context))
        out[q] = p.redecided(deciding, ex.context)
    return out


def run_evaluation(
    model,
    examples: Sequence[SquadExample],
    features: Sequence[Feature],
    options: DecodeOptions = DEFAULT_DECODING,
    *,
    batch_size: int = 32,
    device="cpu",
    progress: bool = False,
) -> EvalResult:
    """Predict, decode (``options.answerability`` decides; ``options.threshold`` overrides its rule)
    and score."""
    outputs = predict_features(model, features, batch_size=batch_size, device=device, progress=progress)
    preds = decode_outputs(examples, features, outputs, options)
    return EvalResult(metrics=evaluate_predictions(examples, preds), predictions=preds)


def _warn_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
    decisions = {
        q: {
            "answerable_prob": p.answerable_prob,
            "threshold": p.threshold,
            "is_impossible": p.is_impossible,
            "best_span": p.best_span_text,
            "cls_logit": p.null_logit,
            "null_log_prob": p.null_log_prob,
        }
        for q, p in preds.items()
    }
    write_json_atomic(out_dir / "decisions.json", decisions)
    nbest = {
        q: [
            {"text": e.text, "start": e.start, "end": e.end, "probability": e.probability, "score": e.score}
            for e in p.n_best
        ]
        for q, p in preds.items()
    }
    write_json_atomic(out_dir / "nbest.json", nbest)
    write_json_atomic(out_dir / "metrics.json", result.metrics)


def evaluate_checkpoint(
    options: EvaluationOptions, warn: Callable[[str], None] = _warn_on_stderr
) -> EvalResult:
    """Official SQuAD 2.0 scores of a fine-tuned checkpoint on ``options.data``, with the prediction files
    written to ``options.out`` (what ``python -m train.evaluate`` does; the study's evaluation stage calls
    it too).

    ``options.answerability`` is ``stored`` (the checkpoint's fitted model, if any) or ``cls``
    (sigmoid(cls_logit) against the stored threshold); ``options.threshold`` replaces the decision rule.
    Articles that make the scores in-sample are passed to ``warn`` as ``warning: ...`` lines and listed as
    ``in_sample`` in the metrics.
    """
    checkpoint_dir, threshold = options.checkpoint, options.threshold
    loaded = checkpoint.load(checkpoint_dir)
    if not loaded.kind.startswith("qa:"):
        raise ValueError(
            f"{checkpoint_dir} holds a {loaded.kind!r} model, not a QA model; fine-tune it first"
        )
    if loaded.tokenizer is None:
        raise ValueError(f"{checkpoint_dir} has no spiece.model")
    meta = loaded.metadata
    settings = ModelSettings.from_metadata(meta, **options.overrides)
    stored = (
        meta if options.answerability == "stored" else {k: v for k, v in meta.items() if k != "answerability"}
    )
    deciding = answerability_from_metadata(stored)
    examples = read_squad(options.data)
    warnings = in_sample_warnings(meta, deciding, examples, own_threshold=threshold is not None)
    for line in warnings:
        warn(f"warning: {line}")
    features = featurize_with(examples, loaded.tokenizer, settings)
    model = loaded.model.to(torch.device(options.device))
    decoding = DecodeOptions.of(settings, deciding, threshold)
    result = run_evaluation(
        model,
        examples,
        features,
        decoding,
        batch_size=options.batch_size,
        device=options.device,
        progress=options.progress,
    )
    result.metrics["in_sample"] = warnings
    write_prediction_files(options.out, result)
    return result

"""Check an exported model against a reference, output by output (torch-free: numpy + train.squad).

Inputs are realistic: windows of a real paragraph and questions in the XLNet SQuAD layout
``P <sep> Q <sep> <cls>`` built by :func:`qa_core.squad.featurize_one` and padded with :func:`pad_batch`,
plus a random-ids row with the same layout and padding, so masks, segments and the beam head's in-graph
p_mask all see what serving sends. Index outputs (beam top-k positions) are compared by equality; a
mismatch is tolerated only where the two scores tie within the tolerance (a swap of equal values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qa_core import contract
from qa_core.contract import INDEX_OUTPUTS, INPUT_NAMES
from qa_core.runtime.runner import Feeds, Runner
from qa_core.squad import featurize_one, pad_batch

DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((1, 16), (2, 64), (3, 200))
DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-2, "int8": 0.5}
# Which float output holds the scores of each index output (for the tie check).
SCORES_OF = {"start_top_index": "start_top_log_probs", "end_top_index": "end_top_log_probs"}
MASKED = -1e4  # scores at or below this are masked positions (p_mask), whatever the masking constant

SAMPLE_CONTEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in "
    "France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway who, under "
    "their leader Rollo, agreed to swear fealty to King Charles III of West Francia. Through generations of "
    "assimilation and mixing with the native Frankish and Roman-Gaulish populations, their descendants would "
    "gradually merge with the Carolingian-based cultures of West Francia. The distinct cultural and ethnic "
    "identity of the Normans emerged initially in the first half of the 10th century, and it continued to "
    "evolve over the succeeding centuries. The Norman dynasty had a major political, cultural and military "
    "impact on medieval Europe and even the Near East. The Normans were famed for their martial spirit and "
    "eventually for their Christian piety, becoming exponents of the Catholic orthodoxy into which they "
    "assimilated. They adopted the Gallo-Romance language of the Frankish land they settled, their dialect "
    "becoming known as Norman, Normaund or Norman French, an important literary language. The Duchy of "
    "Normandy, which they formed by treaty with the French crown, was a great fief of medieval France, and "
    "under Richard I of Normandy was forged into a cohesive and formidable principality in feudal tenure."
)
SAMPLE_QUESTIONS = (
    "In what country is Normandy located?",
    "When were the Normans in Normandy?",
    "From which countries did the Norse originate?",
    "Who was the Norse leader?",
    "What century did the Normans first gain their separate identity?",
)


def _random_row(length: int, vocab_size: int, rng: np.random.Generator) -> Feeds:
    """One `P <sep> Q <sep> <cls>` row of random piece ids, `length` real tokens."""
    n_q = int(rng.integers(1, max(2, length // 3)))
    n_p = max(1, length - n_q - 3)  # lengths under 5 cannot hold the layout; they come out at 5 and are cut
    low = 9 if vocab_size > 10 else 0
    ids = np.concatenate(
        [
            rng.integers(low, vocab_size, n_p),
            [contract.SEP_ID],
            rng.integers(low, vocab_size, n_q),
            [contract.SEP_ID, contract.CLS_ID],
        ]
    ).astype(np.int64)
    types = np.concatenate(
        [np.full(n_p + 1, contract.SEG_ID_A), np.full(n_q + 1, contract.SEG_ID_B), [contract.SEG_ID_CLS]]
    ).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}


def _pad_rows(rows: list[Feeds], length: int) -> Feeds:
    batch = {
        "input_ids": np.full((len(rows), length), contract.PAD_ID, dtype=np.int64),
        "attention_mask": np.zeros((len(rows), length), dtype=np.int64),
        "token_type_ids": np.full((len(rows), length), contract.SEG_ID_PAD, dtype=np.int64),
    }
    for i, row in enumerate(rows):
        k = min(length, len(row["input_ids"]))
        for name in INPUT_NAMES:
            batch[name][i, :k] = row[name][:k]
    return batch


def sample_batches(
    tokenizer, shapes: Sequence[Sequence[int]] = DEFAULT_SHAPES, vocab_size: int | None = None, seed: int = 0
) -> list[Feeds]:
    """One int64 feed dict per (batch, length): real windows first (a full one, then the shortest, padded by
    `pad_batch`), then random-ids rows of random lengths (right padded) to fill the batch."""
    rng = np.random.default_rng(seed)
    vocab_size = vocab_size or tokenizer.vocab_size
    out: list[Feeds] = []
    for b, t in shapes:
        max_query_len = max(1, min(64, t // 4))
        windows = [
            w
            for q in SAMPLE_QUESTIONS
            for w in featurize_one(q, SAMPLE_CONTEXT, tokenizer, t, max(1, t // 2), max_query_len)
        ] if t >= 8 else []  # fmt: skip
        windows.sort(key=len, reverse=True)
        real = [windows[0], windows[-1]][: min(b, 2)] if windows else []
        parts = [{k: v for k, v in pad_batch(real, pad_to=t).items() if k in INPUT_NAMES}] if real else []
        rows = [
            _random_row(int(rng.integers(min(t, max(8, t // 2)), t + 1)), vocab_size, rng)
            for _ in range(b - len(real))
        ]
        if rows:
            parts.append(_pad_rows(rows, t))
        out.append({k: np.concatenate([p[k] for p in parts]) for k in INPUT_NAMES})
    return out


@dataclass
class Comparison:
    """Per-output agreement of a candidate with a reference over several batches."""

    max_abs_diff: dict[str, float] = field(default_factory=dict)
    fraction_equal: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    tolerance: float = 0.0
    relative: bool = False
    scale: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        out = [
            f"  {name:22s} max |diff| {diff:.3g}"
            + (f"  (scale {self.scale[name]:.3g})" if name in self.scale else "")
            for name, diff in self.max_abs_diff.items()
        ]
        out += [f"  {name:22s} equal      {frac:.4f}" for name, frac in self.fraction_equal.items()]
        return out

    def summary(self, header: str) -> list[str]:
        """What a verification prints: ``header``, a line per output, and the verdict."""
        verdict = "passed" if self.passed else "FAILED: " + "; ".join(self.problems)
        return [header, *self.lines(), f"  -> {verdict}"]

    def record(self, shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
        """The verification as an export's sidecar records it (the caller adds what it compared against)."""
        out: dict[str, Any] = {
            "shapes": [list(s) for s in shapes],
            "max_abs_diff": self.max_abs_diff,
            "fraction_equal": self.fraction_equal,
            "tolerance": self.tolerance,
            "passed": self.passed,
        }
        if self.relative:
            out["tolerance_is_relative_to"] = self.scale
        return out


def compare(
    names: Sequence[str],
    reference: Sequence[Sequence[np.ndarray]],
    candidate: Sequence[Sequence[np.ndarray]],
    tolerance: float,
    exact_indices: bool = True,
    relative: bool = False,
) -> Comparison:
    """Compare per-batch output lists; `exact_indices=False` (fp16/int8) reports index agreement only.

    Scores that both sides mask (at or below MASKED) count as equal: fp32 masks with -1e30, fp16 with -65504.
    With `relative`, an output's tolerance is `tolerance * max(1, max |reference|)` (reduced precision errors
    grow with the values' magnitude).
    """
    result = Comparison(tolerance=tolerance, relative=relative)
    scale: dict[str, float] = {n: 1.0 for n in names if n not in INDEX_OUTPUTS}
    diffs: dict[str, float] = {n: 0.0 for n in names if n not in INDEX_OUTPUTS}
    equal: dict[str, list[float]] = {n: [] for n in names if n in INDEX_OUTPUTS}
    for ref_outs, got_outs in zip(reference, candidate, strict=True):
        ref = {n: np.asarray(x) for n, x in zip(names, ref_outs, strict=True)}
        got = {n: np.asarray(x) for n, x in zip(names, got_outs, strict=True)}
        bad_shapes = [n for n in names if ref[n].shape != got[n].shape]
        if bad_shapes:
            result.problems += [f"{n}: shape {got[n].shape} != reference {ref[n].shape}" for n in bad_shapes]
            continue
        for name in names:
            r, g = ref[name], got[name]
            rows = _same_start_rows(name, ref, got)
            if name in INDEX_OUTPUTS:
                same = r == g
                equal[name].append(float(same[rows].mean()) if same[rows].size else 1.0)
                scores = SCORES_OF[name]
                tie = np.abs(ref[scores].astype(np.float64) - got[scores].astype(np.float64)) <= tolerance
                if exact_indices and not (same | tie | ~rows).all():
                    result.problems.append(f"{name}: {int((~same & rows).sum())} positions differ (not ties)")
                continue
            if not np.all(np.isfinite(g)):
                result.problems.append(f"{name}: non-finite values")
            if not np.all(np.isfinite(r)):  # a broken reference must not make every comparison "pass"
                result.problems.append(f"{name}: non-finite reference values")
            keep = rows & ~((r <= MASKED) & (g <= MASKED))
            if keep.any():
                delta = np.abs(r[keep].astype(np.float64) - g[keep].astype(np.float64))
                diffs[name] = max(diffs[name], float(delta.max()))
                scale[name] = max(scale[name], float(np.abs(r[keep]).max()))
    result.max_abs_diff = diffs
    result.fraction_equal = {n: float(np.mean(v)) if v else 1.0 for n, v in equal.items()}
    result.scale = scale if relative else {}
    for name, diff in diffs.items():
        limit = tolerance * (scale[name] if relative else 1.0)
        if diff > limit:
            result.problems.append(f"{name}: max |diff| {diff:.3g} > tolerance {limit:.3g}")
    return result


def _same_start_rows(name: str, ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> np.ndarray:
    """Where an output is comparable: end top-k entries are conditioned on the start at the same rank, so
    they are compared only where both models picked the same start; every other output everywhere."""
    if not name.startswith("end_top_") or "start_top_index" not in ref:
        return np.ones(ref[name].shape, dtype=bool)
    same_start = ref["start_top_index"] == got["start_top_index"]  # [B, k1]
    k2 = ref[name].shape[1] // max(1, same_start.shape[1])
    return np.repeat(same_start, k2, axis=1)


def run_all(runner: Runner, batches: Sequence[Feeds]) -> list[list[np.ndarray]]:
    return [[np.asarray(x) for x in runner(feeds)] for feeds in batches]

"""One question's path through the server: featurize -> micro-batcher (backend) -> decode.

Featurizing and decoding are the same torch-free functions evaluation uses (``train.squad``), so an
answer from the server is exactly the answer ``featurize_one`` + ``decode`` give in-process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from server.batching import JobResult, MicroBatcher
from server.model_spec import ModelSpec
from train.squad import Feature, Prediction, decode, decode_beam, featurize_one, simple_null_logit
from train.squad.features import TokenizerLike

# Below this many characters featurizing/decoding inline is cheaper than a thread hop; above it,
# a thread keeps a long context from stalling the event loop.
_INLINE_CHARS = 2000


class RequestTimeout(RuntimeError):
    """Queue + inference took longer than ``request_timeout_s``."""


@dataclass(frozen=True)
class Question:
    """One answer request after validation."""

    question: str
    context: str
    top_k: int = 1
    max_answer_len: int | None = None
    threshold: float | None = None


@dataclass
class Answered:
    """A decoded prediction and where its time went (milliseconds)."""

    prediction: Prediction
    timing_ms: dict[str, float]
    windows: int


def decode_rows(
    head: str,
    context: str,
    features: Sequence[Feature],
    rows: Sequence[Mapping[str, np.ndarray]],
    *,
    n_best: int,
    max_answer_len: int,
    threshold: float,
) -> Prediction:
    """Decode one question from its windows' output rows, whatever the head."""
    kw = {"n_best": n_best, "max_answer_len": max_answer_len, "threshold": threshold}
    if head == "beam":
        cols = [
            [r[n] for r in rows]
            for n in ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index")
        ]
        cls = np.array([float(r["cls_logits"]) for r in rows])
        return decode_beam(context, features, *cols, cls, **kw)
    starts = [r["start_logits"] for r in rows]
    ends = [r["end_logits"] for r in rows]
    if head == "simple":
        cls = np.array([simple_null_logit(s, e, f) for s, e, f in zip(starts, ends, features, strict=True)])
    else:
        cls = np.array([float(r["cls_logits"]) for r in rows])
    return decode(context, features, starts, ends, cls, **kw)


class QAPipeline:
    """Answers questions with a tokenizer, a model spec and a running :class:`MicroBatcher`."""

    def __init__(
        self,
        spec: ModelSpec,
        tokenizer: TokenizerLike,
        batcher: MicroBatcher,
        *,
        n_best_pool: int = 20,
        threshold: float | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.n_best_pool = n_best_pool
        self.threshold = spec.no_answer_threshold if threshold is None else threshold
        self.timeout_s = timeout_s

    def featurize(self, question: str, context: str) -> list[Feature]:
        s = self.spec
        return featurize_one(question, context, self.tokenizer, s.max_seq_len, s.doc_stride, s.max_query_len)

    def _featurize_all(self, items: Sequence[Question]) -> tuple[list[list[Feature]], list[float]]:
        groups, times = [], []
        for q in items:
            t = time.perf_counter()
            groups.append(self.featurize(q.question, q.context))
            times.append((time.perf_counter() - t) * 1000)
        return groups, times

    def _decode_all(
        self, items: Sequence[Question], groups: Sequence[Sequence[Feature]], results: Sequence[JobResult]
    ) -> tuple[list[Prediction], list[float]]:
        preds, times = [], []
        for q, feats, res in zip(items, groups, results, strict=True):
            t = time.perf_counter()
            preds.append(
                decode_rows(
                    self.spec.head,
                    q.context,
                    feats,
                    res.rows,
                    n_best=max(self.n_best_pool, q.top_k),
                    max_answer_len=q.max_answer_len or self.spec.max_answer_len,
                    threshold=self.threshold if q.threshold is None else q.threshold,
                )
            )
            times.append((time.perf_counter() - t) * 1000)
        return preds, times

    async def answer_many(self, items: Sequence[Question]) -> list[Answered]:
        """Answer several questions; their windows are queued together (all admitted or none).

        Raises QueueFull/BatcherClosed (nothing queued), InferenceError (a batch holding one of
        them failed) or RequestTimeout.
        """
        t0 = time.perf_counter()
        inline = sum(len(q.context) + len(q.question) for q in items) <= _INLINE_CHARS
        if inline:
            groups, feat_ms = self._featurize_all(items)
        else:
            groups, feat_ms = await asyncio.to_thread(self._featurize_all, items)
        futures = self.batcher.submit_many(groups)
        try:
            results: list[JobResult] = await asyncio.wait_for(asyncio.gather(*futures), self.timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"no answer within {self.timeout_s:g} s (server overloaded)") from None
        finally:
            for f in futures:  # on any failure, stop the other questions' queued windows
                if not f.done():
                    f.cancel()
        if inline:
            preds, dec_ms = self._decode_all(items, groups, results)
        else:
            preds, dec_ms = await asyncio.to_thread(self._decode_all, items, groups, results)
        total = (time.perf_counter() - t0) * 1000
        return [
            Answered(
                prediction=p,
                timing_ms={
                    "featurize": round(fm, 3),
                    "queue": round(r.queue_s * 1000, 3),
                    "inference": round(r.inference_s * 1000, 3),
                    "decode": round(dm, 3),
                    "total": round(total, 3),
                },
                windows=len(g),
            )
            for p, r, g, fm, dm in zip(preds, results, groups, feat_ms, dec_ms, strict=True)
        ]

    async def answer(self, item: Question) -> Answered:
        return (await self.answer_many([item]))[0]

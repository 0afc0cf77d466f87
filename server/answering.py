"""One request's path through the server: limits -> featurize -> micro-batcher (backend) -> decode.

Featurizing and decoding are the same torch-free functions evaluation uses (``train.squad``), so an
answer from the server is exactly the answer ``featurize_one`` + ``decode`` give in-process.

Work is bounded before it is done: the characters the tokenizer will read (after NFKD, which can
expand one character into 18) are counted first, in C and with an early exit; the tokens next; the
windows last, before any of them is queued. Every limit counts the whole request (a batch sums its
items). Featurizing happens inside the request's deadline, in a thread of its own for long inputs, and
is skipped when the request gave up while it waited for that thread.
"""

from __future__ import annotations

import asyncio
import time
import unicodedata
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from server.batching import DeadlineUnreachable, JobResult, MicroBatcher, QueueFull
from server.model_spec import ModelSpec, decision_rule
from server.quotas import CallerBudget
from train.squad import Feature, Prediction, decode_head_outputs, featurize_encoded
from train.squad.features import TokenizerLike

# Below this many normalised characters featurizing/decoding inline is cheaper than a thread hop;
# above it, a thread keeps a long context from stalling the event loop.
_INLINE_CHARS = 2000


class RequestTimeout(RuntimeError):
    """Featurizing + queue + inference took longer than ``request_timeout_s``."""


class RejectedInput(ValueError):
    """The request is unanswerable as sent: too much work (``too_large``) or no tokens to read."""

    def __init__(self, kind: str, message: str, too_large: bool) -> None:
        super().__init__(message)
        self.kind, self.message, self.too_large = kind, message, too_large


@dataclass(frozen=True)
class WorkLimits:
    """Most work one request may ask for, summed over its questions (see server.settings)."""

    max_normalized_chars: int = 65536
    max_tokens: int = 16384
    max_windows: int = 128

    @property
    def max_featurize_backlog(self) -> int:
        """Normalised characters that may wait for the featurizing thread: 32 maximal requests, a few
        seconds of tokenizing (~1.5 us per character), well inside a request's deadline."""
        return 32 * self.max_normalized_chars


def normalized_length(text: str) -> int:
    """Characters the tokenizer reads: NFKD expands ligatures and compatibility characters."""
    return len(text) if text.isascii() else len(unicodedata.normalize("NFKD", text))


def _covers_text(offsets: Sequence[tuple[int, int]]) -> bool:
    """Does any token stand for a character? (A bare word-start marker or nothing at all does not.)"""
    return any(end > start for start, end in offsets)


def _where(items: Sequence, i: int) -> str:
    return f"items[{i}]." if len(items) > 1 else ""


def _too_large(kind: str, what: str, measured: int, partial: bool, limit: int, setting: str) -> RejectedInput:
    """413 text naming the limit and what was measured (a lower bound when counting stopped early)."""
    amount = f"at least {measured}" if partial else str(measured)
    return RejectedInput(kind, f"the request has {amount} {what}; the limit is {limit} ({setting})", True)


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
    rule: str  # what set the prediction's threshold (AnswerResponse.rule)


class AnswerService:
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
        limits: WorkLimits | None = None,
    ) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.batcher = batcher
        self.n_best_pool = n_best_pool
        self.threshold = threshold  # the server's own no-answer threshold, replacing the model's rule
        self.timeout_s = timeout_s
        self.limits = limits or WorkLimits()
        # One thread: long inputs are tokenized one at a time, so a flood of them cannot take every core.
        self._featurizer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="featurize")
        self._backlog_chars = 0  # normalised characters waiting for (or in) the featurizing thread

    def close(self) -> None:
        self._featurizer.shutdown(wait=False, cancel_futures=True)

    def check_text_size(self, items: Sequence[Question]) -> int:
        """The cheap check, before any tokenizing: characters after normalisation, summed (returned)."""
        limit, total = self.limits.max_normalized_chars, 0
        for i, q in enumerate(items):
            total += normalized_length(q.question) + normalized_length(q.context)
            if total > limit:
                raise _too_large(
                    "too_many_characters", "characters after Unicode normalisation (NFKD)", total,
                    i < len(items) - 1, limit, "max_normalized_chars",
                )  # fmt: skip
        return total

    def featurize_checked(self, items: Sequence[Question]) -> tuple[list[list[Feature]], list[float]]:
        """Windows of every question, refusing (RejectedInput) empty texts, too many tokens or windows."""
        s, limits = self.spec.serving, self.limits
        encoded, seconds, tokens = [], [], 0
        for i, q in enumerate(items):
            t = time.perf_counter()
            question_ids, question_offsets = self.tokenizer.encode_with_offsets(q.question)
            n_question = len(question_ids)
            if not _covers_text(question_offsets):
                message = f"{_where(items, i)}question has no tokens after normalisation"
                raise RejectedInput("empty_question", message, too_large=False)
            ids, offsets = self.tokenizer.encode_with_offsets(q.context)
            if not _covers_text(offsets):
                message = f"{_where(items, i)}context has no tokens after normalisation"
                raise RejectedInput("empty_context", message, too_large=False)
            tokens += n_question + len(ids)
            if tokens > limits.max_tokens:
                last = i == len(items) - 1
                raise _too_large(
                    "too_many_tokens", "tokens", tokens, not last, limits.max_tokens, "max_request_tokens"
                )
            encoded.append((ids, offsets))
            seconds.append(time.perf_counter() - t)
        groups, windows = [], 0
        for i, (q, (ids, offsets)) in enumerate(zip(items, encoded, strict=True)):
            t = time.perf_counter()
            features = featurize_encoded(
                q.question, ids, offsets, self.tokenizer, s.max_seq_len, s.doc_stride, s.max_query_len
            )
            windows += len(features)
            if windows > limits.max_windows:
                raise _too_large(
                    "too_many_windows", f"windows of {s.max_seq_len} tokens", windows, i < len(items) - 1,
                    limits.max_windows, "max_request_windows",
                )  # fmt: skip
            groups.append(features)
            seconds[i] += time.perf_counter() - t
        return groups, [x * 1000 for x in seconds]

    async def _featurize(
        self, items: Sequence[Question], normalized: int, inline: bool
    ) -> tuple[list[list[Feature]], list[float]]:
        """Short inputs inline; long ones in the featurizing thread, whose backlog (in normalised
        characters) is bounded: beyond it the request is refused (QueueFull) rather than queued."""
        if inline:
            return self.featurize_checked(items)
        if self._backlog_chars + normalized > self.limits.max_featurize_backlog:
            raise QueueFull(f"{self._backlog_chars} characters are waiting to be tokenized")
        given_up = False

        def work() -> tuple[list[list[Feature]], list[float]] | None:
            return None if given_up else self.featurize_checked(items)

        self._backlog_chars += normalized
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._featurizer, work)
        except asyncio.CancelledError:
            given_up = True  # still waiting for the thread: it skips this request
            raise
        finally:
            self._backlog_chars -= normalized
        assert result is not None
        return result

    def decided_by(self, q: Question) -> tuple[float | None, str]:
        """The threshold on p(no answer) that replaces the model's rule for ``q`` (the request's, else
        the server's; None: the model's rule decides) and its name, AnswerResponse.rule."""
        if q.threshold is not None:
            return q.threshold, "request"
        if self.threshold is not None:
            return self.threshold, "server"
        return None, decision_rule(self.spec.decision)

    def _decode_all(
        self, items: Sequence[Question], groups: Sequence[Sequence[Feature]], results: Sequence[JobResult]
    ) -> tuple[list[Prediction], list[float]]:
        preds, times = [], []
        for q, feats, res in zip(items, groups, results, strict=True):
            t = time.perf_counter()
            preds.append(
                decode_head_outputs(
                    self.spec.head,
                    q.context,
                    feats,
                    res.rows,
                    n_best=max(self.n_best_pool, q.top_k),
                    max_answer_len=q.max_answer_len or self.spec.serving.max_answer_len,
                    threshold=self.decided_by(q)[0],
                    answerability=self.spec.decision,
                    question=q.question,
                )
            )
            times.append((time.perf_counter() - t) * 1000)
        return preds, times

    async def answer_many(
        self, items: Sequence[Question], tag: str = "", budget: CallerBudget | None = None
    ) -> list[Answered]:
        """Answer one request's questions; their windows are queued together (all admitted or none).

        Raises RejectedInput (nothing queued), QueueFull/BatcherClosed/BatcherUnhealthy (nothing
        queued), InferenceError (a batch holding one of them failed) or RequestTimeout. Cancelling it
        (client gone) drops its windows that are still queued. ``budget`` (the caller's per-key limits)
        is charged the request's windows before they are queued (OverLimit: nothing queued) and given
        them back when they are done.
        """
        t0 = time.perf_counter()
        self.batcher.check_admission()  # cheap checks first: no tokenizing for a request that cannot run
        normalized = self.check_text_size(items)
        inline = normalized <= _INLINE_CHARS
        futures: list[asyncio.Future] = []

        async def featurize_and_infer() -> tuple[list[list[Feature]], list[float], list[JobResult]]:
            groups, feat_ms = await self._featurize(items, normalized, inline)
            if time.perf_counter() >= t0 + self.timeout_s:  # spent while tokenizing: a timeout, not overload
                raise asyncio.TimeoutError
            if budget is not None:
                budget.acquire(sum(len(g) for g in groups))
            futures.extend(self.batcher.submit_many(groups, tag=tag, deadline=t0 + self.timeout_s))
            return groups, feat_ms, list(await asyncio.gather(*futures))

        try:
            groups, feat_ms, results = await asyncio.wait_for(featurize_and_infer(), self.timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"no answer within {self.timeout_s:g} s (server overloaded)") from None
        except DeadlineUnreachable:
            raise RequestTimeout(
                f"no answer possible within {self.timeout_s:g} s at the current load (server overloaded)"
            ) from None
        finally:
            for f in futures:  # on any failure, stop the other questions' queued windows
                if not f.done():
                    f.cancel()
            if budget is not None:
                budget.release()
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
                rule=self.decided_by(q)[1],
            )
            for q, p, r, g, fm, dm in zip(items, preds, results, groups, feat_ms, dec_ms, strict=True)
        ]

    async def answer(self, item: Question) -> Answered:
        return (await self.answer_many([item]))[0]

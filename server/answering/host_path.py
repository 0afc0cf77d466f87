"""The host's part of answering, apart from any engine: text in, windows out; output rows in, answers out.

Featurizing and decoding are the same torch-free functions evaluation uses (``train.squad``), so an
answer from the server is exactly the answer ``featurize_one`` + ``decode`` give in-process. Work is
bounded before it is done: the characters the tokenizer will read (after NFKD, which can expand one
character into 18) are counted first, in C and with an early exit; the tokens next; the windows last,
before any of them is queued. Every limit counts the whole request (a batch sums its items).

A context the same caller sent recently is not tokenized again (:mod:`server.answering.context_cache`), and
its sentence index, which a lexical answerability rule reads, is built once. The question's own
tokens are encoded once and reused for its windows.

Plain synchronous code with no event loop: :class:`server.answering.request_path.AnswerService` runs it around
the engine; ``bench.serve`` times it in-process as "the server's work minus HTTP".
"""

from __future__ import annotations

import functools
import time
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qa_core.contract import MAX_N_BEST
from qa_core.squad import DecodeOptions, Feature, Prediction, decode_head_outputs, featurize_encoded
from qa_core.squad.alignment import offsets_array
from qa_core.squad.answerability_features import QuestionMatch
from qa_core.squad.features import TokenizerLike
from server.answering.context_cache import KEY_SHARE, ContextCache, EncodedContext, context_key
from server.answering.model_spec import ModelSpec, decision_rule
from server.door.auth import keys_configured
from server.settings import ServerSettings

PreparedDecisions = list[QuestionMatch | None]
"""Per question of a request, what :meth:`HostPath.prepare_decisions` computed ahead (None: nothing)."""


class RejectedInput(ValueError):
    """The request is unanswerable as sent: too much work (``too_large``) or no tokens to read.
    ``work``: the windows' worth of tokenizing already done when it was refused (charged to the
    caller all the same: refusing after the work must not make the work free)."""

    def __init__(self, kind: str, message: str, too_large: bool, work: int = 0) -> None:
        super().__init__(message)
        self.kind, self.message, self.too_large, self.work = kind, message, too_large, work


Featurized = tuple[list[list[Feature]], list[float], list[EncodedContext]]
"""Per question: its windows, the milliseconds featurizing took, its encoded context."""


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


def _covers_offsets(offsets: np.ndarray) -> bool:
    """:func:`_covers_text` for an ``[n, 2]`` offsets array."""
    return bool((offsets[:, 1] > offsets[:, 0]).any())


def _where(items: Sequence, i: int) -> str:
    return f"items[{i}]." if len(items) > 1 else ""


def _too_large(
    kind: str, what: str, measured: int, partial: bool, limit: int, setting: str, work: int = 0
) -> RejectedInput:
    """413 text naming the limit and what was measured (a lower bound when counting stopped early)."""
    amount = f"at least {measured}" if partial else str(measured)
    message = f"the request has {amount} {what}; the limit is {limit} ({setting})"
    return RejectedInput(kind, message, True, work)


@dataclass(frozen=True)
class Question:
    """One answer request after validation."""

    question: str
    context: str
    top_k: int = 1
    max_answer_len: int | None = None
    threshold: float | None = None


def decoding_n_best(spec: ModelSpec, server_pool: int | None) -> int:
    """Spans kept per question when decoding: ``--n-best-pool`` when the server sets one, else the
    model's own n_best (its sidecar or checkpoint metadata) but no more than deciding reads
    (``Answerability.spans_read``): the spans past those change no answer (tests/test_decode_bounds.py)
    and a request's top_k asks for more when it wants them."""
    return server_pool or min(spec.serving.n_best, spec.decision.spans_read)


class HostPath:
    """Featurizing and decoding for one model spec and tokenizer, within the server's limits."""

    def __init__(
        self,
        spec: ModelSpec,
        tokenizer: TokenizerLike,
        *,
        n_best_pool: int | None = None,
        threshold: float | None = None,
        limits: WorkLimits | None = None,
        contexts: ContextCache | None = None,
    ) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.n_best_pool = decoding_n_best(spec, n_best_pool)
        self.threshold = threshold  # the server's own no-answer threshold, replacing the model's rule
        self.limits = limits or WorkLimits()
        self.contexts = contexts if contexts is not None else ContextCache(0)
        self._lexical = spec.decision.uses_lexical  # the decision reads the context's sentences

    @classmethod
    def from_settings(cls, spec: ModelSpec, tokenizer: TokenizerLike, s: ServerSettings) -> HostPath:
        """The host path a server with settings ``s`` runs (its limits, n-best pool, threshold, cache:
        with API keys, one key holds at most its share of the cache)."""
        share = KEY_SHARE if keys_configured(s.api_keys_file) else 1.0
        return cls(
            spec,
            tokenizer,
            n_best_pool=s.n_best_pool,
            threshold=s.no_answer_threshold,
            limits=WorkLimits(s.max_normalized_chars, s.max_request_tokens, s.max_request_windows),
            contexts=ContextCache(int(s.context_cache_mb * (1 << 20)), share),
        )

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

    def _encoded_context(self, caller: str, context: str) -> EncodedContext:
        """The context's tokens and offsets: from the caller's cache, else tokenized (and kept)."""
        key = context_key(caller, context)
        entry = self.contexts.get(key)
        if entry is None:
            ids, offsets = self.tokenizer.encode_with_offsets(context)
            ids_array, offsets_of = np.asarray(ids, dtype=np.int64), offsets_array(offsets)
            entry = EncodedContext.of(ids_array, offsets_of, context, indexed=self._lexical)
            self.contexts.put(caller, key, entry)
        return entry

    def featurize_checked(self, items: Sequence[Question], caller: str = "") -> Featurized:
        """Windows of every question, refusing (RejectedInput) empty texts, too many tokens or windows;
        also the encoded contexts (for decoding) and the milliseconds each question took."""
        s, limits = self.spec.serving, self.limits
        encoded, seconds, tokens = [], [], 0
        for i, q in enumerate(items):
            t = time.perf_counter()
            question_ids, question_offsets = self.tokenizer.encode_with_offsets(q.question)
            n_question = len(question_ids)
            if not _covers_text(question_offsets):
                message = f"{_where(items, i)}question has no tokens after normalisation"
                raise RejectedInput("empty_question", message, too_large=False)
            context = self._encoded_context(caller, q.context)
            if not _covers_offsets(context.offsets):
                message = f"{_where(items, i)}context has no tokens after normalisation"
                raise RejectedInput("empty_context", message, too_large=False)
            tokens += n_question + context.tokens
            if tokens > limits.max_tokens:
                last = i == len(items) - 1
                work = -(-tokens // s.doc_stride)  # the windows these tokens make, about
                raise _too_large(
                    "too_many_tokens",
                    "tokens",
                    tokens,
                    not last,
                    limits.max_tokens,
                    "max_request_tokens",
                    work,
                )
            encoded.append((question_ids, context))
            seconds.append(time.perf_counter() - t)
        groups, windows = [], 0
        for i, (q, (question_ids, context)) in enumerate(zip(items, encoded, strict=True)):
            t = time.perf_counter()
            features = featurize_encoded(
                q.question, context.ids, context.offsets, self.tokenizer, s.max_seq_len, s.doc_stride,
                s.max_query_len, question_ids=question_ids,
            )  # fmt: skip
            windows += len(features)
            if windows > limits.max_windows:
                raise _too_large(
                    "too_many_windows", f"windows of {s.max_seq_len} tokens", windows, i < len(items) - 1,
                    limits.max_windows, "max_request_windows", work=windows,
                )  # fmt: skip
            groups.append(features)
            seconds[i] += time.perf_counter() - t
        return groups, [x * 1000 for x in seconds], [context for _, context in encoded]

    def decided_by(self, q: Question) -> tuple[float | None, str]:
        """The threshold on p(no answer) that replaces the model's rule for ``q`` (the request's, else
        the server's; None: the model's rule decides) and its name, AnswerResponse.rule."""
        if q.threshold is not None:
            return q.threshold, "request"
        if self.threshold is not None:
            return self.threshold, "server"
        return None, decision_rule(self.spec.decision)

    def decode_options(self, q: Question) -> DecodeOptions:
        """How ``q`` is decoded: enough spans for its top_k, its own longest span and threshold if it
        sets them, else the model's (and the server's threshold). A question that sets none of them
        (most) shares one value, made once."""
        n_best = max(self.n_best_pool, q.top_k)
        longest = q.max_answer_len or self.spec.serving.max_answer_len
        threshold = q.threshold if q.threshold is not None else self.threshold
        usual = self._usual_options
        if (n_best, longest, threshold) == (usual.n_best, usual.max_answer_len, usual.threshold):
            return usual
        return DecodeOptions.spans(n_best, longest, threshold, self.spec.decision)

    @functools.cached_property
    def _usual_options(self) -> DecodeOptions:
        return DecodeOptions.spans(
            self.n_best_pool, self.spec.serving.max_answer_len, self.threshold, self.spec.decision
        )

    def prepare_decisions(
        self, items: Sequence[Question], contexts: Sequence[EncodedContext]
    ) -> PreparedDecisions | None:
        """What deciding each question reads of it and its context alone (the question's match with the
        sentences, the verifier's features), computed ahead, for :meth:`decode_answers`'s ``prepared``:
        run while the engine runs, it leaves decoding less to do after it (None: the decision reads
        nothing lexical). Answers are the same without it."""
        if not self._lexical:
            return None
        decision = self.spec.decision
        return [
            decision.prepare(q.question, c.index(q.context)) for q, c in zip(items, contexts, strict=True)
        ]

    def decode_answers(
        self,
        items: Sequence[Question],
        groups: Sequence[Sequence[Feature]],
        contexts: Sequence[EncodedContext],
        outputs: Sequence[Sequence[Mapping[str, np.ndarray]]],
        prepared: PreparedDecisions | None = None,
    ) -> tuple[list[Prediction], list[float]]:
        """Each question's prediction from its windows' output rows (``outputs[i][w][name]``), and the
        milliseconds each took; ``prepared``: :meth:`prepare_decisions`' for these questions."""
        preds, times = [], []
        matches = prepared if prepared is not None else [None] * len(items)
        for q, feats, context, rows, match in zip(items, groups, contexts, outputs, matches, strict=True):
            t = time.perf_counter()
            if match is not None:  # another question of this context may have been kept since
                context.index(q.context).keep(q.question, match)
            preds.append(self._decoded(q, feats, rows, context))
            times.append((time.perf_counter() - t) * 1000)
        return preds, times

    def _decoded(
        self,
        q: Question,
        feats: Sequence[Feature],
        rows: Sequence[Mapping[str, np.ndarray]],
        context: EncodedContext,
    ) -> Prediction:
        """``q``'s prediction. A re-ranker snaps its spans to whole words, and spans that snap alike are
        listed once, so a pool can list fewer than ``q.top_k``: then a pool twice as large is decoded
        until the list is long enough or the pool is MAX_N_BEST (a doubling that adds nothing does not
        stop it: a larger one may still). The list is then the first top_k distinct spans in one order
        whatever the server's pool (the head the re-ranker reads is the same, the spans after it in the
        reader's order); a question whose list is long enough at the server's pool is decoded once,
        and at most 1 + log2(MAX_N_BEST / pool) times in all."""
        index = context.index(q.context) if self._lexical else None

        def decoded(options: DecodeOptions) -> Prediction:
            return decode_head_outputs(
                self.spec.head, q.context, feats, rows, options, question=q.question, context_index=index
            )

        options = self.decode_options(q)
        p = decoded(options)
        while (
            len(p.n_best) < q.top_k
            and options.n_best < MAX_N_BEST
            and self.spec.decision.reranker is not None
        ):
            options = DecodeOptions.spans(
                min(2 * options.n_best, MAX_N_BEST),
                options.max_answer_len,
                options.threshold,
                self.spec.decision,
            )
            p = decoded(options)
        return p

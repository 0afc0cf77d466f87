"""One request's path through the server: limits -> featurize -> micro-batcher (backend) -> decode.

The featurizing and decoding (and the limits checked on the way) are :class:`server.answering.host_path.HostPath`;
this module runs them around the engine, within the request's deadline. Short inputs are featurized and
decoded inline on the event loop (cheaper than a thread hop); long ones in a thread of their own, one
at a time, skipped when the request gave up while it waited for that thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qa_core.squad import Prediction
from server.answering.batching import DeadlineUnreachable, JobResult, QueueFull
from server.answering.context_cache import EncodedContext
from server.answering.deadline import within
from server.answering.fair_executor import FairExecutor
from server.answering.host_path import Featurized, HostPath, PreparedDecisions, Question, RejectedInput
from server.answering.window_queue import WindowQueue

# Below this many normalised characters featurizing/decoding inline is cheaper than a thread hop;
# above it, a thread keeps a long context from stalling the event loop.
_INLINE_CHARS = 2000

logger = logging.getLogger(__name__)


class RequestTimeout(RuntimeError):
    """Featurizing + queue + inference took longer than ``request_timeout_s``."""


@dataclass
class Charge:
    """Who a request is for, and the windows it was charged once queued (for the log and metrics)."""

    caller: str = ""
    windows: int = 0


@dataclass
class Answered:
    """A decoded prediction and where its time went (milliseconds)."""

    prediction: Prediction
    timing_ms: dict[str, float]
    windows: int
    rule: str  # what set the prediction's threshold (AnswerResponse.rule)


class AnswerService:
    """Answers questions: a :class:`HostPath` around an engine (:class:`WindowQueue`)."""

    def __init__(self, host: HostPath, queue: WindowQueue, *, timeout_s: float = 30.0) -> None:
        self.host = host
        self.queue = queue
        self.timeout_s = timeout_s
        # One thread: long inputs are tokenized and decoded one at a time, so a flood of them cannot take
        # every core; it serves callers in turn, so one caller's flood cannot hold the others' back.
        self._host_work = FairExecutor()
        self._backlog_chars = 0  # normalised characters waiting for (or in) the featurizing thread
        self._backlog_by_caller: dict[str, int] = {}

    def close(self) -> None:
        self._host_work.shutdown()

    async def _featurize(
        self, items: Sequence[Question], normalized: int, inline: bool, caller: str
    ) -> Featurized:
        """Short inputs inline; long ones in the featurizing thread, whose backlog (in normalised
        characters) is bounded: beyond it the request is refused (QueueFull) rather than queued."""
        if inline:
            return self.host.featurize_checked(items, caller)
        limit = self.host.limits.max_featurize_backlog
        if self._backlog_chars + normalized > limit:
            raise QueueFull(f"{self._backlog_chars} characters are waiting to be tokenized")
        mine = self._backlog_by_caller.get(caller, 0)
        if mine and mine + normalized > limit // 2:  # one caller may fill half of the backlog, not all
            raise QueueFull(f"{mine} characters of this key are waiting to be tokenized")
        given_up = False

        def work() -> Featurized | None:
            return None if given_up else self.host.featurize_checked(items, caller)

        self._backlog_chars += normalized
        self._backlog_by_caller[caller] = mine + normalized
        try:
            result = await asyncio.wrap_future(self._host_work.submit(caller, work))
        except asyncio.CancelledError:
            given_up = True  # still waiting for the thread: it skips this request
            raise
        finally:
            self._backlog_chars -= normalized
            left = self._backlog_by_caller.pop(caller, 0) - normalized
            if left > 0:
                self._backlog_by_caller[caller] = left
        assert result is not None
        return result

    def _while_engine_runs(
        self,
        items: Sequence[Question],
        contexts: Sequence[EncodedContext],
        prepared: list[PreparedDecisions | None],
    ) -> Callable[[], None]:
        """The host work a request's questions can have done while the engine runs their windows (the
        decision's question-only evidence: HostPath.prepare_decisions, put in ``prepared`` for
        decoding), once; a failure there is logged and left to decoding, which computes it."""
        done = False

        def prepare() -> None:
            nonlocal done
            if done:
                return
            done = True
            try:
                prepared.append(self.host.prepare_decisions(items, contexts))
            except Exception:  # noqa: BLE001 - decoding computes it again and reports a real failure
                logger.exception("preparing a decision while the engine ran failed; decoding computes it")

        return prepare

    async def answer_many(
        self, items: Sequence[Question], tag: str = "", charge: Charge | None = None
    ) -> list[Answered]:
        """Answer one request's questions; their windows are queued together (all admitted or none).

        Raises RejectedInput (nothing queued), OverLimit/QueueFull/BatcherClosed/BatcherUnhealthy
        (nothing queued), InferenceError (a batch holding one of them failed) or RequestTimeout.
        Cancelling it (client gone) drops its windows that are still queued. The queue charges the
        caller (``charge.caller``; its per-key window limits) when they are queued and gives them back
        when they are done; the caller also keys the context cache (a key's contexts are its own).
        """
        t0 = time.perf_counter()
        charge = charge if charge is not None else Charge()
        caller = charge.caller
        self.queue.check_admission()  # cheap checks first: no tokenizing for a request that cannot run
        normalized = self.host.check_text_size(items)
        inline = normalized <= _INLINE_CHARS
        futures: list[asyncio.Future] = []
        prepared: list[
            PreparedDecisions | None
        ] = []  # the decisions' question-only work, once done beside the engine

        async def featurize_and_infer() -> tuple[Featurized, list[JobResult]]:
            featurized = await self._featurize(items, normalized, inline, caller)
            groups = featurized[0]
            if time.perf_counter() >= t0 + self.timeout_s:  # spent while tokenizing: a timeout, not overload
                raise asyncio.TimeoutError
            # short inputs: the decision's question-only work is done on the loop while the engine runs
            meanwhile = self._while_engine_runs(items, featurized[2], prepared) if inline else None
            futures.extend(
                await self.queue.submit(
                    groups, tag=tag, deadline=t0 + self.timeout_s, caller=caller, on_running=meanwhile
                )
            )
            charge.windows = sum(len(g) for g in groups)
            if len(futures) == 1:  # one question (most requests): its future, without a gathering one
                return featurized, [await futures[0]]
            return featurized, list(await asyncio.gather(*futures))

        try:
            deadline = asyncio.get_running_loop().time() + self.timeout_s
            (groups, feat_ms, contexts), results = await within(featurize_and_infer(), deadline)
        except RejectedInput as exc:
            # Tokenized, then refused as too large: a request that can never succeed is charged the
            # windows it asked for, so sending it again and again is not free. (A request refused at
            # its window limits is not: its tokenizing is bounded by the door's request rate, and
            # charging it would punish every retry twice.)
            self.queue.charge(caller, exc.work)
            raise
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
        outputs = [r.rows for r in results]
        if inline:
            ahead = prepared[0] if prepared else None
            preds, dec_ms = self.host.decode_answers(items, groups, contexts, outputs, ahead)
        else:  # in the host-work thread, callers in turn (as for featurizing)
            decoding = self._host_work.submit(
                caller, lambda: self.host.decode_answers(items, groups, contexts, outputs)
            )
            preds, dec_ms = await asyncio.wrap_future(decoding)
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
                rule=self.host.decided_by(q)[1],
            )
            for q, p, r, g, fm, dm in zip(items, preds, results, groups, feat_ms, dec_ms, strict=True)
        ]

    async def answer(self, item: Question) -> Answered:
        return (await self.answer_many([item]))[0]

"""A front process's runtime: HTTP, the door, tokenizing and decoding here; the model in the engine
process (:mod:`server.topology.engine`), which every front of the host shares.

A front loads its tokenizer, connects to the engine and waits until the engine is ready, then warms
up through the whole path (one answer) before it takes connections. Its state is its own until it is
ready; after that it is the engine's as this front sees it: ``engine_unavailable`` while the engine
cannot be reached (killed, restarting, hung), ``engine_loading`` / ``engine_warming`` while a new engine
loads, ``engine_unhealthy`` while its backend hangs. ``/readyz`` is 503 in all of those, and a request
gets 503 ``engine_unavailable`` + Retry-After at once: a front never holds a request for an engine
that is not there. ``/healthz`` stays 200 (restarting the front would not help: the supervisor
restarts the engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from qa_core.tokenizer import XLNetTokenizer
from server.answering.batching import BatcherClosed
from server.answering.host_path import HostPath, Question
from server.answering.lifecycle import Lifecycle
from server.answering.model_spec import ModelSpec
from server.answering.request_path import AnswerService
from server.limits.quotas import CallerLimits
from server.observability.metrics import Metrics
from server.settings import ServerSettings
from server.topology.engine.client import EngineClient

logger = logging.getLogger("server")


# How much longer than the engine's load deadline a front waits for the engine's verdict: the engine's
# clock starts after its process has (fronts may start first), and its verdict travels as a mark on disk.
ENGINE_VERDICT_GRACE_S = 10.0


class FrontLifecycle(Lifecycle):
    """The runtime of one front process (see the module docstring)."""

    UNREADY = {
        **Lifecycle.UNREADY,
        "engine_unavailable": ("engine_unavailable", "the inference engine is restarting; retry shortly"),
        "engine_unhealthy": ("unhealthy", "the inference backend is unhealthy; see the server log"),
        "engine_failed": ("model_failed", "the model failed to load; see the server log"),
    }

    def __init__(
        self,
        settings: ServerSettings,
        spec: ModelSpec,
        metrics: Metrics,
        address: str,
        on_fatal=None,
    ) -> None:
        super().__init__(settings, spec, metrics, on_fatal)
        self.engine = EngineClient(address, limits_active=CallerLimits.from_settings(settings).at_the_door)

    @property
    def state(self) -> str:
        if self._state != "ready":
            return self._state
        return "ready" if self.engine.ready else f"engine_{self.engine.state}"

    @property
    def live(self) -> bool:
        return self._state != "failed"

    async def start(self) -> None:
        await self.engine.start()
        self._start_loading()

    @property
    def load_deadline_s(self) -> float:
        """The engine decides whether the model loads, within the same deadline, after its own start:
        a front waits a little longer, so that the engine's verdict (its load-failed mark) is what a
        failed load reports, not a front's clock that started first."""
        return super().load_deadline_s + ENGINE_VERDICT_GRACE_S

    async def _load_and_warm_up(self) -> None:
        s, spec = self.settings, self.spec
        self._state = "loading"
        tokenizer = await asyncio.to_thread(XLNetTokenizer.from_dir, spec.tokenizer_dir)
        self.pipeline = AnswerService(
            HostPath.from_settings(spec, tokenizer, s), self.engine, timeout_s=s.request_timeout_s
        )
        self._state = "waiting for the engine"
        while not self.engine.ready:
            if self.engine.engine_state in ("failed", "incompatible"):
                raise RuntimeError(f"the inference engine is {self.engine.engine_state}")
            # An engine whose model failed exits without a word to the fronts: its mark says so. (The
            # supervisor's SIGTERM may have reached this front before it listened for one.)
            if Metrics.load_failed_marked():
                raise RuntimeError("the inference engine's model failed to load")
            self.engine.state_changed.clear()
            await self._wait_for_engine()
        self._state = "warming"
        await self.pipeline.answer(Question("What is warmed up?", "The model is warmed up. " * 8))
        self._state = "ready"
        self.metrics.ready.set(1)
        logger.info("front of model %s ready: engine %s", self.name, self.engine.facts)

    async def _wait_for_engine(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.engine.state_changed.wait(), 1.0)

    def _cut_off(self) -> None:
        self.engine.fail_all(BatcherClosed("the server is shutting down"))

    async def stop(self) -> None:
        self._begin_stopping()
        if self.pipeline is not None:
            self.pipeline.close()
        await self.engine.close()

    def describe(self) -> dict[str, Any]:
        facts = dict(self.engine.facts) or {"state": self.state}
        return facts | {"engine": {"state": self.engine.state, "restarts_seen": self.engine.restarts_seen}}

    def runs_on(self) -> dict[str, Any]:
        return dict(self.engine.runs_on)

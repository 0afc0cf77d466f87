"""The served model's lifecycle: load in the background, warm up, serve, drain on shutdown.

A single server listens while the model loads, so ``/healthz`` answers at once and ``/readyz`` stays
503 until the model is loaded *and* has answered a dummy request through the whole path (load balancers
only route to warm replicas). A worker under ``--workers`` waits for :meth:`ModelLifecycle.until_loaded` before
it takes connections (``server.app.create_app``), so a respawned worker never answers 503 while its
siblings could have answered. On shutdown the micro-batcher is drained, so every admitted question is
still answered, within what is left of one graceful timeout.

States: starting -> loading -> warming -> ready -> stopping; ``failed`` when loading failed and
``unhealthy`` while the batcher has crashed or a backend call hangs. Live (``/healthz`` 200) in every
state but those two, so an orchestrator restarts a replica that cannot recover by itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from qa_core.tokenizer import XLNetTokenizer
from server.answering.batch_curve import Grouping, measure_grouping
from server.answering.batching import BatcherClosed, BatchStats, MicroBatcher
from server.answering.host_path import HostPath, Question
from server.answering.model_spec import ModelSpec
from server.answering.request_path import AnswerService
from server.answering.window_queue import LocalQueue
from server.api.api_error import ApiError
from server.backends import Backend, BackendUnavailable, batch_limit
from server.backends.base import dummy_batch
from server.limits.quotas import CallerLimits, CallerQuotas
from server.observability.metrics import Metrics
from server.settings import ServerSettings

logger = logging.getLogger("server")
LOAD_PROGRESS_S = 15.0  # how often a long load says it is still going

BackendFactory = Callable[[ModelSpec, ServerSettings], Backend]


class Lifecycle:
    """What every runtime of the app shares: states, the load under its deadline, readiness, and the
    shutdown that answers what is left with 503 before the graceful timeout ends. Subclasses load
    (``_load_and_warm_up``), cut off (``_cut_off``) and stop."""

    pipeline: AnswerService | None = None

    def __init__(
        self, settings: ServerSettings, spec: ModelSpec, metrics: Metrics, on_fatal: Callable[[], None] | None
    ) -> None:
        self.settings = settings
        self.spec = spec
        self.metrics = metrics
        self.on_fatal = on_fatal
        self._state = "starting"
        self.error: str | None = None  # for the log only: it may hold paths and exception text
        self._loader: asyncio.Task | None = None
        self.max_batch_size = batch_limit(spec, settings)
        self.name = settings.model_name or spec.name
        self._shutdown_started: float | None = None
        self._shutdown_begun = asyncio.Event()  # set on the loop once begin_shutdown ran
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def state(self) -> str:
        return self._state

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def live(self) -> bool:
        """False when only a restart helps: the model failed to load or the backend is unhealthy."""
        return self.state not in ("failed", "unhealthy")

    def begin_shutdown(self) -> None:
        """Shutdown began (SIGTERM): open requests get until shortly before the graceful timeout ends, then
        whatever is still unanswered gets a 503 (uvicorn would cancel those requests, and the client
        would see a bare 500), so waiting and draining together take one timeout."""
        if self._shutdown_started is not None:
            return
        self._shutdown_started = time.monotonic()
        if self._loop is not None:  # may run inside a signal handler: only the thread-safe call
            self._loop.call_soon_threadsafe(self._schedule_cutoff)

    def _schedule_cutoff(self) -> None:
        self._shutdown_begun.set()
        graceful = self.settings.graceful_timeout_s
        assert self._loop is not None
        self._loop.call_later(max(0.0, graceful - min(1.0, 0.2 * graceful)), self._cut_off)

    def _cut_off(self) -> None:
        """Answer what is still waiting (503 shutting_down)."""

    def _begin_stopping(self) -> None:
        """Not ready any more, and no load to finish: what every stop() does first."""
        self.begin_shutdown()
        if self._state == "ready":
            self._state = "stopping"
        self.metrics.ready.set(0)
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()

    @property
    def load_deadline_s(self) -> float:
        """Seconds the load and warm-up may take (``--load-timeout-s`` or its default)."""
        return self.settings.load_deadline_s

    def _track_shutdown_signals(self) -> None:
        """Note when SIGTERM/SIGINT arrive, then let uvicorn's handlers (installed before the app
        starts, main thread only) do the rest. A signal that came before this ran (a supervisor's
        SIGTERM to a front still starting) was noted by uvicorn's handler alone, which then waits for the
        app's startup to end: its server's ``should_exit`` says so, and shutdown begins now."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue
            if getattr(getattr(previous, "__self__", None), "should_exit", False):
                self.begin_shutdown()

            def noted(signum: int, frame: FrameType | None, previous: Callable = previous) -> None:
                self.begin_shutdown()
                previous(signum, frame)

            signal.signal(sig, noted)

    def _start_loading(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._track_shutdown_signals()
        self._loader = self._loop.create_task(self._load(), name="model-loader")

    async def until_loaded(self) -> None:
        """Return once loading ended (ready, or failed: ``on_fatal`` ran) or shutdown began, whichever is
        first; a shutdown leaves the loader to :meth:`stop`, so SIGTERM never waits for a load."""
        assert self._loader is not None, "start() first"
        shutdown = asyncio.ensure_future(self._shutdown_begun.wait())
        try:
            await asyncio.wait({self._loader, shutdown}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            shutdown.cancel()

    async def _load(self) -> None:
        """Load and warm up within the load deadline; any failure (a hang included) ends in ``failed``.
        While it lasts, the log says every ``LOAD_PROGRESS_S`` what it is doing (an engine build at a
        first start takes minutes, and silence looks like a hang)."""
        deadline = self.load_deadline_s
        progress = asyncio.create_task(self._report_progress(time.monotonic(), deadline))
        try:
            await asyncio.wait_for(self._load_and_warm_up(), deadline)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - report any load failure, then stop the server
            if isinstance(exc, asyncio.TimeoutError):
                exc = TimeoutError(
                    f"loading and warming up took longer than {deadline:g} s (--load-timeout-s)"
                )
            self._state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
            # a refusal the backend explains in one line needs no traceback; anything else does
            explained = isinstance(exc, BackendUnavailable)
            logger.error("model failed to load: %s", self.error, exc_info=None if explained else exc)
            if self.on_fatal is not None:
                self.on_fatal()
        finally:
            progress.cancel()

    async def _load_and_warm_up(self) -> None:
        raise NotImplementedError

    async def _report_progress(self, started: float, deadline: float) -> None:
        while True:
            await asyncio.sleep(LOAD_PROGRESS_S)
            logger.info(
                "still %s the model after %.0f s (of at most %g s)%s",
                self._state,
                time.monotonic() - started,
                deadline,
                self.settings.engine_build_note,
            )

    def runtime_labels(self) -> dict[str, str]:
        """The ``xlnetqa_runtime_info`` labels: backend, providers really in use, device."""
        facts = self.runs_on()
        return {
            "backend": self.settings.backend,
            "providers": ",".join(facts.get("providers", [])),
            "device": str(facts.get("device", "")),
        }

    def describe(self) -> dict[str, Any]:
        """What the backend runs on, for ``/v1/model`` (its state before it is loaded)."""
        return {"state": self.state}

    def runs_on(self) -> dict[str, Any]:
        """``providers`` and/or ``device`` as the loaded backend reports them (empty before loading)."""
        facts = self.describe()
        return {k: facts[k] for k in ("providers", "device") if facts.get(k) is not None}

    # The 503 a request gets while the runtime cannot answer, by state: (error kind, message).
    UNREADY: dict[str, tuple[str, str]] = {
        "failed": ("model_failed", "the model failed to load; see the server log"),
        "unhealthy": ("unhealthy", "the inference backend is unhealthy; see the server log"),
        "stopping": ("shutting_down", "the server is shutting down"),
    }

    def require_ready(self) -> AnswerService:
        """The pipeline, or the 503 that says why there is none (never internals: they are logged)."""
        if self.ready and self.pipeline is not None:
            return self.pipeline
        retry = {"Retry-After": str(self.settings.retry_after_s)}
        kind, message = self.UNREADY.get(
            self.state, ("not_ready", f"the model is not ready yet ({self.state})")
        )
        raise ApiError(503, kind, message, retry)


class ModelLifecycle(Lifecycle):
    """Owns the model: loads it in the background, warms it up, serves it, drains it on shutdown."""

    def __init__(
        self,
        settings: ServerSettings,
        spec: ModelSpec,
        metrics: Metrics,
        backend_factory: BackendFactory,
        on_fatal: Callable[[], None] | None = None,
        quotas: CallerQuotas | None = None,
        answers: bool = True,
    ) -> None:
        """``quotas``: the per-key limits the batcher's queue charges (none: unlimited). ``answers=False``
        (the engine process) loads no tokenizer and no host path: its fronts have their own."""
        super().__init__(settings, spec, metrics, on_fatal)
        self.backend_factory = backend_factory
        self.backend: Backend | None = None
        self.batcher: MicroBatcher | None = None
        self.quotas = quotas or CallerQuotas(CallerLimits(), settings.max_request_windows)
        self.answers = answers
        self.batch_curve: Grouping | None = None  # measured at load (--batching measured)

    @property
    def state(self) -> str:
        if self._state in ("ready", "warming") and self.batcher is not None and not self.batcher.healthy:
            return "unhealthy"
        return self._state

    def _cut_off(self) -> None:
        if self.batcher is not None:
            self.batcher.abort(BatcherClosed("the server is shutting down"))

    async def start(self) -> None:
        s = self.settings
        self.batcher = MicroBatcher(
            self._run_backend,
            max_batch_size=self.max_batch_size,
            max_delay_s=s.max_batch_delay_ms / 1000.0,
            max_queue=s.max_queue,
            workers=s.inference_workers,
            pad_multiple_of=s.pad_multiple_of,
            max_padding=s.max_batch_padding,
            aging_s=s.queue_aging_s,
            min_length=self.spec.min_engine_seq_len,
            max_length=self.spec.serving.max_seq_len,
            watchdog_factor=s.watchdog_factor,
            watchdog_min_s=s.watchdog_min_s,
            on_batch=self._on_batch,
            on_queue_depth=self.metrics.queue_depth.set,
            on_dropped=self.metrics.dropped_windows.inc,
            on_hang=self.metrics.backend_hangs.inc,
        )
        self.batcher.start()
        self._start_loading()

    def _run_backend(self, batch):
        assert self.backend is not None
        return self.backend.run(batch)

    def _on_batch(self, stats: BatchStats) -> None:
        m = self.metrics
        m.batch_size.observe(stats.size)
        m.batch_tokens.observe(stats.padded_length)
        m.padding.observe(stats.padding_ratio)
        m.inference_time.observe(stats.seconds)
        if stats.failed:
            m.batch_failures.inc()
        if stats.non_finite:
            m.non_finite.inc(stats.non_finite)

    async def _load_and_warm_up(self) -> None:
        s, spec = self.settings, self.spec
        self._state = "loading"
        self.backend = await asyncio.to_thread(self.backend_factory, spec, s)
        assert self.batcher is not None
        if self.answers:
            tokenizer = await asyncio.to_thread(XLNetTokenizer.from_dir, spec.tokenizer_dir)
            host = HostPath.from_settings(spec, tokenizer, s)
            queue = LocalQueue(self.batcher, self.quotas)
            self.pipeline = AnswerService(host, queue, timeout_s=s.request_timeout_s)
        self._state = "warming"
        if s.warmup_delay_s:
            await asyncio.sleep(s.warmup_delay_s)
        lengths = tuple(sorted({max(16, spec.min_engine_seq_len or 0), spec.serving.max_seq_len}))
        await asyncio.to_thread(self.backend.warmup, lengths, tuple(sorted({1, self.max_batch_size})))
        if s.batching == "measured" and self.max_batch_size > 1:
            await self._measure_batching()
        if self.pipeline is not None:
            await self.pipeline.answer(Question("What is warmed up?", "The model is warmed up. " * 8))
        self._state = "ready"
        self.metrics.runtime_info.labels(**self.runtime_labels()).set(1)
        if self.answers:  # an engine process is not an HTTP server: its fronts say whether they are ready
            self.metrics.ready.set(1)
        logger.info("model %s ready: backend %s, head %s", self.name, self.backend.describe(), spec.head)

    async def _measure_batching(self) -> None:
        """Group only windows whose grouping pays here (server.answering.batch_curve): the rest run one per call."""
        assert self.backend is not None and self.batcher is not None
        longest, size = self.spec.serving.max_seq_len, min(8, self.max_batch_size)
        shortest = self.spec.min_engine_seq_len or 1
        self.batch_curve = await asyncio.to_thread(
            measure_grouping,
            self.backend.run,
            dummy_batch,
            longest,
            size,
            shortest,
            self.settings.pad_multiple_of,
        )
        solo = self.batcher.policy.solo_from = self.batch_curve.solo_from()
        savings = ", ".join(f"{c.length}x{c.size} {c.saving:.0%}" for c in self.batch_curve.curves)
        logger.info(
            "batching: grouping saved %s (tokens x windows): %s", savings,
            "grouping pays at every length" if solo is None else f"windows of {solo}+ tokens run one per call",
        )  # fmt: skip

    async def stop(self) -> None:
        """Refuse new work and finish what was admitted (uvicorn already waited for open requests)."""
        self._begin_stopping()
        if self.batcher is not None:
            assert self._shutdown_started is not None
            left = self.settings.graceful_timeout_s - (time.monotonic() - self._shutdown_started)
            await self.batcher.drain(timeout=max(0.0, left))
        if self.pipeline is not None:
            self.pipeline.close()
        await self.quotas.close()
        if self.backend is not None:
            self.backend.close()
        if (
            self.batcher is not None
            and self.batcher.busy
            and threading.current_thread() is threading.main_thread()
        ):
            # A backend call that never returned holds a thread the interpreter would wait for at exit
            # (in every worker process too): leave now, with an error status.
            logger.error("exiting with a backend call still running")
            logging.shutdown()
            os._exit(1)

    def describe(self) -> dict[str, Any]:
        if self.backend is None:
            return {"state": self.state}
        facts = self.backend.describe()
        return facts | ({"batching": self.batch_curve.describe()} if self.batch_curve is not None else {})

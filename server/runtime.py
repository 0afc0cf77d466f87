"""The served model's lifecycle: load in the background, warm up, serve, drain on shutdown.

The server listens while the model loads, so ``/healthz`` answers at once and ``/readyz`` stays 503
until the model is loaded *and* has answered a dummy request through the whole path (load balancers
only route to warm replicas). On shutdown the micro-batcher is drained, so every admitted question is
still answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from server.backends import Backend
from server.batching import BatchStats, MicroBatcher
from server.errors import ApiError
from server.metrics import Metrics
from server.model_spec import ModelSpec
from server.pipeline import QAPipeline, Question
from server.settings import ServerSettings
from train.tokenizer import XLNetTokenizer

logger = logging.getLogger("server")

BackendFactory = Callable[[ModelSpec, ServerSettings], Backend]


class Runtime:
    """Owns the model: loads it in the background, warms it up, serves it, drains it on shutdown."""

    def __init__(
        self,
        settings: ServerSettings,
        spec: ModelSpec,
        metrics: Metrics,
        backend_factory: BackendFactory,
        on_fatal: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.spec = spec
        self.metrics = metrics
        self.backend_factory = backend_factory
        self.on_fatal = on_fatal
        self.state = "starting"
        self.error: str | None = None
        self.backend: Backend | None = None
        self.pipeline: QAPipeline | None = None
        self.batcher: MicroBatcher | None = None
        self._loader: asyncio.Task | None = None
        self.max_batch_size = min(settings.max_batch_size, spec.max_batch_size or settings.max_batch_size)
        self.name = settings.model_name or spec.name

    @property
    def ready(self) -> bool:
        return self.state == "ready"

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
            min_length=self.spec.min_engine_seq_len,
            on_batch=self._on_batch,
            on_queue_depth=self.metrics.queue_depth.set,
        )
        self.batcher.start()
        self._loader = asyncio.get_running_loop().create_task(self._load(), name="model-loader")

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

    async def _load(self) -> None:
        s, spec = self.settings, self.spec
        try:
            self.state = "loading"
            tokenizer = await asyncio.to_thread(XLNetTokenizer.from_dir, spec.tokenizer_dir)
            self.backend = await asyncio.to_thread(self.backend_factory, spec, s)
            assert self.batcher is not None
            self.pipeline = QAPipeline(
                spec,
                tokenizer,
                self.batcher,
                n_best_pool=s.n_best_pool,
                threshold=s.no_answer_threshold,
                timeout_s=s.request_timeout_s,
            )
            self.state = "warming"
            if s.warmup_delay_s:
                await asyncio.sleep(s.warmup_delay_s)
            lengths = tuple(sorted({max(16, spec.min_engine_seq_len or 0), spec.max_seq_len}))
            await asyncio.to_thread(self.backend.warmup, lengths, tuple(sorted({1, self.max_batch_size})))
            await self.pipeline.answer(Question("What is warmed up?", "The model is warmed up. " * 8))
            self.state = "ready"
            self.metrics.ready.set(1)
            runtime = self.backend.describe()
            logger.info("model %s ready: backend %s, head %s", self.name, runtime, spec.head)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - report any load failure, then stop the server
            self.state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error("model failed to load: %s", self.error)
            if self.on_fatal is not None:
                self.on_fatal()

    async def stop(self) -> None:
        """Refuse new work and finish what was admitted (uvicorn already waited for open requests)."""
        if self.ready:
            self.state = "stopping"
        self.metrics.ready.set(0)
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        if self.batcher is not None:
            await self.batcher.drain(timeout=self.settings.graceful_timeout_s)
        if self.backend is not None:
            self.backend.close()

    def require_ready(self) -> QAPipeline:
        if not self.ready or self.pipeline is None:
            retry = str(self.settings.retry_after_s)
            if self.state == "failed":
                raise ApiError(
                    503, "model_failed", f"the model failed to load: {self.error}", {"Retry-After": retry}
                )
            if self.state == "stopping":
                raise ApiError(503, "shutting_down", "the server is shutting down", {"Retry-After": retry})
            raise ApiError(
                503, "not_ready", f"the model is not ready yet ({self.state})", {"Retry-After": retry}
            )
        return self.pipeline

"""The FastAPI app: middleware, error handlers, lifespan and routers put together (routes in
:mod:`server.routes`, lifecycle in :mod:`server.runtime`, errors in :mod:`server.errors`).

Routes: ``POST /answer``, ``POST /answer/batch``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``,
``GET /v1/model``, and the OpenAPI docs at ``/docs``. On SIGTERM uvicorn stops accepting connections
and waits for in-flight requests; the lifespan then drains the micro-batcher.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from server.backends import create_backend
from server.errors import BodyLimitMiddleware, install_error_handlers
from server.metrics import Metrics, MetricsMiddleware
from server.model_spec import ModelSpec, resolve_spec
from server.playground import playground_router
from server.request_ids import RequestIdMiddleware, configure_logging
from server.routes import answer_router, batch_router, ops_router
from server.runtime import BackendFactory, Runtime
from server.settings import ServerSettings

# ---- the app ----------------------------------------------------------------------------------------


def create_app(
    settings: ServerSettings,
    *,
    backend_factory: BackendFactory | None = None,
    on_fatal: Callable[[], None] | None = None,
    spec: ModelSpec | None = None,
) -> FastAPI:
    """Build the app for ``settings`` (the model loads when the app starts, in the background).

    ``backend_factory`` replaces :func:`server.backends.create_backend` (e.g. to wrap a backend);
    ``on_fatal`` is called if loading fails (``python -m server`` stops the process with exit 1).
    """
    if spec is None:
        if settings.model is None:
            raise ValueError("no model directory (--model or XLNETQA_MODEL)")
        spec = resolve_spec(settings.model, settings.backend)
    metrics = Metrics()
    runtime = Runtime(settings, spec, metrics, backend_factory or create_backend, on_fatal)
    metrics.model_info.labels(runtime.name, settings.backend, spec.head, spec.precision).set(1)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()
            metrics.process_exiting()

    app = FastAPI(
        title="XLNet QA",
        version="1.0",
        description="Extractive question answering (SQuAD 2.0) with XLNet. Answers are character spans of the "
        "given context; long contexts are split into overlapping windows and the best span of all windows wins.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.metrics = metrics
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: sees every response
    install_error_handlers(app, metrics, settings)
    app.include_router(answer_router)
    app.include_router(batch_router(settings.max_batch_items))
    app.include_router(ops_router)
    if settings.playground:
        app.include_router(playground_router)
    return app


WORKER_LOAD_FAILED = 3  # uvicorn's "startup failure" exit code: its supervisor stops instead of restarting


def _exit_worker() -> None:
    """A worker whose model failed to load exits, and its supervisor stops every worker (a restart would
    fail the same way); ``python -m server`` reports it."""
    Metrics.mark_load_failed()
    logging.shutdown()
    os._exit(WORKER_LOAD_FAILED)


def create_app_from_env() -> FastAPI:
    """App factory for ``uvicorn --factory`` / multi-worker mode: settings from ``XLNETQA_*`` only."""
    settings = ServerSettings()
    configure_logging(settings.log_level)
    return create_app(settings, on_fatal=_exit_worker)

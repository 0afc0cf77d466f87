"""The FastAPI app: middleware, error handlers, lifespan and routers put together (routes in
:mod:`server.api.routes`, lifecycle in :mod:`server.answering.lifecycle`, errors in :mod:`server.api.errors`).

Routes: ``POST /answer``, ``POST /answer/batch``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``,
``GET /v1/model``, and the OpenAPI docs at ``/docs``. On SIGTERM uvicorn stops accepting connections
and waits for in-flight requests; the lifespan then drains the micro-batcher.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from server.answering.gil import prefer_latency
from server.answering.lifecycle import BackendFactory, Lifecycle, ModelLifecycle
from server.answering.model_spec import ModelSpec, resolve_spec
from server.api.errors import install_error_handlers
from server.api.playground import playground_router
from server.api.reference import page_html
from server.api.routes import answer_router, batch_router, ops_router
from server.backends import create_backend
from server.door.auth import KeyRing
from server.door.body_limit import BodyLimitMiddleware
from server.door.connection import configure_connections, count_refusals_with
from server.door.framing import FramingMiddleware
from server.door.hosts import HostCheckMiddleware, allowed_hosts, is_loopback
from server.door.key_check import (
    DOCS_PATHS,
    METRICS_PATHS,
    PLAYGROUND_PATHS,
    PROBES,
    DoorLimits,
    DoorMiddleware,
    OpenPaths,
)
from server.limits.quotas import FailureLimiter
from server.limits.quotas_redis import quotas_for
from server.observability.access_log import AccessLogMiddleware
from server.observability.log_format import configure_logging
from server.observability.metrics import Metrics, MetricsMiddleware
from server.observability.request_ids import RequestIdMiddleware
from server.observability.timing import TimingMiddleware
from server.settings import ENGINE_ADDRESS_ENV, ServerSettings
from server.topology.front import FrontLifecycle

# ---- the app ----------------------------------------------------------------------------------------


def create_app(
    settings: ServerSettings,
    *,
    backend_factory: BackendFactory | None = None,
    on_fatal: Callable[[], None] | None = None,
    spec: ModelSpec | None = None,
    listen_while_loading: bool = True,
    engine_address: str | None = None,
) -> FastAPI:
    """Build the app for ``settings`` (the model loads when the app starts).

    ``backend_factory`` replaces :func:`server.backends.create_backend` (e.g. to wrap a backend);
    ``on_fatal`` is called if loading fails (``python -m server`` stops the process with exit 1).
    ``listen_while_loading=False`` makes the lifespan startup wait for the load: uvicorn serves only
    after it, so a worker sharing a socket with ready siblings takes no connection it would answer 503.
    ``engine_address``: this is a front process; the model is in the engine process there.
    """
    if spec is None:
        if settings.model is None:
            raise ValueError("no model directory (--model or XLNETQA_MODEL)")
        spec = resolve_spec(settings.model, settings.backend, allow_unhashed=settings.allow_unhashed_model)
    keys = KeyRing.from_settings(
        settings.api_keys_file, allow_shared=settings.allow_shared_keys_file
    )  # KeyFileError: refuse to start
    metrics = Metrics()
    count_refusals_with(lambda kind: metrics.errors.labels(kind).inc())  # refused before the app
    runtime: Lifecycle
    limits: DoorLimits
    if engine_address is None:
        quotas = quotas_for(settings, metrics.store_watch(), keyed=keys is not None)
        runtime = ModelLifecycle(settings, spec, metrics, backend_factory or create_backend, on_fatal, quotas)
        limits = quotas
    else:  # a front: the engine process owns the model and the per-key limits
        front = FrontLifecycle(settings, spec, metrics, engine_address, on_fatal)
        runtime, limits = front, front.engine

    metrics.model_info.labels(runtime.name, settings.backend, spec.head, spec.precision).set(1)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        reload_on_hup = keys is not None and _on_sighup(keys.reload)
        await runtime.start()
        try:
            if not listen_while_loading:
                await runtime.until_loaded()
            yield
        finally:
            if reload_on_hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            await runtime.stop()
            metrics.process_exiting()

    app = FastAPI(
        title="XLNet QA",
        version="1.0",
        description="Extractive question answering (SQuAD 2.0) with XLNet. Answers are character spans of the "
        "given context; long contexts are split into overlapping windows and the best span of all windows wins.",
        lifespan=lifespan,
        docs_url=None,  # ours below: Swagger UI's page loads its script from a CDN, blank offline
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs else None,
    )
    if settings.docs:
        add_reference_page(app)
    app.state.runtime = runtime
    app.state.metrics = metrics
    app.state.keys = keys
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.body_limit, metrics=metrics, timeout_s=settings.body_timeout_s
    )
    failures = FailureLimiter(settings.auth_failures_per_minute)
    app.add_middleware(
        DoorMiddleware,
        keys=keys,
        open_paths=open_paths(settings),
        failures=failures,
        quotas=limits,
        metrics=metrics,
        retry_after_s=settings.retry_after_s,
    )
    hosts = allowed_hosts(settings.trusted_hosts, is_loopback(settings.host))
    app.add_middleware(HostCheckMiddleware, allowed=hosts, metrics=metrics)
    app.add_middleware(FramingMiddleware, metrics=metrics)
    if settings.access_log:
        app.add_middleware(AccessLogMiddleware)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # sees every response
    app.add_middleware(TimingMiddleware)  # outermost: each request's clock starts first
    install_error_handlers(app, metrics, settings)
    app.include_router(answer_router)
    app.include_router(batch_router(settings.max_batch_items))
    app.include_router(ops_router)
    if settings.playground:
        app.include_router(playground_router)
    return app


def add_reference_page(app: FastAPI) -> None:
    """``GET /docs``: the HTTP API reference rendered from this app's own schema, self-contained (no
    script, style or font from elsewhere), rendered once."""
    rendered: list[str] = []

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        if not rendered:
            rendered.append(page_html(app.openapi()))
        csp = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
        return HTMLResponse(rendered[0], headers={"Content-Security-Policy": csp})


def open_paths(settings: ServerSettings) -> OpenPaths:
    """What the door lets through without a key: the probes, and what the settings opened."""
    paths = list(PROBES)
    if settings.playground:
        paths += PLAYGROUND_PATHS  # the page and its files; its calls to /answer need the key
    if not settings.auth_docs:
        paths += DOCS_PATHS
    if not settings.auth_metrics:
        paths += METRICS_PATHS
    return OpenPaths.of(paths)


def _on_sighup(callback: Callable[[], object]) -> bool:
    """Run ``callback`` on SIGHUP (keys rotation); False where no handler can be installed (not the main
    thread, or no such signal). Worker processes under ``--workers`` are restarted by uvicorn on SIGHUP."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, callback)
    except (NotImplementedError, RuntimeError, ValueError, AttributeError):
        return False
    return True


WORKER_LOAD_FAILED = 3  # uvicorn's "startup failure" exit code: its supervisor stops instead of restarting


def _exit_worker() -> None:
    """A worker whose model failed to load exits, and its supervisor stops every worker (a restart would
    fail the same way); ``python -m server`` reports it."""
    Metrics.mark_load_failed()
    logging.shutdown()
    os._exit(WORKER_LOAD_FAILED)


def create_app_from_env() -> FastAPI:
    """App factory for ``uvicorn --factory`` / multi-worker mode: settings from ``XLNETQA_*`` only. A worker
    takes connections only once its model is ready (a respawned one leaves them to its siblings)."""
    settings = ServerSettings()
    configure_logging(settings.log_level, settings.log_format)
    prefer_latency()
    configure_connections(  # this worker's connections
        settings.header_timeout_s, settings.tls_context(), settings.max_headers, settings.max_header_bytes,
        settings.unauthenticated_per_address, settings.connections_per_key,
    )  # fmt: skip
    address = os.environ.get(ENGINE_ADDRESS_ENV) or None
    return create_app(settings, on_fatal=_exit_worker, listen_while_loading=False, engine_address=address)

"""The HTTP routes, on APIRouters whose handlers get the runtime and settings as dependencies.

``create_app`` (:mod:`server.app`) includes them; the batch route is built per app because its body
model carries the configured item limit in the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from server.answering.batching import (
    BatcherClosed,
    BatcherUnhealthy,
    InferenceError,
    NonFiniteOutput,
    QueueFull,
)
from server.answering.host_path import Question, RejectedInput, decoding_n_best
from server.answering.lifecycle import Lifecycle
from server.answering.request_path import Answered, Charge, RequestTimeout
from server.api.api_error import ApiError
from server.api.errors import ERROR_RESPONSES
from server.api.schemas import (
    AnswerRequest,
    AnswerResponse,
    BatchResponse,
    HealthResponse,
    ModelInfoResponse,
    batch_request_model,
)
from server.api.schemas import BatchRequest as BaseBatchRequest
from server.door.key_check import caller_name
from server.observability.metrics import Metrics
from server.observability.request_ids import request_id_var
from server.observability.timing import StageClock, stage_clock
from server.settings import ServerSettings
from server.topology.engine.failures import EngineUnavailable

# ---- dependencies -----------------------------------------------------------------------------------


async def get_runtime(request: Request) -> Lifecycle:
    """The app's model runtime (set by create_app)."""
    return request.app.state.runtime


async def get_settings(request: Request) -> ServerSettings:
    return request.app.state.runtime.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


RuntimeDep = Annotated[Lifecycle, Depends(get_runtime)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


# ---- request/response mapping -----------------------------------------------------------------------


def check_sizes(items: list[AnswerRequest], settings: ServerSettings) -> None:
    """413 for a context or question beyond the configured characters, naming the item and the limit."""
    for i, item in enumerate(items):
        where = f"items[{i}]." if len(items) > 1 else ""
        if len(item.context) > settings.max_context_chars:
            raise ApiError(
                413,
                "context_too_large",
                f"{where}context has {len(item.context)} characters; the limit is {settings.max_context_chars} "
                "(max_context_chars)",
            )
        if len(item.question) > settings.max_question_chars:
            raise ApiError(
                413,
                "question_too_large",
                f"{where}question has {len(item.question)} characters; the limit is {settings.max_question_chars} "
                "(max_question_chars)",
            )


def _to_question(item: AnswerRequest) -> Question:
    return Question(item.question, item.context, item.top_k, item.max_answer_len, item.threshold)


def _answer_fields(answered: Answered, top_k: int, model: str) -> dict[str, Any]:
    """An :class:`AnswerResponse` as a JSON-ready dict, in its field order (serialised once, by orjson)."""
    p = answered.prediction
    fields: dict[str, Any] = {
        "answer": p.text,
        "start": p.start,
        "end": p.end,
        "score": p.score if math.isfinite(p.score) else None,
        "no_answer_prob": p.no_answer_prob,
        "answerable_prob": p.answerable_prob,
        "threshold": p.threshold,
        "rule": answered.rule,
        "reason": p.reason(answered.rule),
        "margin": p.margin,
        "expected_f1": p.expected_f1,
        "is_impossible": p.is_impossible,
        "best_span": _entry(p.n_best[0]) if p.n_best else None,
    }
    if top_k > 1:
        fields["n_best"] = [_entry(e) for e in p.n_best[:top_k]]
    fields["model"] = model
    fields["timing_ms"] = answered.timing_ms
    return fields


def _entry(e) -> dict[str, Any]:
    """A served span. Its probability is its share of the best TOP_K spans' mass (``NBestEntry.share``),
    not the softmax over the pool the server decoded (``probability``, the original's n-best file's),
    which moves with --n-best-pool and with a widened pool."""
    return {"text": e.text, "start": e.start, "end": e.end, "score": e.score, "probability": e.share}


def json_response(content: Any, clock: StageClock | None) -> Response:
    """A 200 JSON response serialised once (the route's ``response_model`` documents its shape), the
    time it took charged to the request's ``serialize`` stage."""
    start = time.perf_counter()
    response = Response(orjson.dumps(content), media_type="application/json")
    if clock is not None:
        clock.since("serialize", start)
    return response


def _record_stages(clock: StageClock | None, answered: list[Answered]) -> None:
    """The request's stages from its questions' timings: featurize and decode summed, queue and engine
    the slowest question's (they ran side by side)."""
    if clock is None:
        return
    clock.add("featurize", sum(a.timing_ms["featurize"] for a in answered))
    clock.add("queue", max(a.timing_ms["queue"] for a in answered))
    clock.add("engine", max(a.timing_ms["inference"] for a in answered))
    clock.add("decode", sum(a.timing_ms["decode"] for a in answered))


def _parsed(request: Request) -> StageClock | None:
    """The request's clock, charged with routing and reading + validating the body (since the door)."""
    clock = stage_clock(request.scope)
    if clock is not None and clock.admitted is not None:
        clock.since("parse", clock.admitted)
    return clock


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already, so the next message says so)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def answer_items(
    runtime: Lifecycle, items: list[AnswerRequest], request: Request
) -> list[dict[str, Any]]:
    """Run the pipeline for one request, racing the client: if it leaves, its queued windows are dropped."""
    pipeline = runtime.require_ready()
    retry = {"Retry-After": str(runtime.settings.retry_after_s)}
    charge = Charge(caller_name(request.scope))  # its request rate and daily quota were checked at the door
    work = asyncio.ensure_future(
        pipeline.answer_many([_to_question(x) for x in items], tag=request_id_var.get(), charge=charge)
    )
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():  # the client left, or this handler was cancelled (shutdown)
            work.cancel()
    if not work.done() or work.cancelled():
        await asyncio.wait({work})  # let the cancellation reach the batcher (its queued windows are dropped)
        runtime.metrics.disconnects.inc()
        raise ApiError(499, "client_disconnected", "the client closed the connection before the answer")
    request.state.windows = charge.windows
    if charge.windows:
        runtime.metrics.key_windows.labels(charge.caller).inc(charge.windows)
    try:
        answered = work.result()
    except RejectedInput as exc:
        raise ApiError(413 if exc.too_large else 422, exc.kind, exc.message) from None
    except QueueFull as exc:
        raise ApiError(503, "overloaded", f"server overloaded: {exc}; retry later", retry) from None
    except BatcherClosed:
        raise ApiError(503, "shutting_down", "the server is shutting down", retry) from None
    except EngineUnavailable as exc:
        raise ApiError(503, "engine_unavailable", str(exc), retry) from None
    except BatcherUnhealthy:
        raise ApiError(
            503, "unhealthy", "the inference backend is unhealthy; retry on another replica", retry
        ) from None
    except NonFiniteOutput:
        raise ApiError(
            500, "non_finite_output", "the model produced a non-finite output (NaN or infinity)"
        ) from None
    except InferenceError:
        raise ApiError(
            500, "inference_failed", "inference failed for this request; see the server log"
        ) from None
    except RequestTimeout as exc:
        raise ApiError(504, "timeout", str(exc)) from None
    runtime.metrics.questions.inc(len(items))
    for a in answered:
        runtime.metrics.windows.observe(a.windows)
        runtime.metrics.queue_time.observe(a.timing_ms["queue"] / 1000.0)
    _record_stages(stage_clock(request.scope), answered)
    return [_answer_fields(a, x.top_k, runtime.name) for a, x in zip(answered, items, strict=True)]


# ---- routes -----------------------------------------------------------------------------------------

answer_router = APIRouter(tags=["answers"])
ops_router = APIRouter(tags=["operations"])


API_VERSION = "/v1"
"""Every route of the API under one version prefix (``/v1/answer``, ``/v1/answer/batch``, ``/v1/model``).
The probes and ``/metrics`` are unversioned, as Kubernetes and Prometheus expect them."""
LEGACY_ALIASES = {"/answer": f"{API_VERSION}/answer", "/answer/batch": f"{API_VERSION}/answer/batch"}
"""Paths served before the prefix: still answered, marked deprecated in the schema, and each response
names its successor (``Deprecation`` and ``Link`` headers, RFC 9745 and RFC 8288)."""


def _with_successor(request: Request, response: Response) -> Response:
    """On a legacy path, say so and where the route lives now."""
    successor = LEGACY_ALIASES.get(request.url.path)
    if successor is not None:
        response.headers["Deprecation"] = "true"
        response.headers["Link"] = f'<{successor}>; rel="successor-version"'
    return response


def _post_versioned(router: APIRouter, path: str, endpoint: Any, **options: Any) -> None:
    """``POST /v1{path}``, and the same handler at the legacy ``{path}``, deprecated."""
    router.post(f"{API_VERSION}{path}", **options)(endpoint)
    router.post(path, deprecated=True, **options)(endpoint)


def _runtime(request: Request) -> Lifecycle:
    """The app's model runtime, read directly on the answer routes: a dependency (:data:`RuntimeDep`)
    costs FastAPI a resolution per request on the path every answer takes."""
    return request.app.state.runtime


async def answer(body: AnswerRequest, request: Request) -> Response:
    """Answer one question. ``context[start:end] == answer``; unanswerable: answer "" and start = end = -1."""
    clock = _parsed(request)
    runtime = _runtime(request)
    check_sizes([body], runtime.settings)
    fields = (await answer_items(runtime, [body], request))[0]
    return _with_successor(request, json_response(fields, clock))


_post_versioned(
    answer_router,
    "/answer",
    answer,
    response_model=AnswerResponse,
    response_model_exclude_unset=True,
    responses=ERROR_RESPONSES,
)


def batch_router(max_items: int) -> APIRouter:
    """``POST /v1/answer/batch`` with a body model that states ``max_items`` in the schema."""
    router = APIRouter(tags=["answers"])

    async def answer_batch(body: BaseBatchRequest, request: Request) -> Response:
        """Answer several questions (at most ``max_batch_items``, else 413); results in request order."""
        clock = _parsed(request)
        runtime = _runtime(request)
        check_sizes(body.items, runtime.settings)
        results = await answer_items(runtime, body.items, request)
        return _with_successor(request, json_response({"results": results}, clock))

    # The body model is built for this limit, so its annotation is the class itself, not a name.
    answer_batch.__annotations__["body"] = batch_request_model(max_items)
    _post_versioned(
        router,
        "/answer/batch",
        answer_batch,
        response_model=BatchResponse,
        response_model_exclude_unset=True,
        responses=ERROR_RESPONSES,
    )
    return router


@ops_router.get(
    "/healthz",
    response_model=HealthResponse,
    response_model_exclude_none=True,
    responses={503: {"model": HealthResponse}},
)
async def healthz(runtime: RuntimeDep) -> Any:
    """Liveness: 200 while the process can serve or recover (also while the model loads); 503 when
    only a restart helps (the model failed to load, the batcher crashed, a backend call hangs)."""
    if runtime.live:
        return HealthResponse(status=runtime.state)
    return JSONResponse(HealthResponse(status=runtime.state).model_dump(exclude_none=True), status_code=503)


@ops_router.get(
    "/readyz",
    response_model=HealthResponse,
    response_model_exclude_none=True,
    responses={503: {"model": HealthResponse}},
)
async def readyz(runtime: RuntimeDep, settings: SettingsDep) -> Any:
    """Readiness: 200 once the model is loaded and warmed up; 503 before, after a failure and while stopping."""
    if runtime.ready:
        return HealthResponse(status="ready", **runtime.runs_on())
    body = HealthResponse(status=runtime.state).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(settings.retry_after_s)})


@ops_router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def prometheus_metrics(runtime: RuntimeDep, metrics: MetricsDep) -> Response:
    """Prometheus text exposition (requests, errors, latencies, batch sizes, queue time)."""
    metrics.ready.set(1 if runtime.ready else 0)
    return Response(metrics.render(), media_type=metrics.content_type)


@ops_router.get(f"{API_VERSION}/model", response_model=ModelInfoResponse)
async def model_info(runtime: RuntimeDep, settings: SettingsDep) -> ModelInfoResponse:
    """The served model's metadata (sidecar/checkpoint) and the server's runtime configuration."""
    spec = runtime.spec
    public = spec.public()
    public["name"] = runtime.name
    threshold = settings.no_answer_threshold
    public["no_answer_threshold"] = spec.serving.no_answer_threshold if threshold is None else threshold
    public["n_best"] = decoding_n_best(spec, settings.n_best_pool)
    if threshold is not None:  # the server's --no-answer-threshold replaces the model's rule
        public["answerability"] |= {"rule": "threshold", "threshold": threshold, "set_by": "server"}
    facts = runtime.describe()
    return ModelInfoResponse(
        **public,
        backend=settings.backend,
        ready=runtime.ready,
        runtime={k: v for k, v in facts.items() if k != "batching"},
        limits={
            "max_context_chars": settings.max_context_chars,
            "max_question_chars": settings.max_question_chars,
            "max_batch_items": settings.max_batch_items,
            "max_normalized_chars": settings.max_normalized_chars,
            "max_request_tokens": settings.max_request_tokens,
            "max_request_windows": settings.max_request_windows,
            "max_queue": settings.max_queue,
            "max_body_bytes": settings.body_limit,
            "request_timeout_s": settings.request_timeout_s,
        },
        batching={
            "max_batch_size": runtime.max_batch_size,
            "max_batch_delay_ms": settings.max_batch_delay_ms,
            "inference_workers": settings.inference_workers,
            "pad_multiple_of": settings.pad_multiple_of,
            "grouping": settings.batching,  # measured: what the load measured is below
            "measured": facts.get("batching"),
        },
    )

"""Prometheus metrics in a registry of the app's own (several apps per process in tests never collide).

Every label value comes from a fixed set, so no request can add series: routes are route templates
(or ``unmatched``), never raw paths; methods are the API's own or ``other``; statuses are the codes
the app sent; key names are those of the keys file; reasons and limits are this code's words. With several worker processes (``--workers N``) prometheus-client's
multiprocess mode is on (``PROMETHEUS_MULTIPROC_DIR``, set by ``python -m server`` before the workers
start): every worker writes its values to files there and ``/metrics``, whichever worker answers it,
aggregates all of them (counters summed, gauges summed over live workers).
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp, Scope

from server.limits.store_watch import StoreWatch
from server.observability.observe import KEY_NAME, ObservingMiddleware, method_label, route_label

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LOAD_FAILED_MARK = "load-failed"  # a worker whose model failed leaves this in the shared directory
# ... and the engine process, besides, this one: its verdict, for the supervisor, which may have to stop it
# while it is still exiting (a front that read the first mark can stop the server first)
ENGINE_LOAD_FAILED_MARK = "engine-load-failed"


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def reset_multiprocess_dir(directory: str | os.PathLike) -> None:
    """Start a run with no values or marks from an earlier one (prometheus-client's own advice)."""
    for path in Path(directory).iterdir():
        if path.suffix == ".db" or path.name in (LOAD_FAILED_MARK, ENGINE_LOAD_FAILED_MARK):
            path.unlink(missing_ok=True)


def forget_dead_workers(directory: str | os.PathLike) -> None:
    """Drop the live gauges of workers that are gone without saying so (``kill -9``, OOM): their files
    would otherwise keep counting, e.g. a respawned worker's ``xlnetqa_ready`` twice."""
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = path.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), str(directory))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sample_total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` (e.g. ``xlnetqa_batch_size_sum``) in a Prometheus text
    exposition whose labels include ``labels``; 0 if there are none. How benchmarks and tests read
    ``/metrics``, with prometheus-client's own parser."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)


class Metrics:
    """All server metrics; ``render()`` gives the Prometheus text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._add_http(self.registry)
        self._add_batching(self.registry)
        self._add_failures(self.registry)
        self._add_state(self.registry)
        self._add_access(self.registry)
        self._add_model(self.registry)

    def _add_http(self, r: CollectorRegistry) -> None:
        """Requests by route and status, their latency, and what is in flight."""
        self.requests = Counter(
            "xlnetqa_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "xlnetqa_request_duration_seconds",
            "HTTP request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter("xlnetqa_errors", "Error responses by kind", ["kind"], registry=r)
        self.inflight = Gauge(
            "xlnetqa_inflight_requests", "Requests being handled", registry=r, multiprocess_mode="livesum"
        )

    def _add_batching(self, r: CollectorRegistry) -> None:
        """Questions, windows per question, and backend calls (size, padding, time)."""
        self.questions = Counter(
            "xlnetqa_questions", "Questions answered (batch items count one each)", registry=r
        )
        self.windows = Histogram(
            "xlnetqa_windows_per_question",
            "Windows (features) per question",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "xlnetqa_batch_size", "Windows per backend call", buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "xlnetqa_batch_padded_length", "Padded sequence length per backend call",
            buckets=(16, 32, 64, 128, 192, 256, 384, 512, 1024), registry=r,
        )  # fmt: skip
        self.padding = Histogram(
            "xlnetqa_batch_padding_ratio", "Fraction of a batch's tokens that are padding",
            buckets=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0), registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "xlnetqa_queue_time_seconds", "Wait between enqueue and the first backend call", buckets=_LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.inference_time = Histogram(
            "xlnetqa_inference_seconds", "Backend call duration", buckets=_LATENCY_BUCKETS, registry=r
        )

    def _add_failures(self, r: CollectorRegistry) -> None:
        """Backend calls that failed or hung, bad outputs, dropped work and departed clients."""
        self.batch_failures = Counter("xlnetqa_batch_failures", "Backend calls that raised", registry=r)
        self.non_finite = Counter(
            "xlnetqa_non_finite_outputs", "Windows whose model outputs were NaN or infinite", registry=r
        )
        self.backend_hangs = Counter(
            "xlnetqa_backend_hangs", "Backend calls the watchdog declared hung", registry=r
        )
        self.dropped_windows = Counter(
            "xlnetqa_dropped_windows",
            "Queued windows dropped before inference (client gone, deadline passed, question failed)",
            registry=r,
        )
        self.disconnects = Counter(
            "xlnetqa_client_disconnects", "Requests whose client disconnected before the answer", registry=r
        )

    def _add_state(self, r: CollectorRegistry) -> None:
        """Gauges of the moment: the queue's depth and readiness."""
        self.queue_depth = Gauge(
            "xlnetqa_queue_depth",
            "Windows waiting for a backend call",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.ready = Gauge(
            "xlnetqa_ready",
            "1 once the model is loaded and warmed up (with several workers: how many are ready)",
            registry=r,
            multiprocess_mode="livesum",
        )

    def _add_access(self, r: CollectorRegistry) -> None:
        """Authentication failures and per-key traffic and rate limits."""
        self.auth_failures = Counter(
            "xlnetqa_auth_failures",
            "Requests refused for a missing or wrong API key, or from an address over its failure budget",
            ["reason"],
            registry=r,
        )
        self.key_requests = Counter(
            "xlnetqa_key_requests", "Requests by API key name and status", ["key", "status"], registry=r
        )
        self.key_windows = Counter(
            "xlnetqa_key_windows", "Windows (model inputs) admitted, by API key name", ["key"], registry=r
        )
        self.rate_limited = Counter(
            "xlnetqa_rate_limited",
            "Requests refused with 429, by API key name and the limit they hit",
            ["key", "limit"],
            registry=r,
        )
        self.limits_store_up = Gauge(
            "xlnetqa_limits_store_up",
            "1 while the --limits-redis store is in use, 0 while this process enforces the per-key limits on "
            "its own (the store failed; see the log)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.limits_store_errors = Counter(
            "xlnetqa_limits_store_errors",
            "Calls to the --limits-redis store that failed, by error (each one decided by this process's own "
            "limits)",
            ["error"],
            registry=r,
        )

    def _add_model(self, r: CollectorRegistry) -> None:
        """What model is served, and what it really runs on."""
        self.model_info = Gauge(
            "xlnetqa_model_info",
            "Served model (value 1)",
            ["name", "backend", "head", "precision"],
            registry=r,
            multiprocess_mode="max",
        )

        self.runtime_info = Gauge(
            "xlnetqa_runtime_info",
            "What the loaded model really runs on (value 1): onnxruntime providers in use, or the device",
            ["backend", "providers", "device"],
            registry=r,
            multiprocess_mode="max",
        )

    def store_watch(self) -> StoreWatch:
        """What the limits store reports into these metrics."""
        return StoreWatch(
            up=lambda up: self.limits_store_up.set(1 if up else 0),
            error=lambda kind: self.limits_store_errors.labels(kind).inc(),
        )

    def render(self) -> bytes:
        """This process's metrics, or every worker's when several share a multiprocess directory."""
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        forget_dead_workers(directory)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=directory)
        return generate_latest(merged)

    @staticmethod
    def mark_load_failed(engine: bool = False) -> None:
        directory = multiprocess_dir()
        if directory is not None:
            if engine:  # first, so that whoever sees the shared mark finds the engine's too
                (Path(directory) / ENGINE_LOAD_FAILED_MARK).touch()
            (Path(directory) / LOAD_FAILED_MARK).touch()
            multiprocess.mark_process_dead(os.getpid())

    @staticmethod
    def load_failed_marked() -> bool:
        """Whether a process of this server (the engine, or a sibling front) marked its load failed."""
        directory = multiprocess_dir()
        return directory is not None and (Path(directory) / LOAD_FAILED_MARK).exists()

    @staticmethod
    def process_exiting() -> None:
        """Drop this worker's live gauges from the aggregate (its counters stay counted)."""
        if multiprocess_dir() is not None:
            multiprocess.mark_process_dead(os.getpid())


class MetricsMiddleware(ObservingMiddleware):
    """Counts and times every HTTP request by route template and status (and by API key name)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    def started(self, scope: Scope) -> None:
        self.metrics.inflight.inc()

    def finished(self, scope: Scope, status: int, seconds: float) -> None:
        self.metrics.inflight.dec()
        label = route_label(scope)
        self.metrics.requests.labels(label, method_label(scope), str(status)).inc()
        self.metrics.latency.labels(label).observe(seconds)
        key = (scope.get("state") or {}).get(KEY_NAME)
        if key is not None:  # set by the door (server.door.key_check) for every request it let in
            self.metrics.key_requests.labels(str(key), str(status)).inc()

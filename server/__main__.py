"""``python -m server --model DIR --backend onnx|trt|torch [--host H] [--port P] ...``

Flags override ``XLNETQA_*`` environment variables, which override defaults (see server.settings).
A model directory or backend that cannot work here (missing file, no tensorrt/GPU) exits 2 with one
line on stderr before anything listens; a model that fails while loading stops the server with exit 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from server.settings import ServerSettings

# (flag, settings field, type, help); every flag defaults to None = "not given, keep env/default".
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--model", "model", str, "export directory (onnx/trt) or checkpoint directory (torch)"),
    ("--backend", "backend", str, "onnx | trt | torch"),
    ("--model-name", "model_name", str, "name reported in responses"),
    ("--host", "host", str, "bind address (default 127.0.0.1)"),
    ("--port", "port", int, "port (default 8000; 0 = any free port)"),
    ("--workers", "workers", int, "uvicorn worker processes (each loads the model)"),
    ("--threads", "threads", int, "backend intra-op threads (default 1)"),
    ("--inter-op-threads", "inter_op_threads", int, "backend inter-op threads (default 1)"),
    ("--providers", "providers", str, "onnxruntime providers, comma-separated, or 'auto'"),
    ("--max-batch-size", "max_batch_size", int, "most windows per backend call (1 = no batching)"),
    (
        "--max-batch-delay-ms",
        "max_batch_delay_ms",
        float,
        "longest wait for a batch to fill (0 = never wait)",
    ),
    (
        "--max-batch-padding",
        "max_batch_padding",
        float,
        "most padding per batch, as a fraction of its real tokens (default 0.25)",
    ),
    ("--pad-multiple-of", "pad_multiple_of", int, "round padded lengths up to a multiple"),
    ("--inference-workers", "inference_workers", int, "backend calls in flight at once"),
    ("--max-context-chars", "max_context_chars", int, "longer contexts get 413"),
    ("--max-question-chars", "max_question_chars", int, "longer questions get 413"),
    ("--max-batch-items", "max_batch_items", int, "larger /answer/batch requests get 413"),
    ("--max-queue", "max_queue", int, "questions waiting beyond this get 503 + Retry-After"),
    ("--max-body-bytes", "max_body_bytes", int, "larger request bodies get 413"),
    ("--request-timeout-s", "request_timeout_s", float, "queue + inference time before 504"),
    ("--no-answer-threshold", "no_answer_threshold", float, "default threshold (else the model's)"),
    ("--warmup-delay-s", "warmup_delay_s", float, "sleep before warm-up (testing /readyz)"),
    ("--graceful-timeout-s", "graceful_timeout_s", float, "how long SIGTERM waits for in-flight requests"),
    ("--log-level", "log_level", str, "critical | error | warning | info | debug"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m server", description="Serve an XLNet QA model over HTTP.")
    for flag, dest, typ, text in _FLAGS:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=text)
    return p


def load_settings(argv: Sequence[str] | None = None) -> ServerSettings:
    """Settings from env + flags; raises ValidationError with every problem."""
    args = build_parser().parse_args(argv)
    return ServerSettings(**{k: v for k, v in vars(args).items() if v is not None})


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        return _fail(problems)
    if settings.model is None:
        return _fail("--model DIR (or XLNETQA_MODEL) is required")
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    import uvicorn

    from server.backends import BackendUnavailable, preflight
    from server.model_spec import ModelSpecError, resolve_spec

    try:
        preflight(settings.backend)
        spec = resolve_spec(settings.model, settings.backend)
    except (ModelSpecError, BackendUnavailable) as exc:
        return _fail(str(exc))

    common: dict = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "timeout_graceful_shutdown": max(1, round(settings.graceful_timeout_s)),
    }
    if settings.workers > 1:  # worker processes rebuild the app from the environment
        os.environ.update(settings.to_env())
        uvicorn.run("server.app:create_app_from_env", factory=True, workers=settings.workers, **common)
        return 0

    from server.app import create_app

    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, spec=spec, on_fatal=stop)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", **common))
    server.run()
    runtime = app.state.runtime
    if runtime.state == "failed":
        print(f"error: model failed to load: {runtime.error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m server --model DIR --backend onnx|trt|torch [--host H] [--port P] ...``

Flags override ``XLNETQA_*`` environment variables, which override defaults (see server.settings).
A model directory or backend that cannot work here (missing file, no tensorrt/GPU) exits 2 with one
line on stderr before anything listens; a model that fails while loading stops the server with exit 1.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from server.answering.gil import prefer_latency
from server.flags import FlagError, SecretInArgv, load_settings
from server.observability.log_format import configure_logging


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except (SecretInArgv, FlagError) as exc:
        return _fail(str(exc))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        return _fail(problems)
    if settings.model is None:
        return _fail("--model DIR (or XLNETQA_MODEL) is required")
    configure_logging(settings.log_level, settings.log_format)
    prefer_latency()

    import uvicorn

    from server.answering.model_spec import ModelSpecError, resolve_spec
    from server.backends import BackendUnavailable, check_spec, preflight
    from server.door.auth import KeyFileError, KeyRing
    from server.door.connection import configure_connections, connection_protocol
    from server.door.hosts import is_loopback
    from server.door.listen_socket import ListenSocketError, adopt
    from server.door.tls import TlsSetupError
    from server.limits.quotas_redis import LimitsStoreError, check_store

    try:
        preflight(settings)
        spec = resolve_spec(settings.model, settings.backend, allow_unhashed=settings.allow_unhashed_model)
        check_spec(spec, settings)
        keys = KeyRing.from_settings(settings.api_keys_file, allow_shared=settings.allow_shared_keys_file)
        tls = settings.tls_context()
        if settings.limits_redis is not None:
            check_store(settings)
        sockets = [adopt(settings.listen_fd)] if settings.listen_fd is not None else None
    except (
        ModelSpecError, BackendUnavailable, KeyFileError, TlsSetupError, LimitsStoreError, ListenSocketError,
    ) as exc:  # fmt: skip
        return _fail(str(exc))
    if keys is None and not is_loopback(settings.host):
        logging.getLogger("server").warning(
            "no API keys: anyone who reaches %s:%d may use this server (--api-keys-file or XLNETQA_API_KEYS)",
            settings.host,
            settings.port,
        )

    common: dict = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": None,  # uvicorn's own lines go through ours (server.observability.log_format): one format a log
        # uvicorn waits this long for open requests; the drain after it gets what is left of it.
        "timeout_graceful_shutdown": settings.graceful_timeout_s,
        "timeout_keep_alive": settings.timeout_keep_alive_s,
        "limit_concurrency": settings.connection_limit,
        "server_header": False,  # no "server: uvicorn" (nothing to fingerprint)
        "access_log": False,  # ours (server.observability.access_log) names routes and keys, never raw paths
        # httptools with a deadline on request headers (slowloris) and TLS handshakes, header caps and
        # framing rules (server.door.connection); TLS is done there too
        "http": connection_protocol,
        "ws": "none",  # no WebSocket: an upgrade request is a plain request for the door to answer
        # X-Forwarded-* only from the named proxies (uvicorn's default believes loopback)
        "proxy_headers": settings.forwarded_allow_ips is not None,
        "forwarded_allow_ips": settings.forwarded_allow_ips or "",
    }
    configure_connections(
        settings.header_timeout_s, tls, settings.max_headers, settings.max_header_bytes,
        settings.unauthenticated_per_address, settings.connections_per_key,
    )  # fmt: skip
    if settings.fronts_over_engine:
        from server.topology.supervisor import run_fronts_over_engine

        return run_fronts_over_engine(settings, common, sockets)

    from server.app import create_app

    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, spec=spec, on_fatal=stop)
    listener = None
    if settings.metrics_port is not None:
        from server.observability.metrics_listener import start_metrics_listener

        try:
            listener = start_metrics_listener(
                settings.host, settings.metrics_port, registry=app.state.metrics.registry
            )
        except OSError as exc:
            return _fail(f"--metrics-port {settings.metrics_port}: cannot listen ({exc.strerror or exc})")
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", **common))
    try:
        server.run(sockets=sockets)
    finally:
        if listener is not None:
            listener.shutdown()
    runtime = app.state.runtime
    if runtime.state == "failed":
        print(f"error: model failed to load: {runtime.error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m server.topology.engine``: the engine process of a server with front processes.

Started by :mod:`server.topology.supervisor` (never by hand), with the server's settings in ``XLNETQA_*``
variables and its socket's address in ``XLNETQA_ENGINE_ADDRESS``. It loads and warms up the model
(``ModelLifecycle`` without a host path), serves fronts (:class:`server.topology.engine.service.EngineService`)
and, on SIGTERM, refuses new work, finishes what it admitted within the graceful timeout and exits 0.
A model that fails to load exits :data:`LOAD_FAILED` (the supervisor then stops the server rather
than restart an engine that would fail again).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from server.answering.gil import prefer_latency
from server.answering.lifecycle import ModelLifecycle
from server.answering.model_spec import resolve_spec
from server.backends import create_backend
from server.door.auth import keys_configured
from server.limits.quotas_redis import quotas_for
from server.observability.log_format import configure_logging
from server.observability.metrics import Metrics
from server.settings import ENGINE_ADDRESS_ENV, ServerSettings
from server.topology.engine import LOAD_FAILED
from server.topology.engine.service import EngineService

logger = logging.getLogger("server.topology.engine")
SOCKET_FAILED = 1  # any exit but LOAD_FAILED is restarted by the supervisor


async def serve(settings: ServerSettings, address: str) -> int:
    assert settings.model is not None
    spec = resolve_spec(settings.model, settings.backend, allow_unhashed=settings.allow_unhashed_model)
    metrics = Metrics()
    quotas = quotas_for(settings, metrics.store_watch(), keyed=keys_configured(settings.api_keys_file))
    stop = asyncio.Event()
    failed = False

    def fatal() -> None:
        nonlocal failed
        failed = True
        stop.set()

    runtime = ModelLifecycle(settings, spec, metrics, create_backend, fatal, quotas, answers=False)
    service = EngineService(runtime, quotas, address)
    await runtime.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(service.serve(), name="engine-serve")
    logger.info("engine %s listening (pid %d)", service.incarnation[:8], os.getpid())
    await asyncio.wait({serving, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    socket_failed = serving.done() and serving.exception() is not None
    if socket_failed:  # not the model's doing: the supervisor starts the engine again
        logger.error("the engine's socket failed", exc_info=serving.exception())
    await runtime.stop()  # refuses new work (state stopping), finishes what was admitted
    await service.close(timeout_s=1.0)  # their answers go out before the socket closes
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await serving
    if failed:  # only the model's load sets it: the supervisor stops the server (it would fail again)
        Metrics.mark_load_failed(engine=True)
        return LOAD_FAILED
    metrics.process_exiting()
    return SOCKET_FAILED if socket_failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m server.topology.engine",
        description="The engine process of a server with front processes: started by `python -m server "
        f"--workers N` (or --engine-process), which passes the settings as XLNETQA_* variables and the "
        f"socket as {ENGINE_ADDRESS_ENV}; not meant to be run by hand.",
    ).parse_args(argv)
    settings = ServerSettings()
    configure_logging(settings.log_level, settings.log_format)
    prefer_latency()
    address = os.environ.get(ENGINE_ADDRESS_ENV)
    if not address or settings.model is None:
        print(
            f"error: python -m server.topology.engine is started by python -m server ({ENGINE_ADDRESS_ENV} unset)",
            file=sys.stderr,
        )
        return 2
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(settings, address))
    return uvloop.run(serve(settings, address))


if __name__ == "__main__":
    sys.exit(main())

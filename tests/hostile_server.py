"""An in-process server for the hostile tests: uvicorn serving ``create_app`` in a thread, with the real
ONNX backend wrapped to inject faults (a question holding ``<eop>`` triggers them) or to be slow."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from harness.server_process import LOOPBACK as HOST

EOP = 8  # "<eop>" in a question: the injected fault's trigger
FAULTY = {"question": "What is <eop> here?", "context": "Nothing happened here."}


def faulty_backend(fault: Callable) -> Callable:
    """A backend factory: the real backend, but batches holding <eop> go through ``fault(run, batch)``."""
    from server.backends import create_backend

    def factory(spec, settings):
        backend = create_backend(spec, settings)
        run = backend.run

        def run_or_fault(batch):
            return fault(run, batch) if (batch["input_ids"] == EOP).any() else run(batch)

        backend.run = run_or_fault
        return backend

    return factory


def slow_backend(seconds: float) -> Callable:
    """Every call takes at least ``seconds`` (a big model on a small CPU), so queueing order is visible."""
    from server.backends import create_backend

    def factory(spec, settings):
        backend = create_backend(spec, settings)
        run = backend.run

        def slow(batch):
            time.sleep(seconds)
            return run(batch)

        backend.run = slow
        return backend

    return factory


@contextlib.contextmanager
def app_server(
    model: Path, backend_factory: Callable | None = None, **settings
) -> Iterator[tuple[str, object]]:
    """uvicorn serving ``create_app`` in a thread; yields (url, app) once the model is ready or failed."""
    import uvicorn

    from server.app import create_app
    from server.settings import ServerSettings

    listening = socket.create_server((HOST, 0))  # bound here: no other program can take the port first
    config = ServerSettings(model=model, port=listening.getsockname()[1], **settings)
    app = create_app(config, backend_factory=backend_factory)
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=config.port, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]})
    thread.start()
    url = f"http://{HOST}:{config.port}"
    try:
        deadline = time.monotonic() + 60
        while not (server.started and app.state.runtime.state in ("ready", "failed")):
            assert time.monotonic() < deadline and thread.is_alive(), "in-process server did not start"
            time.sleep(0.02)
        yield url, app
    finally:
        server.should_exit = True
        thread.join(60)
        listening.close()


async def post_many(url: str, bodies: list[dict], timeout: float = 60) -> list[httpx.Response]:
    """POST every body to ``/answer`` at once."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as c:
        return await asyncio.gather(*(c.post("/answer", json=b) for b in bodies))

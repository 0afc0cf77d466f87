"""``python -m server --workers N`` (or ``--engine-process``): N front processes over one engine process.

The supervisor (the ``python -m server`` process) starts the engine (``python -m server.topology.engine``) on a
ZeroMQ socket in a private directory (mode 0700, so no other local user can connect), then the fronts
under uvicorn's own supervisor, which restarts a front that dies. A thread here watches the engine: one
that exits while the server runs (``kill -9``, a crash, the OOM killer) is started again, sooner the
first time and later if it keeps dying, while the fronts answer 503 ``engine_unavailable`` and
``/readyz`` says so; one whose model fails to load stops the whole server (it would fail again). On
SIGTERM the fronts finish their requests first, then the engine drains and exits. The engine also
dies with the supervisor (Linux parent-death signal), so a killed supervisor leaves no engine behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from server.observability.metrics import (
    ENGINE_LOAD_FAILED_MARK,
    LOAD_FAILED_MARK,
    MULTIPROC_ENV,
    multiprocess_dir,
    reset_multiprocess_dir,
)
from server.settings import ENGINE_ADDRESS_ENV, ServerSettings
from server.topology.child_process import die_with_parent
from server.topology.engine import LOAD_FAILED

logger = logging.getLogger("server")
RESTART_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
STABLE_S = 30.0  # an engine that ran this long starts the restart delays over


class EngineKeeper:
    """Runs ``python -m server.topology.engine`` and starts it again whenever it exits unasked."""

    def __init__(self, env: dict[str, str], grace_s: float) -> None:
        self.env, self.grace_s = env, grace_s
        self.proc: subprocess.Popen | None = None
        self.load_failed = False
        self.restarts = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="engine-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _spawn(self) -> subprocess.Popen:
        command = [sys.executable, "-m", "server.topology.engine"]
        return subprocess.Popen(command, env=self.env, preexec_fn=die_with_parent)  # noqa: PLW1509

    def _keep(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            self.proc = self._spawn()
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            if code == LOAD_FAILED:
                self.load_failed = True
                logger.error("the engine's model failed to load: stopping the server")
                os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's handler stops the fronts
                return
            failures = 0 if time.monotonic() - started > STABLE_S else failures + 1
            delay = RESTART_DELAYS_S[min(failures - 1, len(RESTART_DELAYS_S) - 1)]
            self.restarts += 1
            logger.error("the engine exited with %s; starting it again in %g s", _exit_text(code), delay)
            self._stopping.wait(delay)

    def stop(self) -> None:
        """SIGTERM (the engine drains), SIGKILL after the grace period."""
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._thread.join(5)


def _exit_text(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"


def _serve_on(sockets: list[socket.socket], workers: int, uvicorn_options: dict) -> None:
    """What ``uvicorn.run`` does for the fronts, on sockets bound by someone else."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(
        "server.app:create_app_from_env", factory=True, workers=workers, **uvicorn_options
    )
    if workers > 1:
        Multiprocess(config, sockets=sockets).run()
    else:
        uvicorn.Server(config).run(sockets=sockets)


def run_fronts_over_engine(
    settings: ServerSettings, uvicorn_options: dict, sockets: list[socket.socket] | None = None
) -> int:
    """Serve with ``settings.workers`` fronts over one engine (on ``sockets`` when the socket was handed
    over, ``--listen-fd``); the exit status of ``python -m server``."""
    import uvicorn

    run_dir = Path(tempfile.mkdtemp(prefix="xlnetqa-engine-"))  # 0700: only this user reaches the socket
    own_metrics = multiprocess_dir() is None
    metrics_dir = tempfile.mkdtemp(prefix="xlnetqa-metrics-") if own_metrics else str(multiprocess_dir())
    Path(metrics_dir).mkdir(parents=True, exist_ok=True)
    reset_multiprocess_dir(metrics_dir)
    shared = {
        **settings.to_env(),
        MULTIPROC_ENV: metrics_dir,
        ENGINE_ADDRESS_ENV: f"ipc://{run_dir}/engine.sock",
    }
    os.environ.update(shared)  # the fronts (uvicorn's workers) inherit them
    listener = None
    if settings.metrics_port is not None:  # every process's metrics, from the shared directory
        from server.observability.metrics_listener import start_metrics_listener

        try:
            listener = start_metrics_listener(settings.host, settings.metrics_port, directory=metrics_dir)
        except OSError as exc:
            shutil.rmtree(run_dir, ignore_errors=True)
            if own_metrics:
                shutil.rmtree(metrics_dir, ignore_errors=True)
            print(
                f"error: --metrics-port {settings.metrics_port}: cannot listen ({exc.strerror or exc})",
                file=sys.stderr,
            )
            return 2
    engine = EngineKeeper(dict(os.environ), grace_s=settings.graceful_timeout_s + 5)
    engine.start()
    try:
        if sockets is None:
            uvicorn.run(
                "server.app:create_app_from_env", factory=True, workers=settings.workers, **uvicorn_options
            )
        else:
            _serve_on(sockets, settings.workers, uvicorn_options)
        front_failed = (Path(metrics_dir) / LOAD_FAILED_MARK).exists()
    finally:
        if listener is not None:
            listener.shutdown()
        engine.stop()
        if (Path(metrics_dir) / ENGINE_LOAD_FAILED_MARK).exists():  # its verdict, if it had no time to exit
            engine.load_failed = True
        shutil.rmtree(run_dir, ignore_errors=True)
        if own_metrics:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if engine.load_failed:
        print("error: model failed to load in the engine (see the log above)", file=sys.stderr)
        return 1
    if front_failed:
        print("error: a front process failed to start (see the log above)", file=sys.stderr)
        return 1
    return 0

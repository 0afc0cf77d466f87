"""``python -m server`` as a child process on a free loopback port: one launcher for the tests, the
benchmarks and the demo, so all three start, wait for and stop a server the same way.

Output goes to a log file (a pipe nobody reads fills up and blocks the server) or, when no log file is
given, to this process's own stdout/stderr.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

import httpx

from server.settings import ENV_PREFIX

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def refusing_port(host: str = LOOPBACK) -> Iterator[socket.socket]:
    """A socket bound to a free port and not listening: while it is held, connections to the port are
    refused and no other program can take it (hand it to a server later: ``ServerProcess(listen_socket=)``)."""
    sock = socket.socket()
    try:
        sock.bind((host, 0))
        yield sock
    finally:
        sock.close()


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now, for code that binds it itself (another checkout's server,
    torchrun, a command in the docs). It is taken from below the system's ephemeral range, where the
    system never hands out ports of its own (a program binding port 0 or connecting out gets one from
    that range): only a program binding this very port could take it before it is bound. Where the code
    accepts a socket, hand one over instead (``--listen-fd``, :func:`refusing_port`)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, low)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # a crowded machine: any port the system picks
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the system's ephemeral range (Linux; 32768 elsewhere or when unreadable)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > 11000 else 32768


def child_env(extra: Mapping[str, str] | None = None, repo: Path = REPO) -> dict[str, str]:
    """This environment without inherited ``XLNETQA_*`` settings (flags decide), plus ``extra``; the
    child imports the checkout ``repo`` (this one by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ServerProcess:
    """One ``python -m server --model M --backend B [flags]`` child; usable as a context manager."""

    def __init__(
        self,
        model: Path | str,
        *flags: str,
        backend: str = "onnx",
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        log_level: str = "warning",
        ready_timeout_s: float = 120.0,
        stop_grace_s: float = 30.0,
        tls_ca: Path | None = None,
        python: str | None = None,
        repo: Path | None = None,
        listen_socket: socket.socket | None = None,
    ) -> None:
        """``listen_socket``: a bound socket the server is to serve (``--listen-fd``; listened on at
        launch). Without it or ``port``, this checkout's server gets a socket bound to a free port here
        and handed over, so no other program can take the port between the choice and the bind; another
        checkout's server (``repo``), which may not take one, gets a port found free."""
        self.model, self.flags, self.backend = Path(model), list(flags), backend
        self.python = python or sys.executable  # another venv's interpreter (e.g. onnxruntime-gpu)
        self.repo = repo or REPO  # another checkout's server (a benchmark's "before")
        self.log_path, self.log_level = log_path, log_level
        self.ready_timeout_s, self.stop_grace_s = ready_timeout_s, stop_grace_s
        self.env = child_env(env, self.repo)
        self._hand_over = listen_socket is not None or (port is None and repo is None)
        self._socket = listen_socket
        self.port = port or (0 if self._hand_over else free_port())
        if self._hand_over:
            self._bind()
        self.tls_ca = tls_ca  # served over HTTPS (flags --ssl-certfile/--ssl-keyfile); probes trust this CA
        self.proc: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    def _bind(self) -> None:
        """The socket to hand over: the one given, else one bound here on the host the flags name."""
        if self._socket is None:
            host = LOOPBACK
            for flag, value in zip(self.flags, self.flags[1:], strict=False):
                if flag == "--host":
                    host = value
            self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            self._socket.bind((host, 0))
        self.port = self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://{LOOPBACK}:{self.port}"

    @property
    def command(self) -> list[str]:
        cmd = [self.python, "-m", "server", "--model", str(self.model), "--backend", self.backend]
        cmd += ["--host", LOOPBACK, "--port", str(self.port), "--log-level", self.log_level]
        if self._socket is not None:
            cmd += ["--listen-fd", str(self._socket.fileno())]
        return cmd + self.flags

    def log(self) -> str:
        """The server's output so far ("" when it writes to our own stdout)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def _where(self) -> str:
        text = self.log()
        return f":\n{text}" if text else (f"; see {self.log_path}" if self.log_path else "")

    def launch(self) -> ServerProcess:
        """Start the process (returns at once; :meth:`wait` polls it)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"this server is running already (pid {self.proc.pid}); stop it first")
        out: IO[bytes] | None = None
        if self.log_path is not None:
            out = self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        if self._hand_over and self._socket is None:  # launched again: a new socket (a new port)
            self._bind()
        fds: tuple[int, ...] = ()
        if self._socket is not None:
            self._socket.listen(1024)
            fds = (self._socket.fileno(),)
        try:
            self.proc = subprocess.Popen(
                self.command, cwd=self.repo, env=self.env, stdout=out, stderr=subprocess.STDOUT if out else None,
                pass_fds=fds,
            )  # fmt: skip
        finally:
            if self._socket is not None:  # the server holds it now: once it exits, the port refuses
                self._socket.close()
                self._socket = None
        return self

    def wait(self, path: str = "/readyz", timeout: float | None = None) -> ServerProcess:
        """Poll ``path`` until it answers 200 (within ``timeout``, default ``ready_timeout_s``); raise with
        the server's log if it exits or time runs out."""
        timeout = self.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}{self._where()}")
            try:
                verify = str(self.tls_ca) if self.tls_ca else True
                if httpx.get(self.url + path, timeout=2.0, verify=verify).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout} s{self._where()}")

    def start(self, path: str = "/readyz", timeout: float | None = None) -> ServerProcess:
        return self.launch().wait(path, timeout)

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM (uvicorn drains in-flight requests), SIGKILL after ``grace_s`` (default
        ``stop_grace_s``); returns the exit code."""
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log_file is not None:
            self._log_file.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        try:
            return self.start()
        except BaseException:  # not ready in time, or exited: never leave the child running
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

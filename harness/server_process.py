"""``python -m server`` as a child process on a free loopback port: one launcher for the tests, the
benchmarks and the demo, so all three start, wait for and stop a server the same way.

Output goes to a log file (a pipe nobody reads fills up and blocks the server) or, when no log file is
given, to this process's own stdout/stderr.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import httpx

from server.settings import ENV_PREFIX

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
    ) -> None:
        self.model, self.flags, self.backend = Path(model), list(flags), backend
        self.python = python or sys.executable  # another venv's interpreter (e.g. onnxruntime-gpu)
        self.repo = repo or REPO  # another checkout's server (a benchmark's "before")
        self.log_path, self.log_level = log_path, log_level
        self.ready_timeout_s, self.stop_grace_s = ready_timeout_s, stop_grace_s
        self.env = child_env(env, self.repo)
        self.port = port or free_port()
        self.tls_ca = tls_ca  # served over HTTPS (flags --ssl-certfile/--ssl-keyfile); probes trust this CA
        self.proc: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://{LOOPBACK}:{self.port}"

    @property
    def command(self) -> list[str]:
        cmd = [self.python, "-m", "server", "--model", str(self.model), "--backend", self.backend]
        return cmd + [
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--log-level",
            self.log_level,
            *self.flags,
        ]

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
        self.proc = subprocess.Popen(
            self.command, cwd=self.repo, env=self.env, stdout=out, stderr=subprocess.STDOUT if out else None
        )
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

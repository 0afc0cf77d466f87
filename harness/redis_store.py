"""A real ``redis-server`` of a test's own, on a Unix socket in a directory of its own (no TCP port to
race for), and the ways a store misbehaves in production: gone, paused, read-only, out of memory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from harness.server_process import free_port

# A TCP port instead of the socket, for a server that only speaks redis:// (the code before unix:// was
# accepted: the tests run against another checkout, XLNETQA_TEST_SERVER_REPO, or a benchmark's "before").
TCP = bool(os.environ.get("XLNETQA_TEST_REDIS_TCP"))
REDIS = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
SKIP_REASON = "redis-server is not installed (apt-get install redis-server)"


class RedisStore:
    """``redis-server`` on a Unix socket in a short private directory (a socket's path is at most 107
    bytes, more than a test's tmp_path may leave), no persistence; a context manager."""

    def __init__(self, password: str | None = None, tcp: bool = TCP) -> None:
        assert REDIS is not None and REDIS_CLI is not None, SKIP_REASON
        self.directory = Path(tempfile.mkdtemp(prefix="xq-redis-"))
        self.password, self.tcp = password, tcp
        self.socket = self.directory / "redis.sock"
        self.port = free_port() if tcp else 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The URL with the password, if any (a server must get it another way than a flag)."""
        if self.tcp:
            return (
                f"redis://:{self.password}@127.0.0.1:{self.port}/0"
                if self.password
                else self.url_without_password
            )
        tail = f"&password={self.password}" if self.password else ""
        return f"unix://{self.socket}?db=0{tail}"

    @property
    def url_without_password(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0" if self.tcp else f"unix://{self.socket}?db=0"

    def start(self) -> RedisStore:
        assert REDIS is not None, SKIP_REASON
        command = [
            REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--unixsocket", str(self.socket),
            "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(self.directory),
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while self.cli("ping") != "PONG":
            assert time.monotonic() < deadline and self.proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)
        return self

    def cli(self, *args: str) -> str:
        """One redis-cli command; its output, stripped."""
        assert REDIS_CLI is not None
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        done = subprocess.run(
            [REDIS_CLI, "-s", str(self.socket), *auth, *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip()

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing answers (a stalled host, a long fork, a GC pause)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def read_only(self) -> None:
        """A replica of a primary that is not there: every write is refused with READONLY (a failover)."""
        assert self.cli("replicaof", "127.0.0.1", "1") == "OK"  # port 1: nothing there, ever

    def out_of_memory(self) -> None:
        """``maxmemory`` below what it holds, no eviction: every write is refused with OOM."""
        assert self.cli("config", "set", "maxmemory-policy", "noeviction") == "OK"
        assert self.cli("config", "set", "maxmemory", "1") == "OK"

    def writable(self) -> None:
        """Back to a primary with no memory bound."""
        self.cli("replicaof", "no", "one")
        self.cli("config", "set", "maxmemory", "0")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

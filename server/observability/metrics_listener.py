"""``--metrics-port``: ``/metrics`` on a port of its own, with no key, for a Prometheus that cannot send one.

The API's port keeps ``/metrics`` behind a key (``--auth-metrics``, the default): whatever routes the
API to the Internet (an ingress, a load balancer) then never exposes key names and per-key counts, while
the scraper reaches this port, which only the cluster's network policy admits it to (the Kubernetes
kit does so).

Nothing on this port can slow the API: it is answered by a process of its own
(:mod:`server.observability.metrics_port`: bounded connections, deadlines, a cached rendering at most once a second),
never by a thread of the server's process (prometheus-client's own server started a thread per
connection, unbounded, and a flood of scrapes held the metrics' locks the API takes on every request).
This module binds the port (a port in use is an error at start), starts that process, and, for a
single-process server, renders this process's registry when it asks, from one thread that sleeps
otherwise. With front processes over an engine, the process reads the multiprocess directory itself.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import subprocess
import sys
import threading

from prometheus_client import CollectorRegistry, generate_latest

from server.topology.child_process import die_with_parent

logger = logging.getLogger("server")


class MetricsListener:
    """The metrics port's process, and (one process) the thread that renders for it."""

    def __init__(
        self, proc: subprocess.Popen, source: socket.socket | None, registry: CollectorRegistry | None
    ) -> None:
        self.proc, self._source, self.registry = proc, source, registry
        if source is not None:
            threading.Thread(target=self._render_on_request, name="metrics-source", daemon=True).start()

    def _render_on_request(self) -> None:
        assert self._source is not None and self.registry is not None
        with contextlib.suppress(OSError):
            while self._source.recv(1):
                body = generate_latest(self.registry)
                self._source.sendall(struct.pack(">I", len(body)) + body)

    def shutdown(self) -> None:
        """Stop the process (and with it the port)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._source is not None:
            self._source.close()


def start_metrics_listener(
    host: str, port: int, registry: CollectorRegistry | None = None, directory: str | None = None
) -> MetricsListener:
    """Serve ``registry`` (one process) or the multiprocess ``directory`` on ``host:port`` from a
    process of its own; returns its handle (``.shutdown()`` stops it). OSError if the port is taken."""
    if (registry is None) == (directory is None):
        raise ValueError("a metrics listener serves a registry or a multiprocess directory, one of them")
    listener = socket.create_server((host, port), backlog=128)
    bound = listener.getsockname()[1]  # the port asked for, or the one the system picked for 0
    command = [
        sys.executable,
        "-m",
        "server.observability.metrics_port",
        "--listen-fd",
        str(listener.fileno()),
    ]
    fds = [listener.fileno()]
    ours: socket.socket | None = None
    if directory is not None:
        command += ["--directory", directory]
    else:
        ours, theirs = socket.socketpair()
        command += ["--source-fd", str(theirs.fileno())]
        fds.append(theirs.fileno())
    try:
        proc = subprocess.Popen(command, pass_fds=fds, preexec_fn=die_with_parent)  # noqa: PLW1509
    finally:
        listener.close()  # the child holds it now
        if directory is None:
            theirs.close()
    handle = MetricsListener(proc, ours, registry)
    logger.info("metrics on http://%s:%d/metrics (no key: keep this port off the Internet)", host, bound)
    return handle

"""``--metrics-port``: ``/metrics`` on a port of its own, with no key, for a Prometheus that cannot send one.

The API's port keeps ``/metrics`` behind a key (``--auth-metrics``, the default): whatever routes the
API to the Internet (an ingress, a load balancer) then never exposes key names and per-key counts, while
the scraper reaches this port, which only the cluster's network policy admits it to (the Kubernetes
kit does so). Served by prometheus-client's own small HTTP server in a thread of the ``python -m
server`` process, from this process's registry or, with front processes over an engine, from every
process's values in the multiprocess directory. Whatever the path, it answers with the metrics.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import multiprocess as prometheus_multiprocess

logger = logging.getLogger("server")


def start_metrics_listener(
    host: str, port: int, registry: CollectorRegistry | None = None, directory: str | None = None
) -> Any:
    """Serve ``registry`` (one process) or the multiprocess ``directory`` on ``host:port``; returns the
    server (``.shutdown()`` stops it)."""
    if directory is not None:
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry, path=directory)
    assert registry is not None
    server, _thread = start_http_server(port, addr=host, registry=registry)
    logger.info("metrics on http://%s:%d/metrics (no key: keep this port off the Internet)", host, port)
    return server

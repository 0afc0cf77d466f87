"""What a shared limits store reports (:mod:`server.limits.quotas_redis`), for whoever watches it (the metrics)."""

from __future__ import annotations

from collections.abc import Callable


class StoreWatch:
    """``up(bool)`` when the store goes away or comes back, ``error(kind)`` for each failed call; the
    defaults do nothing."""

    def __init__(
        self, up: Callable[[bool], None] | None = None, error: Callable[[str], None] | None = None
    ) -> None:
        self.up: Callable[[bool], None] = up or (lambda _: None)
        self.error: Callable[[str], None] = error or (lambda _: None)

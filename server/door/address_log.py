"""Warnings about clients, throttled per client address: a flood of bad connections or requests from
one address writes a line per interval with the count left out, never one line per connection, and
the addresses remembered are bounded (a flood from many addresses cannot grow the table)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

logger = logging.getLogger("server")
LOG_INTERVAL_S = 10.0


class AddressLog:
    """Warnings about clients, at most one line per (address, kind) per ``interval_s``, each saying how
    many were left out since; at most ``max_addresses`` addresses are remembered (the oldest forgotten)."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, max_addresses: int = 4096) -> None:
        self.interval_s, self.max_addresses = interval_s, max_addresses
        self._last: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    def warn(self, address: str, kind: str, message: str) -> bool:
        """Log ``message`` for ``address`` unless it was logged within the interval (True: logged)."""
        now, key = time.monotonic(), (address, kind)
        last, skipped = self._last.pop(key, (-self.interval_s, 0))
        if now - last < self.interval_s:
            self._last[key] = (last, skipped + 1)
            return False
        more = f" (and {skipped} more from this address since the last line)" if skipped else ""
        logger.warning("%s: %s%s", address, message, more)
        self._last[key] = (now, 0)
        while len(self._last) > self.max_addresses:
            self._last.popitem(last=False)
        return True

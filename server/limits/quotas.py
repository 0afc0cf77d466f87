"""Per-caller limits: token buckets in requests/s and windows/s, windows in flight, a daily quota;
and a bucket per client address for failed authentications.

A caller is an API key's name (``anonymous`` when the server runs without keys). Requests are counted
at the door (:mod:`server.door.key_check`), before the body is read, so a flood of malformed bodies is throttled
too; windows once the request is tokenized (windows are what costs: a 20,000-character
context is 40 of them). A request over a limit is refused with :class:`OverLimit`, which the HTTP
layer turns into 429 + ``Retry-After`` (the seconds until the bucket holds enough again), before any
of its windows is queued, so one caller's flood costs the others nothing but the refusals.

Limits live in the process that runs the model: the server's own, or with front processes
(``--workers N``, ``--engine-process``) the engine process, which every front asks at the door and
charges windows itself (:mod:`server.topology.engine`), so a host has one set of limits however many fronts
answer HTTP. Replicas (several hosts) each keep their own: N replicas mean N times the limits.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from server.settings import ServerSettings


class OverLimit(Exception):
    """A caller is over one of its limits: ``limit`` names which, ``retry_after`` in seconds."""

    def __init__(self, caller: str, limit: str, retry_after: float, message: str) -> None:
        super().__init__(message)
        self.caller, self.limit, self.message = caller, limit, message
        self.retry_after = max(1, math.ceil(retry_after))


@dataclass
class TokenBucket:
    """``rate`` tokens per second, holding at most ``burst``; starts full."""

    rate: float
    burst: float
    tokens: float = field(default=-1.0)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self, amount: float = 1.0, now: float | None = None) -> float:
        """Seconds until ``amount`` could be taken (0: now; ``inf`` when it exceeds the burst)."""
        self._refill(time.monotonic() if now is None else now)
        if amount <= self.tokens:
            return 0.0
        if amount > self.burst:
            return math.inf
        return (amount - self.tokens) / self.rate

    def owed(self, now: float | None = None) -> float:
        """How far below empty the bucket is (work charged that it had no tokens for), 0 if none."""
        self._refill(time.monotonic() if now is None else now)
        return max(0.0, -self.tokens)

    def take(self, amount: float = 1.0, now: float | None = None) -> float:
        """Take ``amount`` and return 0, or take nothing and return :meth:`wait`'s seconds."""
        wait = self.wait(amount, now)
        if wait == 0.0:
            self.tokens -= amount
        return wait


@dataclass(frozen=True)
class CallerLimits:
    """What one caller may use (None: unlimited)."""

    requests_per_s: float | None = None
    request_burst: float | None = None  # default: 2 seconds' worth, at least 1
    windows_per_s: float | None = None
    window_burst: float | None = None  # default: 2 seconds' worth, at least one maximal request
    max_inflight_windows: int | None = None
    daily_requests: int | None = None

    @classmethod
    def from_settings(cls, settings: ServerSettings, keyed: bool = False) -> CallerLimits:
        """The per-key limits ``--key-*`` configure (``keyed``: the server has API keys, so each key's
        windows in flight have a bound by default)."""
        return cls(
            requests_per_s=settings.key_requests_per_s,
            request_burst=settings.key_request_burst,
            windows_per_s=settings.key_windows_per_s,
            window_burst=settings.key_window_burst,
            max_inflight_windows=settings.inflight_windows_per_key(keyed),
            daily_requests=settings.key_daily_requests,
        )

    def request_bucket(self) -> float:
        """Requests a key may send at once: the burst set, else 2 seconds' worth (at least 1)."""
        return self.request_burst or max(1.0, 2 * (self.requests_per_s or 0.0))

    def window_bucket(self, max_request_windows: int) -> float:
        """Windows at once: the burst set, else 2 seconds' worth, at least one maximal request."""
        return self.window_burst or max(float(max_request_windows), 2 * (self.windows_per_s or 0.0))

    @property
    def at_the_door(self) -> bool:
        """Whether the door has anything to check: a request rate, a daily quota, or a window rate (whose
        debt it refuses); a bound on windows in flight alone is checked once the request is tokenized."""
        return any(v is not None for v in (self.requests_per_s, self.daily_requests, self.windows_per_s))

    @property
    def active(self) -> bool:
        return any(
            v is not None
            for v in (self.requests_per_s, self.windows_per_s, self.max_inflight_windows, self.daily_requests)
        )


class _Caller:
    def __init__(self, limits: CallerLimits, max_request_windows: int) -> None:
        lim = limits
        self.requests = TokenBucket(lim.requests_per_s, lim.request_bucket()) if lim.requests_per_s else None
        self.windows = (
            TokenBucket(lim.windows_per_s, lim.window_bucket(max_request_windows))
            if lim.windows_per_s
            else None
        )
        self.inflight = 0
        self.refused = 0  # windows of its last request refused at the in-flight cap (0: none since)
        self.day = -1
        self.today = 0


def utc_day(now: float) -> int:
    return int(now // 86400)


def seconds_to_midnight(now: float) -> float:
    return 86400 - now % 86400


class CallerQuotas:
    """The limits of every caller, created on first use (at most the keys' count plus ``anonymous``)."""

    def __init__(self, limits: CallerLimits, max_request_windows: int) -> None:
        self.limits = limits
        self.max_request_windows = max_request_windows
        self._callers: dict[str, _Caller] = {}
        self._lock = threading.Lock()

    def _caller(self, name: str) -> _Caller:
        c = self._callers.get(name)
        if c is None:
            c = self._callers[name] = _Caller(self.limits, self.max_request_windows)
        return c

    def _refuse_if_saturated(self, name: str, c: _Caller) -> None:
        """OverLimit for a key whose last request was refused at its in-flight cap, until that much of
        its work is answered: its next requests are refused at the door, before their bodies are read
        and tokenized only to be refused again."""
        if c.refused:
            raise OverLimit(
                name, "inflight_windows", 1.0,
                f"this key has {c.inflight} windows in flight and its last request needed {c.refused} more "
                f"(limit {self.limits.max_inflight_windows}): retry once some are answered",
            )  # fmt: skip

    def refuse_if_saturated(self, name: str) -> None:
        """:meth:`_refuse_if_saturated` on its own (where the rest of the door's check is elsewhere)."""
        with self._lock:
            self._refuse_if_saturated(name, self._caller(name))

    def admit_request(self, name: str, now: float | None = None) -> None:
        """On arrival: the daily quota, a key at its in-flight cap, the window debt and the request rate
        (OverLimit when over)."""
        if not self.limits.active:
            return
        wall = time.time() if now is None else now
        with self._lock:
            c = self._caller(name)
            quota = self.limits.daily_requests
            if quota is not None:
                if c.day != utc_day(wall):
                    c.day, c.today = utc_day(wall), 0
                if c.today >= quota:
                    raise OverLimit(
                        name, "daily_requests", seconds_to_midnight(wall),
                        f"the daily quota of {quota} requests is used up (it renews at 00:00 UTC)",
                    )  # fmt: skip
            self._refuse_if_saturated(name, c)
            if c.windows is not None and c.windows.owed() > 0:
                owed = c.windows.owed()
                raise OverLimit(
                    name, "windows_per_s", owed / c.windows.rate,
                    f"over the rate of {self.limits.windows_per_s:g} windows/s for this key (tokenizing "
                    f"work already done counts too: {owed:.0f} windows owed)",
                )  # fmt: skip
            if c.requests is not None:
                wait = c.requests.take(1.0)
                if wait > 0:
                    raise OverLimit(
                        name, "requests_per_s", wait,
                        f"over the rate of {self.limits.requests_per_s:g} requests/s for this key",
                    )  # fmt: skip
            if quota is not None:
                c.today += 1

    async def admit(self, name: str) -> None:
        """:meth:`admit_request` as the door awaits it (an engine process's limits are a round trip away)."""
        self.admit_request(name)

    def acquire_windows(self, name: str, windows: int) -> None:
        """Once tokenized: the windows in flight and the window rate (OverLimit when over). A success
        must be paired with :meth:`release_windows`."""
        if not self.limits.active:
            return
        self.hold_inflight(name, windows)
        try:
            self.take_windows(name, windows)
        except OverLimit:
            self.release_windows(name, windows)
            raise

    async def acquire(self, name: str, windows: int) -> None:
        """:meth:`acquire_windows` as the queue awaits it (a shared store's limits are a round trip away)."""
        self.acquire_windows(name, windows)

    def hold_inflight(self, name: str, windows: int) -> None:
        """Count ``windows`` more in flight for ``name``, or OverLimit when that passes its cap."""
        cap = self.limits.max_inflight_windows
        with self._lock:
            c = self._caller(name)
            if cap is not None and c.inflight + windows > cap:
                if windows <= cap:  # the door refuses this key until that much is answered
                    c.refused = windows
                raise OverLimit(
                    name, "inflight_windows", 1.0,
                    f"this key has {c.inflight} windows in flight and this request {windows} (limit {cap})",
                )  # fmt: skip
            c.inflight += windows
            c.refused = 0

    def take_windows(self, name: str, windows: int) -> None:
        """Take ``windows`` from ``name``'s window rate (this process's bucket), or OverLimit."""
        with self._lock:
            bucket = self._caller(name).windows
            if bucket is None:
                return
            wait = bucket.take(float(windows))
            if wait > 0:
                rate = self.limits.windows_per_s
                raise OverLimit(
                    name, "windows_per_s", wait if math.isfinite(wait) else 60.0,
                    f"over the rate of {rate:g} windows/s for this key (this request has {windows})",
                )  # fmt: skip

    def charge_work(self, name: str, windows: int) -> None:
        """Charge work done that no admitted window paid for (tokenizing a request then refused): the
        caller's window rate goes into debt (at most one burst), and the door refuses it until paid."""
        if not self.limits.active or windows <= 0:
            return
        with self._lock:
            bucket = self._caller(name).windows
            if bucket is not None:
                bucket.owed()  # refilled to now
                bucket.tokens = max(-bucket.burst, bucket.tokens - windows)

    async def close(self) -> None:
        """Release what the limits hold outside this process (nothing here; a shared store's connections)."""

    def release_windows(self, name: str, windows: int) -> None:
        if not self.limits.active:
            return
        with self._lock:
            c = self._caller(name)
            c.inflight = max(0, c.inflight - windows)
            cap = self.limits.max_inflight_windows
            if c.refused and (cap is None or c.inflight == 0 or c.inflight + c.refused <= cap):
                c.refused = 0  # room for the request refused last: the door lets the key in again


class FailureLimiter:
    """Failed authentications per client address: a bucket each, the least recently seen address
    forgotten beyond ``max_addresses`` (a scan from many addresses cannot grow memory without bound)."""

    def __init__(self, per_minute: float, burst: float | None = None, max_addresses: int = 10000) -> None:
        self.rate = per_minute / 60.0
        self.burst = burst if burst is not None else max(1.0, per_minute / 6)
        self.max_addresses = max_addresses
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def blocked_for(self, address: str) -> float:
        """Seconds this address must wait before another attempt counts (0: it may try)."""
        with self._lock:
            b = self._buckets.get(address)
            return 0.0 if b is None else b.wait(1.0)

    def failed(self, address: str) -> None:
        with self._lock:
            b = self._buckets.pop(address, None) or TokenBucket(self.rate, self.burst)
            self._buckets[address] = b
            b.take(1.0)
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)

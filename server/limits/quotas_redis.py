"""Per-key limits kept in Redis (``--limits-redis URL``): one set for every replica and process of a
deployment, and a daily quota that survives a restart.

The request rate, the window rate (with the debt of work charged after the fact) and the daily quota
live in Redis, each key's in one hash (``xlnetqa:limits:<name>``) plus one counter per UTC day that
expires two days later; every check-and-take is one Lua script, so two replicas asking at once can
never both take the last token, and the clock is Redis's own (``TIME``), the same for all of them.
What a replica holds in flight (``--key-max-inflight-windows``) stays per replica: it is a count of
work running there, which a crashed replica must not leave behind in a shared store.

**The store degrades, it never fails the service.** Every call is asynchronous (``redis.asyncio``, so
the event loop keeps serving while Redis thinks) and bounded by ``--limits-redis-timeout-ms``; any
failure (unreachable, a timeout, ``READONLY`` after a failover, ``OOM`` under ``maxmemory``, a cluster
error, a reply that cannot be read) falls back to this replica's own limits for that request, and
three in a row open a circuit breaker (:mod:`server.limits.breaker`): while it is open no request waits on
Redis at all, every replica enforces the same limits locally (so N replicas allow up to N times the
limits, never unlimited), and every ``BREAKER_COOLDOWN_S`` one request tries the store again. A
replica's daily count continues from the last count Redis gave it, and what it admitted on its own is
added to Redis's counter when the store answers again. One log line per ``LOG_INTERVAL_S`` says the
store is out, one says it is back; ``xlnetqa_limits_store_up`` is 0 meanwhile and
``xlnetqa_limits_store_errors_total{error}`` counts the failures.

The URL's password never needs to be on the command line (``ps`` shows it to every local user):
``XLNETQA_LIMITS_REDIS`` carries the whole URL, or ``--limits-redis-password-file`` a file holding the
password alone (private, as the keys file); a password in the flag itself is refused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any

from server.door.address_log import AddressLog
from server.door.auth import shared_file_problem
from server.limits.breaker import Breaker, Call
from server.limits.quotas import CallerLimits, CallerQuotas, OverLimit, utc_day
from server.limits.store_watch import StoreWatch
from server.settings import ServerSettings, url_password

logger = logging.getLogger("server")
PREFIX = "xlnetqa:limits:"
DAY_TTL_S = 2 * 86400
BREAKER_FAILURES = 3  # failures in a row that open the breaker
BREAKER_COOLDOWN_S = 2.0  # how long the store is left alone before one request tries it again
LOG_INTERVAL_S = 60.0  # the "store is out" line, at most once per this
MAX_STORE_CONNECTIONS = 64  # per process, at once; a call beyond them falls back (the store is not blamed)
MAX_PENDING_CHARGES = 256  # charges sent without waiting; beyond, they are charged here
NO_PACKAGE = "--limits-redis needs the redis package (pip install 'xlnet-qa[redis]')"

# ARGV: op, request rate, request burst, window rate, window burst, daily quota (-1: none), windows,
# admissions made while the store was out (added to today's counter first).
# Returns {"ok", today's count} or {limit, seconds to wait, amount owed}. Rates of 0 mean no such limit.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op = ARGV[1]
local req_rate, req_burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local win_rate, win_burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local quota, n, missed = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local day = math.floor(now / 86400)
local function bucket(name, rate, burst)
  local tokens = tonumber(redis.call('HGET', KEYS[1], name))
  local stamp = tonumber(redis.call('HGET', KEYS[1], name .. ':at'))
  if tokens == nil then return burst end
  return math.min(burst, tokens + (now - stamp) * rate)
end
local function save(name, tokens)
  redis.call('HSET', KEYS[1], name, tostring(tokens), name .. ':at', tostring(now))
end
if op == 'admit' then
  local daykey = KEYS[1] .. ':day:' .. day
  if quota >= 0 and missed > 0 then
    redis.call('INCRBY', daykey, missed)
    redis.call('EXPIRE', daykey, 172800)
  end
  local today = tonumber(redis.call('GET', daykey) or '0')
  if quota >= 0 and today >= quota then
    return {'daily_requests', tostring(86400 - now % 86400), '0'}
  end
  if win_rate > 0 then
    local w = bucket('windows', win_rate, win_burst)
    if w < 0 then
      save('windows', w)
      return {'windows_owed', tostring(-w / win_rate), tostring(-w)}
    end
  end
  if req_rate > 0 then
    local r = bucket('requests', req_rate, req_burst)
    if r < 1 then
      save('requests', r)
      return {'requests_per_s', tostring((1 - r) / req_rate), '0'}
    end
    save('requests', r - 1)
  end
  if quota >= 0 then
    today = redis.call('INCR', daykey)
    redis.call('EXPIRE', daykey, 172800)
  end
  return {'ok', tostring(today)}
elseif op == 'acquire' then
  if win_rate <= 0 then return {'ok', '0'} end
  local w = bucket('windows', win_rate, win_burst)
  if n <= w then
    save('windows', w - n)
    return {'ok', '0'}
  end
  save('windows', w)
  if n > win_burst then return {'windows_per_s', 'inf', '0'} end
  return {'windows_per_s', tostring((n - w) / win_rate), '0'}
elseif op == 'charge' then
  if win_rate <= 0 then return {'ok', '0'} end
  save('windows', math.max(-win_burst, bucket('windows', win_rate, win_burst) - n))
  return {'ok', '0'}
end
return {'ok', '0'}
"""


class LimitsStoreError(RuntimeError):
    """``--limits-redis`` cannot be used (no redis package, a bad password file, or no answer at start)."""


def store_password(settings: ServerSettings) -> str | None:
    """The Redis password from ``--limits-redis-password-file`` (None without one); LimitsStoreError
    for a file that cannot be read, is empty, or other users may read (as the keys file)."""
    path = settings.limits_redis_password_file
    if path is None:
        return None
    problem = shared_file_problem(Path(path), "the Redis password file", "--allow-shared-keys-file")
    if problem is not None and not settings.allow_shared_keys_file:
        raise LimitsStoreError(problem)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise LimitsStoreError(
            f"--limits-redis-password-file: cannot read it ({type(exc).__name__})"
        ) from None
    password = lines[0].strip() if lines else ""
    if not password:
        raise LimitsStoreError("--limits-redis-password-file: the file is empty")
    if settings.limits_redis is not None and url_password(settings.limits_redis) is not None:
        raise LimitsStoreError("--limits-redis-password-file: the URL holds a password already; give one")
    return password


def check_store(settings: ServerSettings) -> None:
    """Reach Redis once, at start (a wrong URL or password is one clear line before anything listens)."""
    assert settings.limits_redis is not None
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise LimitsStoreError(NO_PACKAGE) from None
    timeout = max(1.0, settings.limits_redis_timeout_ms / 1000)
    client = redis.Redis.from_url(
        settings.limits_redis, password=store_password(settings), socket_timeout=timeout,
        socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
    )  # fmt: skip
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure is the one line the operator needs
        raise LimitsStoreError(
            f"--limits-redis: the store does not answer ({type(exc).__name__}: {_cut(str(exc))})"
        ) from None
    finally:
        client.close()


def _cut(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quotas_for(
    settings: ServerSettings, watch: StoreWatch | None = None, *, keyed: bool = False
) -> CallerQuotas:
    """The per-key limits ``settings`` ask for (``keyed``: the server has API keys, so the default bound
    on each key's windows in flight applies): in Redis with ``--limits-redis``, else in this process."""
    limits = CallerLimits.from_settings(settings, keyed=keyed)
    if settings.limits_redis is None:
        return CallerQuotas(limits, settings.max_request_windows)
    return RedisQuotas(
        limits, settings.max_request_windows, settings.limits_redis,
        password=store_password(settings), timeout_s=settings.limits_redis_timeout_ms / 1000, watch=watch,
    )  # fmt: skip


class RedisQuotas(CallerQuotas):
    """:class:`CallerQuotas` with the rates and the daily quota in Redis, this process's own as the
    fallback (see the module docstring)."""

    def __init__(
        self,
        limits: CallerLimits,
        max_request_windows: int,
        url: str,
        *,
        password: str | None = None,
        timeout_s: float = 0.1,
        watch: StoreWatch | None = None,
    ) -> None:
        super().__init__(limits, max_request_windows)
        try:
            import redis.asyncio
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
        except ImportError:
            raise LimitsStoreError(NO_PACKAGE) from None
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, password=password, max_connections=MAX_STORE_CONNECTIONS, timeout=timeout_s,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
        )  # fmt: skip
        self._slots = asyncio.Semaphore(MAX_STORE_CONNECTIONS)  # calls at once: the pool never waits
        self._redis = redis.asyncio.Redis(connection_pool=pool)
        self._script = self._redis.register_script(_SCRIPT)
        self.timeout_s = timeout_s
        self.breaker = Breaker(BREAKER_FAILURES, BREAKER_COOLDOWN_S)
        self.watch = watch or StoreWatch()
        self._log = AddressLog(interval_s=LOG_INTERVAL_S)
        self._missed: dict[tuple[str, int], int] = {}  # (key name, UTC day) -> admitted while out
        self._charges: set[asyncio.Task] = set()

    # ---- the store --------------------------------------------------------------------------------

    def _args(self, op: str, windows: int = 0, missed: int = 0) -> list[str]:
        lim = self.limits
        quota = -1 if lim.daily_requests is None else lim.daily_requests
        return [
            op,
            str(lim.requests_per_s or 0), str(lim.request_bucket()),
            str(lim.windows_per_s or 0), str(lim.window_bucket(self.max_request_windows)),
            str(quota), str(windows), str(missed),
        ]  # fmt: skip

    async def _run(self, name: str, op: str, windows: int = 0, missed: int = 0) -> list[str] | None:
        """The script's reply, or None when the store is not used now (breaker open, or every
        connection busy: this call falls back, and the store is not blamed) or failed."""
        if self._slots.locked():
            return None
        call = self.breaker.allow()
        if call is None:
            return None
        try:
            async with self._slots:
                reply: Any = await asyncio.wait_for(
                    self._script(keys=[PREFIX + name], args=self._args(op, windows, missed)), self.timeout_s
                )
            values = [r.decode() if isinstance(r, bytes) else str(r) for r in reply]
            if len(values) < 2:
                raise ValueError(f"an unexpected reply from the limits script: {values[:3]!r}")
        except asyncio.CancelledError:
            self.breaker.abandoned(call)  # the request left: no verdict on the store
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of the store is the same fallback
            self._failed(call, exc)
            return None
        if self.breaker.succeeded(call):
            logger.warning("the limits store answers again: per-key limits are shared through it again")
            self.watch.up(True)
        return values

    def _failed(self, call: Call, exc: Exception) -> None:
        kind = type(exc).__name__
        self.watch.error(kind)
        if self.breaker.failed(call):
            self.watch.up(False)
        self._log.warn(
            "redis", "unavailable",
            f"the limits store failed ({kind}: {_cut(str(exc))}): each replica enforces the per-key "
            f"limits on its own until it answers again (tried every {BREAKER_COOLDOWN_S:g} s)",
        )  # fmt: skip

    # ---- the door: request rate, window debt, daily quota --------------------------------------

    async def admit(self, name: str) -> None:
        if not self.limits.active:
            return
        self.refuse_if_saturated(name)  # in flight: this replica's own
        if not self.limits.at_the_door:
            return
        day = utc_day(time.time())
        missed = self._missed.pop((name, day), 0)  # sent with this call: Redis adds them to today's count
        try:
            reply = await self._run(name, "admit", missed=missed)
        except BaseException:
            self._owe(name, day, missed)
            raise
        if reply is None:
            self._owe(name, day, missed)
            self.admit_request(name)  # this replica's own limits (OverLimit when over)
            if self.limits.daily_requests is not None:
                self._owe(name, day, 1)
            return
        if reply[0] == "ok":
            self._mirror_day(name, day, int(float(reply[1])))
            return
        limit, wait = reply[0], float(reply[1])
        if limit == "daily_requests":
            self._mirror_day(name, day, self.limits.daily_requests or 0)
            message = f"the daily quota of {self.limits.daily_requests} requests is used up (it renews at 00:00 UTC)"
        elif limit == "windows_owed":
            limit = "windows_per_s"
            message = (
                f"over the rate of {self.limits.windows_per_s:g} windows/s for this key (tokenizing work "
                f"already done counts too: {float(reply[2]):.0f} windows owed)"
            )
        else:
            message = f"over the rate of {self.limits.requests_per_s:g} requests/s for this key"
        raise OverLimit(name, limit, wait if math.isfinite(wait) else 60.0, message)

    def _owe(self, name: str, day: int, admitted: int) -> None:
        """Admissions of today that Redis has not counted yet (merged with any others meanwhile). A call
        that timed out after Redis ran it is counted again: a key may be charged a request twice, never
        let through one uncounted."""
        if admitted and self.limits.daily_requests is not None:
            self._missed = {k: v for k, v in self._missed.items() if k[1] == day}
            self._missed[(name, day)] = self._missed.get((name, day), 0) + admitted

    def _mirror_day(self, name: str, day: int, count: int) -> None:
        """Remember Redis's count for today: if the store goes away, this replica counts on from it."""
        if self.limits.daily_requests is None:
            return
        with self._lock:
            c = self._caller(name)
            c.day, c.today = day, count

    # ---- the queue: windows --------------------------------------------------------------------

    async def acquire(self, name: str, windows: int) -> None:
        if not self.limits.active:
            return
        self.hold_inflight(name, windows)  # in flight: this replica's own work
        if self.limits.windows_per_s is None:
            return
        try:
            reply = await self._run(name, "acquire", windows)
            if reply is None:
                self.take_windows(name, windows)  # this replica's own bucket
                return
        except BaseException:
            self.release_windows(name, windows)
            raise
        if reply[0] != "ok":
            self.release_windows(name, windows)
            wait = float(reply[1])
            raise OverLimit(
                name, "windows_per_s", wait if math.isfinite(wait) else 60.0,
                f"over the rate of {self.limits.windows_per_s:g} windows/s for this key (this request has {windows})",
            )  # fmt: skip

    def acquire_windows(self, name: str, windows: int) -> None:
        raise TypeError("RedisQuotas is asked asynchronously: await acquire()")

    def charge_work(self, name: str, windows: int) -> None:
        """Charged in Redis without waiting for it (here, when the store is out or too many are pending)."""
        if not self.limits.active or windows <= 0 or self.limits.windows_per_s is None:
            return
        if len(self._charges) >= MAX_PENDING_CHARGES or not self.breaker.closed:
            super().charge_work(name, windows)
            return
        task = asyncio.get_running_loop().create_task(self._charge(name, windows))
        self._charges.add(task)
        task.add_done_callback(self._charges.discard)

    async def _charge(self, name: str, windows: int) -> None:
        if await self._run(name, "charge", windows) is None:
            super().charge_work(name, windows)

    async def close(self) -> None:
        """Close the store's connections (at shutdown)."""
        for task in list(self._charges):
            task.cancel()
        await self._redis.aclose()

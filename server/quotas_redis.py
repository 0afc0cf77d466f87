"""Per-key limits kept in Redis (``--limits-redis URL``): one set for every replica and process of a
deployment, and a daily quota that survives a restart.

The request rate, the window rate (with the debt of work charged after the fact) and the daily quota
live in Redis, each key's in one hash (``xlnetqa:limits:<name>``) plus one counter per UTC day that
expires two days later; every check-and-take is one Lua script, so two replicas asking at once can
never both take the last token, and the clock is Redis's own (``TIME``), the same for all of them.
What a replica holds in flight (``--key-max-inflight-windows``) stays per replica: it is a count of
work running there, which a crashed replica must not leave behind in a shared store.

A round trip per check (two per request when window limits are set, on the event loop: run Redis next
to the servers). If Redis cannot be reached, requests are let through (the limits protect capacity;
an outage of the store should not become an outage of the service), and one log line per interval says
so.
"""

from __future__ import annotations

import logging
import math

from server.address_log import AddressLog
from server.quotas import CallerLimits, CallerQuotas, OverLimit
from server.settings import ServerSettings

logger = logging.getLogger("server")
PREFIX = "xlnetqa:limits:"
DAY_TTL_S = 2 * 86400

# ARGV: op, request rate, request burst, window rate, window burst, daily quota (-1: none), windows
# Returns {"ok"} or {limit, seconds to wait, amount owed}. Rates of 0 mean no such limit.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op = ARGV[1]
local req_rate, req_burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local win_rate, win_burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local quota, n = tonumber(ARGV[6]), tonumber(ARGV[7])
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
  if quota >= 0 and tonumber(redis.call('GET', daykey) or '0') >= quota then
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
    redis.call('INCR', daykey)
    redis.call('EXPIRE', daykey, 172800)
  end
  return {'ok'}
elseif op == 'acquire' then
  if win_rate <= 0 then return {'ok'} end
  local w = bucket('windows', win_rate, win_burst)
  if n <= w then
    save('windows', w - n)
    return {'ok'}
  end
  save('windows', w)
  if n > win_burst then return {'windows_per_s', 'inf', '0'} end
  return {'windows_per_s', tostring((n - w) / win_rate), '0'}
elseif op == 'charge' then
  if win_rate <= 0 then return {'ok'} end
  save('windows', math.max(-win_burst, bucket('windows', win_rate, win_burst) - n))
  return {'ok'}
end
return {'ok'}
"""


class LimitsStoreError(RuntimeError):
    """``--limits-redis`` cannot be used (no redis package, or the store does not answer at start)."""


def quotas_for(settings: ServerSettings) -> CallerQuotas:
    """The per-key limits ``settings`` ask for: in Redis with ``--limits-redis``, else in this process."""
    limits = CallerLimits.from_settings(settings)
    if settings.limits_redis is None:
        return CallerQuotas(limits, settings.max_request_windows)
    return RedisQuotas(limits, settings.max_request_windows, settings.limits_redis)


class RedisQuotas(CallerQuotas):
    """:class:`CallerQuotas` with the rates and the daily quota in Redis (see the module docstring)."""

    def __init__(self, limits: CallerLimits, max_request_windows: int, url: str) -> None:
        super().__init__(limits, max_request_windows)
        try:
            import redis
        except ImportError:
            raise RuntimeError(
                "--limits-redis needs the redis package (pip install 'xlnet-qa[redis]')"
            ) from None
        self._redis = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._script = self._redis.register_script(_SCRIPT)
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._log = AddressLog()

    def ping(self) -> None:
        """Reach Redis now (at start: a wrong URL is one clear error before anything listens)."""
        try:
            self._redis.ping()
        except Exception as exc:  # noqa: BLE001 - any failure is the one line the operator needs
            raise LimitsStoreError(
                f"--limits-redis: the store does not answer ({type(exc).__name__}: {exc})"
            ) from None

    def _args(self, op: str, windows: int = 0) -> list[str]:
        lim = self.limits
        quota = -1 if lim.daily_requests is None else lim.daily_requests
        return [
            op,
            str(lim.requests_per_s or 0), str(lim.request_bucket()),
            str(lim.windows_per_s or 0), str(lim.window_bucket(self.max_request_windows)),
            str(quota), str(windows),
        ]  # fmt: skip

    def _run(self, name: str, op: str, windows: int = 0) -> list[str] | None:
        try:
            reply = self._script(keys=[PREFIX + name], args=self._args(op, windows))
        except self._errors as exc:
            self._log.warn(
                "redis",
                "unreachable",
                f"the limits store cannot be reached ({type(exc).__name__}): limits are not enforced",
            )
            return None
        return [r.decode() if isinstance(r, bytes) else str(r) for r in reply]

    def admit_request(self, name: str, now: float | None = None) -> None:
        if not self.limits.active:
            return
        reply = self._run(name, "admit")
        if reply is None or reply[0] == "ok":
            return
        limit, wait = reply[0], float(reply[1])
        if limit == "daily_requests":
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

    def acquire_windows(self, name: str, windows: int) -> None:
        if not self.limits.active:
            return
        cap = self.limits.max_inflight_windows
        with self._lock:  # in flight: this replica's own work
            c = self._caller(name)
            if cap is not None and c.inflight + windows > cap:
                raise OverLimit(
                    name, "inflight_windows", 1.0,
                    f"this key has {c.inflight} windows in flight and this request {windows} (limit {cap})",
                )  # fmt: skip
            c.inflight += windows
        reply = self._run(name, "acquire", windows)
        if reply is not None and reply[0] != "ok":
            self.release_windows(name, windows)
            wait = float(reply[1])
            rate = self.limits.windows_per_s
            raise OverLimit(
                name, "windows_per_s", wait if math.isfinite(wait) else 60.0,
                f"over the rate of {rate:g} windows/s for this key (this request has {windows})",
            )  # fmt: skip

    def charge_work(self, name: str, windows: int) -> None:
        if self.limits.active and windows > 0:
            self._run(name, "charge", windows)

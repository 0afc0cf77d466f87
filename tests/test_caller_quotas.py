"""Per-key limits in this process (server/limits/quotas.py) on their own: a key refused at its in-flight bound
is refused at the door (before its body is read and tokenized again) until that much of its work is
answered, never longer, and a request larger than the bound never locks its key out."""

from __future__ import annotations

import pytest

from server.limits.quotas import CallerLimits, CallerQuotas, OverLimit


def test_a_key_at_its_in_flight_bound_is_refused_at_the_door_until_room_frees() -> None:
    quotas = CallerQuotas(CallerLimits(max_inflight_windows=10), max_request_windows=10)
    quotas.acquire_windows("a", 8)
    with pytest.raises(OverLimit, match="8 windows in flight and this request 4"):
        quotas.acquire_windows("a", 4)
    with pytest.raises(OverLimit, match="its last request needed 4 more") as refused:
        quotas.admit_request("a")  # at the door now: no body read, nothing tokenized
    assert refused.value.limit == "inflight_windows"
    quotas.admit_request("b")  # another key is not concerned
    quotas.release_windows("a", 1)  # 7 + 4 > 10: still no room for it
    with pytest.raises(OverLimit):
        quotas.admit_request("a")
    quotas.release_windows("a", 1)  # 6 + 4 <= 10
    quotas.admit_request("a")
    quotas.acquire_windows("a", 4)


def test_a_request_larger_than_the_bound_is_refused_without_locking_its_key_out() -> None:
    quotas = CallerQuotas(CallerLimits(max_inflight_windows=4), max_request_windows=16)
    with pytest.raises(OverLimit):
        quotas.acquire_windows("a", 16)  # can never fit: refused, and only it
    quotas.admit_request("a")
    quotas.acquire_windows("a", 3)
    with pytest.raises(OverLimit):
        quotas.acquire_windows("a", 2)
    quotas.release_windows("a", 3)  # nothing in flight: the door lets it in whatever it asked last
    quotas.admit_request("a")

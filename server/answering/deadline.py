"""Awaiting something until a deadline, without a task per call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], deadline: float) -> T:
    """``await awaitable`` until the loop's clock reaches ``deadline`` (TimeoutError after): with
    ``asyncio.timeout_at`` (Python 3.11+) no task is made per call, as ``wait_for`` makes one."""
    timeout_at = getattr(asyncio, "timeout_at", None)
    if timeout_at is None:
        return await asyncio.wait_for(awaitable, deadline - asyncio.get_running_loop().time())
    async with timeout_at(deadline):
        return await awaitable

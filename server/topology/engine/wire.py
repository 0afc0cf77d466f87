"""The messages between front processes and the engine process: one home for the protocol.

msgspec structs in MessagePack over ZeroMQ (a DEALER per front, the engine's ROUTER). Token ids and
model outputs travel as raw little-endian bytes with their dtype and shape, never as lists of numbers.
Every request carries an id unique within its front; the engine answers it once (``Result`` or
``Failed``), or never if the front asked to ``Cancel`` it. ``Ping`` gets the engine's ``State``.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import numpy as np

PROTOCOL = 1  # bumped when a message changes shape; an engine and fronts of two versions refuse each other


class Array(msgspec.Struct, array_like=True):
    """A numpy array as bytes (C order)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, value: np.ndarray) -> Array:
        return cls(value.dtype.str, tuple(value.shape), np.ascontiguousarray(value).tobytes())

    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype)).reshape(self.shape)


class Window(msgspec.Struct, array_like=True):
    """One unpadded window: token ids and segment ids (int32; its attention mask is all ones)."""

    input_ids: bytes
    token_type_ids: bytes


class Ping(msgspec.Struct, tag="ping"):
    protocol: int = PROTOCOL


class State(msgspec.Struct, tag="state"):
    """The engine's state (``ModelLifecycle`` states), who it is and how full it is."""

    state: str
    incarnation: str  # new at every engine start: a front that sees it change forgets what it sent
    queued: int
    max_queue: int
    protocol: int = PROTOCOL
    describe: dict | None = None  # the backend's facts (``/v1/model``), once per incarnation
    runs_on: dict | None = None


class Admit(msgspec.Struct, tag="admit"):
    """A caller's request rate and daily quota, at the door (before the body is read)."""

    id: int
    caller: str


class Submit(msgspec.Struct, tag="submit"):
    """One HTTP request's questions, each a list of windows: all admitted or none."""

    id: int
    caller: str
    tag: str  # the request id, for the engine's log
    seconds_left: float  # until the request's deadline
    questions: list[list[Window]]


class Cancel(msgspec.Struct, tag="cancel"):
    id: int


class Charge(msgspec.Struct, tag="charge"):
    """Work a front did for ``caller`` that no queued window paid for (no answer)."""

    caller: str
    windows: int


class QuestionResult(msgspec.Struct, array_like=True):
    rows: list[dict[str, Array]]  # per window: output name -> that window's row
    queue_s: float
    inference_s: float


class Done(msgspec.Struct, tag="done"):
    """An ``Admit`` let through, or a ``Submit`` answered (``questions`` in order)."""

    id: int
    questions: list[QuestionResult] = []
    windows: int = 0  # charged to the caller


class Failed(msgspec.Struct, tag="failed"):
    """What went wrong, by kind (``server.topology.engine.client.ERRORS`` maps kinds to exceptions)."""

    id: int
    kind: str
    message: str
    limit: str | None = None  # over_limit: which
    retry_after: float | None = None


ToEngine = Ping | Admit | Submit | Cancel | Charge
FromEngine = State | Done | Failed

to_engine = msgspec.msgpack.Decoder(ToEngine)
from_engine = msgspec.msgpack.Decoder(FromEngine)
encode = msgspec.msgpack.Encoder().encode


def window_of(input_ids: np.ndarray, token_type_ids: np.ndarray) -> Window:
    return Window(input_ids.astype("<i4").tobytes(), token_type_ids.astype("<i4").tobytes())


def rows_of(rows: Mapping[str, np.ndarray]) -> dict[str, Array]:
    return {name: Array.of(value) for name, value in rows.items()}

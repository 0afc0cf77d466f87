"""The answerability's stored numbers: validating the JSON a checkpoint or an export's sidecar carries,
and the standardised linear model most of those numbers define.

Kept apart so that both the features (the question verifier is a :class:`Linear`) and the decision
rule can read them without importing each other.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class AnswerabilityError(ValueError):
    """Stored answerability numbers that cannot be applied; the message says which and why."""


def parse_floats(value: Any, name: str, n: int | None = None) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or (n is not None and len(value) != n):
        want = f"a list of {n} numbers" if n is not None else "a list of numbers"
        raise AnswerabilityError(f"{name} must be {want}")
    out = []
    for v in value:
        try:  # a JSON integer too large for a float (10**400) is as unusable as an infinity
            number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            shown = f"{str(v)[:20]}... ({len(str(v))} digits)" if type(v) is int else repr(v)
            raise AnswerabilityError(f"{name} holds a non-finite or non-numeric value {shown[:60]}")
        out.append(number)
    return tuple(out)


def parse_number(value: Any, name: str) -> float:
    return parse_floats([value], name, 1)[0]


def parse_object(raw: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise AnswerabilityError(f"{name} must be a JSON object")
    return raw


def check_format(raw: Mapping[str, Any], name: str, expected: int) -> None:
    """Stored numbers written by another version of their format are refused, not misread."""
    if raw.get("format") != expected:
        raise AnswerabilityError(f"{name}.format {raw.get('format')!r} is not {expected}")


def parse_curve(raw: Any, name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A monotone piecewise-linear map (isotonic regression's thresholds) with values in [0, 1]."""
    raw = parse_object(raw, name)
    x, y = parse_floats(raw.get("x"), f"{name}.x"), parse_floats(raw.get("y"), f"{name}.y")
    if len(x) != len(y) or not x:
        raise AnswerabilityError(f"{name}: x and y must be non-empty and of equal length")
    if any(b < a for a, b in zip(x, x[1:], strict=False)):
        raise AnswerabilityError(f"{name}.x must be non-decreasing")
    if any(not 0.0 <= v <= 1.0 for v in y):
        raise AnswerabilityError(f"{name}.y must lie in [0, 1]")
    return x, y


def feature_columns(model: Any, names: Sequence[str]) -> np.ndarray:
    """Where ``model.features`` sit among the columns ``names``, found once per layout and kept on the
    model (a re-ranker's candidates always come in the same columns): for every stored model that scores
    a matrix of named columns."""
    cache = model.__dict__.setdefault("_column_cache", {})
    key = tuple(names)
    found = cache.get(key)
    if found is None:
        found = cache[key] = np.array([key.index(f) for f in model.features], dtype=np.intp)
    return found


@dataclass(frozen=True)
class Linear:
    """Standardised features -> a weighted sum: a logistic model's logit, or a regression's score."""

    features: tuple[str, ...]
    center: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float

    def __call__(self, feats: Mapping[str, float]) -> float:
        center, scale, coef = self._arrays
        x = np.array([feats[f] for f in self.features], dtype=np.float64)
        return float(np.dot((x - center) / scale, coef) + self.intercept)

    def on_columns(self, x: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Each row's value in one product, the columns of ``x`` named by ``names`` (a re-ranker scores
        ten candidates per question)."""
        center, scale, coef = self._arrays
        # np.dot, not @: the same BLAS product, without matmul's dispatch (a few µs per question)
        return np.dot((x[:, feature_columns(self, names)] - center) / scale, coef) + self.intercept

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """center, scale and coef as arrays, made once (every decided question applies two or three)."""
        return np.array(self.center), np.array(self.scale), np.array(self.coef)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "center": list(self.center),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
        }

    @classmethod
    def from_dict(cls, raw: Any, name: str, allowed: Sequence[str]) -> Linear:
        raw = parse_object(raw, name)
        names = raw.get("features")
        if not isinstance(names, list) or not names or any(n not in allowed for n in names):
            raise AnswerabilityError(f"{name}.features must be a non-empty list drawn from {tuple(allowed)}")
        n = len(names)
        scale = parse_floats(raw.get("scale"), f"{name}.scale", n)
        if any(s <= 0 for s in scale):
            raise AnswerabilityError(f"{name}.scale must be positive")
        return cls(
            tuple(names),
            parse_floats(raw.get("center"), f"{name}.center", n),
            scale,
            parse_floats(raw.get("coef"), f"{name}.coef", n),
            parse_number(raw.get("intercept"), f"{name}.intercept"),
        )

"""A sum of regression trees (gradient boosting) applied with numpy alone, from stored numbers.

The span re-ranker may be boosted trees instead of a linear model (the same features read nonlinearly
pick better spans out of fold: docs/study.md). They are fitted on the training side (scikit-learn's
``HistGradientBoostingRegressor``, :func:`train.answerability.rerank_fit.as_trees`) and stored as plain
arrays per tree; here every candidate walks every tree at once, one array step per level, so a
question's ten candidates cost a few array operations per level, not a Python loop over trees.

A node sends a row left when its feature is ``<= threshold`` (a missing value: where the node says), as
scikit-learn does; the trees' values are added to the baseline in the trees' order (a running sum), so
the scores equal scikit-learn's to the last bit.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .answerability_params import (
    AnswerabilityError,
    feature_columns,
    parse_floats,
    parse_number,
    parse_object,
)

KIND = "boosted_trees"
MAX_TREES = 2000
MAX_DEPTH = 8  # a tree is applied as a complete binary tree of its depth: 2^depth leaves
MAX_NODES = 2 ** (MAX_DEPTH + 1) - 1  # per tree: a complete tree of MAX_DEPTH levels (every node reachable)
# Every tree is applied as a complete tree of the deepest one's depth, and every candidate takes every
# node's test: trees x (2^depth - 1) tests per candidate, bounded so that a stored model cannot make one
# question's decode allocate much (300 trees of depth 3 take 2,100; at the bound and a top k of 100, one
# call's arrays are about 20 MB).
MAX_APPLIED_NODES = 2**13
# The node arrays repeated per candidate count are kept for the counts that recur, up to this many
# elements in all (about 9 bytes each: ~19 MB at most per loaded model; a top k of 10 with 300 depth-3
# trees keeps 10 counts in 1.1 MB).
LAYOUT_CACHE_ELEMENTS = 2**21


@dataclass(frozen=True)
class Tree:
    """One tree as parallel node lists; a leaf has feature -1. Node 0 is the root, every other node is
    the child of exactly one node that comes before it: every walk ends, every node is reachable, and
    the depth is the longest walk (checked when read)."""

    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    missing_left: tuple[bool, ...]
    value: tuple[float, ...]

    def depth(self) -> int:
        """Levels below the root (0: the root is a leaf)."""
        depths = [0] * len(self.feature)
        for i, f in enumerate(self.feature):
            if f >= 0:
                depths[self.left[i]] = depths[self.right[i]] = depths[i] + 1
        return max(depths)

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature": list(self.feature),
            "threshold": [None if t == math.inf else t for t in self.threshold],
            "left": list(self.left),
            "right": list(self.right),
            "missing_left": list(self.missing_left),
            "value": list(self.value),
        }

    @classmethod
    def from_dict(cls, raw: Any, name: str, features: int) -> Tree:
        raw = parse_object(raw, name)
        keys = ("feature", "threshold", "left", "right", "missing_left", "value")
        lists = {k: raw.get(k) for k in keys}
        if any(not isinstance(v, list) for v in lists.values()):
            raise AnswerabilityError(f"{name} must hold the lists {', '.join(keys)}")
        n = len(lists["feature"])
        if not 1 <= n <= MAX_NODES or any(len(v) != n for v in lists.values()):
            raise AnswerabilityError(f"{name}: 1 to {MAX_NODES} nodes, every list as long as the others")
        feature = tuple(_whole(v, f"{name}.feature", -1, features - 1) for v in lists["feature"])
        left = tuple(_whole(v, f"{name}.left", 0, n - 1) for v in lists["left"])
        right = tuple(_whole(v, f"{name}.right", 0, n - 1) for v in lists["right"])
        parents = [0] * n
        for i, f in enumerate(feature):
            if f >= 0:
                if not (left[i] > i and right[i] > i):
                    raise AnswerabilityError(f"{name}: node {i}'s children must come after it")
                parents[left[i]] += 1
                parents[right[i]] += 1
        if any(count != 1 for count in parents[1:]):  # shared (a walk longer than depth() says) or cut off
            node = next(j for j in range(1, n) if parents[j] != 1)
            raise AnswerabilityError(
                f"{name}: node {node} is the child of {parents[node]} nodes; every node but the root "
                "must be the child of exactly one"
            )
        threshold = _thresholds(lists["threshold"], f"{name}.threshold")
        value = parse_floats(lists["value"], f"{name}.value", n)
        if any(not isinstance(v, bool) for v in lists["missing_left"]):
            raise AnswerabilityError(f"{name}.missing_left must be true or false per node")
        tree = cls(feature, threshold, left, right, tuple(lists["missing_left"]), value)
        if tree.depth() > MAX_DEPTH:
            raise AnswerabilityError(f"{name} is deeper than {MAX_DEPTH} levels")
        return tree


def _thresholds(values: list[Any], name: str) -> tuple[float, ...]:
    """Stored thresholds; ``null`` is +infinity, where scikit-learn splits the missing values from all
    the others (every value goes left, a missing one where the node says): JSON has no infinity."""
    return tuple(math.inf if v is None else parse_number(v, f"{name}[{i}]") for i, v in enumerate(values))


def applied_depth(trees: Sequence[Tree]) -> int:
    """The depth every tree is applied at: the deepest one's, at least 1."""
    return max(max(tree.depth() for tree in trees), 1)


def _whole(v: Any, name: str, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise AnswerabilityError(f"{name} must hold whole numbers from {low} to {high}")
    return v


@dataclass(frozen=True)
class BoostedTrees:
    """``baseline + sum of the trees' leaf values``: a regression of a candidate's F1 on its features."""

    features: tuple[str, ...]
    baseline: float
    trees: tuple[Tree, ...]

    def on_columns(self, x: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Each row's score, the columns of ``x`` named by ``names`` (as Linear.on_columns). Every node's
        test is taken for every row at once; then each row walks each tree's levels by index arithmetic
        (the trees are laid out as complete binary trees: node i's children are 2i+1 and 2i+2). Arrays
        are node-major ([node, row]): a node's test gathers one short row of features, and the leaves'
        values are added tree after tree (a reduction over the outer axis is a running sum)."""
        heap = self._heap
        rows = x[:, feature_columns(self, names)]
        n, t = rows.shape[0], len(self.trees)
        inner = 2**heap.depth - 1
        seen = np.ascontiguousarray(rows.T).take(heap.feature, axis=0).ravel()  # [trees * inner * n]
        layout = heap.for_rows(n)
        tests = seen <= layout.threshold
        if np.isnan(rows).any():
            tests = np.where(np.isnan(seen), layout.missing_left, tests)
        at = np.zeros((t, n), dtype=np.intp)  # each (tree, row)'s place in its complete tree
        for _ in range(heap.depth):  # left: 2i+1, right: 2i+2
            at = 2 * at + 2 - tests.take(layout.first + at * n)
        parts = np.empty((t + 1, n))
        parts[0] = self.baseline
        parts[1:] = heap.value.take(at - inner + heap.offsets[:, None])
        if n == 1:  # one column would be summed pairwise: a running sum keeps the trees' order
            return np.cumsum(parts[:, 0])[-1:]
        return np.add.reduce(parts, axis=0)  # row after row: in the trees' order, as the fitted model adds

    @functools.cached_property
    def _heap(self) -> _Heap:
        return _Heap.of(self.trees)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "features": list(self.features),
            "baseline": self.baseline,
            "trees": [tree.to_dict() for tree in self.trees],
        }

    @classmethod
    def from_dict(cls, raw: Any, name: str, allowed: Sequence[str]) -> BoostedTrees:
        raw = parse_object(raw, name)
        if raw.get("kind") != KIND:
            raise AnswerabilityError(f"{name}.kind must be {KIND!r}")
        names = raw.get("features")
        if not isinstance(names, list) or not names or any(n not in allowed for n in names):
            raise AnswerabilityError(f"{name}.features must be a non-empty list drawn from {tuple(allowed)}")
        trees = raw.get("trees")
        if not isinstance(trees, list) or not 1 <= len(trees) <= MAX_TREES:
            raise AnswerabilityError(f"{name}.trees must be a list of 1 to {MAX_TREES} trees")
        parsed = tuple(Tree.from_dict(t, f"{name}.trees[{i}]", len(names)) for i, t in enumerate(trees))
        applied = len(parsed) * (2 ** applied_depth(parsed) - 1)
        if applied > MAX_APPLIED_NODES:
            raise AnswerabilityError(
                f"{name}: {len(parsed)} trees as deep as the deepest one would be {applied:,} tests per "
                f"candidate; at most {MAX_APPLIED_NODES:,} (fewer trees, or shallower ones)"
            )
        return cls(tuple(names), parse_number(raw.get("baseline"), f"{name}.baseline"), parsed)


@dataclass(frozen=True)
class _Heap:
    """The trees as complete binary trees of one depth, flattened: each internal node's feature column,
    threshold and where a missing value goes ([trees * (2^depth - 1)]), each leaf's value ([trees *
    2^depth]). A leaf above the full depth is copied to every leaf below it, through nodes that send every
    row left (feature 0, threshold infinity, missing values left)."""

    depth: int
    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    value: np.ndarray
    offsets: np.ndarray  # [trees]: where each tree's leaves begin in ``value``
    _layouts: dict[int, _RowLayout] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def of(cls, trees: Sequence[Tree]) -> _Heap:
        depth = applied_depth(trees)
        inner, leaves = 2**depth - 1, 2**depth
        feature = np.zeros((len(trees), inner), dtype=np.intp)
        threshold = np.full((len(trees), inner), np.inf)
        missing_left = np.ones((len(trees), inner), dtype=bool)
        value = np.zeros((len(trees), leaves))
        for k, tree in enumerate(trees):
            stack = [(0, 0)]  # (node of the tree, its place in the complete tree)
            while stack:
                node, place = stack.pop()
                if tree.feature[node] >= 0:
                    feature[k, place], threshold[k, place] = tree.feature[node], tree.threshold[node]
                    missing_left[k, place] = tree.missing_left[node]
                    stack += [(tree.left[node], 2 * place + 1), (tree.right[node], 2 * place + 2)]
                    continue
                first, last = place, place  # a leaf: the complete tree's leaves below its place
                while first < inner:
                    first, last = 2 * first + 1, 2 * last + 2
                value[k, first - inner : last - inner + 1] = tree.value[node]
        offsets = np.arange(len(trees)) * leaves
        return cls(depth, feature.ravel(), threshold.ravel(), missing_left.ravel(), value.ravel(), offsets)

    def for_rows(self, n: int) -> _RowLayout:
        """The node arrays repeated for ``n`` rows (node-major), made once per row count: a question's
        candidates are at most the re-ranker's top k, so a few counts recur."""
        layout = self._layouts.get(n)
        if layout is None:
            trees, inner = len(self.offsets), 2**self.depth - 1
            first = np.arange(trees)[:, None] * (inner * n) + np.arange(n)  # [trees, n]: each root test
            layout = _RowLayout(np.repeat(self.threshold, n), np.repeat(self.missing_left, n), first)
            for array in (layout.threshold, layout.missing_left, layout.first):
                array.setflags(write=False)  # shared by every thread that decodes
            with self._lock:  # decoding threads may make the same count at once: kept once, counted once
                kept = sum(other.size for other in self._layouts.values())
                if n not in self._layouts and kept + layout.size <= LAYOUT_CACHE_ELEMENTS:
                    self._layouts[n] = layout
        return layout


@dataclass(frozen=True)
class _RowLayout:
    threshold: np.ndarray  # [trees * inner * n]
    missing_left: np.ndarray
    first: np.ndarray  # [trees, n]: where each (tree, row)'s root test is

    @property
    def size(self) -> int:
        return int(self.threshold.size + self.first.size)


def is_trees(raw: Mapping[str, Any] | Any) -> bool:
    """Whether stored numbers are a tree ensemble's (else a linear model's)."""
    return isinstance(raw, Mapping) and raw.get("kind") == KIND

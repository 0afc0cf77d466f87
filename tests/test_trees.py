"""Boosted trees applied from stored numbers (qa_core.squad.trees): the scores scikit-learn's fitted model
gives, to the last bit, for trees of uneven depth and missing values; stored numbers that would walk
forever, read outside a row or hold no number are refused with a clear error."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from qa_core.squad.answerability_params import AnswerabilityError
from qa_core.squad.trees import LAYOUT_CACHE_ELEMENTS, MAX_APPLIED_NODES, MAX_DEPTH, BoostedTrees
from train.answerability.rerank_fit import as_trees

NAMES = ("a", "b", "c", "d")


def _fitted(seed: int = 0, **settings: Any) -> tuple[HistGradientBoostingRegressor, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(600, len(NAMES)))
    x[rng.random(x.shape) < 0.05] = np.nan  # missing values: each node learns where they go
    y = np.sin(np.nan_to_num(x[:, 0]) * 2) + (np.nan_to_num(x[:, 1]) > 0.3) * np.nan_to_num(x[:, 2])
    settings = {"max_iter": 40, "learning_rate": 0.1, "random_state": 0} | settings
    return HistGradientBoostingRegressor(**settings).fit(x, y), x


@pytest.mark.parametrize(
    "settings",
    [
        {"max_depth": 3},
        {"max_depth": 6, "min_samples_leaf": 40},  # leaves at many depths: each padded to the full depth
        {"max_depth": 1},  # stumps
        {"max_depth": 8, "min_samples_leaf": 5, "max_leaf_nodes": 64, "max_iter": 30},  # the deepest applied
    ],
)
def test_scores_equal_scikit_learns_to_the_last_bit(settings: dict[str, Any]) -> None:
    model, x = _fitted(**settings)
    stored = as_trees(model, NAMES)
    again = BoostedTrees.from_dict(json.loads(json.dumps(stored.to_dict())), "model", NAMES)
    assert again == stored
    rows = np.concatenate([x, np.full((1, len(NAMES)), np.nan), x[:20] * 3.0])
    assert np.array_equal(again.on_columns(rows, NAMES), model.predict(rows))
    # the columns are found by name, in whatever order the caller holds them
    order = [2, 0, 3, 1]
    assert np.array_equal(again.on_columns(rows[:, order], [NAMES[i] for i in order]), model.predict(rows))


@pytest.mark.parametrize("missing", [False, True])
def test_every_count_of_candidates_scores_as_scikit_learn(missing: bool) -> None:
    """A question's candidates come in small groups (1 to the re-ranker's top k): each count has its own
    repeated node layout, and one row is summed by a running sum, not numpy's pairwise sum."""
    model, x = _fitted(seed=1, max_depth=3, max_iter=300, learning_rate=0.05)
    stored = as_trees(model, NAMES)
    rows = x[~np.isnan(x).any(axis=1)] if not missing else x
    for n in range(1, 13):
        for start in range(0, 60, 12):
            group = rows[start : start + n]
            assert np.array_equal(stored.on_columns(group, NAMES), model.predict(group)), (n, start)


def _stored() -> dict[str, Any]:
    model, _ = _fitted(max_depth=2)
    return as_trees(model, NAMES).to_dict()


def _edit(raw: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    raw = json.loads(json.dumps(raw))
    raw["trees"][0][where][0] = value
    return raw


def _shared_child(raw: dict[str, Any]) -> dict[str, Any]:
    """The root's two children made one node (its other child's subtree then hangs from nothing)."""
    raw = json.loads(json.dumps(raw))
    tree = raw["trees"][0]
    tree["right"][0] = tree["left"][0]
    return raw


def _unreachable(raw: dict[str, Any]) -> dict[str, Any]:
    """One more leaf at the end that no node points to."""
    raw = json.loads(json.dumps(raw))
    tree = raw["trees"][0]
    for key, extra in (("feature", -1), ("threshold", 0.0), ("left", 0), ("right", 0)):
        tree[key].append(extra)
    tree["missing_left"].append(True)
    tree["value"].append(0.0)
    return raw


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: _edit(r, "left", 0), "children must come after"),  # a loop: the root its own child
        (lambda r: _shared_child(r), "child of 2 nodes"),  # a walk longer than the stated depth
        (lambda r: _unreachable(r), "child of 0 nodes"),  # a node no walk reaches: size without use
        (lambda r: _edit(r, "feature", len(NAMES)), "feature must hold whole numbers"),  # outside a row
        (lambda r: _edit(r, "feature", True), "feature must hold whole numbers"),
        (lambda r: _edit(r, "value", "1.0"), "non-finite or non-numeric"),
        (lambda r: _edit(r, "threshold", float("nan")), "non-finite or non-numeric"),
        (lambda r: _edit(r, "value", 10**400), r"non-finite or non-numeric value 1000.*\(401 digits\)"),
        (lambda r: _edit(r, "missing_left", 1), "true or false"),
        (lambda r: {**r, "trees": []}, "1 to"),
        (lambda r: {**r, "kind": "linear"}, "kind must be"),
        (lambda r: {**r, "features": ["a", "nope"]}, "features must be"),
        (lambda r: {k: v for k, v in r.items() if k != "baseline"}, "baseline"),
        (lambda r: {**r, "trees": [{**r["trees"][0], "value": []}]}, "as long as the others"),
    ],
)
def test_stored_numbers_are_validated(edit, message: str) -> None:
    with pytest.raises(AnswerabilityError, match=message):
        BoostedTrees.from_dict(edit(_stored()), "model", NAMES)


def test_a_tree_deeper_than_the_limit_is_refused() -> None:
    """A chain of splits (each node's right child a leaf) one level deeper than the decoder applies."""
    depth = MAX_DEPTH + 1
    feature, left, right = [], [], []
    for level in range(depth):
        node = 2 * level
        feature.append(0)
        left.append(node + 2)  # the next split, or the last leaf
        right.append(node + 1)
        feature.append(-1)  # the right child: a leaf
        left.append(0)
        right.append(0)
    feature.append(-1)  # the last left child
    left.append(0)
    right.append(0)
    n = len(feature)
    tree = {"feature": feature, "threshold": [0.5] * n, "left": left, "right": right}
    tree |= {"missing_left": [True] * n, "value": [0.1] * n}
    raw = {"kind": "boosted_trees", "features": ["a"], "baseline": 0.0, "trees": [tree]}
    with pytest.raises(AnswerabilityError, match=f"deeper than {MAX_DEPTH}"):
        BoostedTrees.from_dict(raw, "model", NAMES)


def _chain(depth: int) -> dict[str, Any]:
    """A tree of ``depth`` levels: a chain of splits, each node's right child a leaf."""
    feature, left, right = [], [], []
    for level in range(depth):
        node = 2 * level
        feature += [0, -1]
        left += [node + 2, 0]
        right += [node + 1, 0]
    feature.append(-1)
    left.append(0)
    right.append(0)
    n = len(feature)
    return {"feature": feature, "threshold": [0.5] * n, "left": left, "right": right} | {
        "missing_left": [True] * n,
        "value": [0.1] * n,
    }


def test_a_model_applied_as_too_many_tests_per_candidate_is_refused() -> None:
    """Each tree is applied as a complete tree of the deepest one's depth (255 tests at depth 8): as many
    such trees as the bound holds are accepted, one more is refused, and one tree that deep among
    shallow ones counts as deep."""
    deep = {"kind": "boosted_trees", "features": ["a"], "baseline": 0.0}
    per_tree = 2**MAX_DEPTH - 1
    fits = MAX_APPLIED_NODES // per_tree
    accepted = BoostedTrees.from_dict({**deep, "trees": [_chain(MAX_DEPTH)] * fits}, "model", NAMES)
    assert len(accepted.trees) == fits
    with pytest.raises(AnswerabilityError, match="tests per candidate"):
        BoostedTrees.from_dict({**deep, "trees": [_chain(MAX_DEPTH)] + [_chain(1)] * fits}, "model", NAMES)
    # every leaf holds 0.1, wherever a row goes (left at every split, right at the first, or missing)
    rows = np.array([[0.2], [0.9], [np.nan]])
    expected = np.cumsum([0.0] + [0.1] * fits)[-1]
    assert np.array_equal(accepted.on_columns(rows, ["a"]), np.full(3, expected))


def test_a_split_of_missing_values_from_the_rest_is_stored_and_applied() -> None:
    """scikit-learn splits the rows missing a feature from all the others with an infinite threshold:
    stored as JSON null (JSON has no infinity), read back, applied as the fitted model is."""
    rng = np.random.default_rng(2)
    x = np.ones((400, len(NAMES)))
    missing = rng.random(400) < 0.3
    x[missing, 0] = np.nan
    x[:, 1] = rng.normal(size=400)
    model = HistGradientBoostingRegressor(max_iter=20, max_depth=2, random_state=0).fit(
        x, missing + 0.1 * x[:, 1]
    )
    stored = as_trees(model, NAMES)
    text = json.dumps(stored.to_dict(), allow_nan=False)  # strict JSON
    assert "null" in text
    again = BoostedTrees.from_dict(json.loads(text), "model", NAMES)
    assert again == stored and np.array_equal(again.on_columns(x, NAMES), model.predict(x))


def test_the_repeated_node_arrays_kept_are_bounded() -> None:
    """Every count of candidates 1 to 100 applied: the arrays kept for recurring counts stay within the
    bound, each count scores as the fitted model, and a count not kept is made afresh each time."""
    model, x = _fitted(max_depth=6, min_samples_leaf=5, max_iter=120)
    stored = as_trees(model, NAMES)
    heap = stored._heap
    for n in range(1, 101):
        assert np.array_equal(stored.on_columns(x[:n], NAMES), model.predict(x[:n]))
    kept = sum(layout.size for layout in heap._layouts.values())
    assert kept <= LAYOUT_CACHE_ELEMENTS
    assert 0 < len(heap._layouts) < 100  # the small counts kept, the large ones not

"""Official SQuAD 2.0 scoring rules, with expected numbers worked out by hand (in the comments)."""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter
from pathlib import Path

import pytest
from paths import SHARED_DEV_NAME, shared_squad_file

from qa_core.squad import SquadExample, read_squad
from train.squad import compute_exact, compute_f1, evaluate, find_best_thresh, normalize_answer
from train.squad.metrics import gold_answers

SHARED_DEV = shared_squad_file(SHARED_DEV_NAME)


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The  Quick, brown fox!", "quick brown fox"),
        ("An apple a day", "apple day"),
        ("theater and another answer", "theater and another answer"),  # articles only as whole words
        ("A.B.C.", "abc"),
        ("the-end", "theend"),  # punctuation goes first, so no word boundary is left
        ("  \t\n ", ""),
        ("The", ""),
        ("Hello\u2014World", "hello\u2014world"),  # only ASCII punctuation is removed
        ("\u00c9cole   Normale", "\u00e9cole normale"),
        ("1,000 km", "1000 km"),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_exact() -> None:
    assert compute_exact("the Eiffel Tower", "Eiffel tower.") == 1
    assert compute_exact("Eiffel Tower", "Tower") == 0
    assert compute_exact("", "") == 1
    assert compute_exact("", "a") == 1  # "a" normalises to "" (an article)
    assert compute_exact("", "Paris") == 0


def test_f1_by_hand() -> None:
    # gold [cat, sat, on, mat], pred [cat, on, mat, today]: 3 common, P = R = 3/4 -> F1 = 3/4
    assert compute_f1("the cat sat on the mat", "cat on a mat today") == pytest.approx(0.75)
    # gold [new, york, city], pred [york]: P = 1, R = 1/3 -> F1 = 2 * (1/3) / (4/3) = 1/2
    assert compute_f1("New York City", "York") == pytest.approx(0.5)
    # repeated tokens are counted with multiplicity: common {red: 1, blue: 1} = 2, P = R = 2/3
    assert compute_f1("red red blue", "red blue blue") == pytest.approx(2 / 3)
    assert compute_f1("Paris", "London") == 0.0
    # empty answers: 1 only when both are empty (after normalisation)
    assert compute_f1("", "") == 1.0
    assert compute_f1("", "Paris") == 0.0
    assert compute_f1("Paris", "") == 0.0
    assert compute_f1("the", "") == 1.0


def test_gold_answers_drop_empty_after_normalisation() -> None:
    assert gold_answers(["Paris", "!!!"]) == ["Paris"]
    assert gold_answers(["!!!"]) == [""]
    assert gold_answers([]) == [""]


def _ex(qid: str, answers: list[str]) -> SquadExample:
    context = " ".join(answers) or "nothing here"
    spans, pos = [], 0
    for a in answers:
        spans.append((a, pos))
        pos += len(a) + 1
    return SquadExample(qid, "t", "q?", context, spans, not answers)


# The hand-worked set used below:
#   id  gold                          pred      na    raw EM  raw F1
#   q1  [Paris]                       Paris     0.1   1       1
#   q2  [New York City]               York      0.6   0       1/2
#   q3  []  (unanswerable)            ""        0.3   1       1
#   q4  []  (unanswerable)            Berlin    0.8   0       0
#   q5  [blue whale, the blue whale]  whale     0.9   0       2/3  (gold [blue, whale] vs [whale])
EXAMPLES = [
    _ex("q1", ["Paris"]),
    _ex("q2", ["New York City"]),
    _ex("q3", []),
    _ex("q4", []),
    _ex("q5", ["blue whale", "the blue whale"]),
]
PREDS = {"q1": "Paris", "q2": "York", "q3": "", "q4": "Berlin", "q5": "whale", "extra": "ignored"}
NA = {"q1": 0.1, "q2": 0.6, "q3": 0.3, "q4": 0.8, "q5": 0.9}


def test_evaluate_without_threshold() -> None:
    out = evaluate(EXAMPLES, PREDS)
    # EM (1 + 0 + 1 + 0 + 0) / 5 = 40 %; F1 (1 + 1/2 + 1 + 0 + 2/3) / 5 = 19/30 = 63.33 %
    assert out["exact"] == pytest.approx(40.0)
    assert out["f1"] == pytest.approx(100 * 19 / 30)
    assert out["total"] == 5
    # HasAns q1, q2, q5: EM 1/3; F1 (1 + 1/2 + 2/3) / 3 = 13/18
    assert out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["HasAns_f1"] == pytest.approx(100 * 13 / 18)
    assert out["HasAns_total"] == 3
    # NoAns q3, q4: 1/2
    assert out["NoAns_exact"] == pytest.approx(50.0)
    assert out["NoAns_f1"] == pytest.approx(50.0)
    assert out["NoAns_total"] == 2
    assert "best_exact" not in out  # like the official script: no sweep without probabilities


def test_evaluate_with_threshold_and_best_threshold() -> None:
    out = evaluate(EXAMPLES, PREDS, NA, na_prob_thresh=0.5)
    # na > 0.5 -> "no answer" for q2 (has an answer: 0), q4 (unanswerable: 1), q5 (0)
    # EM = F1 = (1 + 0 + 1 + 1 + 0) / 5 = 60 %
    assert out["exact"] == pytest.approx(60.0)
    assert out["f1"] == pytest.approx(60.0)
    assert out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["HasAns_f1"] == pytest.approx(100 / 3)
    assert out["NoAns_exact"] == pytest.approx(100.0)
    # Sweep (EM): start at 2 (both unanswerable right), then in na order:
    #   q1 0.1 +1 -> 3 (best, thresh 0.1); q3 0.3 +0 -> 3; q2 0.6 +0 -> 3; q4 0.8 -1 -> 2; q5 0.9 +0 -> 2
    assert out["best_exact"] == pytest.approx(60.0)
    assert out["best_exact_thresh"] == pytest.approx(0.1)
    # Sweep (F1): 2; q1 +1 -> 3 (0.1); q3 +0 -> 3; q2 +1/2 -> 3.5 (best, 0.6); q4 -1 -> 2.5; q5 +2/3 -> 3.17
    assert out["best_f1"] == pytest.approx(70.0)
    assert out["best_f1_thresh"] == pytest.approx(0.6)
    # and scoring at the best F1 threshold gives the best F1: q4, q5 -> no answer: 1 + 1/2 + 1 + 1 + 0
    assert evaluate(EXAMPLES, PREDS, NA, na_prob_thresh=0.6)["f1"] == pytest.approx(70.0)


def test_best_threshold_can_be_answer_nothing() -> None:
    examples = [_ex("a", ["Paris"]), _ex("b", []), _ex("c", [])]
    preds = {"a": "London", "b": "x", "c": "y"}
    na = {"a": 0.2, "b": 0.4, "c": 0.9}
    # start at 2 (b, c right by saying nothing); a +0 -> 2; b -1 -> 1; c -1 -> 0: never better
    best, thresh = find_best_thresh(
        preds, {"a": 0.0, "b": 0.0, "c": 0.0}, na, {"a": True, "b": False, "c": False}
    )
    assert best == pytest.approx(200 / 3) and thresh == 0.0
    out = evaluate(examples, preds, na)
    assert out["best_exact"] == pytest.approx(200 / 3) and out["best_exact_thresh"] == 0.0
    assert out["exact"] == 0.0  # na_prob_thresh 1.0: every question answered, all wrong


def test_several_gold_answers_take_the_max() -> None:
    examples = [_ex("x", ["Denver Broncos", "Broncos", "the Denver Broncos team"])]
    out = evaluate(examples, {"x": "the Broncos"})
    assert out["exact"] == 100.0 and out["f1"] == 100.0
    out = evaluate(examples, {"x": "Denver"})
    # vs "Denver Broncos": P 1, R 1/2 -> 2/3; vs "Broncos": 0; vs [denver, broncos, team]: 2*1*(1/3)/(4/3) = 1/2
    assert out["exact"] == 0.0 and out["f1"] == pytest.approx(100 * 2 / 3)
    assert "NoAns_total" not in out and out["HasAns_total"] == 1


def test_unanswerable_only_empty_prediction_scores() -> None:
    examples = [_ex("u", [])]
    assert evaluate(examples, {"u": ""})["exact"] == 100.0
    assert evaluate(examples, {"u": "the"})["exact"] == 100.0  # normalises to ""
    out = evaluate(examples, {"u": "something"})
    assert out["exact"] == 0.0 and out["f1"] == 0.0 and "HasAns_total" not in out
    # a probability above the threshold turns any text into "no answer"
    assert evaluate(examples, {"u": "something"}, {"u": 0.7}, na_prob_thresh=0.5)["exact"] == 100.0
    assert evaluate(examples, {"u": "something"}, {"u": 0.5}, na_prob_thresh=0.5)["exact"] == 0.0  # strict >


def test_missing_predictions_and_probs_raise() -> None:
    with pytest.raises(ValueError, match="1 questions have no prediction"):
        evaluate(EXAMPLES, {k: v for k, v in PREDS.items() if k != "q3"})
    with pytest.raises(ValueError, match="have no na_prob"):
        evaluate(EXAMPLES, PREDS, {"q1": 0.1})
    with pytest.raises(ValueError, match="no questions"):
        evaluate([], {})


def test_dataset_json_and_path_inputs(tmp_path: Path) -> None:
    doc = {
        "version": "v2.0",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "Paris is in France.",
                        "qas": [
                            {"id": "a", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]},
                            {"id": "b", "question": "?", "answers": [], "is_impossible": True},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    preds = {"a": "paris", "b": "France"}
    assert evaluate(doc, preds) == evaluate(path, preds) == evaluate(str(path), preds)
    assert evaluate(doc, preds)["exact"] == 50.0


def test_gold_predictions_score_100_on_dev() -> None:
    if SHARED_DEV is None:
        pytest.skip(f"shared data not found at {SHARED_DEV}")
    examples = read_squad(SHARED_DEV)
    # (the first answer: one question's last gold answer is ".", which the official rules drop)
    preds = {e.qas_id: (e.answers[0][0] if e.answers else "") for e in examples}
    out = evaluate(SHARED_DEV, preds)
    assert out["exact"] == out["f1"] == 100.0
    assert out["total"] == 4944 and out["NoAns_total"] == 2537 and out["HasAns_total"] == 2407
    # answering "" everywhere: exactly the unanswerable share
    empty = evaluate(examples, dict.fromkeys(preds, ""))
    assert empty["exact"] == pytest.approx(100 * 2537 / 4944) and empty["HasAns_f1"] == 0.0


# A literal transcription of the official evaluate-v2.0.py functions, used only as a cross-check on
# random inputs (the hand-worked cases above are the primary tests).
def _official_normalize(s: str) -> str:
    def remove_articles(text: str) -> str:
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _official_f1(a_gold: str, a_pred: str) -> float:
    gold_toks = _official_normalize(a_gold).split() if a_gold else []
    pred_toks = _official_normalize(a_pred).split() if a_pred else []
    common = Counter(gold_toks) & Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def test_random_cross_check_with_official_transcription() -> None:
    rng = random.Random(0)
    words = ["the", "a", "an", "Paris", "paris.", "New", "York", "x", "x", ",", "An", "theory", "!"]
    for _ in range(500):
        gold = " ".join(rng.choice(words) for _ in range(rng.randint(0, 4)))
        pred = " ".join(rng.choice(words) for _ in range(rng.randint(0, 4)))
        assert normalize_answer(pred) == _official_normalize(pred)
        assert compute_f1(gold, pred) == pytest.approx(_official_f1(gold, pred))
        assert compute_exact(gold, pred) == int(_official_normalize(gold) == _official_normalize(pred))

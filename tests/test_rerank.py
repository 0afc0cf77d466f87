"""The span re-ranker: word snapping, its stored numbers, the order it gives, its fit on real questions,
and that every decision path (evaluation's redecide, decode) answers with the re-ranked span."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from collections import Counter

import numpy as np
import pytest

from qa_core.squad import Prediction, SquadExample, read_squad
from qa_core.squad.answerability import Answerability
from qa_core.squad.answerability_params import AnswerabilityError, Linear
from qa_core.squad.prediction import Deciding, NBestEntry
from qa_core.squad.rerank import CANDIDATE_FEATURES, SpanReranker, snap_to_words, snapped
from train.answerability.fit import fit_for
from train.answerability.rerank_fit import CandidateTable, fit_reranker, reranked
from train.evaluation.predict import redecide
from train.experiments.article_stats import (
    compare_by_article,
    sign_test,
    smallest_sign_test_p,
    summary,
    t_interval,
)

CONTEXT = "The Normans came from Normandy in 911. Their leader Rollo swore fealty to Charles III of France."


def _entry(context: str, text: str, score: float, start: int | None = None) -> NBestEntry:
    a = context.index(text) if start is None else start
    return NBestEntry(text, a, a + len(text), score, 0.0, score / 2, score / 2, 0, 0, 0)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (4, 9, "Normans"),  # "Norma" -> the word
        (2, 11, "The Normans"),  # starts inside "The"
        (34, 38, "911."),  # punctuation is kept where the reader put it, never added
        (23, 37, "Normandy in 911"),  # whole words stay as they are
    ],
)
def test_snapping_widens_to_whole_words_only(start: int, end: int, expected: str) -> None:
    a, b = snap_to_words(CONTEXT, start, end)
    assert CONTEXT[a:b] == expected
    assert a <= start and b >= end
    assert snap_to_words(CONTEXT, a, b) == (a, b)  # idempotent


def test_spans_made_equal_by_snapping_are_listed_once() -> None:
    entries = [
        _entry(CONTEXT, "Norma", -1.0),
        _entry(CONTEXT, "Normans", -2.0),
        _entry(CONTEXT, "Rollo", -3.0),
    ]
    out = snapped(CONTEXT, entries)
    assert [e.text for e in out] == ["Normans", "Rollo"]
    assert out[0].score == -1.0  # the better-scored duplicate is kept


def _model(weights: dict[str, float]) -> Linear:
    n = len(CANDIDATE_FEATURES)
    coef = tuple(weights.get(f, 0.0) for f in CANDIDATE_FEATURES)
    return Linear(CANDIDATE_FEATURES, (0.0,) * n, (1.0,) * n, coef, 0.0)


def test_the_reranker_reorders_its_top_k_and_leaves_the_rest() -> None:
    question = "Who swore fealty to Charles III?"
    entries = [
        _entry(CONTEXT, "Normandy", -1.0),
        _entry(CONTEXT, "911", -1.5),
        _entry(CONTEXT, "Rollo", -2.0),  # in the sentence the question matches, next to its words
        _entry(CONTEXT, "France", -3.0),
    ]
    r = SpanReranker(_model({"near_question": 5.0, "in_best_sentence": 5.0, "in_question": -5.0}), top_k=3)
    out = r.rerank(question, CONTEXT, entries)
    assert out[0].text == "Rollo"
    assert out[-1].text == "France"  # beyond top_k: where the reader put it
    assert sorted(e.text for e in out) == sorted(e.text for e in entries)
    # applied once: a second pass over an already re-ranked prediction changes nothing
    p = Prediction("q", "", -1, -1, -1.0, 1.0, 0.0, True, entries)
    once = p.reranked_by(r, question, CONTEXT)
    assert once.reranked and once.n_best[0].text == "Rollo" and once.reranked_by(r, question, CONTEXT) is once


def test_stored_reranker_round_trips_inside_the_answerability() -> None:
    r = SpanReranker(_model({"near_question": 1.5, "score_gap": 0.25}), top_k=7, report={"questions": 3})
    a = Answerability.cls_only(0.4, reranker=r)
    back = Answerability.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back.reranker == r and back.uses_lexical
    assert Answerability.from_dict(Answerability.cls_only(0.4).to_dict()).reranker is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format=2), "reranker.format"),
        (lambda d: d.update(top_k=1), "top_k"),
        (lambda d: d.update(top_k=2.5), "top_k"),
        (lambda d: d["model"].update(features=["no_such_feature"]), "features"),
        (lambda d: d["model"]["coef"].__setitem__(0, math.inf), "non-finite"),
        (lambda d: d.update(model="linear"), "JSON object"),
    ],
)
def test_stored_reranker_numbers_are_validated(edit, message: str) -> None:
    raw = Answerability.cls_only(0.5, reranker=SpanReranker(_model({"near_question": 1.0}))).to_dict()
    edit(raw["reranker"])
    with pytest.raises(AnswerabilityError, match=message):
        Answerability.from_dict(raw)


def _reader_like(examples: list[SquadExample], seed: int = 0) -> dict[str, Prediction]:
    """A reader that finds the gold span but often ranks it below other spans of the paragraph: what a
    small model does. Distractors are 1-3 word spans taken anywhere in the context."""
    rng = random.Random(seed)
    preds = {}
    for ex in examples:
        spans: list[tuple[int, int]] = []
        if ex.answers:
            text, start = ex.answers[0]
            spans.append((start, start + len(text)))
        words = [(m.start(), m.end()) for m in re.finditer(r"\w+", ex.context)]
        while len(spans) < 8 and len(words) > 3:
            i = rng.randrange(len(words) - 3)
            a, b = words[i][0], words[i + rng.randrange(3)][1]
            if (a, b) not in spans:
                spans.append((a, b))
        rng.shuffle(spans)
        scores = sorted((rng.uniform(-6, -1) for _ in spans), reverse=True)
        entries = [
            NBestEntry(ex.context[a:b], a, b, s, 0.0, s / 2, s / 2, 0, 0, 0)
            for (a, b), s in zip(spans, scores, strict=True)
        ]
        preds[ex.qas_id] = Prediction(ex.qas_id, "", -1, -1, scores[0], 1.0, 0.0, True, entries)
    return preds


@pytest.mark.parametrize("model", ["linear", "trees"])
def test_fitting_on_real_questions_beats_the_reader_out_of_fold(sample_dir, model: str) -> None:
    """Real questions and contexts (the sample's calibration articles), a reader that ranks the gold span
    anywhere in its top 8: cross-fitted by article, the re-ranked span is right more often on every
    article, and the stored model is what every decision path then applies (a logistic model or boosted
    trees, read back from their stored numbers alike)."""
    held = read_squad(sample_dir / "calibration.json")
    preds = _reader_like(held)
    r = fit_reranker(held, preds, model=model)
    assert r.report["model"] == model
    stored = SpanReranker.from_dict(json.loads(json.dumps(r.to_dict())))
    assert stored == r  # the numbers survive JSON, and rank every question's spans the same
    assert all(
        stored.rerank(ex.question, ex.context, preds[ex.qas_id].n_best)
        == r.rerank(ex.question, ex.context, preds[ex.qas_id].n_best)
        for ex in held[:40]
    )
    cross = r.report["cross_fitted"]
    assert set(cross) == {ex.title for ex in held}
    for article in cross.values():
        assert article["reranked"] > article["reader"] + 5, article
    t = CandidateTable(held, preds, r.top_k)
    assert len(t) == sum(bool(ex.answers) for ex in held)
    # the decision paths: evaluation's redecide and the fit's re-ranked predictions agree span for span
    rule = Answerability.cls_only(0.5, reranker=r)
    decided = redecide(held, preds, rule)
    by_fit = reranked(held, preds, r)
    for ex in held:
        assert decided[ex.qas_id].best_span_text == by_fit[ex.qas_id].best_span_text
        assert decided[ex.qas_id].reranked
    # a rule fitted with rerank=True holds the re-ranker and decided on the re-ranked spans
    a = fit_for("auto", read_squad(sample_dir / "train.json"), held, preds, rerank=True, reranker_model=model)
    assert a.reranker is not None and a.reranker.report["questions"] == len(t)
    assert a.reranker.report["model"] == model
    assert all(title in a.reranker.summary() for title in cross)
    no = fit_for("auto", read_squad(sample_dir / "train.json"), held, preds, rerank=False)
    assert no.reranker is None


def test_nothing_to_fit_is_a_clear_error(sample_dir) -> None:
    held = [ex for ex in read_squad(sample_dir / "calibration.json") if not ex.answers][:20]
    with pytest.raises(ValueError, match="answerable"):
        fit_reranker(held, _reader_like(held))


def test_sign_test_and_t_interval() -> None:
    assert sign_test([1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.125)  # all four better: 2 / 16
    assert sign_test([1.0] * 8) == pytest.approx(2 / 256)
    assert sign_test([1.0, -1.0]) == 1.0 and sign_test([0.0, 0.0]) == 1.0
    assert smallest_sign_test_p(4) == 0.125 and smallest_sign_test_p(3) == 0.25
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert t_interval([5.0])[1] == -math.inf


def test_credible_only_when_every_view_agrees() -> None:
    eight_up = {f"a{i}": 2.0 + 0.1 * i for i in range(8)}
    hundred = dict.fromkeys(eight_up, 100)
    assert summary(eight_up, hundred, (2.3, 1.0, 3.5))["credible"] == "better"
    four_up = dict(list(eight_up.items())[:4])
    s = summary(four_up, {k: 100 for k in four_up}, (2.1, 1.0, 3.0))
    assert s["credible"] == "no" and s["sign_test_p"] == pytest.approx(0.125)  # 4 articles cannot carry it
    mixed = eight_up | {"a0": -3.0}
    assert summary(mixed, hundred, (1.5, 0.2, 2.9))["credible"] == "no"  # the sign test disagrees
    # the bootstrap disagreeing alone is enough to refuse
    assert summary(eight_up, hundred, (2.3, -0.1, 3.5))["credible"] == "no"


def test_without_a_bootstrap_from_questions_the_articles_give_one() -> None:
    """No view is ever dropped: with only per-article means, the cluster bootstrap is computed from them
    and their sizes, the same numbers as resampling the articles' questions."""
    rng = np.random.default_rng(3)
    articles = [f"a{i}" for i in range(6) for _ in range(20 + 5 * i)]
    a, b = rng.random(len(articles)), rng.random(len(articles))
    from_questions = compare_by_article(a, b, articles)
    from_articles = summary(from_questions["per_article"], Counter(articles))
    assert from_articles["bootstrap"] == pytest.approx(from_questions["bootstrap"], abs=1e-9)
    assert from_articles["mean"] == pytest.approx(from_questions["mean"], abs=1e-9)
    with pytest.raises(ValueError, match="number of questions"):
        summary({"a": 1.0, "b": 2.0}, {"a": 10})


def test_a_decision_answers_with_the_reranked_span() -> None:
    """Prediction.redecided (what decode and evaluation's redecide both end in) re-ranks, then decides
    on the re-ranked best span."""
    question = "Who swore fealty to Charles III?"
    entries = [_entry(CONTEXT, "Normandy", -1.0), _entry(CONTEXT, "Rollo", -2.0)]
    r = SpanReranker(_model({"near_question": 5.0, "in_best_sentence": 5.0}))
    p = Prediction("q", "", -1, -1, -1.0, 1.0, -5.0, True, entries)
    d = p.redecided(Deciding(Answerability.cls_only(0.99, reranker=r), question), CONTEXT)
    assert not d.is_impossible and d.text == "Rollo" and d.n_best[0].text == "Rollo"
    assert d.score == -2.0  # the answered span's own score
    plain = p.redecided(Deciding(Answerability.cls_only(0.99), question), CONTEXT)
    assert plain.text == "Normandy" and not plain.reranked
    # what the decision does not set is carried over, every field (a field added later included)
    decided = {"text", "start", "end", "score", "no_answer_prob", "is_impossible", "n_best"}
    decided |= {"answerable_prob", "threshold", "reranked", "expected_f1"}
    given = Prediction("q", "", -1, -1, -1.0, 1.0, -5.0, True, entries, null_log_prob=-7.5)
    again = given.redecided(Deciding(Answerability.cls_only(0.99), question), CONTEXT)
    for f in dataclasses.fields(Prediction):
        if f.name not in decided:
            assert getattr(again, f.name) == getattr(given, f.name), f.name
    assert {f.name for f in dataclasses.fields(Prediction)} - decided == {
        "qas_id",
        "null_logit",
        "null_log_prob",
    }


@pytest.mark.parametrize("model", ["linear", "trees"])
def test_calibrate_stores_a_reranker_and_the_report_scores_what_evaluate_answers(
    spm_dir, sample_dir, tmp_path, model: str
) -> None:
    """A real checkpoint through the commands: train.rerank_report refuses it before a re-ranker is
    fitted; train.calibrate fits one (either form) with the rule; the report's re-ranked spans are
    train.evaluate's."""
    from harness.tiny_models import tiny_qa_checkpoint
    from train.calibrate import main as calibrate_main
    from train.evaluate import main as evaluate_main
    from train.experiments.rerank_report import main as report_main

    ck = tiny_qa_checkpoint(
        tmp_path / "ck", spm_dir, metadata={"max_seq_len": 128, "doc_stride": 64}, logit_scale=8.0
    )
    dev = sample_dir / "dev.json"
    report_args = [
        "--checkpoint",
        str(ck),
        "--data",
        str(dev),
        "--out",
        str(tmp_path / "report"),
        "--no-progress",
    ]
    with pytest.raises(ValueError, match="no span re-ranker"):
        report_main(report_args)
    calibration, train = sample_dir / "calibration.json", sample_dir / "train.json"
    argv = ["--checkpoint", str(ck), "--data", str(calibration), "--train-file", str(train), "--no-progress"]
    assert calibrate_main([*argv, "--reranker", model]) == 0
    stored = json.loads((ck / "metadata.json").read_text())["answerability"]["reranker"]
    assert (stored["model"].get("kind") == "boosted_trees") == (model == "trees")
    assert stored["top_k"] == 10 and set(stored["report"]["cross_fitted"]) == {
        ex.title for ex in read_squad(calibration)
    }
    assert report_main(report_args) == 0
    out = tmp_path / "report"
    report = json.loads((out / "rerank.json").read_text())
    rows = json.loads((out / "decisions.json").read_text())
    examples = read_squad(dev)
    assert report["questions"] == len(rows) == len(examples)
    assert report["answerable"] == sum(bool(ex.answers) for ex in examples)
    assert (
        report["pooled_out_of_fold"]["articles"] == 3
    )  # 2 calibration articles, cross-fitted, + the scored one
    assert (out / "rerank.png").stat().st_size > 0 and "Span re-ranker on 1 article: 1973_oil_crisis" in (
        out / "RESULTS.md"
    ).read_text()
    assert (
        evaluate_main(
            ["--checkpoint", str(ck), "--data", str(dev), "--out", str(tmp_path / "eval"), "--no-progress"]
        )
        == 0
    )
    nbest = json.loads((tmp_path / "eval" / "nbest.json").read_text())
    for row in rows:
        if "reranked_span" in row:
            assert nbest[row["id"]][0]["text"] == row["reranked_span"]

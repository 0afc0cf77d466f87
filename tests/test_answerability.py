"""The answerability module: features on crafted questions, the decision rules on hand-made cases,
the stored numbers (JSON round trip, validation) and the fitting (scikit-learn's own probabilities
reproduced by the torch-free decoder; cross-fitting never scores a fold with what saw it)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from qa_core.squad import read_squad
from qa_core.squad.answerability import (
    Answerability,
    SpanF1,
    decide,
    from_metadata,
    sigmoid,
)
from qa_core.squad.answerability_features import (
    MODEL_FEATURES,
    QUESTION_FEATURES,
    SPAN_FEATURES,
    VERIFIER_LOGIT,
    ContextIndex,
    SpanReading,
    SpanScores,
    all_features,
    match_question,
    question_features,
    verifier_logit,
)
from qa_core.squad.answerability_params import AnswerabilityError, Linear
from train.answerability.estimators import fit_span_f1
from train.answerability.fit import (
    FEATURE_SETS,
    FitOptions,
    Table,
    answerable_probs,
    answers,
    as_answerability,
    best_threshold,
    build_table,
    credible_lower_bound,
    cross_fit,
    fit_answerability,
    fit_auto,
    fit_calibrated,
    fit_question_verifier,
    fit_table,
    group_folds,
)

CONTEXT = (
    "The Normans were the people who gave their name to Normandy, a region in France. "
    "Rollo, their first ruler, swore fealty to King Charles III in 911. "
    "The duchy emerged in the first half of the 10th century and grew over the next decades."
)


def _q(question: str) -> dict[str, float]:
    return question_features(question, ContextIndex(CONTEXT))


def test_question_features_on_crafted_pairs() -> None:
    """An answerable question and its one-edit unanswerable twins differ where the edit is."""
    base = _q("Who swore fealty to King Charles III in 911?")
    assert base["best_sentence_coverage"] == pytest.approx(1.0)
    assert base["names_missing_in_sentence"] == base["numbers_missing_in_sentence"] == 0
    assert base["negation_mismatch"] == base["antonym_in_sentence"] == base["question_negated"] == 0
    swapped = _q("Who swore fealty to King Louis III in 911?")  # entity swap: a name the text lacks
    assert swapped["names_missing_in_context"] == swapped["names_missing_in_sentence"] == 1
    assert swapped["best_sentence_coverage"] < 1.0 and swapped["context_missing"] == 1
    number = _q("Who swore fealty to King Charles III in 912?")  # number swap
    assert number["numbers_missing_in_sentence"] == 1
    negated = _q("Who did not swear fealty to King Charles III in 911?")  # negation
    assert negated["question_negated"] == negated["negation_mismatch"] == 1
    assert base["numbers_contradicted"] == 0 and number["numbers_contradicted"] == 1  # 912 where it says 911
    assert base["bigram_coverage"] == 1.0 and base["key_phrase_elsewhere"] == 0
    reordered = _q("Who swore Charles fealty to King III in 911?")  # the same words, their relations broken
    assert reordered["best_sentence_coverage"] == pytest.approx(1.0) and reordered["bigram_coverage"] < 0.5
    # most of its words are in the second sentence, its phrase "first half" in the third
    moved = _q("Who swore fealty to King Charles in the first half?")
    assert moved["key_phrase_elsewhere"] > 0 and base["key_phrase_elsewhere"] == 0
    antonym = _q("When did the duchy emerge in the last half of the 10th century?")  # first -> last
    assert antonym["antonym_in_sentence"] == 1
    assert _q("When did the duchy emerge in the first half of the 10th century?")["antonym_in_sentence"] == 0


def test_coverage_from_postings_equals_a_pass_over_every_sentence() -> None:
    """Each sentence's share of the question's weight, as a sum per sentence in the question's order
    would give it (the same floats, the first of equal sentences as the best)."""
    index = ContextIndex(CONTEXT + " Rollo and the Normans and Charles met again in France in 912.")
    for question in ("Who swore fealty to King Charles III in 911?", "Normans France Rollo?", "Zebra?"):
        m = match_question(question, index)
        total = sum(m.weights.values()) or 1.0
        expected = [sum(m.weights[s] for s in m.stems if s in ss) / total for ss in index.sentence_stems]
        assert m.coverage == expected and m.best == int(np.argmax(expected))


def test_a_model_that_does_not_read_the_pair_features_does_not_build_them() -> None:
    """A verifier fitted before the word-pair features existed reads 14 features: deciding with it builds
    no per-context pairs, and its logit is what it was."""
    old = QUESTION_FEATURES[:14]
    n = len(old)
    verifier = Linear(old, (0.1,) * n, (2.0,) * n, tuple(np.linspace(-1, 1, n)), 0.2)
    index = ContextIndex(CONTEXT)
    scores = SpanScores(cls_logit=-1.0, null_log_prob=-3.0, best_log_prob=-1.0, best_probability=0.6)
    logit = all_features("Who swore fealty?", index, scores, (VERIFIER_LOGIT,), verifier)[VERIFIER_LOGIT]
    assert "_sentence_pairs" not in index.__dict__ and "pairs" not in index.__dict__
    assert logit == pytest.approx(verifier(question_features("Who swore fealty?", ContextIndex(CONTEXT))))


def test_a_verifiers_logit_is_computed_once_per_question_and_verifier() -> None:
    """It reads question features only, so it is kept with the question's match (the server computes it
    while the engine runs): the same number as the verifier on those features, once per verifier."""
    n = len(QUESTION_FEATURES)
    first = Linear(QUESTION_FEATURES, (0.1,) * n, (2.0,) * n, tuple(np.linspace(-1, 1, n)), 0.2)
    second = replace(first, intercept=-0.4)
    index = ContextIndex(CONTEXT)
    question = "Who swore fealty?"
    m = match_question(question, index)
    wanted = set(QUESTION_FEATURES)
    logit = verifier_logit(question, index, m, first, wanted)
    assert logit == first(question_features(question, index, m, wanted))
    assert verifier_logit(question, index, m, first, wanted) == logit and len(m.verifier_logits) == 1
    assert verifier_logit(question, index, m, second, wanted) == pytest.approx(logit - 0.6)
    assert len(m.verifier_logits) == 2
    scores = SpanScores(cls_logit=-1.0, null_log_prob=-3.0, best_log_prob=-1.0, best_probability=0.6)
    assert all_features(question, index, scores, (VERIFIER_LOGIT,), first)[VERIFIER_LOGIT] == logit
    assert len(m.verifier_logits) == 2  # deciding read the kept logit
    reads_a_score = Linear(("cls_logit", *QUESTION_FEATURES[:2]), (0.0,) * 3, (1.0,) * 3, (1.0,) * 3, 0.0)
    with pytest.raises(AnswerabilityError, match="question features only"):
        verifier_logit(question, index, m, reads_a_score, set(reads_a_score.features))


def test_a_reading_of_another_span_is_not_taken_for_the_best_span() -> None:
    """A span's evidence read elsewhere (a re-ranker's) stands in only for that span: a SpanScores whose
    best span was replaced since (dataclasses.replace) has its evidence computed from the span again."""
    index = ContextIndex(CONTEXT)
    question = "Who swore fealty to King Charles III?"
    rollo = CONTEXT.index("Rollo")
    scores = SpanScores(-1.5, -4.0, -1.0, 0.7, rollo, rollo + 5)
    computed = all_features(question, index, scores, SPAN_FEATURES)
    stale = SpanReading(0, len("The Normans"), dict.fromkeys(SPAN_FEATURES, 0.25))
    assert all_features(question, index, replace(scores, best_span_read=stale), SPAN_FEATURES) == computed
    own = SpanReading(rollo, rollo + 5, dict.fromkeys(SPAN_FEATURES, 0.25))
    assert all_features(question, index, replace(scores, best_span_read=own), SPAN_FEATURES) == own.features


def test_span_features_and_model_features() -> None:
    index = ContextIndex(CONTEXT)
    start = CONTEXT.index("Rollo")
    scores = SpanScores(cls_logit=-1.5, null_log_prob=-4.0, best_log_prob=-1.0, best_probability=0.7)
    near = replace(scores, best_start=start, best_end=start + 5)
    feats = all_features("Who swore fealty to King Charles III?", index, near, MODEL_FEATURES + SPAN_FEATURES)
    assert feats["cls_logit"] == -1.5 and feats["null_margin"] == -3.0 and feats["span_log_prob"] == -1.0
    assert feats["span_in_best_sentence"] == 1.0 and feats["answer_type_match"] == 1.0  # who -> a name
    assert feats["span_sentence_coverage"] == pytest.approx(1.0)  # its sentence holds every question word
    far = replace(scores, best_start=0, best_end=len("The Normans"))
    assert all_features("Who swore fealty?", index, far, SPAN_FEATURES)["span_in_best_sentence"] == 0.0
    when = all_features("When did Rollo swear fealty?", index, near, ("answer_type_match",))
    assert when["answer_type_match"] == 0.0  # "when" asks for a date or number, "Rollo" is neither
    none = SpanScores(cls_logit=0.0, null_log_prob=None, best_log_prob=None, best_probability=0.0)
    feats = all_features("Who?", index, none, MODEL_FEATURES + SPAN_FEATURES)
    assert (
        feats["span_log_prob"] == -30.0
        and feats["null_margin"] == 0.0
        and feats["span_in_best_sentence"] == 0
    )


def test_cls_only_is_sigmoid_of_cls_against_the_threshold() -> None:
    a = Answerability.cls_only(0.37)
    for cls in (-40.0, -2.0, 0.0, 0.5, 3.0, 40.0):
        scores = SpanScores(cls_logit=cls, null_log_prob=None, best_log_prob=-1.0, best_probability=1.0)
        d = decide(a, "Who?", CONTEXT, scores)
        assert d.no_answer_prob == pytest.approx(sigmoid(cls), rel=1e-12, abs=0)
        assert d.answerable_prob == pytest.approx(1 - sigmoid(cls), abs=1e-15)
        assert d.threshold == 0.37 and d.is_impossible == (sigmoid(cls) > 0.37)
    no_span = SpanScores(cls_logit=-40.0, null_log_prob=None, best_log_prob=None, best_probability=0.0)
    assert decide(a, "Who?", CONTEXT, no_span).is_impossible  # nothing to answer with
    s = SpanScores(cls_logit=3.0, null_log_prob=None, best_log_prob=-1.0, best_probability=1.0)
    assert not decide(a, "Who?", CONTEXT, s, threshold=1.0).is_impossible  # a caller's threshold wins


def _gain_rule() -> Answerability:
    """P(answerable) = sigmoid(-cls); E[span F1] = span_log_prob mapped linearly from [-10, 0] to [0, 1]."""
    model = Linear(("cls_logit",), (0.0,), (1.0,), (-1.0,), 0.0)
    span = SpanF1(Linear(("span_log_prob",), (0.0,), (1.0,), (1.0,), 0.0), ((-10.0, 0.0), (0.0, 1.0)))
    return Answerability(model, rule="expected_gain", span_f1=span)


@pytest.mark.parametrize(
    ("p_answerable", "span_log_prob", "answered"),
    [
        (0.6, -2.0, True),  # 0.6 * 0.8 = 0.48 > 0.4
        (0.5, -2.0, False),  # 0.5 * 0.8 = 0.40 < 0.5
        (0.9, -9.0, False),  # 0.9 * 0.1 = 0.09 < 0.1: a poor span is not worth the risk
        (0.95, -9.0, True),  # 0.095 > 0.05
        (0.99, -10.0, False),  # a span expected to score 0 is never worth answering
    ],
)
def test_expected_gain_rule(p_answerable: float, span_log_prob: float, answered: bool) -> None:
    a = _gain_rule()
    cls = math.log((1 - p_answerable) / p_answerable)
    s = SpanScores(cls_logit=cls, null_log_prob=None, best_log_prob=span_log_prob, best_probability=1.0)
    d = decide(a, "Who?", CONTEXT, s)
    g = (span_log_prob + 10) / 10
    assert d.threshold == pytest.approx(g / (1 + g))
    assert (p_answerable * g > 1 - p_answerable) == answered
    assert (not d.is_impossible) == answered


def _fitted_example() -> Answerability:
    n = len(QUESTION_FEATURES)
    verifier = Linear(QUESTION_FEATURES, (0.1,) * n, (2.0,) * n, tuple(np.linspace(-1, 1, n)), 0.2)
    model = Linear((VERIFIER_LOGIT, "cls_logit"), (0.0, -1.0), (1.0, 3.0), (1.3, -0.4), -0.1)
    span = SpanF1(
        Linear(("span_log_prob", "span_in_best_sentence"), (0, 0), (1, 1), (0.1, 0.3), 0.5),
        ((0.0, 1.0), (0.05, 0.6)),
    )
    return Answerability(
        model, verifier, "platt", (-1.1, 0.2), rule="expected_gain", span_f1=span, report={"x": 1}
    )


def test_json_round_trip_and_the_same_decisions() -> None:
    a = _fitted_example()
    b = Answerability.from_dict(json.loads(json.dumps(a.to_dict())))
    assert b == a and b.report == {"x": 1}
    iso = replace(a, calibration="isotonic", platt=(1.0, 0.0), isotonic=((-2.0, 0.0, 2.0), (0.1, 0.5, 0.8)))
    assert Answerability.from_dict(json.loads(json.dumps(iso.to_dict()))) == iso
    assert from_metadata({"answerability": a.to_dict(), "no_answer_threshold": 0.2}) == a
    assert from_metadata({"no_answer_threshold": 0.2}) == Answerability.cls_only(0.2)
    assert from_metadata(None) == Answerability.cls_only(0.5)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format=2), "format"),
        (lambda d: d["model"].update(coef=[1.0]), "coef"),
        (lambda d: d["model"].update(intercept=float("nan")), "non-finite"),
        (lambda d: d["model"].update(features=["cls_logit", "shoe_size"]), "features"),
        (lambda d: d.pop("verifier"), "no verifier"),
        (lambda d: d["verifier"].update(scale=[0.0] * len(QUESTION_FEATURES)), "positive"),
        (lambda d: d.update(threshold=1.5), "threshold"),
        (lambda d: d.update(calibration="magic"), "calibration"),
        (lambda d: d.update(rule="always"), "rule"),
        (lambda d: d.update(platt={"a": "1"}), "platt"),
        (lambda d: d["span_f1"].update(y=[0.1, 1.5]), "[0, 1]"),
        (lambda d: d["span_f1"].update(x=[1.0, 0.0]), "non-decreasing"),
        (lambda d: d.update(model=None), "model"),
    ],
)
def test_stored_numbers_are_validated(edit, message: str) -> None:
    raw = json.loads(json.dumps(_fitted_example().to_dict()))
    edit(raw)
    with pytest.raises(AnswerabilityError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Answerability.from_dict(raw)


# ---- fitting -----------------------------------------------------------------------------------------------


def _table(n_articles: int = 4, per: int = 60, seed: int = 0) -> Table:
    """A synthetic table: one informative feature (x0), one noise feature, four articles."""
    rng = np.random.default_rng(seed)
    n = n_articles * per
    y = rng.random(n) < 0.5
    x = np.column_stack(
        [
            y + rng.normal(0, 0.8, n),
            rng.normal(0, 1, n),
            rng.normal(-2, 1, n),
            rng.random((n, len(SPAN_FEATURES) + 1)),
        ]
    )
    return Table(
        qids=[f"q{i}" for i in range(n)],
        names=MODEL_FEATURES + SPAN_FEATURES,
        x=x,
        answerable=y,
        answer_f1=np.where(y, rng.random(n), 0.0),
        abstain_f1=(~y).astype(float),
        has_span=np.ones(n, dtype=bool),
        articles=np.repeat([f"article{k}" for k in range(n_articles)], per),
        paragraphs=np.arange(n) // 10,
    )


@pytest.mark.parametrize("calibration", ["platt", "isotonic"])
def test_stored_numbers_reproduce_scikit_learn(calibration: str) -> None:
    """What the server applies (numpy, from JSON) equals scikit-learn's predict_proba."""
    t = _table()
    opts = FitOptions(("cls_logit", "null_margin"), calibration)
    model = fit_calibrated(t, opts)
    a = Answerability.from_dict(json.loads(json.dumps(as_answerability(model, opts, None).to_dict())))
    want = model.predict_proba(t.columns(opts.features))[:, 1]
    np.testing.assert_allclose(answerable_probs(a, t), want, atol=1e-9)


def test_cross_fitting_never_scores_a_fold_with_what_saw_it() -> None:
    """Flipping every label of one article changes no out-of-fold probability or decision of that
    article: whatever scored it (model, calibration, threshold, span curve) never saw it."""
    t = _table()
    opts = FitOptions(("cls_logit", "null_margin"))
    before = cross_fit(t, opts)
    rows = np.flatnonzero(t.articles == "article2")
    flipped = replace(
        t, answerable=t.answerable.copy(), answer_f1=t.answer_f1.copy(), abstain_f1=t.abstain_f1.copy()
    )
    flipped.answerable[rows] = ~flipped.answerable[rows]
    flipped.abstain_f1[rows] = (~flipped.answerable[rows]).astype(float)
    flipped.answer_f1[rows] = np.where(flipped.answerable[rows], 0.5, 0.0)
    after = cross_fit(flipped, opts)
    np.testing.assert_array_equal(before.probs[rows], after.probs[rows])
    for rule in opts.rules:
        np.testing.assert_array_equal(before.answered[rule][rows], after.answered[rule][rows])
    others = np.flatnonzero(t.articles != "article2")
    assert not np.array_equal(before.probs[others], after.probs[others])  # the flip did reach the others


def test_group_folds_keep_groups_whole() -> None:
    groups = np.array(["a"] * 5 + ["b"] * 3 + ["c"] * 7 + ["d"] * 1)
    folds = group_folds(groups, max_folds=3)
    assert sorted(np.concatenate(folds).tolist()) == list(range(16))
    for f in folds:
        for g in set(groups[f].tolist()):
            assert set(np.flatnonzero(groups == g)) <= set(f.tolist())
    with pytest.raises(ValueError, match="two"):
        group_folds(np.array(["a", "a"]))


def test_best_threshold_is_the_official_sweep() -> None:
    t = _table(n_articles=1, per=8)
    t = replace(
        t,
        answerable=np.array([1, 1, 0, 1, 0, 0, 1, 0], dtype=bool),
        answer_f1=np.array([0.9, 0.8, 0, 0.1, 0, 0, 0.7, 0]),
        abstain_f1=np.array([0, 0, 1, 0, 1, 1, 0, 1.0]),
    )
    probs = np.array([0.95, 0.9, 0.85, 0.6, 0.5, 0.4, 0.3, 0.2])  # P(answerable), most sure first
    # answering the first two gains 1.7; the third costs 1: best is after two, at 1 - 0.9
    assert best_threshold(probs, t) == pytest.approx(0.1)
    assert best_threshold(probs[::-1].copy(), t) == 0.0  # nothing beats answering none


def test_fitting_on_real_questions_and_the_report(sample_dir) -> None:
    """The sample's articles through the real pipeline pieces (the QA model's scores faked as cls =
    0: the verifier has to carry the decision): the report's claims are internally consistent."""
    from qa_core.squad import Prediction
    from qa_core.squad.prediction import NBestEntry

    fit = read_squad(sample_dir / "train.json")
    held = read_squad(sample_dir / "calibration.json")
    verifier, report = fit_question_verifier(fit)
    assert report["questions"] == len(fit) and 0.0 <= report["cv_roc_auc"] <= 1.0
    preds = {}
    for ex in held:
        text, start = (ex.answers or ex.plausible_answers or [(ex.context[:5], 0)])[0]
        entry = NBestEntry(text, start, start + len(text), -1.0, 1.0, -0.5, -0.5, 0, 0, 0)
        preds[ex.qas_id] = Prediction(
            ex.qas_id, text, start, start + len(text), -1.0, 0.5, 0.0, False, [entry]
        )
    a = fit_auto(held, preds, verifier)
    r = a.report
    assert r["feature_set"] in ("verifier-only", "verifier") and set(r["candidates"]) == {
        "verifier-only",
        "verifier",
    }
    assert r["fitted_on"]["grouping"] == "article" and r["cv"]["folds"] == 2
    assert r["fitted_on"]["articles"] == sorted({ex.title for ex in held})
    nested = r["nested"]
    assert [g["group"] for g in nested["per_group"]] == sorted({ex.title for ex in held})
    assert r["beats_no_answer"] == (nested["lower_bound"] is not None and nested["lower_bound"] > 0)
    if not r["beats_no_answer"]:
        assert a.rule == "none"  # the explicit fallback: it answers nothing
    t = build_table(held, preds, a.features, verifier)
    assert len(t) == len(held)
    # one decision function: what the fit counts as answered is what the server's path decides
    from train.evaluation.predict import redecide

    served = redecide(held, preds, a)
    np.testing.assert_array_equal(answers(a, t), [not served[q].is_impossible for q in t.qids])
    with pytest.raises(ValueError, match="verifier"):
        fit_answerability(held, preds, FitOptions(FEATURE_SETS["verifier"]))


def test_the_none_rule_never_answers_whatever_the_calibration_says() -> None:
    """Isotonic calibration can say P(answerable) = 1.0; a stored threshold of 0 then answered. The
    explicit none rule answers nothing, and survives the JSON round trip."""
    model = Linear(("cls_logit",), (0.0,), (1.0,), (-1.0,), 0.0)
    sure = Answerability(model, calibration="isotonic", isotonic=((-10.0, 10.0), (1.0, 1.0)), rule="none")
    stored = Answerability.from_dict(json.loads(json.dumps(sure.to_dict())))
    for a in (sure, stored):
        d = a.decision({"cls_logit": -5.0}, has_span=True)
        assert d.answerable_prob == 1.0 and d.no_answer_prob == 0.0 and d.is_impossible
        assert not a.decision({"cls_logit": -5.0}, True, threshold=0.5).is_impossible  # a caller's own
    zero = replace(sure, rule="threshold", threshold=0.0)  # what fitting used to store
    assert not zero.decision({"cls_logit": -5.0}, has_span=True).is_impossible


def _noise_table(n_articles: int = 6, per: int = 60, seed: int = 1) -> Table:
    """Features that say nothing of the labels, over ``n_articles`` articles."""
    t = _table(n_articles, per, seed)
    rng = np.random.default_rng(seed + 100)
    return replace(t, x=rng.normal(0, 1, t.x.shape))


@pytest.mark.parametrize("seed", [1, 2])
def test_the_guard_answers_none_when_the_scores_carry_no_signal(seed: int) -> None:
    t = _noise_table(seed=seed)
    candidates = [FitOptions(("cls_logit",)), FitOptions(("cls_logit", "null_margin"), "isotonic")]
    a = fit_table(t, candidates, None)
    r = a.report
    assert a.rule == "none" and r["beats_no_answer"] is False, r["decision"]
    assert len(r["nested"]["per_group"]) == 6 and r["nested"]["lower_bound"] <= 0
    assert not answers(a, t).any()


def test_the_guard_answers_when_the_signal_is_strong() -> None:
    t = _table(n_articles=6, per=80)
    strong = replace(t, x=t.x.copy())
    strong.x[:, 0] = strong.answerable * 4.0 + np.random.default_rng(5).normal(0, 0.5, len(t))
    strong.answer_f1[:] = np.where(strong.answerable, 0.9, 0.0)
    a = fit_table(strong, [FitOptions(("cls_logit",))], None)
    assert a.rule != "none" and a.report["nested"]["lower_bound"] > 0, a.report["decision"]
    assert answers(a, strong).sum() > 0


def test_credible_lower_bound() -> None:
    assert credible_lower_bound([2.0, 2.0, 2.0], [10, 20, 30]) == pytest.approx(2.0)
    assert credible_lower_bound([5.0], [100]) == float("-inf")  # one group: no bound
    spread = credible_lower_bound([3.0, -1.0, 2.0, 0.5], [1, 1, 1, 1])
    assert spread < np.mean([3.0, -1.0, 2.0, 0.5]) and spread < 0
    assert credible_lower_bound([1.0, 1.2, 0.9, 1.1], [1, 1, 1, 1]) > 0


def test_the_span_f1_map_is_learnt_out_of_fold() -> None:
    """On span evidence that says nothing of the F1, the map gives fresh questions about the mean,
    never the extremes an in-sample map chases."""
    t = _noise_table(seed=4)
    g = fit_span_f1(t)
    fresh = _noise_table(seed=9)
    values = np.array([g(r) for r in fresh.rows(g.score.features)])
    mean = float(t.answer_f1[t.answerable].mean())
    assert np.abs(values - mean).max() < 0.15, (values.min(), values.max(), mean)

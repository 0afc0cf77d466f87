"""Seed ensembles: the members' logits averaged window by window, decoded as one model would be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from paths import SAMPLE_DEV
from server_helpers import build_qa_checkpoint

from qa_core.squad import featurize, read_squad
from train.evaluation.predict import FeatureOutputs, average_outputs, predict_ensemble, predict_features
from train.model import checkpoint


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory, xlnet_tok) -> list:
    root = tmp_path_factory.mktemp("ensemble")
    return [checkpoint.load(build_qa_checkpoint(root / f"seed{s}", xlnet_tok, seed=s)) for s in (0, 1)]


def test_an_ensemble_averages_its_members_logits(members) -> None:
    examples = read_squad(SAMPLE_DEV)[:12]
    meta = members[0].metadata
    features = featurize(
        examples, members[0].tokenizer, max_seq_len=meta["max_seq_len"], doc_stride=meta["doc_stride"]
    )
    each = [predict_features(m.model, features) for m in members]
    mean = average_outputs(each)
    for i in range(len(features)):
        np.testing.assert_allclose(
            mean.values["start_logits"][i],
            (each[0].values["start_logits"][i] + each[1].values["start_logits"][i]) / 2,
        )
        assert mean.values["cls_logits"][i] == pytest.approx(
            (each[0].values["cls_logits"][i] + each[1].values["cls_logits"][i]) / 2
        )
    assert not np.allclose(
        each[0].values["start_logits"][0], each[1].values["start_logits"][0]
    )  # the seeds differ
    # an ensemble of one model with itself decides exactly as the model
    alone = predict_ensemble([members[0]], examples)
    twice = predict_ensemble([members[0], members[0]], examples)
    assert {q: (p.best_span_text, round(p.null_logit, 5)) for q, p in alone.items()} == {
        q: (p.best_span_text, round(p.null_logit, 5)) for q, p in twice.items()
    }


def test_members_must_share_the_tokenizer_and_the_windows(members, tmp_path: Path, xlnet_tok_lower) -> None:
    examples = read_squad(SAMPLE_DEV)[:2]
    other = checkpoint.load(build_qa_checkpoint(tmp_path / "lower", xlnet_tok_lower, seed=2))
    with pytest.raises(ValueError, match="another tokenizer"):
        predict_ensemble([members[0], other], examples)
    with pytest.raises(ValueError, match="beam"):  # top-k log-probabilities cannot be averaged
        average_outputs([FeatureOutputs(head="beam"), FeatureOutputs(head="beam")])

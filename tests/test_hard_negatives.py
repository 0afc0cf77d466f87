"""Hard unanswerable questions (`train.experiments.hard_negatives`, `python -m train.synth --hard-negatives`) and the
plausible-answer span targets that fine-tuning can learn from them (`featurize(plausible_spans=True)`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from paths import SAMPLE_CORPUS, SAMPLE_TRAIN

from qa_core.squad import SquadExample, featurize, read_squad
from qa_core.text import numbers
from train.experiments.hard_negatives import antonym, hard_negative, negate, swap_entity, swap_number
from train.experiments.synth import leaks
from train.synth import main as synth_main

CONTEXT = "Rollo swore fealty to King Charles III in 911. The duchy grew in the first half of the century."


def test_each_edit_on_crafted_questions() -> None:
    rng = np.random.default_rng(0)
    swapped = swap_entity("Who swore fealty to King Charles III?", CONTEXT, ["Normandy", "Louis"], rng)
    question = "Who swore fealty to King Charles III?"
    assert swapped is not None and ("Louis" in swapped or "Normandy" in swapped)
    changed = [a != b for a, b in zip(swapped.split(), question.split(), strict=True)]
    assert sum(changed) == 1  # one word swapped, the rest kept
    assert swap_entity("Who swore fealty?", CONTEXT, ["Louis"], rng) is None  # no name to swap
    assert (
        swap_entity("Who swore fealty to Charles?", CONTEXT, ["Rollo"], rng) is None
    )  # every name is in the text
    number = swap_number("What happened in 911?", CONTEXT, rng)
    assert number is not None and number != "What happened in 911?" and not numbers(number) & numbers(CONTEXT)
    assert negate("When did the duchy grow?") == "When did not the duchy grow?"
    assert negate("When did the duchy not grow?") is None  # already negated
    assert negate("Which duchy grew?") is None  # no auxiliary to negate
    assert (
        antonym("In which half did the duchy grow first?", CONTEXT)
        == "In which half did the duchy grow last?"
    )
    assert (
        antonym("Which was the last duchy?", CONTEXT) is None
    )  # "first" is in the sentence: could be answerable
    assert hard_negative("Why?", "Because.", CONTEXT, [], rng) is None


@pytest.fixture(scope="module")
def hard(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth_hard") / "synth.json"
    argv = ["--input", str(SAMPLE_TRAIN), str(SAMPLE_CORPUS), "--out", str(out)]
    assert synth_main([*argv, "--seed", "1", "--hard-negatives", "0.6"]) == 0
    return out, json.loads(out.read_text())


def test_synth_hard_negatives_keep_the_sentence_and_the_plausible_answer(hard, tmp_path: Path) -> None:
    path, _ = hard
    examples = read_squad(path)  # validated: plausible answers sit at their offsets
    edited = [ex for ex in examples if ex.plausible_answers]
    assert len(edited) > 50 and all(ex.is_impossible and not ex.answers for ex in edited)
    for ex in edited:
        text, start = ex.plausible_answers[0]
        assert ex.context[start : start + len(text)] == text  # the sentence it was made from is kept
        assert not leaks(ex.question, text)
    # the same call again gives the same file; without the flag no question carries a plausible answer
    again = tmp_path / "again.json"
    argv = ["--input", str(SAMPLE_TRAIN), str(SAMPLE_CORPUS), "--seed", "1"]
    assert synth_main([*argv, "--out", str(again), "--hard-negatives", "0.6"]) == 0
    assert again.read_text() == path.read_text()
    plain = tmp_path / "plain.json"
    assert synth_main([*argv, "--out", str(plain)]) == 0
    assert not any(ex.plausible_answers for ex in read_squad(plain))


def test_bad_hard_negatives_share_is_refused(tmp_path: Path, capsys) -> None:
    from train.common.cli import run

    argv = [
        "--input",
        str(SAMPLE_TRAIN),
        "--out",
        str(tmp_path / "x.json"),
        "--hard-negatives",
        "1.5",
    ]
    assert run(synth_main, argv, prog="train.synth") == 2
    assert "--hard-negatives must be in [0, 1]" in capsys.readouterr().err


def test_plausible_spans_point_at_the_plausible_answer_and_stay_unanswerable(xlnet_tok) -> None:
    context = "The Normans gave their name to Normandy, a region in France, in the 10th century."
    start = context.index("Normandy")
    ex = SquadExample(
        "q1", "t", "What did the Danes give their name to?", context, [], True, [("Normandy", start)]
    )
    plain = featurize([ex], xlnet_tok, is_training=True, max_seq_len=64, doc_stride=32, max_query_len=16)
    assert all(f.is_impossible and f.start_position == f.end_position == f.cls_index for f in plain)
    marked = featurize(
        [ex],
        xlnet_tok,
        is_training=True,
        plausible_spans=True,
        max_seq_len=64,
        doc_stride=32,
        max_query_len=16,
    )
    assert all(f.is_impossible for f in marked)
    holding = [f for f in marked if f.start_position != f.cls_index]
    assert holding
    for f in holding:
        a, b = f.token_to_char[f.start_position][0], f.token_to_char[f.end_position][1]
        assert context[a:b] == "Normandy"
    # an answerable question is labelled as before, whatever the flag
    answerable = SquadExample("q2", "t", "Who gave their name?", context, [("The Normans", 0)], False)
    kw = {"is_training": True, "max_seq_len": 64, "doc_stride": 32, "max_query_len": 16}
    a1 = featurize([answerable], xlnet_tok, **kw)
    a2 = featurize([answerable], xlnet_tok, plausible_spans=True, **kw)
    assert [(f.start_position, f.end_position, f.is_impossible) for f in a1] == [
        (f.start_position, f.end_position, f.is_impossible) for f in a2
    ]

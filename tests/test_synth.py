"""Self-supervised cloze questions (`python -m train.synth`): valid SQuAD 2.0, exact offsets, no leaks, determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from paths import SAMPLE

from qa_core.squad import featurize, read_squad
from qa_core.tokenizer import XLNetTokenizer
from train.experiments.synth import (
    SynthConfig,
    draft_questions,
    finalise,
    find_candidates,
    make_question,
    read_articles,
    synthesize,
)
from train.synth import main

INPUTS = [SAMPLE / "train.json", SAMPLE / "corpus.json"]


def word_occurs(needle: str, haystack: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(needle.lower()) + r"(?!\w)", haystack.lower()) is not None


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth") / "synth.json"
    assert main(["--input", *map(str, INPUTS), "--out", str(out), "--seed", "3"]) == 0
    return out, json.loads(out.read_text())


def test_output_is_squad_with_exact_offsets_and_no_leaks(generated):
    path, data = generated
    examples = read_squad(path)  # the official layout, validated
    assert len(examples) > 500
    for ex in examples:
        assert ex.is_impossible == (not ex.answers)
        for text, start in ex.answers:
            assert ex.context[start : start + len(text)] == text
        for text in {t for t, _ in ex.answers}:
            assert not word_occurs(text, ex.question), (ex.question, text)
        assert ex.question.endswith("?")
    assert len({ex.qas_id for ex in examples}) == len(examples)


def test_where_each_question_is_answered():
    """Unanswerable: the context lacks the answer. Elsewhere: the source sentence is gone and the label
    points at another occurrence. In place: the sentence is there and the label is inside it."""
    cfg = SynthConfig(seed=5, answerable=0.5)
    rng = np.random.default_rng(cfg.seed)
    records = finalise(draft_questions(read_articles(INPUTS), cfg, rng), cfg, rng)
    assert {r["how"] for r in records} == {"in place", "elsewhere", "sentence removed", "other context"}
    for r in records:
        qa, context, answer, source = r["qa"], r["context"], r["answer"], r["sentence"]
        if qa["is_impossible"]:
            assert not word_occurs(answer, context), (qa["question"], answer)
            continue
        start = qa["answers"][0]["answer_start"]
        assert context[start : start + len(answer)] == answer
        if r["how"] == "elsewhere":
            assert source not in context
        else:
            s0 = context.index(source)
            assert s0 <= start < s0 + len(source)


@pytest.mark.parametrize("share", [0.0, 0.3, 0.5, 0.8, 1.0])
def test_answerable_share_is_as_configured(share):
    dataset, stats = synthesize(INPUTS, SynthConfig(answerable=share, seed=1))
    n = stats["questions"]
    answerable = sum(bool(q["answers"]) for a in dataset["data"] for p in a["paragraphs"] for q in p["qas"])
    assert answerable == stats["answerable"]
    assert abs(answerable - share * n) <= 1, (answerable, share, n)


def test_deterministic_for_a_seed_and_different_across_seeds(tmp_path):
    runs = []
    for seed, name in ((7, "a"), (7, "b"), (8, "c")):
        out = tmp_path / f"{name}.json"
        assert main(["--input", str(SAMPLE / "train.json"), "--out", str(out), "--seed", str(seed)]) == 0
        runs.append(out.read_bytes())
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_candidates_and_question_forms():
    sentence = "The oil crisis began in October 1973, when the University of Notre Dame sold 42 cars for $12."
    rest = "Later the oil crisis ended."
    found = {sentence[c.start : c.end]: c.kind for c in find_candidates(sentence, rest)}
    assert found["October 1973"] == "date"
    assert found["42"] == "number" and found["$12"] == "number"
    assert found["University of Notre Dame"] == "capitalised"
    assert found["oil crisis"] == "recurring"
    assert "The" not in found  # a sentence-initial capital alone names nothing
    date = next(c for c in find_candidates(sentence, rest) if c.kind == "date")
    assert make_question(sentence, date, "cloze").startswith("The oil crisis began in when, when the")
    assert make_question(sentence, date, "wh").startswith("When the oil crisis began in, when")
    money = next(c for c in find_candidates(sentence, rest) if sentence[c.start : c.end] == "$12")
    assert make_question(sentence, money, "cloze").endswith("sold 42 cars for how much?")
    # a phrase does not run across punctuation
    other = "They met Norman (Latin: Normanni) there."
    spans = [other[c.start : c.end] for c in find_candidates(other, "")]
    assert "Norman" in spans and all("(" not in s for s in spans)
    other = "In 1869 the college chose Charles W. Eliot as its president."
    assert "Charles W. Eliot" in [other[c.start : c.end] for c in find_candidates(other, "")]


def test_plain_text_input_and_finetuning_reads_the_output(tmp_path, spm_dir):
    text = tmp_path / "doc.txt"
    text.write_text(
        "Paris is the capital of France. In 1889 the Eiffel Tower opened in Paris.\n"
        "About 2,100,000 people live in Paris. The Seine flows through Paris.\n\n"
        "Berlin is the capital of Germany. The Berlin Wall fell in 1989.\n"
    )
    out = tmp_path / "s.json"
    assert main(["--input", str(text), "--out", str(out), "--answerable", "0.6"]) == 0
    examples = read_squad(out)
    assert examples and {ex.title for ex in examples} <= {"doc-0", "doc-1"}
    features = featurize(
        examples, XLNetTokenizer.from_dir(spm_dir), is_training=True, max_seq_len=64, max_query_len=24
    )
    assert len(features) >= len(examples)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--answerable", "1.5"], "--answerable must be in"),
        (["--in-place", "-0.1"], "--in-place must be in"),
        (["--per-sentence", "0"], "--per-sentence"),
        (["--types", "date,colour"], "--types"),
        (["--max-questions", "0"], "--max-questions"),
    ],
)
def test_bad_settings_are_clear_errors(args, message, tmp_path, capsys):
    from train.common.cli import run

    code = run(
        main, ["--input", str(SAMPLE / "train.json"), "--out", str(tmp_path / "o.json"), *args], "synth"
    )
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_bad_inputs_are_clear_errors(tmp_path, capsys):
    from train.common.cli import run

    def err(path: Path) -> str:
        assert run(main, ["--input", str(path), "--out", str(tmp_path / "o.json")], "synth") == 2
        return capsys.readouterr().err

    assert "not found" in err(tmp_path / "missing.txt")
    cases = {
        "bad.json": ("{not json", "invalid JSON"),
        "wrong.json": ('{"data": 3}', "not a SQuAD JSON file"),
        "empty.txt": ("\n\n", "no text found"),
        "plain.txt": ("all of this is lower case and has no names.\n", "no question could be made"),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).write_text(text)
        assert says in err(tmp_path / name), name

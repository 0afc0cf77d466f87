"""SQuAD JSON reading, validation and article splits on the real data files."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from paths import (
    REPO,
    SAMPLE_CALIBRATION,
    SAMPLE_CORPUS,
    SAMPLE_DEV,
    SAMPLE_TRAIN,
    SHARED_DEV_NAME,
    shared_squad_file,
)

from qa_core.squad import (
    SquadExample,
    article_titles,
    dataset_stats,
    load_dataset,
    merge_datasets,
    read_squad,
    select_articles,
    split_by_article,
    write_squad,
)

SHARED_DEV = shared_squad_file(SHARED_DEV_NAME)

MINI = {
    "version": "v2.0",
    "data": [
        {
            "title": "A",
            "paragraphs": [
                {
                    "context": "Paris is the capital of France.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "What is the capital of France?",
                            "answers": [{"text": "Paris", "answer_start": 0}],
                            "is_impossible": False,
                        },
                        {
                            "id": "q2",
                            "question": "What is the capital of Mars?",
                            "answers": [],
                            "plausible_answers": [{"text": "France", "answer_start": 24}],
                            "is_impossible": True,
                        },
                    ],
                }
            ],
        }
    ],
}


def test_read_sample_train() -> None:
    examples = read_squad(SAMPLE_TRAIN)
    assert len(examples) == 470
    assert sum(e.is_impossible for e in examples) == 262
    first = examples[0]
    assert isinstance(first, SquadExample)
    assert first.qas_id == "68cf05f67fd29c6f129fe2fb9"
    assert first.title == "Normans"
    assert first.question == "In what country is Normandy located?"
    assert first.answers[0] == ("France", 159)
    assert first.first_answer == ("France", 159)
    assert first.context[159 : 159 + len("France")] == "France"
    assert not first.is_impossible
    # every answer and plausible answer is where it says it is
    for ex in examples:
        assert ex.is_impossible == (not ex.answers)
        for text, start in ex.answers + ex.plausible_answers:
            assert ex.context[start : start + len(text)] == text
    assert any(ex.plausible_answers for ex in examples if ex.is_impossible)


def test_read_file_without_is_impossible() -> None:
    # corpus.json (like the unlabelled test split) has no is_impossible and empty answers
    examples = read_squad(SAMPLE_CORPUS)
    assert examples and all(ex.is_impossible and not ex.answers for ex in examples)
    assert {ex.title for ex in examples} == {"Jacksonville,_Florida", "Sky_(United_Kingdom)", "Miscellaneous"}


def test_read_shared_dev_matches_readme() -> None:
    if SHARED_DEV is None:
        pytest.skip("../shared is absent (a fresh clone)")
    examples = read_squad(SHARED_DEV)
    assert len(examples) == 4944
    assert sum(e.is_impossible for e in examples) == 2537
    assert dataset_stats(SHARED_DEV) == {
        "articles": 13,
        "paragraphs": 540,
        "questions": 4944,
        "unanswerable": 2537,
    }


def _write(tmp_path: Path, doc: object, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _mini_with(edit) -> dict:
    doc = copy.deepcopy(MINI)
    edit(doc)
    return doc


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d.pop("data"), "missing field 'data'"),
        (lambda d: d["data"][0].pop("paragraphs"), "data[0]: missing field 'paragraphs'"),
        (
            lambda d: d["data"][0]["paragraphs"][0].pop("context"),
            "data[0].paragraphs[0]: missing field 'context'",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].pop("id"),
            "data[0].paragraphs[0].qas[0]: missing field 'id'",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(question=7),
            "data[0].paragraphs[0].qas[0].question: expected str, got int",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start="0"),
            "qas[0].answers[0].answer_start: expected int, got str",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=500),
            "qas[0].answers[0].answer_start: 500 puts 'Paris' outside the context",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=1),
            "qas[0].answers[0]: text 'Paris' does not match the context at answer_start=1",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(text=""),
            "qas[0].answers[0].text: empty answer text",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(id="q1"),
            "qas[1].id: duplicate id 'q1'",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=True),
            "is_impossible is true but answers is not empty",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(is_impossible=False),
            "is_impossible is false but answers is empty",
        ),
        (
            lambda d: d["data"][0]["paragraphs"][0]["qas"][1]["plausible_answers"][0].update(answer_start=3),
            "qas[1].plausible_answers[0]: text 'France' does not match",
        ),
    ],
)
def test_validation_names_file_and_field(tmp_path: Path, edit, fragment: str) -> None:
    path = _write(tmp_path, _mini_with(edit))
    with pytest.raises(ValueError) as err:
        read_squad(path)
    assert str(path) in str(err.value)
    assert fragment in str(err.value)


def test_validation_not_json_and_not_object(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        read_squad(path)
    with pytest.raises(ValueError, match="expected a JSON object at the top level"):
        read_squad(_write(tmp_path, [1, 2]))


def test_non_strict_accepts_misplaced_answer(tmp_path: Path) -> None:
    doc = _mini_with(lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=1))
    examples = read_squad(_write(tmp_path, doc), strict=False)
    assert examples[0].answers == [("Paris", 1)]


def test_mini_roundtrip(tmp_path: Path) -> None:
    examples = read_squad(write_squad(MINI, tmp_path / "sub" / "mini.json"))
    assert [e.qas_id for e in examples] == ["q1", "q2"]
    assert examples[1].is_impossible and examples[1].plausible_answers == [("France", 24)]
    assert examples[0].answer_texts == ["Paris"] and examples[1].first_answer is None


def test_split_by_titles(tmp_path: Path) -> None:
    train_json = SAMPLE_TRAIN
    assert article_titles(train_json) == ["Normans", "Harvard_University"]
    chosen, rest = split_by_article(train_json, ["Harvard_University"])
    assert article_titles(chosen) == ["Harvard_University"]
    assert article_titles(rest) == ["Normans"]
    assert chosen["version"] == rest["version"] == "v2.0"
    a = read_squad(write_squad(chosen, tmp_path / "a.json"))
    b = read_squad(write_squad(rest, tmp_path / "b.json"))
    assert len(a) + len(b) == 470
    assert not {e.qas_id for e in a} & {e.qas_id for e in b}
    assert not {e.context for e in a} & {e.context for e in b}


def test_several_labelled_files_are_one_document_and_a_title_in_two_is_refused() -> None:
    merged = merge_datasets([SAMPLE_TRAIN, SAMPLE_DEV, SAMPLE_CALIBRATION])
    assert article_titles(merged) == [
        *article_titles(SAMPLE_TRAIN),
        *article_titles(SAMPLE_DEV),
        *article_titles(SAMPLE_CALIBRATION),
    ]
    held, rest = split_by_article(merged, ["1973_oil_crisis"])
    assert article_titles(held) == ["1973_oil_crisis"] and "1973_oil_crisis" not in article_titles(rest)
    with pytest.raises(ValueError, match="'Normans' is in labelled files 1 and 2"):
        merge_datasets([SAMPLE_TRAIN, SAMPLE_TRAIN])


def _labelled_sample(tmp_path: Path) -> Path:
    """The shipped sample's labelled articles (train, dev, calibration) as one document of five."""
    parts = [load_dataset(f) for f in (SAMPLE_TRAIN, SAMPLE_DEV, SAMPLE_CALIBRATION)]
    return write_squad(
        {"version": "v2.0", "data": [a for p in parts for a in p["data"]]}, tmp_path / "all.json"
    )


@pytest.mark.parametrize("source", ["sample", "shared"])
def test_split_by_count_fraction_and_seed(source: str, tmp_path: Path) -> None:
    if source == "shared" and SHARED_DEV is None:
        pytest.skip("../shared is absent (a fresh clone)")
    path = _labelled_sample(tmp_path) if source == "sample" else SHARED_DEV
    titles = article_titles(path)
    n = len(titles)
    assert n >= 5 and len(set(titles)) == n
    first, rest = split_by_article(path, 3)
    assert article_titles(first) == titles[:3] and article_titles(rest) == titles[3:]
    assert first["version"] == rest["version"] == "v2.0"
    a = read_squad(write_squad(first, tmp_path / "first.json"))
    b = read_squad(write_squad(rest, tmp_path / "rest.json"))
    assert len(a) + len(b) == len(read_squad(path))
    assert not {e.context for e in a} & {e.context for e in b}
    half, other = split_by_article(path, 0.5)
    assert len(half["data"]) == round(0.5 * n) and len(other["data"]) == n - round(0.5 * n)
    assert (
        split_by_article(path, 0)[0]["data"] == [] and article_titles(split_by_article(path, n)[0]) == titles
    )
    s1, r1 = split_by_article(path, 2, seed=7)
    s2, _ = split_by_article(path, 2, seed=7)
    assert article_titles(s1) == article_titles(s2)
    assert sorted(article_titles(s1) + article_titles(r1)) == sorted(titles)
    # a seed shuffles first: some seed takes articles out of file order
    assert any(article_titles(split_by_article(path, 2, seed=k)[0]) != titles[:2] for k in range(10))


def test_split_errors() -> None:
    dataset = load_dataset(SAMPLE_TRAIN)
    with pytest.raises(ValueError, match="unknown article titles \\['Nope'\\]"):
        split_by_article(dataset, ["Nope"])
    with pytest.raises(ValueError, match="cannot take 5 of 2 articles"):
        split_by_article(dataset, 5)
    with pytest.raises(ValueError, match="fraction must be in"):
        split_by_article(dataset, 1.5)
    with pytest.raises(ValueError, match="not a str"):
        split_by_article(dataset, "Normans")
    with pytest.raises(ValueError, match="exactly one of"):
        select_articles(dataset)
    with pytest.raises(ValueError, match="out of range"):
        select_articles(dataset, indices=[2])
    # the source document is left untouched
    assert article_titles(dataset) == ["Normans", "Harvard_University"]


def test_package_is_torch_free() -> None:
    # the HTTP server imports train.squad; it must never pull in torch
    code = "import sys, train.squad; bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

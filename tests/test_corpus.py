"""train.common.corpus: plain-text and SQuAD JSON corpora -> documents of sentences, with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import SAMPLE_CORPUS, SAMPLE_TRAIN, SHARED_DEV_NAME, shared_squad_file

from train.common.corpus import (
    iter_documents,
    iter_texts,
    read_documents,
    read_squad_contexts,
    split_sentences,
)

SHARED_DEV = shared_squad_file(SHARED_DEV_NAME)


def squad_file(path: Path, contexts: list[list[str]]) -> Path:
    data = {
        "version": "v2.0",
        "data": [
            {"title": f"a{i}", "paragraphs": [{"context": c, "qas": []} for c in paras]}
            for i, paras in enumerate(contexts)
        ],
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_plain_text_documents(tmp_path: Path) -> None:
    f = tmp_path / "corpus.txt"
    f.write_text(
        "\n\nFirst doc, line one.\n  line two  \n\n\n   \nSecond doc.\r\n\r\nThird doc.\nlast line without newline",
        encoding="utf-8",
    )
    assert read_documents([f]) == [
        ["First doc, line one.", "line two"],
        ["Second doc."],
        ["Third doc.", "last line without newline"],
    ]
    assert list(iter_texts([f])) == [line for doc in read_documents([f]) for line in doc]


def test_plain_text_bom_and_str_path(tmp_path: Path) -> None:
    f = tmp_path / "bom.txt"
    f.write_bytes("\ufeffHello\n".encode())
    assert read_documents(str(f)) == [["Hello"]]  # a lone path is accepted too


def test_squad_json_documents(tmp_path: Path) -> None:
    f = squad_file(
        tmp_path / "s.json",
        [["The U.S. is big. Mr. Smith lives there!  It is 3.5 km away.", "   "], ["Only one sentence"]],
    )
    assert read_squad_contexts(f) == [
        "The U.S. is big. Mr. Smith lives there!  It is 3.5 km away.",
        "   ",
        "Only one sentence",
    ]
    assert read_documents([f]) == [
        ["The U.S. is big.", "Mr. Smith lives there!", "It is 3.5 km away."],
        ["Only one sentence"],
    ]  # the blank context makes no document


def test_mixed_inputs_keep_order(tmp_path: Path) -> None:
    t = tmp_path / "a.txt"
    t.write_text("text doc\n")
    j = squad_file(tmp_path / "b.JSON", [["json doc."]])  # extension match ignores case
    assert read_documents([j, t]) == [["json doc."], ["text doc"]]
    assert read_documents([t, j]) == [["text doc"], ["json doc."]]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("One. Two? Three! Four", ["One.", "Two?", "Three!", "Four"]),
        ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
        (
            "Dr. Who met J. R. R. Tolkien in the U.S. Army.",
            ["Dr. Who met J. R. R. Tolkien in the U.S. Army."],
        ),
        ("Born in 1968. Died in 2001.", ["Born in 1968.", "Died in 2001."]),
        ("Pi is 3.14 and e is 2.71. Fine.", ["Pi is 3.14 and e is 2.71.", "Fine."]),
        ("see (e.g. Fig. 3) for details. Next", ["see (e.g. Fig. 3) for details.", "Next"]),
        ("lower case. after period stays", ["lower case. after period stays"]),
        ("  spaced \t out.\n\nNew one.  ", ["spaced out.", "New one."]),
        ("", []),
        ("   ", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_sentences_preserve_text_on_real_contexts() -> None:
    paths = [SAMPLE_CORPUS, SAMPLE_TRAIN] + ([SHARED_DEV] if SHARED_DEV else [])
    n_docs = n_sents = 0
    for path in paths:
        contexts = read_squad_contexts(path)
        docs = read_documents([path])
        assert len(docs) == len(contexts)
        for context, doc in zip(contexts, docs, strict=True):
            assert " ".join(doc) == " ".join(context.split())
            assert all(s == s.strip() and s for s in doc)
        n_docs += len(docs)
        n_sents += sum(map(len, docs))
    assert n_sents > 3 * n_docs  # really split into sentences


def test_missing_and_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="corpus file not found: .*nope.txt"):
        read_documents([tmp_path / "nope.txt"])
    good = tmp_path / "good.txt"
    good.write_text("x\n")
    with pytest.raises(FileNotFoundError, match="nope.json"):
        iter_texts([good, tmp_path / "nope.json"])  # checked at call time, before any reading
    with pytest.raises(FileNotFoundError):
        iter_documents([tmp_path / "nope.txt"])
    with pytest.raises(ValueError, match="not a regular file"):
        read_documents([tmp_path])
    with pytest.raises(ValueError, match="no corpus files"):
        read_documents([])
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"ok\n\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="bin.txt: not UTF-8"):
        read_documents([binary])


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", r"bad.json: invalid JSON \(.* line 1, column 2\)"),
        (
            "[1, 2]",
            r'bad.json: not a SQuAD JSON file: top level must be an object with a "data" list \(got list\)',
        ),
        (
            '{"version": "v2.0"}',
            r'bad.json: not a SQuAD JSON file: top level must be an object with a "data"',
        ),
        (
            '{"data": [{"title": "x"}]}',
            r'bad.json: not a SQuAD JSON file: data\[0\] must be an object with a "paragraphs"',
        ),
        (
            '{"data": [{"paragraphs": [{"context": "ok"}, {"qas": []}]}]}',
            r'bad.json: not a SQuAD JSON file: data\[0\].paragraphs\[1\] must be an object with a string "context"',
        ),
        ('{"data": [{"paragraphs": [{"context": 5}]}]}', r"data\[0\].paragraphs\[0\]"),
    ],
)
def test_bad_squad_json(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_documents([bad])


def test_text_file_that_looks_like_json_is_text(tmp_path: Path) -> None:
    """Only the .json extension selects SQuAD parsing; other files are plain text, whatever they hold."""
    f = tmp_path / "data.txt"
    f.write_text('{"data": []}\n')
    assert read_documents([f]) == [['{"data": []}']]

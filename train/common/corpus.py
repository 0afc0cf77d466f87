"""Read raw text corpora for pretraining and tokenizer training (torch-free).

Two input formats are understood, chosen by file extension:

* plain text (any extension but ``.json``): one sentence or paragraph per line, a blank line between
  documents -- the format of the original XLNet ``data_utils.py``;
* SQuAD JSON (``.json``, the official ``{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}``
  layout): every paragraph context is one document, split into sentences so that pretraining can put
  segment boundaries at sentence ends.

A document is a ``list[str]`` of non-empty, whitespace-stripped lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from qa_core.text import split_sentences

__all__ = [
    "iter_documents",
    "iter_texts",
    "read_articles",
    "read_documents",
    "read_squad_contexts",
    "split_sentences",
]

PathLike = str | Path


def _check_path(path: PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus file not found: {p}")
    if not p.is_file():
        raise ValueError(f"{p}: not a regular file (pass text or SQuAD .json files, not directories)")
    return p


def _is_json(path: Path) -> bool:
    return path.suffix.lower() == ".json"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_squad_contexts(path: PathLike) -> list[str]:
    """Return every paragraph context of a SQuAD JSON file, validating the layout on the way.

    Raises ``ValueError`` naming the file and the offending element on anything that is not the
    official SQuAD format, so that a wrong ``--input`` fails loudly instead of training on nothing.
    """
    p = _check_path(path)
    try:
        obj: Any = json.loads(_read_text(p))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: invalid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None

    def bad(where: str, what: str) -> ValueError:
        return ValueError(f"{p}: not a SQuAD JSON file: {where} {what}")

    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        got = type(obj).__name__
        raise bad("top level", f'must be an object with a "data" list (got {got})')
    contexts: list[str] = []
    for i, article in enumerate(obj["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise bad(f"data[{i}]", 'must be an object with a "paragraphs" list')
        for j, para in enumerate(article["paragraphs"]):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise bad(f"data[{i}].paragraphs[{j}]", 'must be an object with a string "context"')
            contexts.append(para["context"])
    return contexts


def line_documents(lines: Iterable[str]) -> Iterator[list[str]]:
    """Plain-text documents: stripped non-empty lines, a blank line between documents."""
    doc: list[str] = []
    for line in lines:
        line = line.strip()
        if line:
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def _iter_text_documents(path: Path) -> Iterator[list[str]]:
    try:
        with path.open(encoding="utf-8-sig") as f:
            yield from line_documents(f)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _checked_paths(paths: Sequence[PathLike]) -> list[Path]:
    """Check every path up front (a typo in the last of many files should fail before any work)."""
    if isinstance(paths, str | Path):  # a lone path is an easy mistake; accept it
        paths = [paths]
    if not paths:
        raise ValueError("no corpus files given")
    return [_check_path(p) for p in paths]


def iter_documents(paths: Sequence[PathLike]) -> Iterator[list[str]]:
    """Yield documents (lists of lines) from text and SQuAD JSON files, in order, streaming text files.

    Every path is checked when this is called, so a typo fails before any work is done.
    """
    checked = _checked_paths(paths)

    def generate() -> Iterator[list[str]]:
        for p in checked:
            if _is_json(p):
                for context in read_squad_contexts(p):
                    sentences = split_sentences(context)
                    if sentences:
                        yield sentences
            else:
                yield from _iter_text_documents(p)

    return generate()


def read_articles(paths: Sequence[PathLike], context_words: int = 150) -> list[tuple[str, list[str]]]:
    """(title, contexts) per article, whitespace runs collapsed to single spaces.

    SQuAD JSON: each article's paragraphs as they are (titles from the file). Plain text: each
    document, cut at sentence ends into contexts of about `context_words` words, titled
    ``<file stem>-<document number>``. Articles without text are left out.
    """
    articles: list[tuple[str, list[str]]] = []
    for path in _checked_paths(paths):
        if _is_json(path):
            read_squad_contexts(path)  # validates the layout with a clear message
            obj = json.loads(_read_text(path))
            for i, article in enumerate(obj["data"]):
                title = article.get("title") if isinstance(article.get("title"), str) else f"{path.stem}-{i}"
                contexts = [" ".join(p["context"].split()) for p in article["paragraphs"]]
                articles.append((title, [c for c in contexts if c]))
            continue
        for k, doc in enumerate(_iter_text_documents(path)):
            contexts, current, words = [], [], 0
            for sentence in split_sentences(" ".join(doc)):
                current.append(sentence)
                words += len(sentence.split())
                if words >= context_words:
                    contexts.append(" ".join(current))
                    current, words = [], 0
            if current:
                contexts.append(" ".join(current))
            articles.append((f"{path.stem}-{k}", contexts))
    return [(title, contexts) for title, contexts in articles if contexts]


def read_documents(paths: Sequence[PathLike]) -> list[list[str]]:
    """All documents of all files: plain text split on blank lines, SQuAD contexts split into sentences."""
    return list(iter_documents(paths))


def iter_texts(paths: Sequence[PathLike]) -> Iterator[str]:
    """Yield the corpus one line (sentence or paragraph) at a time, e.g. for sentencepiece training.

    Paths are checked when this is called (see :func:`iter_documents`).
    """
    docs = iter_documents(paths)
    return (line for doc in docs for line in doc)

"""SQuAD 2.0 JSON: reading, validation and article-level subsets.

The official format is ``{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}], "is_impossible", "plausible_answers"?}]}]}]}``.
Training, evaluation and the demo all go through :func:`read_squad`, so a malformed file fails here,
once, with the file and the JSON path of the bad field, instead of deep inside featurisation.
Splits are made by *article* (never by question) so that a held-out set shares no paragraph with
the fine-tuning set.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, TypeAlias

Answer: TypeAlias = tuple[str, int]
"""(text, answer_start): the answer's text and its character offset in the context."""

Dataset: TypeAlias = dict[str, Any]
"""A parsed SQuAD JSON document (``{"version": ..., "data": [...]}``)."""

PathOrDataset: TypeAlias = str | PathLike[str] | Dataset


@dataclass
class SquadExample:
    """One question about one paragraph.

    ``is_impossible`` is taken from the file; files without the field (SQuAD 1.1, unlabelled test
    splits whose ``answers`` are empty) get ``not answers``. ``plausible_answers`` are the spans the
    annotators marked for an unanswerable question (not gold: scoring ignores them).
    """

    qas_id: str
    title: str
    question: str
    context: str
    answers: list[Answer]
    is_impossible: bool
    plausible_answers: list[Answer] = field(default_factory=list)

    @property
    def answer_texts(self) -> list[str]:
        """The gold answer texts (empty for an unanswerable question)."""
        return [text for text, _ in self.answers]

    @property
    def first_answer(self) -> Answer | None:
        """The answer used as the training label (the first one, as in the original recipe)."""
        return self.answers[0] if self.answers else None


def _where(source: str, path: str) -> str:
    return f"{source}: {path}" if path else source


def _require(obj: Any, key: str, kind: type | tuple[type, ...], source: str, path: str) -> Any:
    """``obj[key]`` if present and of type ``kind``; a ValueError naming the file and field otherwise."""
    if not isinstance(obj, dict):
        raise ValueError(f"{_where(source, path)}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise ValueError(f"{_where(source, path)}: missing field {key!r}")
    value = obj[key]
    # bool is an int in Python; an answer_start of `true` is still malformed.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(
            f"{_where(source, f'{path}.{key}' if path else key)}: expected {names}, got {type(value).__name__}"
        )
    return value


def _read_answers(
    qa: dict[str, Any], key: str, context: str, source: str, path: str, strict: bool
) -> list[Answer]:
    raw = qa.get(key, [])
    if not isinstance(raw, list):
        raise ValueError(f"{source}: {path}.{key}: expected a list, got {type(raw).__name__}")
    answers: list[Answer] = []
    for k, ans in enumerate(raw):
        apath = f"{path}.{key}[{k}]"
        text = _require(ans, "text", str, source, apath)
        start = _require(ans, "answer_start", int, source, apath)
        if not text:
            raise ValueError(f"{source}: {apath}.text: empty answer text")
        if not 0 <= start <= len(context) - len(text):
            raise ValueError(
                f"{source}: {apath}.answer_start: {start} puts {text!r} outside the context "
                f"({len(context)} characters)"
            )
        if strict and context[start : start + len(text)] != text:
            raise ValueError(
                f"{source}: {apath}: text {text!r} does not match the context at answer_start={start} "
                f"({context[start : start + len(text)]!r})"
            )
        answers.append((text, start))
    return answers


def examples_from_dataset(
    dataset: Dataset, source: str = "<dataset>", strict: bool = True
) -> list[SquadExample]:
    """Validate a parsed SQuAD JSON document and flatten it into examples (file order).

    ``strict`` also checks that every answer's text is found in the context at its ``answer_start``
    (true for all official SQuAD 2.0 files); answer alignment relies on it.
    """
    articles = _require(dataset, "data", list, source, "")
    examples: list[SquadExample] = []
    seen: dict[str, str] = {}
    for i, article in enumerate(articles):
        apath = f"data[{i}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        if not isinstance(title, str):
            raise ValueError(f"{source}: {apath}.title: expected str, got {type(title).__name__}")
        paragraphs = _require(article, "paragraphs", list, source, apath)
        for j, para in enumerate(paragraphs):
            ppath = f"{apath}.paragraphs[{j}]"
            context = _require(para, "context", str, source, ppath)
            for k, qa in enumerate(_require(para, "qas", list, source, ppath)):
                qpath = f"{ppath}.qas[{k}]"
                qas_id = _require(qa, "id", str, source, qpath)
                question = _require(qa, "question", str, source, qpath)
                if qas_id in seen:
                    raise ValueError(
                        f"{source}: {qpath}.id: duplicate id {qas_id!r} (first at {seen[qas_id]})"
                    )
                seen[qas_id] = qpath
                answers = _read_answers(qa, "answers", context, source, qpath, strict)
                plausible = _read_answers(qa, "plausible_answers", context, source, qpath, strict)
                if "is_impossible" in qa:
                    is_impossible = _require(qa, "is_impossible", bool, source, qpath)
                    if is_impossible and answers:
                        raise ValueError(f"{source}: {qpath}: is_impossible is true but answers is not empty")
                    if not is_impossible and not answers:
                        raise ValueError(f"{source}: {qpath}: is_impossible is false but answers is empty")
                else:
                    is_impossible = not answers
                examples.append(
                    SquadExample(qas_id, title, question, context, answers, is_impossible, plausible)
                )
    return examples


def load_dataset(path_or_dataset: PathOrDataset) -> Dataset:
    """A parsed SQuAD document: loads a path, passes a dict through unchanged."""
    if isinstance(path_or_dataset, dict):
        return path_or_dataset
    path = Path(path_or_dataset)
    try:
        with path.open(encoding="utf-8") as f:
            dataset = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(dataset, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level, got {type(dataset).__name__}")
    return dataset


def read_squad(path: str | PathLike[str], strict: bool = True) -> list[SquadExample]:
    """Read and validate a SQuAD (2.0 or 1.1) JSON file into examples, in file order."""
    return examples_from_dataset(load_dataset(path), source=str(path), strict=strict)


def article_titles(path_or_dataset: PathOrDataset) -> list[str]:
    """The titles of the articles, in file order."""
    return [a.get("title", "") for a in load_dataset(path_or_dataset)["data"]]


def merge_datasets(paths_or_datasets: Sequence[PathOrDataset]) -> Dataset:
    """One document holding every article of several, in order: a study can fine-tune on the official
    training articles and the labelled dev articles it does not score. A title in two files is refused,
    since splitting by title could then put one article on both sides."""
    merged: Dataset = {"version": "v2.0", "data": []}
    seen: dict[str, int] = {}
    for i, item in enumerate(paths_or_datasets):
        dataset = load_dataset(item)
        for article in dataset.get("data", []):
            title = article.get("title", "")
            if title in seen:
                raise ValueError(f"article {title!r} is in labelled files {seen[title] + 1} and {i + 1}")
            seen[title] = i
            merged["data"].append(article)
    return merged


def select_articles(
    path_or_dataset: PathOrDataset,
    titles: Iterable[str] | None = None,
    indices: Iterable[int] | None = None,
) -> Dataset:
    """A new SQuAD document holding only the chosen articles (by title or by index, in that order).

    Unknown titles or out-of-range indices raise ValueError: a typo must not silently shrink a split.
    """
    dataset = load_dataset(path_or_dataset)
    articles = dataset["data"]
    if (titles is None) == (indices is None):
        raise ValueError("select_articles: give exactly one of titles= or indices=")
    if titles is not None:
        by_title = {a.get("title", ""): a for a in articles}
        wanted = list(titles)
        missing = [t for t in wanted if t not in by_title]
        if missing:
            raise ValueError(f"select_articles: unknown article titles {missing}; known: {sorted(by_title)}")
        chosen = [by_title[t] for t in wanted]
    else:
        wanted_idx = list(indices or [])
        bad = [i for i in wanted_idx if not -len(articles) <= i < len(articles)]
        if bad:
            raise ValueError(f"select_articles: article indices {bad} out of range (0..{len(articles) - 1})")
        chosen = [articles[i] for i in wanted_idx]
    return {**{k: v for k, v in dataset.items() if k != "data"}, "data": chosen}


def split_by_article(
    path_or_dataset: PathOrDataset,
    first: int | float | Sequence[str],
    *,
    seed: int | None = None,
) -> tuple[Dataset, Dataset]:
    """Split a document into two by article: ``(chosen, rest)``.

    ``first`` is a number of articles (int), a fraction of them (float in (0, 1)), or a list of
    titles. With a count or fraction the articles are taken in file order, or shuffled with
    ``seed`` first. Both parts keep the file's ``version``; neither shares a paragraph with the other.
    """
    dataset = load_dataset(path_or_dataset)
    n_articles = len(dataset["data"])
    order = list(range(n_articles))
    if isinstance(first, (str, bytes)):
        raise ValueError(
            "split_by_article: first= must be a count, a fraction or a list of titles, not a str"
        )
    if isinstance(first, Sequence):
        chosen = select_articles(dataset, titles=first)
        wanted = set(first)
        rest_idx = [i for i, a in enumerate(dataset["data"]) if a.get("title", "") not in wanted]
        return chosen, select_articles(dataset, indices=rest_idx)
    if isinstance(first, float) and not isinstance(first, bool):
        if not 0.0 < first < 1.0:
            raise ValueError(f"split_by_article: a fraction must be in (0, 1), got {first}")
        n = round(first * n_articles)
    else:
        n = int(first)
    if not 0 <= n <= n_articles:
        raise ValueError(f"split_by_article: cannot take {n} of {n_articles} articles")
    if seed is not None:
        random.Random(seed).shuffle(order)
    return select_articles(dataset, indices=order[:n]), select_articles(dataset, indices=order[n:])


def squad_bytes(dataset: Dataset) -> bytes:
    """A SQuAD document as :func:`write_squad` writes it (UTF-8 JSON): what a file's hash is taken of."""
    return json.dumps(dataset, ensure_ascii=False).encode("utf-8")


def write_squad(dataset: Dataset, path: str | PathLike[str]) -> Path:
    """Write a SQuAD document as UTF-8 JSON (creating parent folders); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(squad_bytes(dataset))
    return path


def dataset_stats(path_or_dataset: PathOrDataset) -> dict[str, int]:
    """Counts for logs and READMEs: articles, paragraphs, questions, unanswerable questions."""
    dataset = load_dataset(path_or_dataset)
    stats = {"articles": len(dataset["data"]), "paragraphs": 0, "questions": 0, "unanswerable": 0}
    for article in dataset["data"]:
        for para in article["paragraphs"]:
            stats["paragraphs"] += 1
            for qa in para["qas"]:
                stats["questions"] += 1
                stats["unanswerable"] += bool(qa.get("is_impossible", not qa.get("answers")))
    return stats

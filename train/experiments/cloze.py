"""Cloze questions from one sentence (torch-free): answer candidates (dates, numbers, capitalised
phrases, spans that recur in the context) and the question made by replacing one with a wh-phrase.

What :mod:`train.experiments.synth` builds its datasets from; nothing here draws at random.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from qa_core.text import DATE, NUMBER, STOPWORDS, split_sentences

ANSWER_TYPES = ("date", "number", "capitalised", "recurring")
# Capitalised words that start sentences or name no entity on their own.
GENERIC_CAPITALS = frozenset(s.capitalize() for s in STOPWORDS) | {"However", "Although", "Despite"}
PHRASE_CONNECTORS = frozenset({"of", "the", "de", "du", "da", "van", "von", "der", "del", "la", "le", "and"})
MAX_PHRASE_WORDS = 6
MAX_RECURRING_WORDS = 4

_WORD = re.compile(r"[^\W_][\w'’\-.&]*[^\W_]|[^\W_]")


@dataclass(frozen=True)
class Candidate:
    """An answer inside a sentence: [start, end) relative to the sentence, with its type."""

    start: int
    end: int
    kind: str


# ---------------------------------------------------------------- reading
def sentence_spans(context: str) -> list[tuple[int, int]]:
    """[start, end) of each sentence in a whitespace-normalised context (sentences joined by one space)."""
    spans, pos = [], 0
    for sentence in split_sentences(context):
        start = context.index(sentence, pos)
        spans.append((start, start + len(sentence)))
        pos = start + len(sentence)
    return spans


# ---------------------------------------------------------------- answer candidates
def word_spans(sentence: str) -> list[tuple[int, int]]:
    return [m.span() for m in _WORD.finditer(sentence)]


def find_candidates(
    sentence: str, rest_of_context: str, types: Iterable[str] = ANSWER_TYPES
) -> list[Candidate]:
    """Answer candidates of one sentence, longest first where they overlap."""
    types = set(types)
    found: list[Candidate] = []
    if "date" in types:
        found += [Candidate(*m.span(), "date") for m in DATE.finditer(sentence)]
    if "number" in types:
        found += [Candidate(*m.span(), "number") for m in NUMBER.finditer(sentence)]
    words = word_spans(sentence)
    if "capitalised" in types:
        found += capitalised_phrases(sentence, words)
    if "recurring" in types:
        found += _recurring_spans(sentence, words, rest_of_context.lower())
    chosen: list[Candidate] = []
    for c in sorted(found, key=lambda c: (-(c.end - c.start), c.start)):
        if not sentence[c.start : c.end].strip():
            continue
        if all(c.end <= o.start or c.start >= o.end for o in chosen):
            chosen.append(c)
    return sorted(chosen, key=lambda c: c.start)


def _is_capital(word: str) -> bool:
    return word[:1].isupper() and word not in GENERIC_CAPITALS


def capitalised_phrases(sentence: str, words: list[tuple[int, int]]) -> list[Candidate]:
    out, i = [], 0
    while i < len(words):
        text = sentence[words[i][0] : words[i][1]]
        if not _is_capital(text) or (i == 0 and not _continues(sentence, words, i)):
            i += 1
            continue
        j = i + 1
        while j < len(words) and j - i < MAX_PHRASE_WORDS and _spaced(sentence, words, j):
            nxt = sentence[words[j][0] : words[j][1]]
            if _is_capital(nxt):
                j += 1
            elif (
                nxt in PHRASE_CONNECTORS
                and j + 1 < len(words)
                and _spaced(sentence, words, j + 1)
                and _is_capital(sentence[slice(*words[j + 1])])
            ):
                j += 2
            else:
                break
        out.append(Candidate(words[i][0], words[j - 1][1], "capitalised"))
        i = j
    return out


def _spaced(sentence: str, words: list[tuple[int, int]], j: int) -> bool:
    """Only whitespace between word j - 1 and word j (a phrase does not run across punctuation),
    or the period of an initial ("Charles W. Eliot")."""
    gap = sentence[words[j - 1][1] : words[j][0]]
    if not gap.strip():
        return True
    previous = sentence[slice(*words[j - 1])]
    return gap.strip() == "." and len(previous) == 1 and previous.isupper() and gap[-1:].isspace()


def _continues(sentence: str, words: list[tuple[int, int]], i: int) -> bool:
    """A sentence-initial capital counts only when the next word is capitalised too ("New York ...")."""
    return (
        i + 1 < len(words) and _spaced(sentence, words, i + 1) and _is_capital(sentence[slice(*words[i + 1])])
    )


def _recurring_spans(sentence: str, words: list[tuple[int, int]], rest_lower: str) -> list[Candidate]:
    """Word n-grams (up to MAX_RECURRING_WORDS, not only stopwords) that occur again outside the sentence."""
    out = []
    for n in range(MAX_RECURRING_WORDS, 0, -1):
        for i in range(len(words) - n + 1):
            start, end = words[i][0], words[i + n - 1][1]
            text = sentence[start:end]
            tokens = [sentence[slice(*w)].lower() for w in words[i : i + n]]
            if all(t in STOPWORDS for t in tokens) or len(text) < 4:
                continue
            if tokens[0] in STOPWORDS or tokens[-1] in STOPWORDS:
                continue
            if occurs(text.lower(), rest_lower):
                out.append(Candidate(start, end, "recurring"))
    return out


def mentions(context: str, answer: str) -> bool:
    """Whether the answer occurs in the context in any letter case (then it cannot be unanswerable)."""
    return occurs(answer.lower(), context.lower())


def occurs(needle: str, haystack: str) -> bool:
    return bool(find_all(needle, haystack))


def find_all(needle: str, haystack: str) -> list[int]:
    """Starts of `needle` in `haystack` at word boundaries (case as given)."""
    pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)")
    return [m.start() for m in pattern.finditer(haystack)]


# ---------------------------------------------------------------- questions
def wh_phrase(answer: str, kind: str) -> str:
    if kind == "date":
        return "when"
    if kind == "number":
        if answer.endswith("%"):
            return "what percentage"
        if answer[:1] in "$£€":
            return "how much"
        return "how many"
    return "what"


def make_question(sentence: str, cand: Candidate, style: str) -> str:
    """The sentence with the answer replaced by a wh-phrase, as a cloze ("... in when?") or with the
    wh-phrase moved to the front ("When ... in?")."""
    answer = sentence[cand.start : cand.end]
    wh = wh_phrase(answer, cand.kind)
    left = sentence[: cand.start].strip()
    right = sentence[cand.end :].strip().rstrip(".!?;:").strip()
    if style == "cloze":
        text = " ".join(p for p in (left, wh, right) if p)
    else:
        if left and left[0].isupper() and not _is_capital(left.split()[0]):
            left = left[0].lower() + left[1:]
        text = " ".join(p for p in (wh.capitalize(), left, right) if p)
    text = re.sub(r"\s+([,;:])", r"\1", text).strip(" ,;:")
    return text[0].upper() + text[1:] + "?"


def leaks(question: str, answer: str) -> bool:
    """Whether the answer text appears in the question (case-insensitive, at word boundaries)."""
    return occurs(answer.lower(), question.lower())


def remove_span(context: str, start: int, end: int) -> str:
    """The context without [start, end) and one adjacent space."""
    if end < len(context) and context[end] == " ":
        end += 1
    elif start > 0 and context[start - 1] == " ":
        start -= 1
    return context[:start] + context[end:]


def entity_names(articles: list[tuple[str, list[str]]]) -> list[str]:
    """Every capitalised phrase of the corpus (sorted, unique): what an entity swap draws from."""
    found: set[str] = set()
    for _, contexts in articles:
        for context in contexts:
            for s0, s1 in sentence_spans(context):
                sentence = context[s0:s1]
                found |= {
                    sentence[c.start : c.end] for c in capitalised_phrases(sentence, word_spans(sentence))
                }
    return sorted(found)

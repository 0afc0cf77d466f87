"""Small, predictable rules about English text (torch-free, standard library only).

One home for the word lists and patterns that several parts read: the sentence splitter (pretraining
corpora, synthetic questions, the answer verifier), stopwords, numbers and dates (synthetic answer
candidates, number agreement), negation words and a small antonym list (hard synthetic negatives and
the verifier's negation/antonym features), and a crude suffix-stripping stemmer (lemma overlap). Rules,
not a model: what they get wrong they get wrong the same way in training and in serving.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

# ---------------------------------------------------------------- sentences
# Candidate boundary: sentence-final punctuation, optional closing quotes/brackets, whitespace, then
# something that can open a sentence (capital letter, digit, opening quote/bracket).
_BOUNDARY = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*(\s+)(?=["'\u201c\u2018(\[]?[A-Z0-9\u00c0-\u00de])""")
# Abbreviations that end in a period but rarely end a sentence (compared case-insensitively).
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "e.g", "i.e", "cf", "al"}
    | {"approx", "gen", "lt", "sgt", "capt", "gov", "rev", "jan", "feb", "apr", "jun", "jul", "aug", "sept"}
    | {"oct", "nov", "dec", "fig", "figs", "vol", "eq", "inc", "ltd", "corp", "dept", "pp"}
)
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")  # "J", "U.S", "e.g" (before the final period)


def sentence_bounds(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` character offsets of each sentence of ``text``, surrounding whitespace excluded.

    Splits after ``.``, ``!`` or ``?`` (plus closing quotes) when whitespace and a capital letter, digit
    or opening quote follow, except after common abbreviations and initials ("Mr. Smith", "U.S.
    state", "J. R. R. Tolkien").
    """
    bounds: list[tuple[int, int]] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        end = m.start(1)  # the sentence ends before the whitespace
        word = text[start:end].rsplit(None, 1)[-1] if text[start:end].strip() else ""
        word = word.rstrip("\"'\u201d\u2019)]").rstrip(".!?").lstrip("\"'\u201c\u2018([")
        if text[m.start()] == "." and (word.lower() in _ABBREVIATIONS or _INITIALS.match(word)):
            continue
        bounds.append(_strip(text, start, end))
        start = m.end(1)
    bounds.append(_strip(text, start, len(text)))
    return [(a, b) for a, b in bounds if b > a]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def split_sentences(text: str) -> list[str]:
    """The sentences of a paragraph with their whitespace runs collapsed (joining them with single
    spaces gives back the paragraph with its whitespace collapsed)."""
    return [" ".join(text[a:b].split()) for a, b in sentence_bounds(text)]


# ---------------------------------------------------------------- words
def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _wordset(
    "a an the of in on at to for from by with and or but as is was were are be been being it its this "
    "that these those he she they we you i his her their our your which who whom what when where why how "
    "not no than then there here also into over after before during about under between while such can "
    "could would should may might will shall has have had do does did so if one two"
)
# Words that negate what they govern (compared lower-case; "n't" is split off by WORD).
NEGATIONS = _wordset(
    "not no never none nobody nothing neither nor without cannot n't fail failed fails unable"
)
# Pairs whose swap turns a statement into its opposite: the SQuAD 2.0 paper's "antonym" edits.
ANTONYM_PAIRS: tuple[tuple[str, str], ...] = (
    ("first", "last"),
    ("largest", "smallest"),
    ("biggest", "smallest"),
    ("highest", "lowest"),
    ("most", "least"),
    ("more", "less"),
    ("increase", "decrease"),
    ("increased", "decreased"),
    ("before", "after"),
    ("early", "late"),
    ("earliest", "latest"),
    ("earlier", "later"),
    ("older", "younger"),
    ("oldest", "youngest"),
    ("start", "end"),
    ("began", "ended"),
    ("begin", "end"),
    ("won", "lost"),
    ("win", "lose"),
    ("major", "minor"),
    ("maximum", "minimum"),
    ("north", "south"),
    ("east", "west"),
    ("northern", "southern"),
    ("eastern", "western"),
    ("inside", "outside"),
    ("above", "below"),
    ("upper", "lower"),
    ("accept", "reject"),
    ("accepted", "rejected"),
    ("allow", "forbid"),
    ("allowed", "forbidden"),
    ("success", "failure"),
    ("successful", "unsuccessful"),
    ("positive", "negative"),
    ("private", "public"),
    ("internal", "external"),
    ("ancient", "modern"),
    ("rich", "poor"),
    ("strong", "weak"),
    ("long", "short"),
    ("high", "low"),
    ("large", "small"),
    ("best", "worst"),
    ("better", "worse"),
    ("same", "different"),
    ("true", "false"),
    ("open", "closed"),
    ("born", "died"),
    ("import", "export"),
    ("imports", "exports"),
)
ANTONYMS: dict[str, str] = {a: b for a, b in ANTONYM_PAIRS} | {b: a for a, b in ANTONYM_PAIRS}
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

WORD = re.compile(r"n't|[^\W_]+(?:['\u2019][^\W_]+)*")
_MONTH = "|".join(MONTHS)
DATE = re.compile(
    rf"\b(?:\d{{1,2}}\s+(?:{_MONTH})(?:,?\s+\d{{3,4}})?|(?:{_MONTH})(?:\s+\d{{1,2}})?(?:,?\s+\d{{3,4}})?"
    rf"|(?:1[0-9]|20)\d{{2}}s?)\b"
)
NUMBER = re.compile(
    r"(?<![\w.])[$£€]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?|(?<![\w.,])[$£€]?\d+(?:\.\d+)?%?(?![\w])"
)
_NUMBER_WORDS = _wordset(
    "zero one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty hundred "
    "thousand million billion trillion dozen"
)


def words(text: str) -> list[str]:
    """Lower-cased word tokens; "didn't" gives "did" and "n't" so negation is its own word."""
    text = text.replace("\u2019", "'")
    if text.isascii():  # lower-casing first finds the same words, lower-cased, in one pass
        lowered = text.lower()
        found = WORD.findall(lowered)
        if "n't" not in lowered:
            return found
    else:
        found = [w.lower() for w in WORD.findall(text)]
    out: list[str] = []
    for low in found:
        if low.endswith("n't") and low != "n't":
            out += [low[:-3], "n't"]
        else:
            out.append(low)
    return out


@functools.lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """A crude suffix stripper (plural, past, gerund, adverb, possessive) for lemma overlap:
    "emperors" / "emperor", "ruled" / "rules" / "ruling" / "rule" all meet."""
    w = word.lower()
    if w.endswith("'s"):
        w = w[:-2]
    for suffix, repl in (
        ("ies", "y"),
        ("ied", "y"),
        ("ing", ""),
        ("ed", ""),
        ("es", ""),
        ("ly", ""),
        ("s", ""),
    ):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)] + repl
            break
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


def content_stems(text: str, tokens: list[str] | None = None) -> list[str]:
    """Stems of the words that carry content (stopwords and negations left out), in order;
    ``tokens``: ``words(text)`` when the caller has them already."""
    return [
        stem(w)
        for w in (words(text) if tokens is None else tokens)
        if w not in STOPWORDS and w not in NEGATIONS
    ]


def numbers(text: str, tokens: Iterable[str] | None = None) -> set[str]:
    """Numbers written with digits, normalised ("1,000" and "1000" are one), plus number words;
    ``tokens``: ``words(text)`` when the caller has them already."""
    found = {m.group().strip("$£€%").replace(",", "") for m in NUMBER.finditer(text)}
    return found | _NUMBER_WORDS.intersection(words(text) if tokens is None else tokens)


def has_number(text: str, tokens: Iterable[str] | None = None) -> bool:
    """Whether ``text`` names a number (``bool(numbers(text))``, without building the set)."""
    return not _NUMBER_WORDS.isdisjoint(words(text) if tokens is None else tokens) or bool(
        NUMBER.search(text)
    )


def capitalised(text: str) -> set[str]:
    """Lower-cased words written with a capital, except a text's first word (names, mostly)."""
    tokens = WORD.findall(text)
    return {w.lower() for w in tokens[1:] if w[:1].isupper() and w.lower() not in STOPWORDS}


def has_negation(text: str, tokens: Iterable[str] | None = None) -> bool:
    """Whether ``text`` holds a negation; ``tokens``: its ``words`` (or a set of them) when known."""
    return not NEGATIONS.isdisjoint(words(text) if tokens is None else tokens)

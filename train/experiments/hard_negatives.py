"""Hard unanswerable questions: a near-copy of an answerable question with one thing changed.

The SQuAD 2.0 paper's annotators wrote unanswerable questions mostly by negation, antonyms, entity
swaps, mutual exclusion and impossible conditions: the question still points at a sentence of the
paragraph, the words still match, and one change makes the sentence no longer answer it. Easy
negatives (the sentence removed, another paragraph) teach a model to look for the question's words;
these teach it to check what the words say. Each edit keeps the original answer as the plausible
answer (where the question points), so ``--plausible-spans`` fine-tuning can learn from it too.

Edits (tried in a seeded random order, the first that applies wins):
- entity swap: a capitalised name in the question becomes a name that occurs nowhere in the context;
- number swap: a number in the question becomes another number that occurs nowhere in the context;
- negation: "not" after the question's first auxiliary verb ("was" -> "was not");
- antonym: a word with an antonym in :data:`qa_core.text.ANTONYMS` becomes that antonym, unless the
  question's sentence holds the antonym (which could make it answerable again).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from qa_core.text import ANTONYMS, NUMBER, capitalised, numbers, words

EDITS = ("entity swap", "number swap", "negation", "antonym")
MAX_DRAWS = 20  # names drawn for an entity swap before giving up
AUXILIARIES = frozenset(
    ("is", "was", "were", "are", "am", "do", "does", "did", "has", "have", "had", "can", "could")
    + ("would", "will", "should", "shall", "may", "might", "must")
)
_TOKEN = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")


def _mentions(context_lower: str, text: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(text.lower()) + r"(?!\w)", context_lower) is not None


def swap_entity(question: str, context: str, names: Sequence[str], rng: np.random.Generator) -> str | None:
    """Replace one capitalised word of the question with a name absent from the context."""
    q_names = sorted(capitalised(question))
    if not q_names or not names:
        return None
    context_lower, question_lower = context.lower(), question.lower()
    target = q_names[int(rng.integers(len(q_names)))]
    replacement = None
    for i in rng.integers(len(names), size=MAX_DRAWS).tolist():  # a few draws, not a scan of the pool
        if not _mentions(context_lower, names[i]) and names[i].lower() not in question_lower:
            replacement = names[i]
            break
    if replacement is None:
        return None
    pattern = re.compile(r"(?<!\w)" + re.escape(target) + r"(?!\w)", re.IGNORECASE)
    edited = pattern.sub(replacement, question, count=1)
    return edited if edited != question else None


def swap_number(question: str, context: str, rng: np.random.Generator) -> str | None:
    """Replace one number of the question with a different one the context does not hold."""
    found = list(NUMBER.finditer(question))
    if not found:
        return None
    m = found[int(rng.integers(len(found)))]
    digits = m.group().strip("$£€%").replace(",", "")
    try:
        value = float(digits)
    except ValueError:
        return None
    taken = numbers(context)
    for _ in range(20):
        delta = int(rng.integers(1, 10)) * (1 if rng.random() < 0.5 else -1)
        new = value + delta if value.is_integer() else round(value * (1 + delta / 10), 2)
        text = str(int(new)) if float(new).is_integer() else str(new)
        if new > 0 and text not in taken:
            prefix = m.group()[: len(m.group()) - len(m.group().lstrip("$£€"))]
            suffix = "%" if m.group().endswith("%") else ""
            return question[: m.start()] + prefix + text + suffix + question[m.end() :]
    return None


def negate(question: str) -> str | None:
    """Insert "not" after the question's first auxiliary verb (None if it has none or is negated)."""
    if any(w in ("not", "n't", "never", "no") for w in words(question)):
        return None
    for m in _TOKEN.finditer(question):
        if m.group().lower() in AUXILIARIES:
            return question[: m.end()] + " not" + question[m.end() :]
    return None


def antonym(question: str, sentence: str) -> str | None:
    """Replace a word with its antonym, unless the sentence holds the antonym (which could make the
    edited question answerable again)."""
    sentence_words = set(words(sentence))
    for m in _TOKEN.finditer(question):
        w = m.group().lower()
        if w in ANTONYMS and ANTONYMS[w] not in sentence_words:
            repl = ANTONYMS[w]
            if m.group()[:1].isupper():
                repl = repl.capitalize()
            return question[: m.start()] + repl + question[m.end() :]
    return None


def hard_negative(
    question: str, sentence: str, context: str, names: Sequence[str], rng: np.random.Generator
) -> tuple[str, str] | None:
    """``(edit, question)``: the question made unanswerable by one edit, or None if none applies."""
    for k in rng.permutation(len(EDITS)).tolist():
        edit = EDITS[k]
        if edit == "entity swap":
            out = swap_entity(question, context, names, rng)
        elif edit == "number swap":
            out = swap_number(question, context, rng)
        elif edit == "negation":
            out = negate(question)
        else:
            out = antonym(question, sentence)
        if out is not None and out != question:
            return edit, out
    return None

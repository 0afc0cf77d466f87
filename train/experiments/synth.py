"""`python -m train.experiments.synth`: self-supervised SQuAD 2.0 questions from unlabelled text (torch-free).

Cloze questions in the spirit of Dhingra et al. 2018 (questions from a passage's own sentences),
Lewis et al. 2019 (cloze turned into wh-questions) and Ram et al. 2021 (recurring spans). For every
sentence of a context, answer candidates are found (numbers, dates, capitalised phrases, spans that
recur elsewhere in the context); the answer is replaced by a wh-phrase, giving a question.

Where each question is answered:
- elsewhere: the answer also occurs outside the question's sentence; that sentence is removed from
  the context and the label points at the other occurrence, so the model cannot just find the
  question's own words and copy what filled the gap;
- in place: the sentence stays and the label is the answer's own position (the easy case);
- unanswerable: the sentence is removed and the answer occurs nowhere else, or the question is
  paired with another context of the same document that lacks the answer.

The answerable share is exact (the questions that become answerable are drawn with the seed); the
output is ordinary SQuAD 2.0 JSON that `train.finetune` reads unchanged. Deterministic for a seed.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from train.common.cli import Parser, run
from train.common.corpus import read_articles
from train.common.text import DATE, NUMBER, STOPWORDS, split_sentences
from train.experiments.hard_negatives import hard_negative
from train.squad import write_squad

ANSWER_TYPES = ("date", "number", "capitalised", "recurring")
STYLES = ("cloze", "wh", "mix")
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


@dataclass
class SynthConfig:
    answerable: float = 0.5  # share of questions with an answer
    in_place: float = 0.5  # share of answerable questions answered at their own position
    per_sentence: int = 2  # at most this many questions from one sentence
    max_questions: int | None = None
    style: str = "mix"  # cloze: the sentence with a wh-phrase in the gap; wh: the wh-phrase first
    types: tuple[str, ...] = ANSWER_TYPES
    seed: int = 0
    hard_negatives: float = (
        0.0  # share of unanswerable questions made by one edit (train.experiments.hard_negatives)
    )

    def validate(self) -> None:
        if not 0.0 <= self.answerable <= 1.0:
            raise ValueError(f"--answerable must be in [0, 1], got {self.answerable}")
        if not 0.0 <= self.in_place <= 1.0:
            raise ValueError(f"--in-place must be in [0, 1], got {self.in_place}")
        if not 0.0 <= self.hard_negatives <= 1.0:
            raise ValueError(f"--hard-negatives must be in [0, 1], got {self.hard_negatives}")
        if self.per_sentence < 1:
            raise ValueError(f"--per-sentence must be at least 1, got {self.per_sentence}")
        if self.max_questions is not None and self.max_questions < 1:
            raise ValueError(f"--max-questions must be at least 1, got {self.max_questions}")
        if self.style not in STYLES:
            raise ValueError(f"--style must be one of {STYLES}, got {self.style!r}")
        unknown = set(self.types) - set(ANSWER_TYPES)
        if unknown or not self.types:
            raise ValueError(f"--types must be a non-empty subset of {ANSWER_TYPES}, got {list(self.types)}")


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
def _words(sentence: str) -> list[tuple[int, int]]:
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
    words = _words(sentence)
    if "capitalised" in types:
        found += _capitalised_phrases(sentence, words)
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


def _capitalised_phrases(sentence: str, words: list[tuple[int, int]]) -> list[Candidate]:
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
            if _occurs(text.lower(), rest_lower):
                out.append(Candidate(start, end, "recurring"))
    return out


def _mentions(context: str, answer: str) -> bool:
    """Whether the answer occurs in the context in any letter case (then it cannot be unanswerable)."""
    return _occurs(answer.lower(), context.lower())


def _occurs(needle: str, haystack: str) -> bool:
    return bool(_find_all(needle, haystack))


def _find_all(needle: str, haystack: str) -> list[int]:
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
    return _occurs(answer.lower(), question.lower())


def remove_span(context: str, start: int, end: int) -> str:
    """The context without [start, end) and one adjacent space."""
    if end < len(context) and context[end] == " ":
        end += 1
    elif start > 0 and context[start - 1] == " ":
        start -= 1
    return context[:start] + context[end:]


# ---------------------------------------------------------------- generation
@dataclass
class _Draft:
    """One question with both fates prepared; `finalise` picks one."""

    title: str
    qid: str
    sentence: str  # the sentence the question was made from
    question: str
    answer: str
    kind: str
    style: str
    answerable: tuple[str, str, int] | None  # (how, context, answer_start)
    unanswerable: tuple[str, str] | None  # (how, context)
    hard: tuple[str, str, str, int] | None = None  # (edit, question, context, plausible answer_start)


def entity_names(articles: list[tuple[str, list[str]]]) -> list[str]:
    """Every capitalised phrase of the corpus (sorted, unique): what an entity swap draws from."""
    found: set[str] = set()
    for _, contexts in articles:
        for context in contexts:
            for s0, s1 in sentence_spans(context):
                sentence = context[s0:s1]
                found |= {sentence[c.start : c.end] for c in _capitalised_phrases(sentence, _words(sentence))}
    return sorted(found)


def draft_questions(
    articles: list[tuple[str, list[str]]], cfg: SynthConfig, rng: np.random.Generator
) -> list[_Draft]:
    drafts: list[_Draft] = []
    names = entity_names(articles) if cfg.hard_negatives > 0 else []
    for a, (title, contexts) in enumerate(articles):
        for p, context in enumerate(contexts):
            for s, (s0, s1) in enumerate(sentence_spans(context)):
                sentence = context[s0:s1]
                rest = remove_span(context, s0, s1)
                cands = find_candidates(sentence, rest, cfg.types)
                if not cands:
                    continue
                picks = rng.permutation(len(cands))[: cfg.per_sentence]
                for k in sorted(picks.tolist()):
                    cand = cands[k]
                    answer = sentence[cand.start : cand.end]
                    style = cfg.style if cfg.style != "mix" else ("cloze", "wh")[int(rng.integers(2))]
                    question = make_question(sentence, cand, style)
                    if leaks(question, answer):
                        continue
                    in_place = ("in place", context, s0 + cand.start)
                    answerable, unanswerable = _fates(answer, in_place, rest, contexts, p, cfg, rng)
                    hard = None
                    if cfg.hard_negatives > 0:
                        edited = hard_negative(question, sentence, context, names, rng)
                        if edited is not None and not leaks(edited[1], answer):
                            hard = (edited[0], edited[1], context, s0 + cand.start)
                    drafts.append(
                        _Draft(
                            title,
                            f"synth-{a}-{p}-{s}-{k}",
                            sentence,
                            question,
                            answer,
                            cand.kind,
                            style,
                            answerable,
                            unanswerable,
                            hard,
                        )
                    )
    return drafts


def _fates(
    answer: str,
    in_place: tuple[str, str, int],
    rest: str,
    contexts: list[str],
    p: int,
    cfg: SynthConfig,
    rng: np.random.Generator,
) -> tuple[tuple[str, str, int], tuple[str, str] | None]:
    """(answerable, unanswerable) versions of a question whose sentence is cut out of context `p`
    leaving `rest`: answered elsewhere or in place; unanswerable with its sentence removed, or in
    another context without the answer."""
    elsewhere = _find_all(answer, rest)
    if elsewhere:
        answerable = in_place if rng.random() < cfg.in_place else ("elsewhere", rest, elsewhere[0])
        return answerable, _other_context(contexts, p, answer, rng)
    if _mentions(rest, answer):  # only in another letter case ("great" / "Great")
        return in_place, _other_context(contexts, p, answer, rng)
    return in_place, ("sentence removed", rest)


def _other_context(
    contexts: list[str], p: int, answer: str, rng: np.random.Generator
) -> tuple[str, str] | None:
    """Another context of the same article that lacks the answer (nearest first, random tie-break)."""
    others = [q for q in range(len(contexts)) if q != p and not _mentions(contexts[q], answer)]
    if not others:
        return None
    distance = np.array([abs(q - p) for q in others]) + rng.random(len(others)) * 0.5
    return ("other context", contexts[others[int(distance.argmin())]])


def finalise(drafts: list[_Draft], cfg: SynthConfig, rng: np.random.Generator) -> list[dict]:
    """Choose which drafts become answerable (exactly round(share * n) where both fates exist)."""
    order = rng.permutation(len(drafts))
    if cfg.max_questions is not None:
        order = order[: cfg.max_questions]
    chosen = [drafts[i] for i in sorted(order.tolist())]
    n_answerable = round(cfg.answerable * len(chosen))
    only_a = [d for d in chosen if d.unanswerable is None and d.hard is None]
    both = [d for d in chosen if d.unanswerable is not None or d.hard is not None]
    if len(only_a) > n_answerable:  # too many drafts without an unanswerable fate: drop some
        keep = set(rng.permutation(len(only_a))[:n_answerable].tolist())
        only_a = [d for i, d in enumerate(only_a) if i in keep]
    need = min(len(both), n_answerable - len(only_a))
    answerable_ids = {d.qid for d in only_a} | {
        both[i].qid for i in rng.permutation(len(both))[:need].tolist()
    }
    records = []
    for d in chosen:
        if d.unanswerable is None and d.hard is None and d.qid not in answerable_ids:
            continue
        question, plausible = d.question, []
        if d.qid in answerable_ids:
            how, context, start = d.answerable
            answers = [{"text": d.answer, "answer_start": start}]
        elif d.hard is not None and (d.unanswerable is None or rng.random() < cfg.hard_negatives):
            how, question, context, start = d.hard
            answers, plausible = [], [{"text": d.answer, "answer_start": start}]
        else:
            assert d.unanswerable is not None
            how, context = d.unanswerable
            answers = []
        qa = {"id": d.qid, "question": question, "answers": answers, "is_impossible": not answers}
        if plausible:
            qa["plausible_answers"] = plausible
        records.append(
            {
                "title": d.title,
                "context": context,
                "qa": qa,
                "how": how,
                "answer": d.answer,
                "sentence": d.sentence,
                "kind": d.kind,
                "style": d.style,
            }
        )
    return records


def to_squad(records: list[dict]) -> dict:
    """Group questions by article and context into the official layout."""
    articles: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        articles.setdefault(r["title"], {}).setdefault(r["context"], []).append(r["qa"])
    data = [
        {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paras.items()]}
        for title, paras in articles.items()
    ]
    return {"version": "v2.0-synthetic-cloze", "data": data}


def synthesize(paths: Sequence[str | Path], cfg: SynthConfig) -> tuple[dict, dict]:
    """SQuAD 2.0 dataset of cloze questions from the files, and statistics about it."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    articles = read_articles(paths)
    if not articles:
        raise ValueError("no text found in the input files")
    records = finalise(draft_questions(articles, cfg, rng), cfg, rng)
    if not records:
        raise ValueError("no question could be made from the input (no numbers, names or recurring spans)")
    n = len(records)
    answerable = sum(bool(r["qa"]["answers"]) for r in records)
    stats = {
        "articles": len(articles),
        "contexts": sum(len(cs) for _, cs in articles),
        "questions": n,
        "answerable": answerable,
        "answerable_share": answerable / n,
        "answer_types": dict(Counter(r["kind"] for r in records)),
        "answered": dict(Counter(r["how"] for r in records)),
        "styles": dict(Counter(r["style"] for r in records)),
    }
    return to_squad(records), stats


def build_parser() -> Parser:
    p = Parser(prog="python -m train.experiments.synth", description=__doc__.splitlines()[0])
    p.add_argument("--input", nargs="+", required=True, help="plain text and/or SQuAD JSON files")
    p.add_argument("--out", required=True, help="SQuAD 2.0 JSON to write")
    p.add_argument("--answerable", type=float, default=0.5, help="share of answerable questions")
    p.add_argument("--in-place", type=float, default=0.5, help="share of answerable ones answered in place")
    p.add_argument("--per-sentence", type=int, default=2, help="questions per sentence at most")
    p.add_argument("--max-questions", type=int, default=None)
    p.add_argument("--style", choices=STYLES, default="mix")
    p.add_argument("--types", default=",".join(ANSWER_TYPES), help="answer types, comma-separated")
    p.add_argument(
        "--hard-negatives",
        type=float,
        default=0.0,
        help="share of unanswerable questions made by editing an answerable one (entity or number swap, "
        "negation, antonym; train.experiments.hard_negatives), the original answer kept as the plausible answer",
    )
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = SynthConfig(
        answerable=args.answerable,
        in_place=args.in_place,
        per_sentence=args.per_sentence,
        max_questions=args.max_questions,
        style=args.style,
        types=tuple(t.strip() for t in args.types.split(",") if t.strip()),
        seed=args.seed,
        hard_negatives=args.hard_negatives,
    )
    dataset, stats = synthesize(args.input, cfg)
    write_squad(dataset, args.out)
    print(
        f"{stats['questions']:,} questions from {stats['contexts']:,} contexts of {stats['articles']} articles, "
        f"{stats['answerable_share']:.1%} answerable -> {args.out}"
    )
    for key in ("answer_types", "answered", "styles"):
        print(f"  {key.replace('_', ' ')}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(stats[key].items())))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, prog="train.experiments.synth"))

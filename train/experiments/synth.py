"""`python -m train.synth`: self-supervised SQuAD 2.0 questions from unlabelled text (torch-free).

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

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qa_core.squad import write_squad
from train.common.cli import Parser
from train.common.corpus import read_articles
from train.common.dataclass_flags import add_flags, flag, options_from
from train.experiments.cloze import (
    ANSWER_TYPES,
    entity_names,
    find_all,
    find_candidates,
    leaks,
    make_question,
    mentions,
    remove_span,
    sentence_spans,
)
from train.experiments.hard_negatives import hard_negative

STYLES = ("cloze", "wh", "mix")


def comma_separated(text: str) -> tuple[str, ...]:
    """``--types a,b`` -> ("a", "b")."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


@dataclass
class SynthConfig:
    answerable: float = flag(0.5, help="share of answerable questions")
    in_place: float = flag(0.5, help="share of answerable ones answered at their own position")
    per_sentence: int = flag(2, help="questions per sentence at most")
    max_questions: int | None = flag(None, help="stop after this many questions")
    style: str = flag(
        "mix", choices=STYLES, help="cloze: the sentence with a wh-phrase in the gap; wh: the wh-phrase first"
    )
    types: tuple[str, ...] = flag(ANSWER_TYPES, parse=comma_separated, help="answer types, comma-separated")
    seed: int = flag(0, help="seeds the choices of sentences, answers and styles")
    hard_negatives: float = flag(
        0.0,
        help="share of unanswerable questions made by editing an answerable one (entity or number swap, "
        "negation, antonym; train.experiments.hard_negatives), the original answer kept as the plausible answer",
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
    elsewhere = find_all(answer, rest)
    if elsewhere:
        answerable = in_place if rng.random() < cfg.in_place else ("elsewhere", rest, elsewhere[0])
        return answerable, _other_context(contexts, p, answer, rng)
    if mentions(rest, answer):  # only in another letter case ("great" / "Great")
        return in_place, _other_context(contexts, p, answer, rng)
    return in_place, ("sentence removed", rest)


def _other_context(
    contexts: list[str], p: int, answer: str, rng: np.random.Generator
) -> tuple[str, str] | None:
    """Another context of the same article that lacks the answer (nearest first, random tie-break)."""
    others = [q for q in range(len(contexts)) if q != p and not mentions(contexts[q], answer)]
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
    """The files, then one flag per field of :class:`SynthConfig`."""
    p = Parser(prog="python -m train.synth", description=__doc__.splitlines()[0])
    p.add_argument("--input", nargs="+", required=True, help="plain text and/or SQuAD JSON files")
    p.add_argument("--out", required=True, help="SQuAD 2.0 JSON to write")
    add_flags(p, SynthConfig)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    write_synthetic(args.input, args.out, options_from(SynthConfig, args))
    return 0


def write_synthetic(paths: Sequence[str | Path], out: str | Path, cfg: SynthConfig) -> dict:
    """:func:`synthesize` into the SQuAD 2.0 file ``out``, with a summary printed; returns the statistics."""
    dataset, stats = synthesize(paths, cfg)
    write_squad(dataset, out)
    print(
        f"{stats['questions']:,} questions from {stats['contexts']:,} contexts of {stats['articles']} articles, "
        f"{stats['answerable_share']:.1%} answerable -> {out}"
    )
    for key in ("answer_types", "answered", "styles"):
        print(f"  {key.replace('_', ' ')}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(stats[key].items())))
    return stats

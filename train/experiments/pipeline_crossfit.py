"""`python -m train.crossfit`: every labelled article scored by a pipeline that never saw it.

A study that holds out a few articles can say little (three articles: the smallest sign-test p is 0.25)
and spends the rest on fitting. Here the labelled articles are split into ``--folds`` folds of about
equal questions, and every stage that reads labels is cross-fitted by fold:

1. A tokenizer and a synthetic-question stage on the unlabelled ``--corpus`` only (shared by every fold:
   they read no labelled text, so no fold's articles are in them).
2. Per fold, a reader fine-tuned from that stage on the other folds' articles; its n-best spans for the
   fold's own questions are the out-of-fold outputs.
3. Per fold, nested: the span re-ranker and the answerability rule (question verifier included) fitted on
   the *other* folds' out-of-fold outputs, then applied unchanged to the fold. So every question's answer
   comes from a reader, a re-ranker and a rule none of which saw its article.
4. With ``--final``, the reader to ship: fine-tuned the same way on every labelled article, with the
   re-ranker and rule fitted on every fold's out-of-fold outputs stored in its metadata. Its quality is
   what the report says of the pipeline (no labelled article is left to score it on alone).

Reported per article and over all of them, each difference with the cluster bootstrap, Student's t over
articles and the exact sign test (`train.experiments.article_stats`): span F1 of the reader's best span and
of the re-ranked one on the answerable questions, the decided answers against answering none, and the ROC
AUC of P(answerable). Stages are reused when their outputs exist (``--resume``-safe by construction), so an
interrupted run continues where it stopped. The cost is the synthetic stage once plus ``--folds`` readers
(then a few minutes of predicting and fitting): reader-v3's stages took 45 min (3,000 synthetic steps) and
35 min (3,000 fine-tuning steps) on 2 cores of an AVX-512 EPYC, so 5 folds are about 3.5 hours there, and
about twice that on the AVX2-only machine (docs/study.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qa_core.squad import (
    Answerability,
    Prediction,
    SquadExample,
    load_dataset,
    merge_datasets,
    read_squad,
    squad_bytes,
    write_squad,
)
from train.answerability.estimators import roc_auc
from train.answerability.fit import fit_for
from train.answerability.rerank_fit import RERANK_MODELS, RERANKER_HELP
from train.common.atomic_dir import atomic_write_bytes, atomic_write_text
from train.common.cli import Parser
from train.common.dataclass_flags import add_flags
from train.evaluation.predict import redecide
from train.experiments.article_stats import column, compare_by_article, describe
from train.experiments.heldout import predict_files
from train.experiments.runs import given
from train.experiments.stage_inputs import RECORD, StageInputsChanged, content_fingerprint
from train.experiments.study import Stages, weights_inputs
from train.experiments.study_flags import short_batch_flag
from train.experiments.synth import SynthConfig, write_synthetic
from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
from train.squad.metrics import best_exact_f1
from train.tokenizer import train_spm

# The reader-v3 recipe (docs/study/reader-v3/run.sh): random init, synthetic questions with hard negatives,
# the exact-match feature, plausible answers as span targets.
HARD_NEGATIVES = 0.5
SYNTH_KEEP_OUT_OF_WINDOW = 0.2
LAYER_DECAY = 0.9
# A training stage writes a checkpoint this often, so that a stage a kill or a closed session stops
# continues from at most this many steps back (a stage of 3,000 steps is an hour or two on 2 cores).
CHECKPOINT_EVERY = 250


def assign_folds(dataset: Mapping[str, Any], folds: int) -> dict[str, int]:
    """Each article's fold: the largest articles first, each into the fold with the fewest questions so
    far (the lowest fold on ties), so folds hold about equal questions; deterministic."""
    sizes = {a["title"]: sum(len(p["qas"]) for p in a["paragraphs"]) for a in dataset["data"]}
    if not 2 <= folds <= len(sizes):
        raise ValueError(f"--folds must be from 2 to the number of articles ({len(sizes)}), got {folds}")
    load = [0] * folds
    out: dict[str, int] = {}
    for title in sorted(sizes, key=lambda t: (-sizes[t], t)):
        f = min(range(folds), key=lambda i: (load[i], i))
        out[title] = f
        load[f] += sizes[title]
    return out


def _subset(dataset: Mapping[str, Any], titles: set[str]) -> dict[str, Any]:
    return {"version": "v2.0", "data": [a for a in dataset["data"] if a["title"] in titles]}


@dataclass(frozen=True)
class FoldOutputs:
    """One fold's questions with the out-of-fold reader's predictions and the nested rule's decisions."""

    examples: list[SquadExample]
    reader: dict[str, Prediction]  # the fold's reader, decided by nothing fitted (its spans as decoded)
    decided: dict[str, Prediction]  # re-ranked and decided by the rule fitted on the other folds


def question_rows(outputs: Sequence[FoldOutputs], fold_of: Mapping[str, int]) -> list[dict[str, Any]]:
    """One row per question: its article and fold, the reader's and the re-ranked best span's F1 (answerable
    questions), the decided answer's F1 and answering none's, P(answerable) and whether it is."""
    rows = []
    for out in outputs:
        for ex in out.examples:
            golds = ex.answer_texts or [""]
            reader, decided = out.reader[ex.qas_id], out.decided[ex.qas_id]
            rows.append(
                {
                    "article": ex.title,
                    "fold": fold_of[ex.title],
                    "answerable": bool(ex.answers),
                    "reader_f1": best_exact_f1(golds, reader.best_span_text)[1],
                    "reranked_f1": best_exact_f1(golds, decided.best_span_text)[1],
                    "decided_f1": best_exact_f1(golds, decided.text)[1],
                    "none_f1": best_exact_f1(golds, "")[1],
                    "answered": not decided.is_impossible,
                    "answerable_prob": decided.answerable_prob,
                }
            )
    return rows


def report(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Span F1 (reader vs re-ranked), the decision vs answering none and the ROC AUC, over every article
    and per article, each difference with its three views over articles."""

    spans = [r for r in rows if r["answerable"]]
    articles = sorted({r["article"] for r in rows})
    per_article = {}
    for title in articles:
        mine = [r for r in rows if r["article"] == title]
        mine_spans = [r for r in mine if r["answerable"]]
        labels = column(mine, "answerable")
        per_article[title] = {
            "fold": mine[0]["fold"],
            "questions": len(mine),
            "answerable": len(mine_spans),
            "reader_span_f1": 100 * float(column(mine_spans, "reader_f1").mean()) if mine_spans else None,
            "reranked_span_f1": 100 * float(column(mine_spans, "reranked_f1").mean()) if mine_spans else None,
            "decided_f1": 100 * float(column(mine, "decided_f1").mean()),
            "none_f1": 100 * float(column(mine, "none_f1").mean()),
            "answered": sum(bool(r["answered"]) for r in mine),
            "roc_auc": roc_auc(column(mine, "answerable_prob"), labels)
            if 0 < labels.sum() < len(mine)
            else None,
        }
    mixed = {t for t, a in per_article.items() if 0 < a["answerable"] < a["questions"]}
    return {
        "articles": len(articles),
        "questions": len(rows),
        "answerable": len(spans),
        "mixed_articles": sorted(mixed),
        "span_f1": {
            "reader": 100 * float(column(spans, "reader_f1").mean()),
            "reranked": 100 * float(column(spans, "reranked_f1").mean()),
        },
        "reranked_vs_reader": compare_by_article(
            column(spans, "reranked_f1"), column(spans, "reader_f1"), [r["article"] for r in spans]
        ),
        "decision": _decision(rows),
        # the articles that hold both kinds, SQuAD 2.0's evaluation mix (its training articles may hold no
        # unanswerable question, where answering anything beats answering none)
        "decision_mixed": _decision([r for r in rows if r["article"] in mixed]) if mixed else None,
        "per_fold": {
            str(f): _decision([r for r in rows if r["fold"] == f], intervals=False)
            for f in sorted({r["fold"] for r in rows})
        },
        "per_article": per_article,
    }


def _decision(rows: Sequence[Mapping[str, Any]], intervals: bool = True) -> dict[str, Any]:
    """The decided answers against answering none over ``rows`` (and its three views over their articles)."""
    out: dict[str, Any] = {
        "articles": len({r["article"] for r in rows}),
        "questions": len(rows),
        "answered": sum(bool(r["answered"]) for r in rows),
        "f1": 100 * float(column(rows, "decided_f1").mean()),
        "none_f1": 100 * float(column(rows, "none_f1").mean()),
    }
    if intervals:
        out["vs_none"] = compare_by_article(
            column(rows, "decided_f1"), column(rows, "none_f1"), [r["article"] for r in rows]
        )
        out["roc_auc"] = roc_auc(column(rows, "answerable_prob"), column(rows, "answerable"))
    return out


def results_markdown(r: Mapping[str, Any], folds: int) -> str:
    """The report as a page: the three claims over all articles, then one row per article."""
    s, d = r["span_f1"], r["decision"]
    lines = [
        f"# Cross-fitted over {r['articles']} articles ({folds} folds)",
        "",
        f"{r['questions']} questions, {r['answerable']} answerable; every answer from a reader, "
        f"{'re-ranker' if r.get('reranker_model', 'linear') == 'linear' else 're-ranker (boosted trees)'} "
        "and rule fitted without its article.",
        "",
        f"- span F1, answerable questions, decision off: reader {s['reader']:.2f}, re-ranked "
        f"{s['reranked']:.2f}; re-ranked vs reader: {describe(r['reranked_vs_reader'])}",
        f"- decided: F1 {d['f1']:.2f} against {d['none_f1']:.2f} for answering none ({d['answered']} "
        f"answered); vs none: {describe(d['vs_none'])}",
        f"- ROC AUC of P(answerable): {d['roc_auc']:.3f}",
    ]
    m = r.get("decision_mixed")
    if m is not None:
        lines.append(
            f"- decided, on the {m['articles']} articles that hold unanswerable questions too: F1 {m['f1']:.2f} "
            f"against {m['none_f1']:.2f} for answering none ({m['answered']} answered); vs none: "
            f"{describe(m['vs_none'])}; ROC AUC {m['roc_auc']:.3f}"
        )
    per_fold = ", ".join(
        f"fold {f} {v['f1'] - v['none_f1']:+.2f} ({v['answered']} of {v['questions']} answered)"
        for f, v in r["per_fold"].items()
    )
    lines += [
        f"- decided minus none, each fold's articles taken together: {per_fold}",
        "",
        "| article | fold | questions | answerable | reader span F1 | re-ranked span F1 | decided F1 | none F1 "
        "| answered | ROC AUC |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for title, a in r["per_article"].items():
        cells = [
            title,
            str(a["fold"]),
            str(a["questions"]),
            str(a["answerable"]),
            *(
                "–" if a[k] is None else f"{a[k]:.2f}"
                for k in ("reader_span_f1", "reranked_span_f1", "decided_f1", "none_f1")
            ),
            str(a["answered"]),
            "–" if a["roc_auc"] is None else f"{a['roc_auc']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_articles(path: Path, r: Mapping[str, Any]) -> None:
    """Per article: the reader's and the re-ranked span F1, and the decision's gain over answering none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = list(r["per_article"])
    a = r["per_article"]
    x = np.arange(len(titles))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7, 0.6 * len(titles)), 7), sharex=True)
    for offset, key, label in ((-0.2, "reader_span_f1", "reader"), (0.2, "reranked_span_f1", "re-ranked")):
        top.bar(x + offset, [a[t][key] or 0.0 for t in titles], 0.4, label=label)
    top.set_ylabel("span F1 (answerable)")
    top.legend()
    bottom.bar(x, [a[t]["decided_f1"] - a[t]["none_f1"] for t in titles], 0.6, color="tab:green")
    bottom.axhline(0.0, color="black", linewidth=0.8)
    bottom.set_ylabel("decided F1 - none F1")
    bottom.set_xticks(x, titles, rotation=60, ha="right", fontsize=8)
    fig.suptitle("each article scored out of fold")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> Parser:
    p = Parser(prog="python -m train.crossfit", description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--labelled", nargs="+", required=True, help="SQuAD 2.0 files whose every article is scored"
    )
    p.add_argument(
        "--corpus",
        nargs="+",
        required=True,
        help="unlabelled text: the tokenizer's and the synthetic questions'",
    )
    p.add_argument("--folds", type=int, default=5, help="folds of articles (readers trained)")
    p.add_argument("--vocab", type=int, default=4000, help="the tokenizer's vocabulary")
    p.add_argument("--config", default="small", help="the readers' model preset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=CHECKPOINT_EVERY,
        help="each training stage writes a checkpoint every N steps; a stage a kill stopped resumes from its last",
    )
    add_flags(p, FinetuneConfig, ("steps", "lr"), {"steps": 3000, "lr": 5e-4}, prefix="synth")
    add_flags(p, SynthConfig, ("per_sentence",), {"per_sentence": 4}, prefix="synth")
    add_flags(
        p,
        FinetuneConfig,
        ("steps", "batch_size", "lr"),
        {"steps": 3000, "batch_size": 16, "lr": 5e-4},
        prefix="finetune",
        spell=short_batch_flag("finetune"),
    )
    add_flags(
        p,
        FinetuneConfig,
        ("max_seq_len", "doc_stride", "precision", "threads", "no_progress"),
        {"max_seq_len": 192, "doc_stride": 128},
    )
    p.add_argument(
        "--rule-articles",
        choices=("mixed", "all"),
        default="mixed",
        help="the articles the answerability rule is fitted on: those holding unanswerable questions too "
        "(mixed), or all",
    )
    p.add_argument(
        "--reranker",
        choices=RERANK_MODELS,
        default="linear",
        help=RERANKER_HELP,
    )
    p.add_argument(
        "--final",
        action="store_true",
        help="then train the reader to ship on every labelled article (final/reader, the folds' budget) "
        "and store in it the re-ranker and rule fitted on every fold's out-of-fold outputs",
    )
    p.add_argument(
        "--final-hold-out",
        nargs="+",
        default=[],
        metavar="TITLE",
        help="with --final: these labelled articles are left out of the reader to ship and of its re-ranker "
        "and rule, so they can score the shipped pipeline (its own folder, final-holdout-<hash>/, with "
        "their questions in heldout.json)",
    )
    p.add_argument("--out", default="runs/crossfit", help="where every stage and the report go")
    return p


def _finetune(
    args,
    stages: Stages,
    name: str,
    settings: Mapping[str, Any],
    files: Mapping[Path, dict[str, Any]] | None = None,
) -> Path:
    """A fine-tuning stage. ``files``: SQuAD documents it reads (its train and dev files) or keeps
    beside it (held-out questions), written only once its inputs are accepted; those among its settings
    are recorded by their content."""
    out = Path(settings["out"])
    data = {path: squad_bytes(document) for path, document in (files or {}).items()}
    by_content = {k: content_fingerprint(data[Path(v)]) for k, v in settings.items() if Path(str(v)) in data}

    def write_files() -> None:
        for path, content in data.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, content)

    common = {"max_seq_len": args.max_seq_len, "doc_stride": args.doc_stride, "seed": args.seed}
    common |= {"precision": args.precision}  # every stage's autocast (bf16: ~1.8x faster on AVX-512 BF16)
    common |= {"threads": args.threads} if args.threads else {}
    common |= {"no_progress": True} if args.no_progress else {}
    # the reader-v3 recipe's settings; no rule here (it is fitted later, nested); a stage an interruption
    # left unfinished continues from its last checkpoint
    common |= {"layer_decay": LAYER_DECAY, "plausible_spans": True, "answerability": "cls", "resume": True}
    config = given(FinetuneConfig, **{**common, **settings})
    # a folder holding another call's reader (other articles, steps, start) is refused, not reused
    inputs = weights_inputs({**common, **settings}) | by_content
    stages.run(name, out / "metadata.json", FinetuneRecipe(config).run, inputs, prepare=write_files)
    return out


def _out_of_fold(
    stages: Stages, fold: int, reader: Path, examples: list[SquadExample], path: Path, args
) -> dict[str, Prediction]:
    """The fold reader's n-best spans for its held-out questions, decoded once and kept as a stage: the
    re-ranker and the rule are then fitted again (new features, new rules) without running a reader."""

    kept = _kept_predictions(path, reader, examples)

    def decode() -> None:
        found = predict_files([reader], examples, progress=not args.no_progress).predictions
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({q: p.to_dict() for q, p in found.items()}, ensure_ascii=False))
        tmp.replace(path)  # whole or absent: an interrupted decode is done again, never half read

    stages.run(f"out-of-fold spans {fold}", path, decode)
    return kept if kept is not None else _read_predictions(path)


def _kept_predictions(
    path: Path, reader: Path, examples: Sequence[SquadExample]
) -> dict[str, Prediction] | None:
    """The spans a previous run kept for this fold, or None (and the file removed, so the stage decodes
    again) when there are none, they cannot be read (a disk's damage, a hand edit), are older than their
    reader (retrained since) or are not for exactly these questions (another --labelled). An mtime that
    a copy reset can only cost a decode, never the reuse of wrong spans."""
    if not path.exists():
        return None
    why = ""
    try:
        kept = _read_predictions(path)
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # json's errors are ValueErrors
        why = f"cannot be read ({type(e).__name__}: {str(e)[:120]})"
    else:
        if path.stat().st_mtime < (reader / "metadata.json").stat().st_mtime:
            why = "is older than its reader"
        elif set(kept) != {ex.qas_id for ex in examples}:
            why = "holds other questions than this fold's"
        elif any(p.n_best and not any(e.share for e in p.n_best) for p in kept.values()):
            why = "lacks the spans' shares (kept before they were recorded; the re-ranker reads them)"
    if not why:
        return kept
    print(f"{path} {why}: decoding its spans again", flush=True)
    path.unlink()
    return None


def _read_predictions(path: Path) -> dict[str, Prediction]:
    """Kept out-of-fold spans (fold-N/predictions.json), by question id."""
    return {q: Prediction.from_dict(d) for q, d in json.loads(path.read_text()).items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every must be at least 1 step, not {args.checkpoint_every}")
    if args.precision == "fp16" and not torch.cuda.is_available():  # refused here, not hours in
        parser.error("--precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if args.final_hold_out and not args.final:
        parser.error("--final-hold-out leaves articles out of the reader --final trains: give --final too")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    labelled = merge_datasets(args.labelled)
    fold_of = assign_folds(labelled, args.folds)
    unknown = sorted(set(args.final_hold_out) - set(fold_of))
    if unknown:
        parser.error(f"--final-hold-out: no labelled article is called {', '.join(map(repr, unknown))}")
    if set(args.final_hold_out) == set(fold_of):
        parser.error("--final-hold-out: every labelled article held out, none left to train the reader on")
    _write_folds(out, fold_of)
    stages = Stages()
    corpus = [str(c) for c in args.corpus]
    tok = out / "tokenizer"
    stages.run(
        "tokenizer (corpus only)",
        tok / "spiece.model",
        partial(train_spm, corpus, str(tok), args.vocab),
        {"corpus": corpus, "vocab": args.vocab},
    )
    synthetic = out / "synthetic.json"
    cfg = SynthConfig(per_sentence=args.synth_per_sentence, hard_negatives=HARD_NEGATIVES, seed=args.seed)
    stages.run(
        "synthetic questions (corpus only)",
        synthetic,
        partial(write_synthetic, corpus, str(synthetic), cfg),
        {"corpus": corpus, "synth": dataclasses.asdict(cfg)},
        record=out / "synthetic.inputs.json",
    )
    generated = load_dataset(synthetic)
    synth_dev = write_squad(_subset(generated, {generated["data"][0]["title"]}), out / "synthetic-dev.json")
    stage = _finetune(
        args,
        stages,
        "synthetic stage",
        {
            "config": args.config,
            "spm": str(tok),
            "question_match": True,
            "keep_out_of_window": SYNTH_KEEP_OUT_OF_WINDOW,
            "train_file": str(synthetic),
            "dev_file": str(synth_dev),
            "out": str(out / "synth-stage"),
            "steps": args.synth_steps,
            "lr": args.synth_lr,
            "batch_size": args.finetune_batch,
            "eval_every": args.synth_steps,
            "save_every": min(args.synth_steps, args.checkpoint_every),
        },
    )
    examples: dict[int, list[SquadExample]] = {}
    titles = {f: {t for t, g in fold_of.items() if g == f} for f in range(args.folds)}
    readers: dict[int, dict[str, Prediction]] = {}
    for f in range(args.folds):
        fold_dir = out / f"fold-{f}"
        train = _subset(labelled, set(fold_of) - titles[f])
        held = {fold_dir / "heldout.json": _subset(labelled, titles[f])}
        name = f"reader {f} ({len(titles[f])} articles held out)"
        reader = _fine_tuned_reader(args, stages, name, stage, train, fold_dir, held)
        examples[f] = read_squad(fold_dir / "heldout.json")
        readers[f] = _out_of_fold(stages, f, reader, examples[f], fold_dir / "predictions.json", args)
    fit_and_report(examples, readers, fold_of, out, args.rule_articles, args.reranker)
    print((out / "RESULTS.md").read_text())
    if args.final:
        _final_stage(args, stages, stage, labelled, fold_of, examples, readers, out)
    return 0


def _final_stage(
    args,
    stages: Stages,
    stage: Path,
    labelled: dict[str, Any],
    fold_of: Mapping[str, int],
    examples: Mapping[int, list[SquadExample]],
    readers: Mapping[int, Mapping[str, Prediction]],
    out: Path,
) -> Path:
    """Stage 4: the reader to ship, trained on every labelled article but ``--final-hold-out``'s, with the
    re-ranker and rule fitted on the other articles' out-of-fold outputs stored in it. Held-out articles
    get a folder of their own (named by their titles) holding their questions, to score the pipeline."""
    kept_out = set(args.final_hold_out)
    folder = out / "final" if not kept_out else out / f"final-holdout-{_titles_hash(kept_out)}"
    held = {folder / "heldout.json": _subset(labelled, kept_out)} if kept_out else {}
    trained_on = "every labelled article" if not kept_out else f"all but {len(kept_out)} held-out articles"
    name = f"the shipped reader ({len(fold_of) - len(kept_out)} articles: {trained_on})"
    shipped = _fine_tuned_reader(
        args, stages, name, stage, _subset(labelled, set(fold_of) - kept_out), folder, held
    )
    try:
        rule = shipped_rule(examples, readers, args.rule_articles, args.reranker, held_out=kept_out)
    except ValueError as exc:  # too few questions of either kind: the reader's own cls rule stays
        print(f"[shipped reader] no rule fitted ({exc}): its own sigmoid(cls_logit) decides", flush=True)
    else:
        store_rule(shipped, rule)
        print(f"[shipped reader] answerability: {rule.report.get('decision', rule.rule)}", flush=True)
    print(f"{shipped}: trained on {trained_on}, its rule fitted on their out-of-fold outputs", flush=True)
    if kept_out:
        print(f"  the held-out articles' questions, to score it on: {folder / 'heldout.json'}")
    print(f"  export it with: python -m export.onnx --checkpoint {shipped} --precision int8")
    return shipped


def _titles_hash(titles: set[str]) -> str:
    """A short name for a set of articles: another hold-out never reuses this one's reader."""
    return hashlib.sha256("\n".join(sorted(titles)).encode()).hexdigest()[:8]


def _fine_tuned_reader(
    args,
    stages: Stages,
    name: str,
    stage: Path,
    train: dict[str, Any],
    folder: Path,
    beside: Mapping[Path, dict[str, Any]] | None = None,
) -> Path:
    """A reader fine-tuned from the synthetic stage on ``train``'s articles into ``folder/reader`` (the
    first article doubles as the dev file fine-tuning asks for: nothing is chosen on it); ``beside``:
    documents kept in its folder (its held-out questions), written with its own once it is accepted."""
    files = {folder / "train.json": train, folder / "dev.json": _subset(train, {train["data"][0]["title"]})}
    return _finetune(
        args,
        stages,
        name,
        {
            "init": str(stage),
            "train_file": str(folder / "train.json"),
            "dev_file": str(folder / "dev.json"),
            "out": str(folder / "reader"),
            "steps": args.finetune_steps,
            "lr": args.finetune_lr,
            "batch_size": args.finetune_batch,
            "eval_every": args.finetune_steps,
            "save_every": min(args.finetune_steps, args.checkpoint_every),
        },
        {**files, **(beside or {})},
    )


def _write_folds(out: Path, fold_of: Mapping[str, int]) -> None:
    """folds.json, unless this --out holds fold readers cut from other folds (each would be refused at
    its stage; refused here first, before the file that describes them changes)."""
    path = out / "folds.json"
    text = json.dumps(fold_of, indent=2, ensure_ascii=False) + "\n"
    if path.exists() and path.read_text() != text and any(out.glob(f"fold-*/reader/{RECORD}")):
        raise StageInputsChanged(
            f"[folds] {out} holds fold readers cut into other folds (folds.json differs: other --labelled "
            "or --folds): give another --out, or remove it to make them again"
        )
    path.write_text(text)


def shipped_rule(
    examples: Mapping[int, Sequence[SquadExample]],
    readers: Mapping[int, Mapping[str, Prediction]],
    rule_articles: str = "mixed",
    reranker_model: str = "linear",
    held_out: set[str] | frozenset[str] = frozenset(),
) -> Answerability:
    """The re-ranker and rule for a reader trained on every article (but ``held_out``), fitted on every
    fold's out-of-fold outputs (but those of ``held_out``'s articles, which are left to score the
    pipeline) as each fold's rule was on the other folds': what readers that never saw an article made of
    it is what the shipped reader will make of a new one (stacking's usual assumption: a reader trained
    on all folds is a little surer than one trained on three quarters of them)."""
    every = [ex for f in sorted(examples) for ex in examples[f] if ex.title not in held_out]
    predictions = {q: p for f in readers for q, p in readers[f].items()}
    titles, mixed = {ex.title for ex in every}, mixed_articles(every)
    rule = _fit_rule(every, predictions, mixed, rule_articles, reranker_model)
    rule.report.setdefault("fitted_on", {})["out_of_fold"] = {
        "folds": len(readers),
        "articles": len(titles),
        "questions": len(every),
        "rule_articles": sorted(titles if rule_articles == "all" else mixed),
    }
    return rule


def _fit_rule(
    examples: Sequence[SquadExample],
    predictions: Mapping[str, Prediction],
    mixed: set[str],
    rule_articles: str,
    reranker_model: str,
) -> Answerability:
    """The re-ranker (on every article's spans) and the rule (on the ``mixed`` articles, or on all with
    ``rule_articles`` "all"), fitted on out-of-fold outputs: a fold's from the other folds', the shipped
    reader's from all. ValueError when they cannot support a fit."""
    on = examples if rule_articles == "all" else [ex for ex in examples if ex.title in mixed]
    return fit_for(
        "auto", examples, examples, predictions, rerank=True, rule_examples=on, reranker_model=reranker_model
    )


def store_rule(reader: Path, rule: Answerability) -> None:
    """The rule into the reader's metadata.json, where evaluation, the exporters and the server read it
    (written whole or not at all, as train.calibrate does)."""
    meta = json.loads((reader / "metadata.json").read_text())
    meta["answerability"] = rule.to_dict()
    atomic_write_text(reader / "metadata.json", json.dumps(meta, indent=2, sort_keys=True))


def fit_and_report(
    examples: Mapping[int, list[SquadExample]],
    readers: Mapping[int, Mapping[str, Prediction]],
    fold_of: Mapping[str, int],
    out: Path,
    rule_articles: str = "mixed",
    reranker_model: str = "linear",
) -> dict[str, Any]:
    """Stage 3 and the report: per fold, the re-ranker and the rule fitted on the other folds'
    out-of-fold outputs and applied to the fold; RESULTS.md, crossfit.json and the plot written to ``out``.
    ``rule_articles``: "mixed" fits the rule on the articles that hold unanswerable questions too (the
    re-ranker and the question verifier still read every article); "all" on every article.
    ``reranker_model``: the re-ranker's form, "linear" or "trees" (boosted trees)."""
    folds = sorted(examples)
    mixed = mixed_articles([ex for f in folds for ex in examples[f]])
    outputs = []
    rules: dict[int, Any] = {}
    for f in folds:
        others = [ex for g in folds if g != f for ex in examples[g]]
        other_preds = {q: p for g in folds if g != f for q, p in readers[g].items()}
        try:
            rule = _fit_rule(others, other_preds, mixed, rule_articles, reranker_model)
        except ValueError as exc:  # too few questions of either kind to fit on: the reader's cls decides
            print(f"[fold {f}] no rule fitted ({exc}): sigmoid(cls_logit) at 0.5 decides", flush=True)
            rule = Answerability.cls_only(0.5)
        rules[f] = rule.report.get("decision", "cls only (not fitted)")
        outputs.append(FoldOutputs(examples[f], dict(readers[f]), redecide(examples[f], readers[f], rule)))
    rows = question_rows(outputs, fold_of)
    r = report(rows) | {
        "folds": dict(fold_of),
        "rules": rules,
        "rule_articles": rule_articles,
        "reranker_model": reranker_model,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "crossfit.json").write_text(json.dumps(r, indent=2, ensure_ascii=False) + "\n")
    (out / "RESULTS.md").write_text(results_markdown(r, len(folds)))
    # every question's row, for comparisons between refits (question by question, articles as the unit)
    (out / "questions.json").write_text(json.dumps(rows, ensure_ascii=False) + "\n")
    plot_articles(out / "crossfit.png", r)
    return r


def mixed_articles(examples: Sequence[SquadExample]) -> set[str]:
    """The articles that hold both answerable and unanswerable questions. SQuAD 2.0's training articles
    may hold none of the second kind (the first ten of train-v2.0 hold none): a rule fitted with them
    learns a share of answerable questions that the evaluation articles (about half) do not have."""
    kinds: dict[str, set[bool]] = {}
    for ex in examples:
        kinds.setdefault(ex.title, set()).add(bool(ex.answers))
    return {t for t, k in kinds.items() if len(k) == 2}


def load_outputs(
    run: Path,
) -> tuple[dict[int, list[SquadExample]], dict[int, dict[str, Prediction]], dict[str, int]]:
    """A finished run's held-out questions, out-of-fold spans and folds (its folds.json), read back (no
    reader is run)."""
    fold_of = json.loads((run / "folds.json").read_text())
    folds = range(max(fold_of.values()) + 1)
    examples = {f: read_squad(run / f"fold-{f}" / "heldout.json") for f in folds}
    readers = {f: _read_predictions(run / f"fold-{f}" / "predictions.json") for f in folds}
    return examples, readers, fold_of

"""`make demo`: the whole product on the shipped sample, end to end, in a few minutes on 2 CPU cores.

First the model shipped in `models/` (an int8 export trained by the study's recipe, its provenance
beside it) is served and asked questions from articles it never trained on, within the first minute.
Then the path a user runs, through the libraries the commands wrap (each stage is what one command
does): tokenizer -> short pretraining -> self-supervised cloze questions from the sample text -> a stage on
them -> fine-tuning on the sample's SQuAD questions -> evaluation -> ONNX export -> server on
127.0.0.1 -> the Python SDK asks questions about an article it never trained on (one unanswerable)
-> prints answers -> stops the server. Both QA stages use the exact-match input feature
(`--question-match`), which is what lets a model this small and this briefly trained point at the
right region at all; docs/results.md shows what the longer recipe reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from train.common.sample_data import SAMPLE_CALIBRATION, SAMPLE_DIR

if TYPE_CHECKING:
    from clients import ModelInfo

REPO = Path(__file__).resolve().parent
SAMPLE = SAMPLE_DIR
SHIPPED = REPO / "models" / "squad2-small-int8"
SYNTH_STEPS = 200
FINETUNE_STEPS = 150
QA_WINDOW = {"max_seq_len": 128, "doc_stride": 64, "batch_size": 16}
# What the closing line points at, where each stage writes it.
MADE = ("pretrain/loss.png", "finetune/loss.png", "finetune/dev_f1.png", "eval/metrics.json", "onnx/")


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stage(name: str, work: Callable[[], object]) -> None:
    """Run one stage through the libraries, timed; what a command would report as a user error (bad
    input, a full disk, an export that does not verify) ends the demo in one line."""
    from export.onnx.options import VerificationFailed
    from train.common.cli import USER_ERRORS

    banner(name)
    t = time.time()
    try:
        work()
    except (*USER_ERRORS, OSError, VerificationFailed) as exc:
        raise SystemExit(f"demo: stage '{name}' failed: {exc}") from None
    print(f"[{name}: {time.time() - t:.0f} s]", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--config", default="small")
    parser.add_argument("--pretrain-steps", type=int, default=50)
    parser.add_argument(
        "--qa-init",
        choices=("random", "pretrained"),
        default="random",
        help="what the QA stages start from: minutes of CPU pretraining do not help them (docs/study)",
    )
    parser.add_argument("--synth-steps", type=int, default=SYNTH_STEPS)
    parser.add_argument("--finetune-steps", type=int, default=FINETUNE_STEPS)
    parser.add_argument("--shipped", type=Path, default=SHIPPED, help="the shipped export served first")
    parser.add_argument("--skip-shipped", action="store_true", help="go straight to training")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.skip_shipped:
        banner(
            f"0/8 the shipped model ({args.shipped.relative_to(REPO) if args.shipped.is_relative_to(REPO) else args.shipped})"
        )
        t = time.time()
        try:
            print(ask_shipped(args.shipped)[0])
        except (RuntimeError, TimeoutError) as exc:  # as the trained model's server below: one line
            raise SystemExit(f"demo: the shipped model's server did not become ready: {exc}") from None
        print(f"[shipped model: {time.time() - t:.0f} s]", flush=True)

    from export.onnx.exporter import export_onnx
    from export.onnx.options import OnnxExportOptions
    from qa_core.tokenizer import XLNetTokenizer
    from train.evaluation.options import EvaluationOptions
    from train.evaluation.predict import evaluate_checkpoint
    from train.experiments.synth import SynthConfig, write_synthetic
    from train.recipes.finetune import FinetuneConfig, FinetuneRecipe
    from train.recipes.pretrain import PretrainConfig, PretrainRecipe
    from train.tokenizer import summary_lines, train_spm

    corpus = [str(SAMPLE / "corpus.json"), str(SAMPLE / "train.json")]
    tok_dir = out / "tokenizer"

    def tokenizer() -> None:
        t = time.perf_counter()
        model = train_spm(corpus, tok_dir, 2000)
        tok = XLNetTokenizer.from_dir(model.parent)
        for line in summary_lines(tok, model, corpus, 2000, True, time.perf_counter() - t):
            print(line)

    stage("1/8 train a sentencepiece tokenizer", tokenizer)
    pretraining = PretrainConfig(
        corpus=corpus,
        spm=str(tok_dir),
        config=args.config,
        steps=args.pretrain_steps,
        batch_size=8,
        seq_len=128,
        reuse_len=64,
        mem_len=64,
        lr=1e-3,
        warmup=15,
        log_every=25,
        out=str(out / "pretrain"),
        overwrite=True,  # the demo starts over each time
    )
    stage("2/8 pretrain (permutation LM, two streams, memory)", PretrainRecipe(pretraining).run)
    synthetic = out / "synthetic.json"
    stage(
        "3/8 write cloze questions from the sample text (train.synth)",
        lambda: write_synthetic(corpus, synthetic, SynthConfig()),
    )

    # The fine-tuning runs' dev file holds articles of their own: the answerability model is fitted
    # there, so nothing is chosen on dev.json, the article the demo scores.
    def qa_stage(name: str, start: dict, train_file: Path, steps: int, run_dir: Path, **extra) -> None:
        config = FinetuneConfig.of(
            train_file=str(train_file),
            dev_file=str(SAMPLE_CALIBRATION),
            **start,
            head="shallow",
            question_match=True,
            steps=steps,
            **QA_WINDOW,
            lr=5e-4,
            layer_decay=0.9,
            eval_every=steps,
            log_every=25,
            out=str(run_dir),
            overwrite=True,
            **extra,
        )
        stage(name, FinetuneRecipe(config).run)

    if args.qa_init == "pretrained":
        start: dict = {"init": str(out / "pretrain")}
    else:
        print(
            "(the QA stages start from random init: at this budget pretraining does not help them, docs/study)"
        )
        start = {"config": args.config, "spm": str(tok_dir)}
    qa_stage(
        "4/8 a stage on the cloze questions",
        start,
        synthetic,
        args.synth_steps,
        out / "synth",
        answerability="cls",  # a stage only: monitored, not calibrated
        max_dev_examples=200,
    )
    qa_stage(
        "5/8 fine-tune on SQuAD 2.0 (shallow head)",
        {"init": str(out / "synth")},
        SAMPLE / "train.json",
        args.finetune_steps,
        out / "finetune",
    )
    evaluation = EvaluationOptions(out / "finetune", SAMPLE / "dev.json", out / "eval")
    stage(
        "6/8 evaluate (official SQuAD 2.0 metrics)",
        lambda: print(json.dumps(evaluate_checkpoint(evaluation).metrics, indent=2)),
    )
    export = OnnxExportOptions(out / "finetune", out / "onnx")
    stage(
        "7/8 export to ONNX and verify against PyTorch", lambda: export_onnx(export, report=print, warn=say)
    )

    banner("8/8 serve on 127.0.0.1 and ask through the Python SDK")
    from harness.server_process import ServerProcess

    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    # info: the start-up lines show; the per-request access log would interleave with the answers
    server = ServerProcess(out / "onnx", "--access-log", "false", env=threads, log_level="info").launch()
    try:
        from clients import XLNetQAClient

        try:
            server.wait(timeout=120)
        except (RuntimeError, TimeoutError) as exc:
            raise SystemExit(f"demo: the server did not become ready: {exc}") from None
        with XLNetQAClient(server.url, timeout=30.0, retries=5) as client:
            print(describe(client.model_info(), server.url))
            article = json.loads((SAMPLE / "dev.json").read_text())["data"][0]
            paragraph = article["paragraphs"][0]
            answerable = [qa for qa in paragraph["qas"] if qa["answers"]][:6]
            for qa in answerable:
                res = client.answer(qa["question"], paragraph["context"])
                print(f"Q: {qa['question']}\n   model: {said(res)}   gold: {qa['answers'][0]['text']!r}")
            res = client.answer("What is the capital of Mars?", paragraph["context"])
            print(f"Q: What is the capital of Mars?  (not in the text)\n   model: {said(res)}")
    finally:
        server.stop()
    print(f"\n{verdict(out / 'eval', out / 'finetune')}")
    made = ", ".join(name for name in MADE if (out / name).exists())
    print(f"Demo finished. Everything it made is in {out}/, among it {made}.")
    return 0


def ask_shipped(model_dir: Path) -> tuple[str, dict[str, str]]:
    """Serve the shipped export and ask its held-out questions: the lines to print (ending with the
    score) and each question's answer ("" for no answer) by id.

    The questions come from the articles its provenance lists as scored, which nothing was trained,
    calibrated or chosen on; "right" is the official exact match (no answer counts when gold has none).
    Beside it, how often the best span (what it would say if made to answer) hits an answerable question's
    gold answer: with a rule that answers nothing, that is where the model's reading shows.
    """
    from clients import XLNetQAClient
    from harness.server_process import ServerProcess
    from train.squad.metrics import compute_exact, compute_f1

    provenance = json.loads((model_dir / "provenance.json").read_text())
    questions = json.loads((model_dir / "questions.json").read_text())["data"]
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    lines: list[str] = []
    answers: dict[str, str] = {}
    right = f1_sum = asked = span_right = answerable = right_silent = said_something = 0
    server = ServerProcess(model_dir, "--access-log", "false", env=threads)
    with server, XLNetQAClient(server.url, timeout=30.0, retries=5) as client:
        lines.append(describe(client.model_info(), server.url))
        for article in questions:
            lines.append(f"-- {article['title']} (held out: never trained on)")
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    res = client.answer(qa["question"], paragraph["context"])
                    golds = [a["text"] for a in qa["answers"]] or [""]
                    said_text = answers[qa["id"]] = "" if res.is_impossible else res.answer
                    exact = max(compute_exact(g, said_text) for g in golds)
                    right += exact
                    right_silent += exact and not qa["answers"]
                    said_something += bool(said_text)
                    f1_sum += max(compute_f1(g, said_text) for g in golds)
                    asked += 1
                    if qa["answers"] and res.best_span is not None:
                        span_right += max(compute_exact(g, res.best_span.text) for g in golds)
                    answerable += bool(qa["answers"])
                    gold = repr(golds[0]) if golds[0] else "no answer"
                    mark = "right" if exact else "wrong"
                    lines.append(f"Q: {qa['question']}\n   model: {said(res)}   gold: {gold}   [{mark}]")
    scores = provenance["held_out"]
    lines.append(
        f"{right} of {asked} right (exact match), F1 {100 * f1_sum / max(asked, 1):.1f} on these questions: "
        f"{right_silent} of the {asked - answerable} unanswerable questions left unanswered; "
        f"{said_something} answered, {right - right_silent} of them right"
        + ("" if said_something else " (its rule answers nothing)")
        + f"; the best span is the gold answer on {span_right} of the {answerable} answerable ones. "
        f"On all {scores['questions']:,} questions of its {len(scores['articles'])} held-out articles: "
        f"F1 {scores['f1']:.2f} against {scores['none_f1']:.2f} for answering none, span F1 "
        f"{scores['span_f1']:.2f} ({model_dir / 'provenance.json'} says how it was made)."
    )
    return "\n".join(lines), answers


def describe(info: ModelInfo, url: str) -> str:
    """What is served, in whole lines (GET /v1/model has everything)."""
    providers = ", ".join(info.runtime.get("providers") or [info.backend])
    a = info.answerability
    if a and a.get("kind") == "fitted" and a.get("beats_no_answer") is False:  # the stored rule: none
        rule = a.get("decision") or "answer nothing: no rule credibly beat answering none"
        rule += "; each answer still carries its best span and P(answerable)"
    elif a and a.get("kind") == "fitted":
        rule = (
            f"a fitted {a.get('rule')} rule on {', '.join(a.get('features') or [])} (cross-validated F1 "
            f"{a.get('cv_f1', float('nan')):.1f} against {a.get('cv_no_answer_f1', float('nan')):.1f} for answering none)"
        )
    else:
        rule = f"sigmoid(cls) against the threshold {info.no_answer_threshold:.3f}"
    if a and a.get("reranker"):
        rule += (
            f"; its top {a['reranker']['top_k']} spans are re-ranked (whole words) before the best is chosen"
        )
    return (
        f"Serving {info.name} ({info.backend} on {providers}): head {info.head}, {info.precision}, windows of "
        f"{info.max_seq_len} tokens (stride {info.doc_stride}).\nAnswerability: {rule}.\n"
        f"The whole description: GET {url}/v1/model"
    )


def said(res) -> str:
    """What the model said: the answer or "no answer", how sure it is, and the span it would give."""
    best = f" — best span: {res.best_span.text!r}" if res.best_span is not None else ""
    p = f"P(answerable) {res.answerable_prob:.2f}"
    why = f"\n      why: {res.reason}" if res.reason else ""
    if res.is_impossible:
        return f"no answer ({p}){best}   [{res.timing_ms.total:.0f} ms]{why}"
    return f"{res.answer!r} ({p})   [{res.timing_ms.total:.0f} ms]{why}"


def verdict(eval_dir: Path, model_dir: Path) -> str:
    """What the demo's model reached on the dev article (nothing was fitted or chosen on it), against
    answering none, with a paired bootstrap interval, and what the fitted decision rule expected."""
    from qa_core.squad import read_squad
    from train.experiments.study import span_quality
    from train.squad import paired_bootstrap, per_question_f1

    examples = read_squad(SAMPLE / "dev.json")
    predictions = json.loads((eval_dir / "predictions.json").read_text())
    spans = span_quality(examples, json.loads((eval_dir / "nbest.json").read_text()))
    model = per_question_f1(examples, predictions)
    none = per_question_f1(examples, dict.fromkeys(predictions, ""))
    qids = [ex.qas_id for ex in examples]
    diff, low, high = paired_bootstrap([model[q] for q in qids], [none[q] for q in qids])
    f1, none_f1 = 100 * sum(model.values()) / len(qids), 100 * sum(none.values()) / len(qids)
    answerability = json.loads((model_dir / "metadata.json").read_text()).get("answerability") or {}
    rule = (answerability.get("report") or {}).get("decision", "sigmoid(cls) against a threshold")
    return (
        f"On the {len(examples)} dev questions (never trained on, nothing chosen on them): F1 {f1:.1f} against "
        f"{none_f1:.1f} for answering none (difference {100 * diff:+.1f}, 95% interval {100 * low:+.1f} to "
        f"{100 * high:+.1f}); span F1 {spans['span_f1']:.1f} (best span of each answerable one). Answerability, "
        f"fitted on {SAMPLE_CALIBRATION.name}: {rule}. Four minutes of training do not answer reliably; "
        f"see docs/results.md for the longer recipe."
    )


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.one_window``: a SQuAD file whose every question fits one window of a model.

A latency figure "at 1x384" means one window per question: a context longer than the window splits into
several (a batch of 2 or 3 windows, not the shape claimed). This keeps each question with the leading
sentences of its context that fit beside it in ``--max-seq-len`` tokens of the model's own tokenizer
(question, context and the three special tokens), and drops questions whose first sentence alone does
not fit. Gold answers cut away are dropped with it (the file times serving; it is not scored).

    python -m bench.one_window --tokenizer CKPT --data dev.json --max-seq-len 384 --out one-window.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from qa_core.text import sentence_bounds
from qa_core.tokenizer import XLNetTokenizer

SPECIAL_TOKENS = 3  # <sep> after the question, <sep> and <cls> after the context


def fitting_context(tokenizer: XLNetTokenizer, question: str, context: str, max_seq_len: int) -> str:
    """The longest run of leading sentences of ``context`` that fits one window beside ``question``
    ('' when not even the first does)."""
    room = max_seq_len - SPECIAL_TOKENS - len(tokenizer.encode(question))
    kept = ""
    for _, end in sentence_bounds(context):  # the sentences as the answerability features split them
        candidate = context[:end]
        if len(tokenizer.encode(candidate)) > room:
            break
        kept = candidate
    return kept


def one_window_file(tokenizer: XLNetTokenizer, data: dict, max_seq_len: int) -> dict:
    """``data`` (SQuAD 2.0 JSON) with each question in a paragraph of its own, cut to fit one window."""
    articles = []
    for article in data["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                context = fitting_context(tokenizer, qa["question"], paragraph["context"], max_seq_len)
                if not context:
                    continue
                answers = [
                    a for a in qa.get("answers", []) if a["answer_start"] + len(a["text"]) <= len(context)
                ]
                kept = {**qa, "answers": answers, "is_impossible": not answers}
                paragraphs.append({"context": context, "qas": [kept]})
        if paragraphs:
            articles.append({"title": article.get("title", ""), "paragraphs": paragraphs})
    return {"version": data.get("version", "v2.0"), "data": articles}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.one_window", description=__doc__.splitlines()[0])
    p.add_argument(
        "--tokenizer", type=Path, required=True, help="a directory holding the model's spiece.model"
    )
    p.add_argument("--data", type=Path, required=True, help="SQuAD 2.0 JSON")
    p.add_argument("--max-seq-len", type=int, default=384)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.max_seq_len < 16:
        p.error("--max-seq-len must be >= 16")
    for path in (args.tokenizer, args.data):
        if not path.exists():
            p.error(f"{path} does not exist")
    written = one_window_file(
        XLNetTokenizer.from_dir(args.tokenizer), json.loads(args.data.read_text()), args.max_seq_len
    )
    count = sum(len(p["qas"]) for a in written["data"] for p in a["paragraphs"])
    if not count:
        p.error(f"no question of {args.data} fits {args.max_seq_len} tokens")
    args.out.write_text(json.dumps(written))
    print(f"{count} questions, each one window of <= {args.max_seq_len} tokens: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

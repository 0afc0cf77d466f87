"""The realistic mix of ``bench.latency --realistic N``: dev questions at their true window lengths.

Production traffic is not a stream of full 384-token windows: most SQuAD paragraphs fit one window
of ~150-250 tokens. Each path answers N dev questions one window at a time, every window at its
own length (batch 1, no padding), as the server does with batching off. HF-via-ONNX (b) is left out:
its exported graph is specialised to the traced length (wrong numbers at any other length), so it
cannot serve a length mix without one export per length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from bench.common import markdown_table
from qa_core.contract import INPUT_NAMES
from qa_core.squad import featurize_one, pad_batch, read_squad
from qa_core.tokenizer import XLNetTokenizer
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_DEV
from train.tokenizer import train_spm

Runner = Callable[[Mapping[str, np.ndarray]], Callable[[], object]]


def tokenizer_for_lengths(spm: Path | None, work: Path, text: Path = SAMPLE_CORPUS) -> XLNetTokenizer:
    """The given sentencepiece model, or an 8k-piece one trained on ``text`` (not the dev questions)."""
    if spm is not None:
        return XLNetTokenizer.from_dir(spm.parent if spm.is_file() else spm)
    out = work / "spm-realistic"
    if not (out / "spiece.model").exists():
        train_spm([text], out, 8000)
    return XLNetTokenizer.from_dir(out)


def realistic_windows(
    n: int,
    tokenizer: XLNetTokenizer,
    max_seq_len: int = 384,
    doc_stride: int = 128,
    source: Path = SAMPLE_DEV,
) -> tuple[list[dict[str, np.ndarray]], int, Path]:
    """Unpadded [1, T] feeds of n questions of ``source`` spread over its articles; also the count."""
    examples = read_squad(source)
    step = max(1, len(examples) // n)
    chosen = examples[::step][:n]
    windows = []
    for ex in chosen:
        for feature in featurize_one(ex.question, ex.context, tokenizer, max_seq_len, doc_stride, 64):
            batch = pad_batch([feature])
            windows.append({name: batch[name] for name in INPUT_NAMES})
    return windows, len(chosen), source


def realistic_table(
    runners: Mapping[str, Runner],
    n: int,
    spm: Path | None,
    work: Path,
    config,
    dev: Path = SAMPLE_DEV,
    text: Path = SAMPLE_CORPUS,
) -> str:
    """Time every path (except HF-via-ONNX) over the same windows; totals as ratios to (a)."""
    tokenizer = tokenizer_for_lengths(spm, work, text)
    windows, questions, source = realistic_windows(n, tokenizer, source=dev)
    lengths = np.array([w["input_ids"].shape[1] for w in windows])
    rows, ref_total = [], None
    for name, make in runners.items():
        if name.startswith("(b)"):
            continue
        calls = [make(w) for w in windows]
        for call in (calls[0], calls[int(np.argmax(lengths))]):  # warm-up, shortest-first allocators
            call()
        seconds = []
        for call in calls:
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
        total = float(np.sum(seconds))
        if name.startswith("(a)"):
            ref_total = total
        speedup = ref_total / total if ref_total else float("nan")
        rows.append([name, total, total / questions * 1e3, float(np.median(seconds)) * 1e3, speedup])
        print(f"  realistic {name}: {total:.2f} s", flush=True)
    head = (
        f"Realistic mix: {questions} questions of {source.name} ({len(windows)} windows, tokens per window "
        f"p10/p50/p90 {np.percentile(lengths, 10):.0f}/{np.percentile(lengths, 50):.0f}/"
        f"{np.percentile(lengths, 90):.0f}, tokenizer vocab {tokenizer.vocab_size}), batch 1, no padding; "
        f"{config.n_layer} layers, d_model {config.d_model}. (b) is left out: its graph only runs at the "
        "traced length.\n\n"
    )
    return head + markdown_table(
        ["path", "total s", "ms / question", "p50 ms / window", "speed-up vs (a)"], rows
    )

"""``python -m bench.graph_ops``: how many operations a forward pass is, and what they cost, side by side.

For ONNX exports (any tree's, e.g. one made by an older checkout): nodes by type in the file and in the
graph onnxruntime runs (its optimisations at the server's level, on this machine), per layer, and the
latency of every export at one shape, measured in interleaved rounds (each round runs every export in
turn, so a drift of the machine's clock touches them all) with the ratio of medians to the first.
For a checkpoint (``--checkpoint``): the operations one eager forward launches, as torch's profiler
records them (on the CPU: aten operators; on a GPU: CUDA kernels), for the fused inference path and
the reference layers of the same weights.

    python -m bench.graph_ops --exports before/ after/ --shape 1x192 --threads 1 [--json FILE]
    python -m bench.graph_ops --checkpoint CKPT --shape 1x384 [--device cuda]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cpu_summary, markdown_table


def window_feeds(batch: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A SQuAD-shaped window batch: paragraph, a question of a fifth of the window, <sep>, <cls>."""
    from qa_core.contract import CLS_ID, SEG_ID_CLS, SEG_ID_QUESTION, SEP_ID

    rng = np.random.default_rng(seed)
    ids = rng.integers(10, vocab, size=(batch, length)).astype(np.int64)
    types = np.zeros((batch, length), np.int64)
    question = max(1, length // 5)
    types[:, length - question - 1 : length - 1] = SEG_ID_QUESTION
    types[:, -1] = SEG_ID_CLS
    ids[:, length - question - 2] = ids[:, -2] = SEP_ID
    ids[:, -1] = CLS_ID
    return {"input_ids": ids, "attention_mask": np.ones((batch, length), np.int64), "token_type_ids": types}


def node_counts(path: Path) -> dict[str, int]:
    import onnx

    return dict(collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node).most_common())


def export_record(export_dir: Path, threads: int, work: Path) -> tuple[dict[str, Any], Any]:
    """Node counts of an export (file and as onnxruntime runs it) and its session, the server's settings."""
    from qa_core.runtime.sessions import session
    from qa_core.runtime.sidecar import Sidecar

    side = Sidecar.load(export_dir)
    model = export_dir / side.model_file
    ran = work / f"{len(list(work.iterdir()))}.ort.onnx"
    sess = session(model, threads=threads, level="all", optimized_path=ran)
    file_counts, run_counts = node_counts(model), node_counts(ran)
    record = {
        "export": str(export_dir),
        "precision": side.precision,
        "n_layer": side.n_layer,
        "vocab_size": side.vocab_size,
        "nodes_in_file": sum(file_counts.values()),
        "nodes_run": sum(run_counts.values()),
        "nodes_run_by_type": run_counts,
        "nodes_in_file_by_type": file_counts,
    }
    return record, sess


def interleaved_latency(
    sessions: Sequence[Any], feeds: dict[str, np.ndarray], rounds: int, runs: int, warmup: int
) -> list[list[float]]:
    """Seconds per run of each session, ``rounds`` rounds of ``runs`` runs each, sessions in turn."""
    for sess in sessions:
        for _ in range(warmup):
            sess.run(None, feeds)
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(rounds):
        for k, sess in enumerate(sessions):
            for _ in range(runs):
                start = time.perf_counter()
                sess.run(None, feeds)
                times[k].append(time.perf_counter() - start)
    return times


def eager_ops(checkpoint: str, batch: int, length: int, device: str) -> dict[str, Any]:
    """Operations one eager forward launches (profiler events: aten ops on the CPU, kernels on CUDA),
    fused inference path against the reference layers, same weights. ``checkpoint`` is a directory, or
    ``preset:NAME`` for random weights of that preset (shallow head)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from train.model import XLNetConfig, XLNetForQuestionAnswering
    from train.model import checkpoint as ckpt_io
    from train.model.inference import QAInference

    def fresh() -> Any:
        if checkpoint.startswith("preset:"):
            torch.manual_seed(0)
            config = XLNetConfig.preset(checkpoint[len("preset:") :], vocab_size=32000, dropout=0.0)
            return XLNetForQuestionAnswering(config, head="shallow").eval()
        return ckpt_io.load(Path(checkpoint)).model

    feeds = window_feeds(batch, length, fresh().config.vocab_size)
    args = tuple(
        torch.from_numpy(feeds[n]).to(device) for n in ("input_ids", "attention_mask", "token_type_ids")
    )
    out: dict[str, Any] = {"device": device, "shape": f"{batch}x{length}"}
    for name, positions in (("reference layers", None), ("fused", length)):
        model = fresh().to(device)
        module = QAInference(model, max_positions=positions)
        with torch.no_grad():
            module(*args)  # warm-up: lazy initialisation is not part of a forward
            cuda = device.startswith("cuda")
            activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
            with profile(activities=activities) as prof:
                module(*args)
                if cuda:
                    torch.cuda.synchronize()
        events = [e for e in prof.events() if (e.device_type.name == "CUDA") == cuda]
        if not cuda:  # top-level aten operators only: an op's own sub-calls are not launches
            events = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
        by_name = collections.Counter(e.name for e in events)
        out[name] = {"count": len(events), "top": dict(by_name.most_common(12))}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.graph_ops", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--exports", type=Path, nargs="*", default=[], help="export directories; the first is the base"
    )
    p.add_argument(
        "--checkpoint",
        help="count the eager forward's operations of this checkpoint (or preset:base, random)",
    )
    p.add_argument("--shape", default="1x192", help="BxT")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=30, help="runs per export per round")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--device", default="cpu", help="for --checkpoint: cpu or cuda")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    if not args.exports and args.checkpoint is None:
        p.error("give --exports DIR... and/or --checkpoint DIR")
    for d in args.exports:
        if not (d / "export.json").is_file():
            p.error(f"--exports {d}: not an export directory (no export.json)")
    try:
        batch, length = (int(x) for x in args.shape.lower().split("x"))
    except ValueError:
        p.error(f"--shape {args.shape!r}: expected BxT, e.g. 1x192")
    result: dict[str, Any] = {"machine": cpu_summary(), "shape": args.shape, "threads": args.threads}
    print(f"Machine: {result['machine']}; {args.shape}, {args.threads} thread(s)")
    if args.exports:
        with tempfile.TemporaryDirectory(prefix="graph-ops-") as tmp:
            pairs = [export_record(d, args.threads, Path(tmp)) for d in args.exports]
            records, sessions = [r for r, _ in pairs], [s for _, s in pairs]
            vocab = min(r["vocab_size"] for r in records) or 1000
            feeds = window_feeds(batch, length, vocab)
            times = interleaved_latency(sessions, feeds, args.rounds, args.runs, args.warmup)
        base = float(np.median(times[0]))
        for record, t in zip(records, times, strict=True):
            record["p50_ms"] = float(np.median(t)) * 1e3
            record["p10_ms"] = float(np.percentile(t, 10)) * 1e3
            record["ratio_to_first"] = float(np.median(t)) / base
        result["exports"] = records
        rows = [
            [
                r["export"],
                r["precision"],
                r["n_layer"],
                r["nodes_in_file"],
                r["nodes_run"],
                ", ".join(f"{k} {v}" for k, v in list(r["nodes_run_by_type"].items())[:6]),
                r["p50_ms"],
                r["ratio_to_first"],
            ]
            for r in records
        ]
        header = [
            "export",
            "precision",
            "layers",
            "nodes (file)",
            "nodes (run)",
            "most run",
            "p50 ms",
            "vs first",
        ]
        print(markdown_table(header, rows))
    if args.checkpoint is not None:
        ops = eager_ops(args.checkpoint, batch, length, args.device)
        result["eager"] = ops
        for name in ("reference layers", "fused"):
            top = ", ".join(f"{k} {v}" for k, v in list(ops[name]["top"].items())[:6])
            print(f"eager forward, {name}: {ops[name]['count']} operations on {args.device} ({top})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

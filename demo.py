"""`make demo`: the whole product on the shipped sample, end to end, in a few minutes on 2 CPU cores.

tokenizer -> short pretraining -> short fine-tuning -> evaluation -> ONNX export -> server on
127.0.0.1 -> the Python SDK asks a few questions (one unanswerable) -> prints answers -> stops the
server. The models are far too small and briefly trained to answer well: the demo shows the
pipeline, not the accuracy (see README "Results" for what longer runs reach).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent
SAMPLE = REPO / "data" / "sample"


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage(name: str, fn, argv: list[str]) -> None:
    banner(name)
    t = time.time()
    code = fn(argv)
    if code:
        raise SystemExit(f"demo: stage '{name}' failed with exit code {code}")
    print(f"[{name}: {time.time() - t:.0f} s]", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--config", default="small")
    parser.add_argument("--pretrain-steps", type=int, default=100)
    parser.add_argument("--finetune-steps", type=int, default=120)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from train import evaluate, finetune, pretrain
    from train import tokenizer as tokenizer_cli

    tok_dir = out / "tokenizer"
    stage(
        "1/6 train a sentencepiece tokenizer",
        tokenizer_cli.main,
        [
            "--input",
            str(SAMPLE / "corpus.json"),
            str(SAMPLE / "train.json"),
            "--vocab-size",
            "2000",
            "--out",
            str(tok_dir),
        ],
    )
    stage(
        "2/6 pretrain (permutation LM, two streams, memory)",
        pretrain.main,
        [
            "--corpus",
            str(SAMPLE / "corpus.json"),
            str(SAMPLE / "train.json"),
            "--spm",
            str(tok_dir),
            "--config",
            args.config,
            "--steps",
            str(args.pretrain_steps),
            "--batch-size",
            "8",
            "--seq-len",
            "128",
            "--reuse-len",
            "64",
            "--mem-len",
            "64",
            "--lr",
            "1e-3",
            "--warmup",
            "15",
            "--log-every",
            "25",
            "--out",
            str(out / "pretrain"),
        ],
    )
    stage(
        "3/6 fine-tune on SQuAD 2.0 (shallow head)",
        finetune.main,
        [
            "--train-file",
            str(SAMPLE / "train.json"),
            "--dev-file",
            str(SAMPLE / "dev.json"),
            "--init",
            str(out / "pretrain"),
            "--head",
            "shallow",
            "--steps",
            str(args.finetune_steps),
            "--batch-size",
            "8",
            "--lr",
            "1e-3",
            "--layer-decay",
            "0.9",
            "--max-seq-len",
            "192",
            "--doc-stride",
            "96",
            "--eval-every",
            str(args.finetune_steps),
            "--log-every",
            "20",
            "--out",
            str(out / "finetune"),
        ],
    )
    stage(
        "4/6 evaluate (official SQuAD 2.0 metrics)",
        evaluate.main,
        [
            "--checkpoint",
            str(out / "finetune"),
            "--data",
            str(SAMPLE / "dev.json"),
            "--out",
            str(out / "eval"),
        ],
    )

    from export import onnx as onnx_export

    stage(
        "5/6 export to ONNX and verify against PyTorch",
        onnx_export.main,
        ["--checkpoint", str(out / "finetune"), "--out", str(out / "onnx")],
    )

    banner("6/6 serve on 127.0.0.1 and ask through the Python SDK")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server",
            "--model",
            str(out / "onnx"),
            "--backend",
            "onnx",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=env,
    )
    try:
        from clients import XLNetQAClient

        with XLNetQAClient(f"http://127.0.0.1:{port}", timeout=30.0, retries=5) as client:
            deadline = time.time() + 120
            while not client.ready():
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit("demo: the server did not become ready")
                time.sleep(0.5)
            print(json.dumps(client.model_info().model_dump(), indent=2)[:600])
            article = json.loads((SAMPLE / "dev.json").read_text())["data"][0]
            paragraph = article["paragraphs"][0]
            for qa in paragraph["qas"][:4]:
                res = client.answer(qa["question"], paragraph["context"], top_k=3)
                gold = [a["text"] for a in qa["answers"]] or ["<no answer>"]
                shown = res.answer if not res.is_impossible else "<no answer>"
                best = res.n_best[0].text if res.n_best else ""
                print(
                    f"Q: {qa['question']}\n   model: {shown!r} (best span {best!r}, p_no_answer="
                    f"{res.no_answer_prob:.2f}, {res.timing_ms.total:.1f} ms)   gold: {gold[0]!r}"
                )
            res = client.answer("What is the capital of Mars?", paragraph["context"])
            print(
                f"Q: What is the capital of Mars?  (unanswerable)\n   model: "
                f"{res.answer if not res.is_impossible else '<no answer>'!r} (p_no_answer={res.no_answer_prob:.2f})"
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(
        f"\nDemo finished. Everything it made is in {out}/ (loss.png, dev_f1.png, eval/metrics.json, onnx/)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

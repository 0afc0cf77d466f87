"""Fine-tuning and evaluation end to end in miniature: every head trains, files are well formed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from module_runs import run_module
from paths import REPO, SAMPLE
from sample_cuts import first_article_split

from harness.server_process import free_port
from qa_core.squad import Answerability, read_squad, split_by_article
from train.evaluate import main as evaluate_main
from train.finetune import main as finetune_main
from train.model import XLNetConfig, XLNetForQuestionAnswering, checkpoint

METRIC_KEYS = {
    "exact",
    "f1",
    "total",
    "HasAns_exact",
    "HasAns_f1",
    "HasAns_total",
    "NoAns_exact",
    "NoAns_f1",
    "NoAns_total",
    "best_exact",
    "best_exact_thresh",
    "best_f1",
    "best_f1_thresh",
}


@pytest.fixture(scope="module")
def small_split(tmp_path_factory) -> tuple[Path, Path]:
    """A few paragraphs of the sample: train on the first article's start, evaluate on the dev article's."""
    return first_article_split(tmp_path_factory.mktemp("squad"), 4, 2)


def official_squad2_scores(data_file: Path, predictions: dict[str, str]) -> tuple[float, float]:
    """EM and F1 (percent) by the rules of the official evaluate-v2.0.py: answers normalised (lower
    case, punctuation, articles and extra whitespace removed); an unanswerable question scores 1 only
    for the empty prediction; the best over the gold answers."""
    import collections
    import re
    import string

    def normalize(text: str) -> str:
        text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())

    def f1_score(gold: str, pred: str) -> float:
        g, p = normalize(gold).split(), normalize(pred).split()
        if not g or not p:
            return float(g == p)
        common = sum((collections.Counter(g) & collections.Counter(p)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    data = json.loads(Path(data_file).read_text())["data"]
    exact = f1 = 0.0
    n = 0
    for article in data:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                golds = [a["text"] for a in qa["answers"] if normalize(a["text"])] or [""]
                pred = predictions[qa["id"]]
                exact += max(float(normalize(g) == normalize(pred)) for g in golds)
                f1 += max(f1_score(g, pred) for g in golds)
                n += 1
    return 100.0 * exact / n, 100.0 * f1 / n


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


COMMON = [
    "--max-seq-len",
    "96",
    "--doc-stride",
    "48",
    "--max-query-len",
    "24",
    "--batch-size",
    "8",
    "--log-every",
    "5",
    "--no-progress",
    "--seed",
    "1",
]


def finetune_argv(split: tuple[Path, Path], out: Path, *flags: str | Path) -> list[str]:
    """These tests' fine-tuning command line: the small split into ``out``, ``flags``, then COMMON."""
    train_file, dev_file = split
    paths = ["--train-file", str(train_file), "--dev-file", str(dev_file), "--out", str(out)]
    return [*paths, *map(str, flags), *COMMON]


@pytest.mark.parametrize("head", ["shallow", "deep", "beam", "simple"])
def test_each_head_trains_and_evaluates(head, small_split, spm_dir, tmp_path):
    dev_file = small_split[1]
    out = tmp_path / head
    flags = ["--config", "tiny", "--spm", spm_dir, "--head", head, "--steps", "40", "--eval-every", "20"]
    flags += ["--lr", "2e-3", "--layer-decay", "1.0", "--warmup", "0", "--dropout", "0"]
    args = [*finetune_argv(small_split, out, *flags), "--log-every", "1"]
    assert finetune_main(args) == 0
    losses = [r["loss"] for r in read_metrics(out) if "loss" in r]
    first, last = losses[0], sum(losses[-5:]) / 5
    print(f"{head}: loss {first:.3f} at step 1 -> {last:.3f} (mean of the last 5 steps)")
    assert last < 0.7 * first
    evals = [r for r in read_metrics(out) if "dev_f1" in r]
    assert [r["step"] for r in evals] == [20, 40]
    loaded = checkpoint.load(out)
    assert loaded.kind == f"qa:{head}" and loaded.tokenizer is not None
    meta = loaded.metadata
    assert 0.0 <= meta["no_answer_threshold"] <= 1.0 and meta["max_seq_len"] == 96 and meta["head"] == head
    assert (out / "loss.png").exists() and (out / "dev_f1.png").exists()

    ev = tmp_path / f"eval-{head}"
    assert (
        evaluate_main(["--checkpoint", str(out), "--data", str(dev_file), "--out", str(ev), "--no-progress"])
        == 0
    )
    metrics = json.loads((ev / "metrics.json").read_text())
    assert set(metrics) >= METRIC_KEYS
    preds = json.loads((ev / "predictions.json").read_text())
    na = json.loads((ev / "na_probs.json").read_text())
    nbest = json.loads((ev / "nbest.json").read_text())
    ids = {ex.qas_id for ex in read_squad(dev_file)}
    assert set(preds) == set(na) == set(nbest) == ids
    assert all(0.0 <= p <= 1.0 for p in na.values())
    assert metrics["total"] == len(ids)
    # the fitted answerability is stored with its cross-validated report, and evaluation applies it
    answerability = Answerability.from_dict(meta["answerability"])
    assert answerability.report["fitted_on"]["questions"] == len(ids)
    decisions = json.loads((ev / "decisions.json").read_text())
    assert all(d["is_impossible"] == (preds[q] == "") for q, d in decisions.items())
    # with the cls rule, evaluation reproduces what fine-tuning measured on the same file (dev_metrics:
    # sigmoid(cls) at the threshold searched there, as the original reports)
    cls_dir = tmp_path / f"eval-cls-{head}"
    argv = ["--checkpoint", str(out), "--data", str(dev_file), "--out", str(cls_dir), "--no-progress"]
    assert evaluate_main([*argv, "--answerability", "cls"]) == 0
    cls_metrics = json.loads((cls_dir / "metrics.json").read_text())
    for key in ("f1", "exact", "best_f1"):
        assert cls_metrics[key] == pytest.approx(meta["dev_metrics"][key])
    assert cls_metrics["threshold"] == pytest.approx(meta["no_answer_threshold"])
    # ... and the official SQuAD 2.0 rules, written out here independently, give the same EM/F1 for the
    # written predictions (what a user would feed to the official evaluate-v2.0.py).
    exact, f1 = official_squad2_scores(dev_file, preds)
    assert metrics["exact"] == pytest.approx(exact) and metrics["f1"] == pytest.approx(f1)


def test_freezing_keeps_bottom_layers_and_embeddings_fixed(small_split, spm_dir, tmp_path):
    out = tmp_path / "frozen"
    torch.manual_seed(0)
    init = tmp_path / "init"
    from qa_core.tokenizer import XLNetTokenizer

    tok = XLNetTokenizer.from_dir(spm_dir)
    config = XLNetConfig.preset("tiny", vocab_size=tok.vocab_size, n_layer=3)
    checkpoint.save(XLNetForQuestionAnswering(config, head="shallow"), init, tokenizer=tok)
    before = checkpoint.load(init).model.state_dict()
    flags = ["--init", init, "--head", "shallow", "--steps", "6", "--eval-every", "6", "--freeze-layers", "2"]
    args = finetune_argv(small_split, out, *flags, "--freeze-embeddings", "--lr", "1e-3")
    assert finetune_main(args) == 0
    after = checkpoint.load(out).model.state_dict()
    for key in before:
        same = torch.equal(before[key], after[key])
        frozen = "word_embedding" in key or "mask_emb" in key or ".layer.0." in key or ".layer.1." in key
        assert same == frozen, key


def test_init_from_huggingface_directory(small_split, spm_dir, tmp_path):
    """A local HF XLNet checkpoint (here random weights + our spm) fine-tunes directly."""
    from qa_core.tokenizer import XLNetTokenizer

    tok = XLNetTokenizer.from_dir(spm_dir)
    hf_dir = tmp_path / "hf-xlnet"
    cfg = transformers.XLNetConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=2, n_head=2, d_inner=64)
    transformers.XLNetLMHeadModel(cfg).save_pretrained(hf_dir)
    shutil.copy(spm_dir / "spiece.model", hf_dir / "spiece.model")
    out = tmp_path / "from-hf"
    args = finetune_argv(
        small_split, out, "--init", hf_dir, "--head", "beam", "--steps", "4", "--eval-every", "4"
    )
    # Step 0 starts from the HF weights: every backbone tensor equal (not re-initialised or ignored).
    from train.finetune import parse_config
    from train.recipes.finetune_setup import load_tokenizer_and_model

    _, start, _ = load_tokenizer_and_model(parse_config(args), tmp_path / "unused")
    hf_backbone = {
        k: v for k, v in transformers.XLNetLMHeadModel.from_pretrained(hf_dir).state_dict().items()
        if k.startswith("transformer.")
    }  # fmt: skip
    ours = start.state_dict()
    assert len(hf_backbone) > 20 and hf_backbone.keys() <= ours.keys()
    for name, value in hf_backbone.items():
        assert torch.equal(ours[name], value), name
    assert finetune_main(args) == 0
    loaded = checkpoint.load(out)
    assert loaded.kind == "qa:beam" and loaded.config.d_model == 32
    hf = transformers.XLNetForQuestionAnswering.from_pretrained(out)  # and HF reads our result back
    assert hf.config.d_model == 32


def test_resume_continues_the_same_run(small_split, spm_dir, tmp_path):
    train_file, dev_file = small_split
    base = [
        "--train-file",
        str(train_file),
        "--dev-file",
        str(dev_file),
        "--config",
        "tiny",
        "--spm",
        str(spm_dir),
    ]
    base += ["--steps", "10", "--eval-every", "100", "--lr", "1e-3", "--dropout", "0"]
    base += [*COMMON, "--log-every", "1", "--batch-size", "4", "--seed", "3"]  # the later flag wins
    assert finetune_main([*base, "--out", str(tmp_path / "a")]) == 0
    assert finetune_main([*base, "--out", str(tmp_path / "b"), "--stop-after", "4"]) == 0
    assert finetune_main([*base, "--out", str(tmp_path / "b"), "--resume"]) == 0
    a = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "a") if "loss" in r}
    b = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "b") if "loss" in r}
    assert sorted(b) == list(range(1, 11))
    for step in range(5, 11):
        assert abs(a[step] - b[step]) <= 1e-5, (step, a[step], b[step])


def test_progress_bar_and_log_lines_keep_apart(small_split, spm_dir, tmp_path):
    """As a terminal shows it (stdout and stderr in one stream): the bar shows best_f1 only once there is an
    evaluation (never the -1.0 placeholder), and every line printed while the bar is open starts a line of
    its own instead of landing on the bar."""
    train_file, dev_file = small_split
    argv = ["--train-file", str(train_file), "--dev-file", str(dev_file), "--config", "tiny"]
    argv += ["--spm", str(spm_dir), "--steps", "4", "--eval-every", "2", "--out", str(tmp_path / "run")]
    argv += [a for a in COMMON if a != "--no-progress"] + ["--log-every", "1"]
    r = subprocess.run(
        [sys.executable, "-m", "train.finetune", *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout
    before, evaluated, after = r.stdout.partition("step 2: dev EM")
    assert evaluated and "best_f1=" not in before and "best_f1=" in after, r.stdout
    pieces = [p for line in r.stdout.splitlines() for p in line.split("\r")]
    printed = [p for p in pieces if "step 2: dev EM" in p or "step 4: dev EM" in p or "answerability" in p]
    assert len(printed) >= 3 and all(p.startswith(("step ", "answerability")) for p in printed), printed


def test_cli_errors_are_one_line(tmp_path):
    r = run_module(
        "train.finetune",
        "--train-file",
        tmp_path / "x.json",
        "--dev-file",
        tmp_path / "y.json",
        "--out",
        tmp_path / "o",
    )
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"title": "t", "paragraphs": [{"context": 3}]}]}')
    r = run_module("train.evaluate", "--checkpoint", tmp_path, "--data", bad, "--out", tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_split_helper_for_the_end_to_end_study(tmp_path):
    chosen, rest = split_by_article(SAMPLE / "train.json", 1)
    assert len(chosen["data"]) == 1 and len(rest["data"]) == 1


def test_two_ranks_equal_one_process_at_twice_the_batch(small_split, spm_dir, tmp_path):
    """torchrun with 2 gloo ranks of batch 4 ends with the parameters of 1 process of batch 8 (the
    same global batches, gradients all-reduced once per step): a broken all-reduce, duplicated or
    missing data shards, or ranks drifting apart would all change them."""
    import subprocess
    import sys

    train_file, dev_file = small_split
    base = ["--train-file", str(train_file), "--dev-file", str(dev_file), "--config", "tiny"]
    base += ["--spm", str(spm_dir), "--dropout", "0", "--steps", "3", "--eval-every", "3", "--lr", "1e-3"]
    base += ["--max-seq-len", "96", "--doc-stride", "48", "--max-query-len", "24", "--no-progress"]
    single = tmp_path / "single"
    assert finetune_main([*base, "--batch-size", "8", "--out", str(single)]) == 0

    port = free_port()  # below the ephemeral range: no neighbour binding port 0 can take it
    double = tmp_path / "double"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    cmd += ["-m", "train.finetune", *base, "--batch-size", "4", "--out", str(double), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    from train.engine.execution import seed_everything
    from train.finetune import parse_config
    from train.recipes.finetune_setup import load_tokenizer_and_model

    config = parse_config([*base, "--out", str(tmp_path / "unused")])
    seed_everything(config.seed)  # as the recipe's setup does before building the model
    initial = load_tokenizer_and_model(config, tmp_path / "unused")[1].state_dict()
    a = checkpoint.load(single).model.state_dict()
    b = checkpoint.load(double).model.state_dict()
    assert a.keys() == b.keys()
    moved = max((a[k] - initial[k]).abs().max().item() for k in a)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert moved > 1e-4 and worst <= 1e-5, (moved, worst)  # trained, and to the same parameters
    assert all(torch.isfinite(v).all() for v in b.values())
    assert len(read_metrics(double)) == len(read_metrics(single))  # only rank 0 logs

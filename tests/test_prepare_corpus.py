"""Prepared corpora: the same token stream and batches as the in-memory pipeline, byte-identical shards
after a kill -9, tasks that merge into one manifest, bad input in one line, another tokenizer refused."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from module_runs import run_module
from paths import REPO

from qa_core.tokenizer import XLNetTokenizer
from train.common.corpus import iter_documents, iter_texts
from train.common.sample_data import SAMPLE_CORPUS, SAMPLE_TRAIN
from train.data import PretrainBatches, PretrainDataConfig, tokenize_documents
from train.data.shards import MANIFEST, ShardedCorpus
from train.prepare_corpus import main as prepare_main

PROG = "python -m train.prepare_corpus"


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's sentences as plain text, a blank line after every third one (documents of 3)."""
    lines = list(iter_texts([SAMPLE_CORPUS]))
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("".join(f"{line}\n" + ("\n" if k % 3 == 2 else "") for k, line in enumerate(lines)))
    return path


def prepare(corpus: list[Path], spm: Path, out: Path, *extra: str) -> int:
    args = ["--corpus", *map(str, corpus), "--spm", str(spm), "--out", str(out), *extra]
    return prepare_main(args)


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard-*")) if p.suffix != ".json"}


def test_shards_hold_the_in_memory_stream_and_give_the_same_batches(
    text_corpus: Path, spm_dir: Path, tmp_path: Path
) -> None:
    inputs = [text_corpus, SAMPLE_TRAIN]
    assert prepare(inputs, spm_dir, tmp_path / "data", "--shard-mb", "0.01", "--workers", "2") == 0
    corpus = ShardedCorpus(tmp_path / "data", verify=True)
    assert len(corpus.records) > 3  # the text file was cut into several shards
    tok = XLNetTokenizer.from_dir(spm_dir)
    stream = tokenize_documents(iter_documents(inputs), tok.encode)
    np.testing.assert_array_equal(corpus.ids(0, len(corpus)), stream.ids)
    np.testing.assert_array_equal(corpus.unigram_counts(), np.bincount(stream.ids, minlength=tok.vocab_size))
    for bi_data in (False, True):
        for rank in (0, 1):
            cfg = PretrainDataConfig(seq_len=64, reuse_len=32, batch_size=4, bi_data=bi_data, seed=7)
            mapped = PretrainBatches(corpus, tok.word_start_table, cfg, rank=rank, world_size=2)
            memory = PretrainBatches(stream, tok.word_start_table, cfg, rank=rank, world_size=2)
            for _ in range(len(memory) + 2):  # a whole pass and into the next
                a, b = next(mapped), next(memory)
                for name in b:
                    assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def test_ranks_read_disjoint_streams(text_corpus: Path, spm_dir: Path, tmp_path: Path) -> None:
    assert prepare([text_corpus], spm_dir, tmp_path / "data", "--shard-mb", "0.01") == 0
    corpus = ShardedCorpus(tmp_path / "data")
    cfg = PretrainDataConfig(seq_len=32, reuse_len=16, batch_size=4, bi_data=True)
    spans = []
    for rank in range(2):
        rows = PretrainBatches(corpus, np.ones(8000, bool), cfg, rank=rank, world_size=2).rows
        spans += [(row.start, row.start + len(row)) for row in rows.rows if not row.reverse]
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)) and len(spans) == 4


def test_kill_9_then_the_same_command_gives_identical_shards(
    text_corpus: Path, spm_dir: Path, tmp_path: Path
) -> None:
    big = tmp_path / "big.txt"
    big.write_text(text_corpus.read_text() * 8)
    clean = tmp_path / "clean"
    assert prepare([big], spm_dir, clean, "--shard-mb", "0.02") == 0
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "train.prepare_corpus", "--corpus", str(big), "--spm", str(spm_dir)]
    cmd += ["--out", str(killed), "--shard-mb", "0.02", "--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and not list(killed.glob("shard-*.json")):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list(killed.glob("shard-*.json")))
    assert not (killed / MANIFEST).exists() or done_before == len(list(clean.glob("shard-*.json")))
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{done_before} of this task's" in again.stdout
    assert shard_bytes(killed) == shard_bytes(clean)
    assert not [p for p in killed.iterdir() if ".tmp-" in p.name]
    manifests = [json.loads((d / MANIFEST).read_text()) for d in (clean, killed)]
    assert manifests[0]["shards"] == manifests[1]["shards"]


def test_tasks_prepare_their_shards_and_the_last_writes_the_manifest(
    text_corpus: Path, spm_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "shared"
    assert prepare([text_corpus], spm_dir, out, "--shard-mb", "0.01", "--num-tasks", "2", "--task", "1") == 0
    assert not (out / MANIFEST).exists()  # task 0's shards are missing
    assert prepare([text_corpus], spm_dir, out, "--shard-mb", "0.01", "--num-tasks", "2", "--task", "0") == 0
    single = tmp_path / "single"
    assert prepare([text_corpus], spm_dir, single, "--shard-mb", "0.01") == 0
    assert shard_bytes(out) == shard_bytes(single)
    assert json.loads((out / MANIFEST).read_text())["tokens"] == ShardedCorpus(single).manifest["tokens"]


def test_bad_input_is_one_line(spm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    assert prepare([binary], spm_dir, tmp_path / "a") == 2
    assert "not UTF-8 text" in capsys.readouterr().err and not (tmp_path / "a" / MANIFEST).exists()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert prepare([empty], spm_dir, tmp_path / "b") == 2
    assert "every input is empty" in capsys.readouterr().err
    text = tmp_path / "ok.txt"
    text.write_text("A sentence here.\n" + "x" * 5000 + "\nAnother one.\n")
    jsonl = tmp_path / "docs.jsonl.gz"
    with gzip.open(jsonl, "wt") as f:
        f.write(json.dumps({"text": "Ada wrote it. Then she left."}) + "\n")
    assert prepare([empty, text, jsonl], spm_dir, tmp_path / "c", "--max-line-chars", "1000") == 0
    manifest = ShardedCorpus(tmp_path / "c").manifest
    assert manifest["skipped_lines"] == 1 and manifest["tokens"] > 0  # the long line is counted, not read
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"txt": "no text field"}\n')
    assert prepare([bad_jsonl], spm_dir, tmp_path / "d") == 2
    assert 'line 1 has no string "text" field' in capsys.readouterr().err
    assert prepare([text], spm_dir, tmp_path / "c", "--max-line-chars", "99") == 2  # other options, same dir
    assert "prepared from other input files or options" in capsys.readouterr().err


def test_pretrain_refuses_a_corpus_of_another_tokenizer(
    text_corpus: Path, spm_dir: Path, spm_dir_lower: Path, tmp_path: Path
) -> None:
    assert prepare([text_corpus], spm_dir, tmp_path / "data") == 0
    cmd = [
        sys.executable,
        "-m",
        "train.pretrain",
        "--data",
        str(tmp_path / "data"),
        "--spm",
        str(spm_dir_lower),
    ]
    cmd += ["--out", str(tmp_path / "run"), "--steps", "1", "--config", "tiny"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "its token ids come from another tokenizer" in lines[-1]
    missing = run_module("train.pretrain", "--data", tmp_path / "nope", "--out", tmp_path / "r2")
    assert missing.returncode == 2 and "no manifest.json" in missing.stderr.strip().splitlines()[-1]


def test_a_full_disk_fails_in_one_line_and_a_rerun_finishes_the_same_shards(
    text_corpus: Path, spm_dir: Path, tmp_path: Path
) -> None:
    """A write that fails (here the file-size limit, as a full disk would) is exit 1 in one line; nothing
    of it is recorded, no manifest written, and the same command then finishes identically. Twice: the
    tokenizer's copy failing, then a shard's counts file (its ids file fits)."""
    import resource

    clean, full = tmp_path / "clean", tmp_path / "full"
    assert prepare([text_corpus], spm_dir, clean, "--shard-mb", "0.01", "--workers", "1") == 0
    counts_size = (clean / "shard-00000.counts").stat().st_size
    assert (clean / "shard-00000.ids").stat().st_size < counts_size // 2
    cmd = [sys.executable, "-m", "train.prepare_corpus", "--corpus", str(text_corpus), "--spm", str(spm_dir)]
    cmd += ["--out", str(full), "--shard-mb", "0.01", "--workers", "1", "--num-tasks", "2"]

    def run(task: int, limit: int | None) -> subprocess.CompletedProcess:
        def cap() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        argv = [*cmd, "--task", str(task)]
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=cap)

    for task, limit in ((1, 4000), (1, None), (0, counts_size // 2), (0, None)):
        proc = run(task, limit)
        if limit is None:
            assert proc.returncode == 0, proc.stderr
            continue
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert last.startswith(f"{PROG}: error: ") and "File too large" in last
        assert not (full / MANIFEST).exists() and not (full / "shard-00000.json").exists()
    assert shard_bytes(full) == shard_bytes(clean)
    assert ShardedCorpus(full, verify=True).manifest["tokens"] == ShardedCorpus(clean).manifest["tokens"]

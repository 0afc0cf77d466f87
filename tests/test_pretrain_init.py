"""``train.pretrain --init``: continued pretraining of a published (HuggingFace) XLNet.

The objective equals transformers' own loss (its ``labels``) on our pipeline's batches, with and
without memory, two streams, bi_data off and on; three real steps write a checkpoint that
``XLNetLMHeadModel.from_pretrained`` loads and scores as we do; --resume needs the run only; flags that
contradict the checkpoint, and a corpus of another tokenizer, are one line; a 32,000-piece vocabulary
goes through prepare_corpus (uint16 ids) into pretraining.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from fixtures_spm import pad_vocabulary
from paths import SAMPLE_CORPUS
from xlnet_oracle import hf_loss

from qa_core.tokenizer import XLNetTokenizer
from train.common.cli import run
from train.common.corpus import iter_documents
from train.data import PretrainBatches, tokenize_documents
from train.data.shards import ShardedCorpus
from train.engine.execution import to_tensors
from train.model import checkpoint
from train.prepare_corpus import main as prepare_main
from train.pretrain import main as pretrain_main
from train.recipes.pretrain import PretrainConfig, data_config, pretrain_loss
from train.recipes.pretrain_init import InitSource

TOL = 1e-5
SHAPE = dict(d_model=32, n_layer=2, n_head=4, d_inner=64)
RUN = ["--seq-len", "32", "--reuse-len", "16", "--mem-len", "24", "--batch-size", "4", "--no-progress"]


def make_published(out: Path, spm_file: Path, seed: int = 0, **config) -> Path:
    """A random HF XLNetLMHeadModel saved by transformers, with a spiece.model beside it: what a user
    has on disk for xlnet-base-cased. Biases and LayerNorms are made non-trivial so every weight counts."""
    vocab = XLNetTokenizer(spm_file).vocab_size
    torch.manual_seed(seed)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(vocab_size=vocab, **{**SHAPE, **config}))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "bias" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(out)
    shutil.copy(spm_file, out / "spiece.model")
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, spm_dir: Path) -> Path:
    return make_published(tmp_path_factory.mktemp("published") / "xlnet", spm_dir / "spiece.model")


def batches(config: PretrainConfig, tokenizer: XLNetTokenizer, n: int) -> list[dict[str, torch.Tensor]]:
    data = PretrainBatches.from_files([SAMPLE_CORPUS], tokenizer, data_config(config))
    return [to_tensors(next(data), torch.device("cpu")) for _ in range(n)]


@pytest.mark.parametrize("bi_data", [False, True], ids=["bi_data-off", "bi_data-on"])
def test_our_objective_equals_transformers_loss(published: Path, bi_data: bool, tmp_path: Path) -> None:
    config = PretrainConfig(
        out=str(tmp_path / "run"),
        init=str(published),
        seq_len=32,
        reuse_len=16,
        mem_len=24,
        batch_size=4,
        bi_data=bi_data,
        dropout=0.0,
    )
    source = InitSource.open(config)
    ours = source.load_model(config).eval()
    assert ours.lm_loss.weight is ours.transformer.word_embedding.weight  # tied, as HF ties them
    hf = transformers.XLNetLMHeadModel.from_pretrained(
        published, mem_len=24, reuse_len=16, bi_data=bi_data, dropout=0.0
    ).eval()
    assert hf.lm_loss.weight.data_ptr() == hf.transformer.word_embedding.weight.data_ptr()
    first, second = batches(config, source.tokenizer, 2)
    with torch.no_grad():
        loss, mems = pretrain_loss(ours, first)
        ref, ref_mems = hf_loss(hf, first)
        loss_mem, _ = pretrain_loss(ours, second, mems)
        ref_mem, _ = hf_loss(hf, second, ref_mems)
    deltas = {"no memory": (loss - ref).abs().item(), "with memory": (loss_mem - ref_mem).abs().item()}
    deltas["memory tensors"] = max((a - b).abs().max().item() for a, b in zip(mems, ref_mems, strict=True))
    print(f"bi_data={bi_data}: loss {loss.item():.6f} / {loss_mem.item():.6f}; |Δ| {deltas}")
    assert mems[0].shape == (16, 4, SHAPE["d_model"])  # reuse_len positions cached
    assert all(d <= TOL for d in deltas.values()), deltas


def test_three_steps_load_in_transformers_and_resume_without_the_init(
    published: Path, tmp_path: Path
) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = [
        "--corpus",
        str(SAMPLE_CORPUS),
        *RUN,
        "--bi-data",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--steps",
        "3",
    ]
    assert pretrain_main([*args, "--init", str(published), "--out", str(straight)]) == 0
    # the same run stopped after 2 steps, its init moved away, then resumed from its own checkpoint
    moved = shutil.copytree(published, tmp_path / "moved")
    assert pretrain_main([*args, "--init", str(moved), "--out", str(resumed), "--stop-after", "2"]) == 0
    shutil.rmtree(moved)
    assert pretrain_main(["--out", str(resumed), "--resume", "--no-progress"]) == 0

    ours = checkpoint.load(straight).model
    start = checkpoint.load(published, kind="lm").model.state_dict()
    unmoved = [k for k, v in ours.state_dict().items() if torch.equal(v, start[k])]
    assert not unmoved, f"pretraining left these weights as they were: {unmoved}"
    again = checkpoint.load(resumed).model.state_dict()
    assert all(torch.equal(v, again[k]) for k, v in ours.state_dict().items())
    tokenizer = XLNetTokenizer.from_dir(straight)
    assert tokenizer.fingerprint() == XLNetTokenizer.from_dir(published).fingerprint()

    hf, info = transformers.XLNetLMHeadModel.from_pretrained(straight, output_loading_info=True)
    assert not any(info.values()), info  # every weight found, none re-initialised
    hf.eval()
    config = PretrainConfig(out="-", seq_len=32, reuse_len=16, mem_len=24, batch_size=4, bi_data=True, seed=9)
    first, second = batches(config, tokenizer, 2)
    with torch.no_grad():
        _, mems = pretrain_loss(ours, first)
        loss, _ = pretrain_loss(ours, second, mems)
        _, ref_mems = hf_loss(hf, first)
        ref, _ = hf_loss(hf, second, ref_mems)
    print(
        f"after 3 steps: our loss {loss.item():.6f}, transformers {ref.item():.6f}, |Δ| {abs(loss - ref):.2e}"
    )
    assert abs(loss - ref).item() <= TOL


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The command's exit code is 2 and its error one line: returned."""
    capsys.readouterr()  # what ran before
    assert run(pretrain_main, argv, prog="train.pretrain") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.pretrain: error: "), err
    return err[0]


def test_flags_that_contradict_the_checkpoint_are_one_line(
    published: Path, spm_dir_lower: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    base = ["--init", str(published), "--corpus", str(SAMPLE_CORPUS), *RUN, "--out", str(out)]
    cases = {
        ("--config", "base"): "--config base contradicts --init",
        ("--d-model", "64"): "(d_model 32)",
        ("--n-layer", "3"): "(n_layer 2)",
        ("--activation", "relu"): "(ff_activation gelu)",
        ("--aoa",): "(use_aoa False)",
        ("--train-spm", "500"): "brings its tokenizer",
        ("--spm", str(spm_dir_lower)): "is not the tokenizer of --init",
        ("--lower",): "is cased",
    }
    for flags, says in cases.items():
        assert says in refused([*base, *flags], capsys), flags
        assert not out.exists()  # refused before the run was recorded
    assert "(d_model 32)" in refused([*base, "--config", "tiny"], capsys)  # a preset of another shape
    agreeing = PretrainConfig(out=str(out), init=str(published), d_model=32, n_layer=2, n_head=4, d_inner=64)
    assert InitSource.open(agreeing).config.d_model == 32  # flags that agree with the checkpoint are fine
    no_spm = shutil.copytree(published, tmp_path / "no-spm", ignore=shutil.ignore_patterns("spiece.model"))
    line = refused(["--init", str(no_spm), "--corpus", str(SAMPLE_CORPUS), "--out", str(out)], capsys)
    assert "has no spiece.model: pass --spm" in line


def test_a_base_model_or_our_qa_checkpoint_starts_the_lm(
    published: Path, qa_checkpoint: Path, tmp_path: Path
) -> None:
    """An HF XLNetModel directory (no LM head) gets a zero output bias; a checkpoint of ours with another
    head gives its backbone; both keep their weights and tokenizer."""
    base = tmp_path / "base"
    transformers.XLNetLMHeadModel.from_pretrained(published).transformer.save_pretrained(base)
    shutil.copy(published / "spiece.model", base)
    for init, embedding in (
        (base, checkpoint.load(published).model.transformer.word_embedding.weight),
        (qa_checkpoint, checkpoint.load(qa_checkpoint).model.transformer.word_embedding.weight),
    ):
        config = PretrainConfig(out=str(tmp_path / "run"), init=str(init), mem_len=8, reuse_len=4)
        model = InitSource.open(config).load_model(config)
        assert torch.equal(model.transformer.word_embedding.weight, embedding)
        assert torch.equal(model.lm_loss.bias, torch.zeros_like(model.lm_loss.bias))
        assert model.training and model.config.mem_len == 8


def test_an_untied_lm_head_is_refused(published: Path, tmp_path: Path) -> None:
    hf = transformers.XLNetLMHeadModel.from_pretrained(published, tie_word_embeddings=False)
    with torch.no_grad():
        hf.lm_loss.weight.add_(1.0)
    hf.save_pretrained(tmp_path / "untied")
    with pytest.raises(checkpoint.CheckpointError, match="untied LM head"):
        checkpoint.load(tmp_path / "untied")


def test_a_32k_vocabulary_prepares_as_uint16_and_the_fingerprint_is_checked(
    published: Path, spm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A published-size vocabulary (real pieces at ids 30,009..31,999) through prepare_corpus with
    ``--spm DIR/spiece.model`` into pretraining ``--init DIR``; the 2,000-piece model's --init refuses it."""
    big = pad_vocabulary(spm_dir / "spiece.model", tmp_path / "spm32k" / "spiece.model", 32000)
    model_dir = make_published(tmp_path / "xlnet32k", big, d_model=16, n_layer=1, n_head=2, d_inner=32)
    data = tmp_path / "corpus"
    spm = str(model_dir / "spiece.model")
    assert (
        prepare_main(["--corpus", str(SAMPLE_CORPUS), "--spm", spm, "--out", str(data), "--workers", "1"])
        == 0
    )
    tokenizer = XLNetTokenizer.from_dir(model_dir)
    manifest = json.loads((data / "manifest.json").read_text())
    assert tokenizer.vocab_size == 32000 and manifest["dtype"] == "uint16"
    assert 30009 <= manifest["max_id"] <= 31999
    assert manifest["tokenizer"]["sha256"] == tokenizer.fingerprint()
    corpus = ShardedCorpus(data, verify=True)
    stream = tokenize_documents(iter_documents([SAMPLE_CORPUS]), tokenizer.encode)
    np.testing.assert_array_equal(corpus.ids(0, len(corpus)), stream.ids)

    steps = ["--steps", "1", "--warmup", "0", *RUN]
    assert (
        pretrain_main(["--init", str(model_dir), "--data", str(data), *steps, "--out", str(tmp_path / "r")])
        == 0
    )
    assert checkpoint.load(tmp_path / "r").config.vocab_size == 32000
    line = refused(
        ["--init", str(published), "--data", str(data), *steps, "--out", str(tmp_path / "r2")], capsys
    )
    theirs, ours = tokenizer.fingerprint()[:12], XLNetTokenizer.from_dir(published).fingerprint()[:12]
    assert "its token ids come from another tokenizer" in line and theirs in line and ours in line
    assert not (tmp_path / "r2").exists()

"""The exact-match input feature (`question_match`): what it marks, that it starts neutral, that it exports."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from export.onnx.cli import main as export_main
from export.onnx.verify import sample_batches
from harness.tiny_models import tiny_qa_checkpoint
from qa_core.contract import INPUT_NAMES
from qa_core.runtime import sidecar as sc
from qa_core.runtime.sessions import session
from qa_core.tokenizer import XLNetTokenizer
from train.model import XLNetConfig, XLNetForQuestionAnswering, XLNetLMHeadModel, checkpoint
from train.model.inference import QAInference
from train.model.layout import question_match


def test_marks_tokens_found_across_the_separator_only():
    #          paragraph: 10  11  12 <sep> | question: 11  13 <sep> | <cls> | pad(11)
    ids = torch.tensor([[10, 11, 12, 4, 11, 13, 4, 3, 11]])
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 3]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0]])
    assert question_match(ids, types, mask).tolist() == [[0, 1, 0, 0, 1, 0, 0, 0, 0]]
    # a repeat inside one segment is not a match; padding never matches even without a mask row
    ids2 = torch.tensor([[10, 10, 4, 12, 4, 3]])
    types2 = torch.tensor([[0, 0, 0, 1, 1, 2]])
    assert question_match(ids2, types2, None).tolist() == [[0, 0, 0, 0, 0, 0]]


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(9, 60, (2, 24), generator=g)
    types = torch.zeros(2, 24, dtype=torch.long)
    types[:, 16:23], types[:, 23] = 1, 2
    ids[:, 15], ids[:, 22], ids[:, 23] = 4, 4, 3
    ids[:, 17:20] = ids[:, 3:6]  # the question quotes the paragraph
    return ids, types, torch.ones(2, 24, dtype=torch.long)


def test_off_is_the_plain_model_and_a_zero_start_changes_nothing():
    torch.manual_seed(0)
    config = XLNetConfig.preset("tiny", vocab_size=60, dropout=0.0)
    plain = XLNetForQuestionAnswering(config, head="shallow").eval()
    assert plain.transformer.match_emb is None and "match" not in str(plain.state_dict().keys())
    matched = XLNetForQuestionAnswering(config.replace(question_match=True), head="shallow").eval()
    missing, unexpected = matched.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["transformer.match_emb"] and not unexpected
    ids, types, mask = _batch()
    assert question_match(ids, types, mask).sum() >= 6
    with torch.no_grad():
        want = plain(ids, types, mask).start_logits
        assert torch.equal(matched(ids, types, mask).start_logits, want)
        matched.transformer.match_emb.normal_(0, 1.0)
        assert not torch.allclose(matched(ids, types, mask).start_logits, want, atol=1e-3)


def test_the_feature_learns_and_fused_inference_agrees():
    torch.manual_seed(0)
    model = XLNetForQuestionAnswering(
        XLNetConfig.preset("tiny", vocab_size=60, dropout=0.0, question_match=True), head="beam"
    )
    ids, types, mask = _batch(1)
    out = model(ids, types, mask, start_positions=torch.tensor([3, 4]), end_positions=torch.tensor([5, 5]))
    out.loss.backward()
    assert model.transformer.match_emb.grad.abs().sum() > 0
    with torch.no_grad():
        model.transformer.match_emb.normal_(0, 1.0)
    reference = QAInference(copy.deepcopy(model), max_positions=None)
    fused = QAInference(model)
    with torch.no_grad():
        for w, g_ in zip(reference(ids, mask, types), fused(ids, mask, types), strict=True):
            torch.testing.assert_close(g_, w, atol=1e-4, rtol=1e-4)


def test_pretraining_refuses_it_and_a_pretrained_checkpoint_switches_it_on(tmp_path):
    config = XLNetConfig.preset("tiny", vocab_size=60)
    with pytest.raises(ValueError, match="fine-tuning feature"):
        XLNetLMHeadModel(config.replace(question_match=True))
    lm = checkpoint.save(XLNetLMHeadModel(config), tmp_path / "lm")
    loaded = checkpoint.load(lm, head="shallow", config_overrides={"question_match": True})
    assert loaded.config.question_match and torch.equal(
        loaded.model.transformer.match_emb, torch.zeros(config.d_model)
    )
    qa = checkpoint.save(loaded.model, tmp_path / "qa")
    # a checkpoint whose config has the feature must carry its weights
    state = {k: v for k, v in loaded.model.state_dict().items() if k != "transformer.match_emb"}
    save_file({k: v.contiguous() for k, v in state.items()}, str(qa / "model.safetensors"))
    with pytest.raises(checkpoint.CheckpointError, match="match_emb"):
        checkpoint.load(qa)


def test_exported_graph_computes_the_feature(tmp_path, spm_dir):
    ckpt = tiny_qa_checkpoint(tmp_path / "ckpt", spm_dir, "shallow", question_match=True)
    assert export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "onnx")]) == 0
    assert sc.Sidecar.load(tmp_path / "onnx").verification["passed"]
    sess = session(tmp_path / "onnx" / "model.onnx", threads=1)
    model = checkpoint.load(ckpt).model
    without = copy.deepcopy(model)
    with torch.no_grad():
        without.transformer.match_emb.zero_()
    tokenizer = XLNetTokenizer.from_dir(spm_dir)
    batch = sample_batches(tokenizer, shapes=[(2, 64)])[0]
    feeds = tuple(torch.from_numpy(batch[n]) for n in INPUT_NAMES)
    assert question_match(feeds[0], feeds[2], feeds[1]).sum() > 0
    got = sess.run(None, batch)[0]
    with torch.no_grad():
        want = QAInference(model)(*feeds)[0].numpy()
        plain = QAInference(without)(*feeds)[0].numpy()
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=1e-4)
    assert np.abs(got[real] - plain[real]).max() > 1e-2

"""The head registry (qa_core/heads.py) is the only list of QA heads: every other part reads it,
and every registered head builds, runs, exports and decodes through it."""

from __future__ import annotations

import ast

import pytest
import torch
from paths import REPO

from qa_core.contract import OUTPUT_NAMES
from qa_core.heads import HEADS, REGISTRY, head_spec
from train.model import XLNetConfig, XLNetForQuestionAnswering
from train.model.heads import HEAD_MODULES
from train.model.inference import QAInference

# Where heads are named one by one: the registry itself, and each head's modules.
HOMES = {"qa_core/heads.py", "train/model/heads.py"}


def literals_naming_heads(path) -> list[int]:
    """Lines of tuple/list/set/dict literals that name two or more heads (a second list of heads)."""
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, ast.Dict | ast.Tuple | ast.List | ast.Set) or items is None:
            continue
        names = [
            i.value.removeprefix("qa:")
            for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str)
        ]
        named = {n for n in names if n in HEADS}
        if len(named) >= 2:
            lines.append(node.lineno)
    return lines


def test_no_other_module_lists_the_heads() -> None:
    found = {}
    for room in ("qa_core", "train", "export", "server", "clients", "bench"):
        for path in sorted((REPO / room).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel not in HOMES and (lines := literals_naming_heads(path)):
                found[rel] = lines
    assert not found, f"heads listed outside the registry (read qa_core.heads instead): {found}"


def test_every_registered_head_has_modules_and_the_contract_reads_the_registry() -> None:
    assert set(HEAD_MODULES) == set(REGISTRY)
    assert {h: s.outputs for h, s in REGISTRY.items()} == OUTPUT_NAMES
    with pytest.raises(ValueError, match="unknown head 'nope'; choose one of"):
        head_spec("nope")


@pytest.mark.parametrize("head", HEADS)
def test_each_head_runs_and_exports_the_registry_outputs(head: str) -> None:
    torch.manual_seed(0)
    cfg = XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32, dropout=0.0)
    model = XLNetForQuestionAnswering(cfg, head=head)
    ids = torch.randint(10, 50, (2, 12))
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    types[:, -1] = 2
    outputs = QAInference(model)(ids, torch.ones_like(ids), types)
    spec = head_spec(head)
    assert len(outputs) == len(spec.outputs)
    for name, value in zip(spec.outputs, outputs, strict=True):
        assert value.shape[0] == 2, name
        assert (value.dim() == 2) == (name != "cls_logits"), name
    for name in HEAD_MODULES[head].span_scorers:  # the named parameters exist on the model
        assert name in dict(model.named_parameters())

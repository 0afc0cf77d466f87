"""Question-answering heads on the content stream and the QA model that wears them.

- simple:  one Linear(d, 2) for start/end (HF `XLNetForQuestionAnsweringSimple` weights load here).
- shallow: start/end/answerability each one Linear(d, 1); answerability reads `<cls>`.
- deep:    MLPs start/end d->512->384->1, answerability d->256->1 (CS224N/CS293S project heads).
- beam:    the original XLNet head (HF `XLNetForQuestionAnswering` weights load here): end logits
           conditioned on the start token, top-k beam inside the model at inference, answer class on
           the start-probability-weighted state and `<cls>`.

`cls_logits` is always the logit that the question is UNANSWERABLE. Unlike HF, whose beam outputs
named `*_log_probs` are softmax probabilities, ours are true log-probabilities (log_softmax).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from qa_core.contract import SEG_ID_CLS
from qa_core.heads import HEADS, head_spec
from train.model.config import XLNetConfig
from train.model.layers import activation
from train.model.xlnet import XLNetModel, init_weights


@dataclass
class QAOutput:
    start_logits: torch.Tensor | None = None  # [B, T]
    end_logits: torch.Tensor | None = None  # [B, T] (beam head: only in training, for the gold start)
    cls_logits: torch.Tensor | None = None  # [B] logit of "unanswerable"
    loss: torch.Tensor | None = None
    start_top_log_probs: torch.Tensor | None = None  # [B, k1]        (beam head, inference)
    start_top_index: torch.Tensor | None = None  # [B, k1]
    end_top_log_probs: torch.Tensor | None = None  # [B, k1 * k2]   (start-major: start i, end j at i*k2+j)
    end_top_index: torch.Tensor | None = None  # [B, k1 * k2]
    mems: list[torch.Tensor] | None = None


def apply_p_mask(logits: torch.Tensor, p_mask: torch.Tensor | None) -> torch.Tensor:
    """Positions that cannot be an answer get a huge negative logit (same formula as the original)."""
    if p_mask is None:
        return logits
    p_mask = p_mask.to(logits.dtype)
    big = 65500.0 if logits.dtype == torch.float16 else 1e30
    return logits * (1 - p_mask) - big * p_mask


def gather_positions(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, D], index [B] -> [B, D]."""
    return hidden.gather(1, index[:, None, None].expand(-1, 1, hidden.shape[-1])).squeeze(1)


def find_cls_index(token_type_ids: torch.Tensor | None, seq_len: int, batch: int, device) -> torch.Tensor:
    """`<cls>` is the token with segment id 2 (at the end of the real tokens, before right padding)."""
    if token_type_ids is None:
        return torch.full((batch,), seq_len - 1, dtype=torch.long, device=device)
    return (token_type_ids == SEG_ID_CLS).long().argmax(dim=1)


class PoolerStartLogits(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d, 1)

    def forward(self, hidden: torch.Tensor, p_mask: torch.Tensor | None = None) -> torch.Tensor:
        return apply_p_mask(self.dense(hidden).squeeze(-1), p_mask)


class PoolerEndLogits(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.dense_0 = nn.Linear(2 * d, d)
        self.LayerNorm = nn.LayerNorm(d, eps=eps)
        self.dense_1 = nn.Linear(d, 1)

    def forward(self, hidden: torch.Tensor, start_states: torch.Tensor, p_mask=None) -> torch.Tensor:
        x = self.LayerNorm(torch.tanh(self.dense_0(torch.cat([hidden, start_states], dim=-1))))
        return apply_p_mask(self.dense_1(x).squeeze(-1), p_mask)


class PoolerAnswerClass(nn.Module):
    """Answerability logit from a start representation and `<cls>`: dense -> tanh -> dropout -> dense.

    The dropout after tanh is the original's (function_builder.py, scope answer_class); HF has none,
    so `dropout=0` gives HF's module.
    """

    def __init__(self, d: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dense_0 = nn.Linear(2 * d, d)
        self.dropout = nn.Dropout(dropout)
        self.dense_1 = nn.Linear(d, 1, bias=False)

    def forward(self, start_states: torch.Tensor, cls_states: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense_0(torch.cat([start_states, cls_states], dim=-1)))
        return self.dense_1(self.dropout(x)).squeeze(-1)


def expected_start_state(hidden: torch.Tensor, start_probs: torch.Tensor) -> torch.Tensor:
    """sum_t p_t * hidden_t for the start probabilities p (softmax of the masked start logits):
    [B, T, D], [B, T] -> [B, D]."""
    return (start_probs[:, None] @ hidden).squeeze(1)


def mlp(sizes: list[int], act_name: str, dropout: float) -> nn.Sequential:
    act = activation(act_name)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers += [Lambda(act), nn.Dropout(dropout)]
    return nn.Sequential(*layers)


class Lambda(nn.Module):
    """Wrap a stateless function so it can sit inside nn.Sequential."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def qa_loss(start_logits, end_logits, start_positions, end_positions, cls_logits=None, is_impossible=None):
    """(CE_start + CE_end) / 2 + 0.5 * BCE(answerability), as the original recipe."""
    loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
    if cls_logits is not None and is_impossible is not None:
        loss = loss + 0.5 * F.binary_cross_entropy_with_logits(cls_logits, is_impossible.to(cls_logits.dtype))
    return loss


def _build_simple(model: nn.Module, config: XLNetConfig) -> None:
    model.qa_outputs = nn.Linear(config.d_model, 2)


def _build_shallow(model: nn.Module, config: XLNetConfig) -> None:
    d = config.d_model
    model.start_head = nn.Linear(d, 1)
    model.end_head = nn.Linear(d, 1)
    model.cls_head = nn.Linear(d, 1)


def _build_deep(model: nn.Module, config: XLNetConfig) -> None:
    d, act, p = config.d_model, config.ff_activation, config.dropout
    model.start_head = mlp([d, 512, 384, 1], act, p)
    model.end_head = mlp([d, 512, 384, 1], act, p)
    model.cls_head = mlp([d, 256, 1], act, p)


def _build_beam(model: nn.Module, config: XLNetConfig) -> None:
    d = config.d_model
    model.start_logits = PoolerStartLogits(d)
    model.end_logits = PoolerEndLogits(d, config.layer_norm_eps)
    original = config.answer_class_input == "softmax_start"
    model.answer_class = PoolerAnswerClass(d, dropout=config.dropout if original else 0.0)


@dataclass(frozen=True)
class HeadModules:
    """How one registered head is built on the QA model. Its modules are attributes of the model, so
    their names are the state-dict names (HF's for simple and beam) and checkpoints load unchanged; how
    the outputs are computed follows the head's decoder in the registry (qa_core/heads.py)."""

    build: Callable[[nn.Module, XLNetConfig], None]
    span_scorers: tuple[str, ...]  # parameters of the last projections that produce start and end scores


HEAD_MODULES: dict[str, HeadModules] = {
    "simple": HeadModules(_build_simple, ("qa_outputs.weight", "qa_outputs.bias")),
    "shallow": HeadModules(
        _build_shallow, ("start_head.weight", "start_head.bias", "end_head.weight", "end_head.bias")
    ),
    "deep": HeadModules(
        _build_deep, ("start_head.6.weight", "start_head.6.bias", "end_head.6.weight", "end_head.6.bias")
    ),
    "beam": HeadModules(
        _build_beam,
        (
            "start_logits.dense.weight",
            "start_logits.dense.bias",
            "end_logits.dense_1.weight",
            "end_logits.dense_1.bias",
        ),
    ),
}
if set(HEAD_MODULES) != set(HEADS):
    raise ImportError(f"heads registered {HEADS} but built {tuple(HEAD_MODULES)}: each needs both")


class XLNetForQuestionAnswering(nn.Module):
    """Backbone + one of the registered heads; state-dict names match HF for simple and beam."""

    # The head's modules, which its builder in HEAD_MODULES sets (only those of the chosen head exist).
    qa_outputs: nn.Linear
    start_head: nn.Module
    end_head: nn.Module
    cls_head: nn.Module
    start_logits: PoolerStartLogits
    end_logits: PoolerEndLogits
    answer_class: PoolerAnswerClass

    def __init__(self, config: XLNetConfig, head: str = "simple") -> None:
        super().__init__()
        self.spec = head_spec(head)
        config = config.for_finetuning()
        self.config = config
        self.head = head
        self.transformer = XLNetModel(config)
        HEAD_MODULES[head].build(self, config)
        for name, module in self.named_children():
            if name != "transformer":
                module.apply(lambda m: init_weights(m, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        p_mask: torch.Tensor | None = None,
        cls_index: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        is_impossible: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
        use_mems: bool = False,
    ) -> QAOutput:
        out = self.transformer(
            input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            mems=mems,
            use_mems=use_mems,
        )
        hidden = out.last_hidden_state
        bsz, seq_len, _ = hidden.shape
        if cls_index is None:
            cls_index = find_cls_index(token_type_ids, seq_len, bsz, hidden.device)
        training = start_positions is not None and end_positions is not None
        if self.spec.decoder == "beam":
            result = self._beam(
                hidden, p_mask, cls_index, start_positions, end_positions, is_impossible, training
            )
        else:
            result = self._per_token(hidden, p_mask, cls_index)
            if training:
                result.loss = qa_loss(
                    result.start_logits,
                    result.end_logits,
                    start_positions,
                    end_positions,
                    result.cls_logits,
                    is_impossible,
                )
        result.mems = out.mems
        return result

    def _per_token(self, hidden, p_mask, cls_index) -> QAOutput:
        if not self.spec.has_answerability_output:
            start, end = self.qa_outputs(hidden).unbind(-1)
            return QAOutput(start_logits=apply_p_mask(start, p_mask), end_logits=apply_p_mask(end, p_mask))
        start = apply_p_mask(self.start_head(hidden).squeeze(-1), p_mask)
        end = apply_p_mask(self.end_head(hidden).squeeze(-1), p_mask)
        cls_logits = self.cls_head(gather_positions(hidden, cls_index)).squeeze(-1)
        return QAOutput(start_logits=start, end_logits=end, cls_logits=cls_logits)

    def _beam(
        self, hidden, p_mask, cls_index, start_positions, end_positions, is_impossible, training
    ) -> QAOutput:
        start_logits = self.start_logits(hidden, p_mask)
        cls_states = gather_positions(hidden, cls_index)
        if training:
            start_states = gather_positions(hidden, start_positions)
            end_logits = self.end_logits(hidden, start_states[:, None].expand_as(hidden), p_mask)
            if self.config.answer_class_input == "gold_start":
                cls_logits = self.answer_class(start_states, cls_states)
            else:
                start_probs = F.softmax(start_logits, dim=-1)
                cls_logits = self.answer_class(expected_start_state(hidden, start_probs), cls_states)
            loss = qa_loss(
                start_logits, end_logits, start_positions, end_positions, cls_logits, is_impossible
            )
            return QAOutput(
                start_logits=start_logits, end_logits=end_logits, cls_logits=cls_logits, loss=loss
            )
        k1, k2 = self.config.start_n_top, self.config.end_n_top
        bsz, seq_len, d = hidden.shape
        start_log_probs = F.log_softmax(start_logits, dim=-1)
        start_top_log_probs, start_top_index = torch.topk(start_log_probs, k1, dim=-1)
        start_states = hidden.gather(1, start_top_index[:, :, None].expand(-1, -1, d))  # [B, k1, D]
        hidden_exp = hidden[:, None].expand(-1, k1, -1, -1)  # [B, k1, T, D]
        end_logits = self.end_logits(
            hidden_exp,
            start_states[:, :, None].expand_as(hidden_exp),
            p_mask[:, None] if p_mask is not None else None,
        )  # [B, k1, T]
        end_log_probs = F.log_softmax(end_logits, dim=-1)
        end_top_log_probs, end_top_index = torch.topk(end_log_probs, k2, dim=-1)  # [B, k1, k2]
        cls_logits = self.answer_class(expected_start_state(hidden, start_log_probs.exp()), cls_states)
        return QAOutput(
            start_logits=start_logits,
            cls_logits=cls_logits,
            start_top_log_probs=start_top_log_probs,
            start_top_index=start_top_index,
            end_top_log_probs=end_top_log_probs.reshape(bsz, k1 * k2),
            end_top_index=end_top_index.reshape(bsz, k1 * k2),
        )

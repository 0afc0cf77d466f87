"""XLNet in PyTorch: config, backbone (two streams + memory), LM head and QA heads."""

from qa_core.heads import HEADS
from train.model.config import ACTIVATIONS, PRESETS, XLNetConfig
from train.model.heads import QAOutput, XLNetForQuestionAnswering
from train.model.xlnet import XLNetLMHeadModel, XLNetLMOutput, XLNetModel, XLNetModelOutput

__all__ = [
    "ACTIVATIONS",
    "HEADS",
    "PRESETS",
    "QAOutput",
    "XLNetConfig",
    "XLNetForQuestionAnswering",
    "XLNetLMHeadModel",
    "XLNetLMOutput",
    "XLNetModel",
    "XLNetModelOutput",
]

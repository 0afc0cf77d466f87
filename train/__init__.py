"""xlnet-qa training package.

Importing `train` (or `train.tokenizer`, `train.squad`) must never import torch: the ONNX/TensorRT
server depends on those torch-free modules only. Torch lives in `train.model`, `train.model.checkpoint` and
the CLIs.
"""

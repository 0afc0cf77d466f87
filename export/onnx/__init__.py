"""ONNX export: trace, verify against PyTorch, optimise, quantise; ``python -m export.onnx``."""

"""Triton model repositories (``python -m export.triton``): config.pbtxt and the model folder layout."""

"""The serving core: what both training and serving run to turn a question and a context into an answer.

The model-file contract and :class:`~qa_core.contract.ModelSettings` (:mod:`.contract`, :mod:`.heads`),
the tokenizer (:mod:`.tokenizer`), windows, decoding, re-ranking and the answerability rule
(:mod:`.squad`), text rules and digests, and the onnxruntime sessions with their provider checks
(:mod:`.runtime`). It is the ground floor: train/, export/ and server/ import it, it imports none of them,
nor torch, FastAPI or a command (import contracts in pyproject.toml keep it so).
"""

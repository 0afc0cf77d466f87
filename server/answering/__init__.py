"""Answering: one request's path from text to answers. The host path (tokenize, windows, decode), the
context cache, the micro-batcher and its scheduling policy, the served model's spec and lifecycle."""

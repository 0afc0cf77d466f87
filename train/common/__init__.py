"""Torch-free foundations every part of the product reads: the contract (token ids, input/output names,
inference defaults), the shipped sample's paths, text rules, raw corpora, digests, atomic directories and
the CLI error convention."""

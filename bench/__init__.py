"""Benchmarks that print Markdown tables (results in BENCHMARKS.md)."""

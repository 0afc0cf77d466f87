"""Watching the server: Prometheus metrics (and their own port), the access log, log formats, request
ids and the ``Server-Timing`` stage clock."""

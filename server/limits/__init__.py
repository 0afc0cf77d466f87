"""Per-key and per-address limits: token buckets and quotas in the process or in Redis, and the breaker
that lets the server do without a sick store."""

"""`sparkctl dashboard`: one live web page (and /metrics) for the whole cluster (docs/dashboard.md)."""

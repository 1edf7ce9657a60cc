"""The HarmonAIze controller: ingest, cluster state, redaction and tenant feeds."""

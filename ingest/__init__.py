"""Raw traces -> the Parquet activity tables of a store (docs/architecture.md, ingest)."""

"""Raw traces -> the Parquet activity tables of a store (docs/architecture.md, ingest)."""

from pathlib import Path

# The store folder commands use unless told otherwise (here, where importing it costs nothing:
# the CLI names it in its options before anything heavy is imported).
DEFAULT_STORE = Path(".daydream")

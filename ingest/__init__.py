"""Raw traces -> the Parquet activity tables of a store (docs/architecture.md, ingest)."""

from pathlib import Path

# The store folder commands use unless told otherwise (here, where importing it costs nothing:
# the CLI names it in its options before anything heavy is imported).
DEFAULT_STORE = Path(".daydream")

# The activity store's layout, here where a reader of the store imports it without pyarrow
# (ingest.schema, which declares the tables' Arrow types, re-exports them): the schema version
# every table's file carries, and the order tables are committed to the store, ``trace`` last,
# so a trace is visible only once all of its tables are in place.
SCHEMA_VERSION = 1
VERSION_KEY = "daydream.schema_version"  # the footer key each table's file carries it under
COMMIT_ORDER = ("kernel", "memcpy", "memset", "api", "sync", "range", "flow", "trace")

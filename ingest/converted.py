"""What a reader hands to the store: the activity tables of one trace plus its trace-level facts."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from daydream.ingest.stats import Stats


@dataclass
class Converted:
    """One trace, read. ``tables`` holds every activity table except ``trace``, each already
    conformed to its declared schema (``ingest.schema.conform``)."""

    source_format: str
    source_version: str | None
    events: int
    tables: dict[str, pa.Table]
    stats: Stats = field(default_factory=Stats)
    devices: list[dict] | None = None
    rank: int | None = None
    world_size: int | None = None
    metadata: dict = field(default_factory=dict)
    start_ns: int | None = None  # earliest activity start
    end_ns: int | None = None    # latest activity end

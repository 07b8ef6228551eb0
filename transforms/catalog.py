"""What ``daydream opts`` lists, without importing the optimizations: importing them (polars,
pyarrow, duckdb and the models) was 1.5 s of the command's 1.8 s.

opts/catalog.json holds ``registry.list_opts()`` and a digest of the sources it was made from
(the registry and every module of transforms/opts). A catalog whose digest does not match the
sources is not used: the listing then comes from the registry, slower but right.
``python -m daydream.transforms.catalog`` rewrites it; tests/transforms/test_catalog.py fails
until it is rewritten, and checks that it says what the registry says.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
CATALOG = HERE / "opts" / "catalog.json"


def digest() -> str:
    """Of the sources the listing is made from, file names included (a module added or
    removed changes it too)."""
    h = hashlib.sha256()
    for f in [HERE / "registry.py", *sorted((HERE / "opts").glob("*.py"))]:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def stored() -> list[dict] | None:
    """The catalog's listing where it was made from the sources as they are; else None."""
    try:
        d = json.loads(CATALOG.read_bytes())
    except (OSError, ValueError):
        return None
    return d["opts"] if d.get("digest") == digest() else None


def listing() -> list[dict]:
    """Every optimization as ``registry.list_opts()`` lists it (name, signature, parameters,
    summary, doc, example): from the catalog when it is current."""
    got = stored()
    if got is not None:
        return got
    from daydream.transforms.registry import list_opts
    return list_opts()


def write() -> Path:
    """The catalog, made again from the registry."""
    from daydream.transforms.registry import list_opts
    text = json.dumps({"digest": digest(), "opts": list_opts()}, indent=1, ensure_ascii=False)
    CATALOG.write_text(text + "\n", encoding="utf-8")
    return CATALOG


if __name__ == "__main__":
    print(write())

"""transforms/opts/catalog.json, what `daydream opts` lists without importing the
optimizations, says what the registry says, and is rewritten when their sources change."""

from __future__ import annotations

from daydream.transforms import catalog
from daydream.transforms.registry import list_opts


def test_the_catalog_is_current_and_says_what_the_registry_says():
    got = catalog.stored()
    assert got is not None, ("transforms/opts/catalog.json was made from other sources: run "
                             "`python -m daydream.transforms.catalog`")
    assert got == list_opts()


def test_a_catalog_of_other_sources_is_not_used(tmp_path, monkeypatch):
    stale = tmp_path / "catalog.json"
    stale.write_text('{"digest": "0", "opts": [{"name": "gone"}]}')
    monkeypatch.setattr(catalog, "CATALOG", stale)
    assert catalog.stored() is None
    assert catalog.listing() == list_opts()
    monkeypatch.setattr(catalog, "CATALOG", tmp_path / "none.json")
    assert catalog.listing() == list_opts()

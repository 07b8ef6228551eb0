"""Counters of what ingest had to repair, skip or noticed, each with a severity.

Recoverable oddities are never dropped silently: a reader counts them here and they end up in
the ``stats`` column of the ``trace`` table, where ``daydream info`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("info", "warning", "error")


@dataclass
class Stat:
    name: str
    severity: str
    count: int = 0
    detail: str = ""


@dataclass
class Stats:
    items: dict[str, Stat] = field(default_factory=dict)

    def add(self, name: str, count: int = 1, *, severity: str = "warning",
            detail: str = "") -> None:
        """Count ``count`` occurrences of ``name``; zero counts are not recorded."""
        if severity not in SEVERITIES:
            raise ValueError(f"unknown severity {severity!r}")
        count = int(count)
        if count <= 0:
            return
        st = self.items.get(name)
        if st is None:
            self.items[name] = Stat(name, severity, count, detail)
        else:
            st.count += count
            if detail and not st.detail:
                st.detail = detail

    def get(self, name: str) -> int:
        st = self.items.get(name)
        return st.count if st else 0

    def rows(self) -> list[dict]:
        return [{"name": s.name, "severity": s.severity, "count": s.count, "detail": s.detail}
                for s in sorted(self.items.values(), key=lambda s: s.name)]

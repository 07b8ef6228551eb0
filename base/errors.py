"""The one exception type the project raises for bad input or misuse.

Library code raises ``DaydreamError`` with the fields a user needs to find the problem (file,
record, field); the CLI prints ``error: <message>`` and exits 1 with no traceback.
"""

from __future__ import annotations


class DaydreamError(Exception):
    """A problem the user can fix: bad input, bad arguments, a busy store."""

    def __init__(self, message: str, *, file: str | None = None, record: int | None = None,
                 field: str | None = None):
        self.file = file
        self.record = record
        self.field = field
        self.reason = message
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(str(self.file))
        if self.record is not None:
            parts.append(f"record {self.record}")
        if self.field is not None:
            parts.append(f"field {self.field}")
        parts.append(self.reason)
        return ": ".join(parts)


class TraceFormatError(DaydreamError):
    """The file is not a trace we can read, or is damaged."""

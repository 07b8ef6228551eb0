"""Daydream: how much faster would this training iteration be with optimization X?"""

from daydream.api import DaydreamError, info, ingest

__all__ = ["DaydreamError", "info", "ingest"]

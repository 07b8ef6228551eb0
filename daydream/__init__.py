"""Daydream: how much faster would this training iteration be with optimization X?"""

from daydream.api import DaydreamError, collect, collect_steps, info, ingest, predict, sql

__all__ = ["DaydreamError", "collect", "collect_steps", "info", "ingest", "predict", "sql"]

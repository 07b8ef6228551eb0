"""What every stage needs, below them all: the one error type (``errors``), the store's root
and layout with the process's DuckDB instance and Parquet writing (``store``), the worker
runner of batch work (``runner``), how a process that has done its work ends (``ending``) and
the loader of compiled kernels (``compiled``).

Imports go one way: base imports no stage; every stage may import base
(tests/test_layout.py reads the imports and fails otherwise).
"""

"""Kernels that numba compiles on first use (no ahead-of-time build: a plain `pip install`)
say so on stderr, with what was compiled and how long it took; loads from numba's cache say
nothing."""

from __future__ import annotations

import os
import subprocess
import sys

_MODULE = '''
import numpy as np
from daydream.base.compiled import helper, kernel

@helper()
def _twice(x):
    return 2 * x

@kernel("int64", "int64[::1]")
def total(a):
    s = 0
    for x in a:
        s += _twice(x)
    return s
'''

_RUN = "import numpy as np, firstuse; print(firstuse.total(np.arange(4, dtype=np.int64)))"


def _run(tmp_path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path), **env},
                          check=True)


def test_first_use_compile_is_announced_once(tmp_path):
    (tmp_path / "firstuse.py").write_text(_MODULE)
    env = {"DAYDREAM_JIT": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    first = _run(tmp_path, env)
    assert first.stdout.strip() == "12"
    assert "numba is compiling the kernels this command needs" in first.stderr
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("daydream: numba compiled 1 kernel (firstuse 1) in "), last
    assert last.endswith(" s")
    again = _run(tmp_path, env)  # from numba's cache now: nothing compiled, nothing said
    assert again.stdout.strip() == "12"
    assert "numba" not in again.stderr

"""What the collector loads inside the user's training process: what writing CUPTI records
needs (the format of ingest.cupti_format, numpy, orjson), never the reader's packages. Run in a
fresh interpreter, which imports what sitecustomize and ``collect.cli.start_from_env`` do and
writes a raw file, then lists what it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

# Loaded by reading traces, never by collecting them.
READER_ONLY = ("daydream.ingest.source", "daydream.ingest.cupti_raw", "isal", "pyarrow",
               "numba", "duckdb", "polars")

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from daydream.collect import api, cli, cupti_backend, demangle, markers, recorder, records
    from daydream.collect.writer import RawWriter
    from daydream.ingest import cupti_format as fmt

    # the writing path: a header, a layout, names, records, meta, the end
    w = RawWriter(sys.argv[1], {"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION})
    layout = w.layout(fmt.MARKER_STRUCT, fmt.MARKER_DTYPE, fmt.MARKER_STRINGS)
    w.names(0, ["step"])
    w.records(layout, np.zeros(2, fmt.MARKER_DTYPE))
    w.meta({"dropped_records": 0})
    w.close({})
    with open(sys.argv[1], "rb") as f:
        assert f.read(len(fmt.MAGIC)) == fmt.MAGIC
    print(json.dumps(sorted(sys.modules)))
""")


def test_collector_loads_no_reader(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "t.ddcupti")],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "daydream.collect.cli" in loaded and "daydream.ingest.cupti_format" in loaded
    bad = [m for m in loaded if m in READER_ONLY or m.split(".")[0] in READER_ONLY]
    assert not bad, f"the collector loaded the reader's modules: {bad}"

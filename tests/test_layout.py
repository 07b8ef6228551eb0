"""The installed layout: one top-level import name, ``daydream``, with every stage beneath it;
imports between the stages going one way; and a user's own modules named like a stage
breaking no command."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT

# Each folder of the repository, the name it is installed under, and the stages it may import
# (DESIGN.md: data flows ingest -> graphstore -> transforms -> simulate; base is below them
# all; the collector writes what ingest reads; the daydream package chains them).
LAYERS = {
    "base": set(),
    "ingest": {"base"},
    "collect": {"base", "ingest"},
    "graphstore": {"base", "ingest"},
    "transforms": {"base", "ingest", "graphstore"},
    "simulate": {"base", "ingest", "graphstore", "transforms"},
    "daydream": {"base", "ingest", "collect", "graphstore", "transforms", "simulate"},
}
STAGES = set(LAYERS) - {"daydream"}
SMALL = DATA / "kineto" / "resnet50_v100_nw0_run1.json.gz"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, and of every string constant handed
    to importlib.import_module (an import all the same)."""
    out = []
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            out += [(n.lineno, n.module)] + [(n.lineno, f"{n.module}.{a.name}") for a in n.names]
        elif isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "import_module" \
                and n.args:
            a = n.args[0]
            text = a.value if isinstance(a, ast.Constant) else (
                a.values[0].value if isinstance(a, ast.JoinedStr) and a.values
                and isinstance(a.values[0], ast.Constant) else None)
            if isinstance(text, str):
                out.append((n.lineno, text.rstrip(".")))
    return out


def _stage(module: str) -> str | None:
    """The stage a module belongs to (``daydream`` for the package's own modules), or None
    for a module that is not ours."""
    parts = module.split(".")
    if parts[0] != "daydream":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else "daydream"


def test_imports_between_the_stages_go_one_way():
    wrong = []
    for folder, allowed in LAYERS.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            for line, module in _imports(f):
                if module.split(".")[0] in STAGES:
                    wrong.append(f"{f.relative_to(ROOT)}:{line}: imports {module!r} by its bare "
                                 "name (it is installed as daydream." + module + ")")
                    continue
                stage = _stage(module)
                if stage is not None and stage != folder and stage not in allowed:
                    wrong.append(f"{f.relative_to(ROOT)}:{line}: {folder} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_tests_and_benchmarks_import_stages_by_the_installed_name():
    wrong = [f"{f.relative_to(ROOT)}:{line}: {module}"
             for d in ("tests", "bench") for f in sorted((ROOT / d).rglob("*.py"))
             for line, module in _imports(f) if module.split(".")[0] in STAGES]
    assert not wrong, "\n".join(wrong)


def test_the_layering_rule_catches_an_upward_import(tmp_path):
    """The rule above, on a hand-made module: base importing a stage is caught."""
    f = tmp_path / "m.py"
    f.write_text("import importlib\nfrom daydream.ingest import store\n"
                 "importlib.import_module(f'daydream.graphstore.{x}')\nimport ingest\n")
    found = [(line, _stage(m), m.split(".")[0] in STAGES) for line, m in _imports(f)]
    assert (2, "ingest", False) in found and (3, "graphstore", False) in found
    assert (4, None, True) in found
    assert "ingest" not in LAYERS["base"] and "graphstore" not in LAYERS["base"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy of the sources: setuptools writes its build/ folder beside them
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv*", ".git", "build", ".daydream*", "__pycache__", "*.so", "*.stamp", "tests",
        "docs", "bench", ".pytest_cache", ".ruff_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(out), str(src)],
                   check=True, capture_output=True, cwd=out)
    (whl,) = out.glob("daydream-*.whl")
    return zipfile.ZipFile(whl)


def test_the_distribution_installs_one_top_level_package(wheel):
    names = wheel.namelist()
    info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(info).decode().split() == ["daydream"]
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"daydream"}
    for stage in STAGES:
        assert f"daydream/{stage}/__init__.py" in names
    # the data files that travel with the stages
    assert "daydream/collect/_site/sitecustomize.py" in names
    assert "daydream/transforms/opts/catalog.json" in names


def _shadows(folder: Path) -> None:
    """A module named like each stage, and like the package's own modules users might have,
    that raises when imported."""
    for name in (*STAGES, "cli", "pipeline"):
        (folder / f"{name}.py").write_text(f"raise RuntimeError('the user\\'s {name}.py')\n")


@pytest.mark.parametrize("how", ["working folder", "PYTHONPATH"])
def test_a_users_modules_named_like_a_stage_break_no_command(tmp_path, how):
    """A training repository with its own transforms.py (torchvision's reference scripts have
    one) or ingest.py, in the working folder or on sys.path: daydream opts, ingest and
    predict run as anywhere else."""
    user = tmp_path / "user"
    user.mkdir()
    _shadows(user)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if how == "PYTHONPATH":
        env["PYTHONPATH"] = str(user)
    # ``python -m`` puts the working folder first on sys.path, as a user's shell would
    cmd = [sys.executable, "-m", "daydream"]
    store = str(tmp_path / "store")
    opts = subprocess.run([*cmd, "opts"], cwd=user, env=env, capture_output=True, text=True)
    assert opts.returncode == 0, opts.stderr
    assert "amp" in opts.stdout
    pred = subprocess.run([*cmd, "predict", str(SMALL), "--opt", "amp", "--store", store,
                           "--json"], cwd=user, env=env, capture_output=True, text=True)
    assert pred.returncode == 0, pred.stderr
    assert '"predicted_ms"' in pred.stdout
    assert "the user's" not in pred.stderr + opts.stderr

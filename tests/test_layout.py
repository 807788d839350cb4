"""The package's import structure (architecture issue): imports point down the layers declared in
pyproject.toml (import-linter's contract, which also forbids cycles between layers), and no
private name (``_x``) is imported from another module - only private *modules* are."""
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "entangle_ext"


def test_imports_follow_the_declared_layers():
    pytest.importorskip("importlinter")
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("lint-imports is not installed beside this Python")
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "0 broken" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


def _is_module(pkg_dir: Path, name: str) -> bool:
    return (pkg_dir / f"{name}.py").exists() or (pkg_dir / name / "__init__.py").exists()


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level > 0):
                continue
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*node.module.split(".")) if node.module else base
            for alias in node.names:
                n = alias.name
                if n.startswith("_") and not n.startswith("__") and not _is_module(target, n):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {n} from {node.module or '.'}")
    assert bad == [], "\n".join(bad)


OPERATORS = ("wasserstein", "augmented_lagrangian", "projection")


@pytest.mark.parametrize("op", OPERATORS)
def test_each_operator_shares_one_stem(op):
    """wrapper, argument helper, reference, C++ header, CPU and CUDA sources and tests of one
    operator are found by one name."""
    paths = [PKG / f"{op}.py", PKG / f"_{op}_args.py", PKG / "reference" / f"{op}.py",
             ROOT / "csrc" / f"{op}.h", ROOT / "csrc" / "cpu" / f"{op}.cpp", ROOT / "csrc" / "cuda" / f"{op}.cu"]
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert missing == [], missing
    assert list((ROOT / "tests").rglob(f"test_{op}*.py")), f"no tests/**/test_{op}*.py"


def test_each_operator_argument_module_is_named_after_its_operator():
    args = sorted(p.stem for p in PKG.glob("_*_args.py"))
    assert args == sorted(f"_{op}_args" for op in OPERATORS), args


def test_every_method_is_an_ordinary_method():
    """The two-stage family plugs in like any baseline: no ``.two_stage`` class flag and no second
    run lifecycle (the old driver.py / methods/runner.py)."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in PKG.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.two_stage\b", line)]
    assert hits == [], hits
    for gone in ("unlearn/driver.py", "methods/runner.py", "methods/ablations.py", "unlearn/method_run.py"):
        assert not (PKG / gone).exists(), gone

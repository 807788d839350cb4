"""The package's import structure (architecture issue): imports point down the layers declared in
pyproject.toml (import-linter's contract, which also forbids cycles between layers), and no
private name (``_x``) is imported from another module - only private *modules* are."""
import ast
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

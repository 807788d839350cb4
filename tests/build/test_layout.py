"""The package's structure (architecture issue): imports point down the layers declared in
pyproject.toml (import-linter's contract, which also forbids cycles between layers), no private
name (``_x``) is imported from another module - only private *modules* are -, one stem per operator,
tests in folders that mirror the package, files <= 400 lines and functions <= 60 lines of code."""
import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
from _support import REPO_ROOT

ROOT = REPO_ROOT
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


def _relative_imports(path: Path):
    """(node, the folder or module path it imports from) for each relative ``from . import`` of
    ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            yield node, base.joinpath(*node.module.split(".")) if node.module else base


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for path in PKG.rglob("*.py"):
        for node, target in _relative_imports(path):
            for alias in node.names:
                n = alias.name
                if n.startswith("_") and not n.startswith("__") and not _is_module(target, n):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {n} from {node.module or '.'}")
    assert bad == [], "\n".join(bad)


def test_internal_imports_name_the_defining_module():
    """A module imports a name from the module that defines it, not from a package's face
    (``from ..unlearn import Splits`` -> ``from ..unlearn.data import Splits``); only the
    ``__init__.py`` files, which are the faces, import from their modules."""
    bad = []
    for path in PKG.rglob("*.py"):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        for node, target in _relative_imports(path):
            if (target / "__init__.py").exists():
                names = [a.name for a in node.names if not _is_module(target, a.name)]
                if names:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {names} from the package {node.module}")
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
    assert list((ROOT / "tests" / "ops").glob(f"test_{op}*.py")), f"no tests/ops/test_{op}*.py"


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


TEST_FOLDERS = {"ops", "unlearn", "methods", "settings", "compare", "cli", "build"}


def test_tests_mirror_the_package():
    """Every test file sits in one of the folders named after a part of the package (no
    ``tests/test_*.py`` at the top level), and no two share a basename (pytest's default import
    mode would refuse them)."""
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    files = list(tests.rglob("test_*.py"))
    assert {p.parent.name for p in files} <= TEST_FOLDERS, sorted({p.parent.name for p in files} - TEST_FOLDERS)
    names = [p.name for p in files]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


MAX_FILE_LINES, MAX_FUNCTION_CODE_LINES = 400, 60


def _code_lines(src: str, tree: ast.AST) -> set:
    """Line numbers holding code: not blank, not only a comment, not part of a docstring."""
    doc = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    code = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return code - doc


def test_files_and_functions_stay_small():
    """No Python file of the package over 400 lines; no function over 60 lines of code (blank
    lines, comments and docstrings not counted; a nested function counts in its parent too)."""
    long_files, long_functions = [], []
    for path in sorted(PKG.rglob("*.py")):
        src = path.read_text()
        rel = path.relative_to(ROOT)
        if len(src.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{rel}: {len(src.splitlines())} lines")
        tree = ast.parse(src)
        code = _code_lines(src, tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = sum(1 for line in code if node.lineno <= line <= node.end_lineno)
                if n > MAX_FUNCTION_CODE_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name}: {n} code lines")
    assert long_files == [] and long_functions == [], "\n".join(long_files + long_functions)


def test_the_size_rule_can_fail():
    """The counter sees a long function and ignores its docstring and comments."""
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    src = f'def f():\n    """doc\n    more doc"""\n    # a comment\n\n{body}\n'
    tree = ast.parse(src)
    fn = tree.body[0]
    code = _code_lines(src, tree)
    assert sum(1 for line in code if fn.lineno <= line <= fn.end_lineno) == 62   # def line + 61 statements

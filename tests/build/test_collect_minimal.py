"""The test suite collects in an environment with only the package's runtime dependencies, pytest
and hypothesis (the GPU image, for instance, has no POT).

A subprocess blocks every installed third-party module that is not needed by torch, numpy, pytest,
hypothesis or entangle_ext's declared runtime dependencies (pyproject.toml), transitively, and runs
``pytest --collect-only`` on tests/. Optional packages (POT, scikit-learn, scipy, torchvision,
transformers, ...) must be ``pytest.importorskip``ed inside the tests that need them.
"""
import json
import os
import subprocess
import sys
import textwrap
from _support import REPO_ROOT

ROOT = REPO_ROOT

# Runs in the subprocess: compute the allowed distributions, block every other top-level module,
# check the block works, then collect.
_BOOTSTRAP = textwrap.dedent(r"""
    import importlib.metadata as md, json, re, sys
    from packaging.requirements import Requirement

    def canon(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    def closure(roots):
        seen, todo = set(), [canon(r) for r in roots]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            try:
                reqs = md.requires(name) or []
            except md.PackageNotFoundError:
                continue
            for line in reqs:
                req = Requirement(line)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    todo.append(canon(req.name))
        return seen

    roots = json.loads(sys.argv[1])
    allowed = closure(roots + ["torch", "numpy", "pytest", "hypothesis", "entangle_ext"])
    blocked = sorted(top for top, dists in md.packages_distributions().items()
                     if not top.startswith("_") and top not in sys.modules
                     and not any(canon(d) in allowed for d in dists))
    for top in blocked:
        sys.modules[top] = None   # `import top` (and top.sub) now raises ModuleNotFoundError
    for probe in ("ot", "sklearn", "scipy", "torchvision", "transformers"):
        if probe in blocked:
            try:
                __import__(probe)
            except ImportError:
                pass
            else:
                sys.exit(f"blocking {probe} did not work")
    print("BLOCKED", json.dumps(blocked), flush=True)
    import pytest
    sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"]))
""")


def _runtime_dependencies():
    """Names of [project].dependencies in pyproject.toml (version specifiers dropped)."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
        deps = tomllib.loads(text)["project"]["dependencies"]
    except ImportError:  # Python < 3.11: the one array we need, read by hand
        block = text.split("dependencies", 1)[1].split("[", 1)[1].split("]", 1)[0]
        deps = [d.strip().strip("\"'") for d in block.split(",") if d.strip()]
    from packaging.requirements import Requirement
    return [Requirement(d).name for d in deps]


def test_suite_collects_without_optional_packages():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"   # plugins of optional packages would be blocked
    proc = subprocess.run([sys.executable, "-c", _BOOTSTRAP, json.dumps(_runtime_dependencies())],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert "BLOCKED" in out, out[-4000:]
    blocked = json.loads(out.split("BLOCKED", 1)[1].splitlines()[0])
    assert "ot" in blocked or "ot" not in _installed_top_levels(), "POT is installed but was not blocked"
    errors = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
    rc = proc.returncode
    assert rc == 0 and not errors, (
        f"pytest --collect-only failed without the optional packages {blocked} (rc={rc}):\n"
        + "\n".join(errors) + "\n" + out[-3000:])
    assert " collected" in out or "tests collected" in out, out[-2000:]


def _installed_top_levels():
    import importlib.metadata as md
    return set(md.packages_distributions())

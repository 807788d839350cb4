"""One-screen summary of a scripts/gpu_check.sh run: summary.txt and summary.json.

Reads the step table (steps.tsv: name, rc, seconds, cap, group, note), each step's log and
env.txt from the work directory, and the benchmark JSON files from the result directory. Only
the standard library, so that it runs on any image. Benchmark targets (H200, ratios measured side
by side in the same run):

* W2^2 forward+backward vs the torch.sort composite: >= 5x at 64x512, 4096x128 and the ragged
  case, >= 3x at 1x2^20;
* projection: >= 70 % of the measured copy bandwidth at P = 11.2M and 125M for k = 2, >= 50 % for
  k = 8 (flat workloads);
* Stage-2 step of the driver vs the naive transcription on ResNet-18: >= 3x.

    python scripts/gpu_summary.py --work WORK_DIR --out OUT_DIR
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

W2_TARGETS = {"64x512": 5.0, "4096x128": 5.0, "ragged": 5.0, "1x1048576": 3.0}
PROJECTION_TARGETS = {2: 0.70, 8: 0.50}
PROJECTION_SIZES = (11.2e6, 125e6)
STAGE2_TARGET = 3.0

_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)")
_COLLECTED = re.compile(r"(\d+)(?:/(\d+))? tests? collected")
_PROGRESS = re.compile(r"^(?:\S+\.py )?([.FEsxX]+)\s*\[\s*\d+%\]$")
_SAN_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_SAN_FINDING = re.compile(r"^========= +(Invalid|Race|Uninitiali[sz]ed|Barrier|Program hit|.*[Hh]azard|"
                          r".*[Ee]rror:)")
_BUILD_WARNING = re.compile(r"(csrc/\S+?)[:(](\d+)\)?.*warning", re.IGNORECASE)


def read_steps(work: Path):
    steps = []
    table = work / "steps.tsv"
    for line in (table.read_text().splitlines() if table.exists() else []):
        f = line.split("\t") + [""] * 6
        steps.append(dict(name=f[0], rc=f[1], seconds=int(f[2] or 0), cap=int(f[3] or 0),
                          group=f[4], note=f[5]))
    return steps


def pytest_result(log: str):
    """Counts from pytest's final line; collect-only runs give {'collected': n}."""
    res = {}
    lines = [ln for ln in log.splitlines() if re.search(r" in [\d.]+s", ln)]
    if lines:
        last = lines[-1]
        for n, word in _COUNTS.findall(last):
            res[word.rstrip("s") if word.startswith(("error", "warning")) else word] = int(n)
        m = _COLLECTED.search(last)
        if m:
            res["collected"] = int(m.group(1))
    else:   # killed before the final line: count the progress characters (-q output)
        progress = [ln for ln in log.splitlines() if _PROGRESS.match(ln)]
        if progress:
            chars = "".join(_PROGRESS.match(ln).group(1) for ln in progress)
            res.update(passed=chars.count("."), failed=chars.count("F"), error=chars.count("E"),
                       skipped=chars.count("s"), incomplete_at=progress[-1].rsplit("[", 1)[1].strip(" ]"))
    res["failures"] = [ln.split(" - ")[0] for ln in log.splitlines()
                       if ln.startswith(("FAILED ", "ERROR "))][:8]
    if "Timeout (" in log and "most recent call first" in log:
        res["hard_timeout"] = True
    return res


def sanitizer_result(log: str):
    m = _SAN_SUMMARY.findall(log)
    findings = []
    for ln in log.splitlines():
        if _SAN_FINDING.match(ln) and ln not in findings:
            findings.append(ln.strip("= ").strip())
    return {"errors": int(m[-1]) if m else None, "findings": findings[:4],
            "pytest": pytest_result(log)}


def build_result(log: str):
    warnings = sorted({f"{m.group(1)}:{m.group(2)}" for m in _BUILD_WARNING.finditer(log)})
    return {"warnings_in_csrc": len(warnings), "warning_sites": warnings[:5]}


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rows(data):
    if isinstance(data, dict):
        for key in ("rows", "results"):
            if isinstance(data.get(key), list):
                return data[key]
    return data if isinstance(data, list) else []


def _check(name, value, target, fmt):
    ok = None if value is None else value >= target
    return dict(name=name, value=value, target=target, ok=ok, fmt=fmt)


def w2_checks(data):
    rows = {str(r.get("case", "")): r for r in _rows(data)}
    out = []
    for case, target in W2_TARGETS.items():
        row = next((r for c, r in rows.items() if c == case or (case == "ragged" and c.startswith("ragged"))), None)
        value = None if row is None else row.get("ratio", row.get("speedup"))   # bench_w2: "ratio"
        out.append(_check(f"W2 fwd+bwd {case}: speed-up vs composite", value, target, "x"))
    return out


def projection_checks(data):
    meta = data.get("meta", {}) if isinstance(data, dict) else {}
    out = []
    for k, target in PROJECTION_TARGETS.items():
        for size in PROJECTION_SIZES:
            value = None
            for r in _rows(data):
                flat = str(r.get("workload", "flat")).startswith("flat") or r.get("tensors") == 1
                if r.get("k") == k and flat and abs(float(r.get("P", 0)) - size) <= 0.01 * size:
                    frac = r.get("frac_of_copy", r.get("copy_fraction", r.get("fraction_of_copy")))
                    copy = r.get("copy_GBps", meta.get("copy_GBps"))
                    if frac is None and r.get("fused_GBps") and copy:
                        frac = r["fused_GBps"] / copy
                    value = frac
            out.append(_check(f"projection k={k} P={size / 1e6:g}M: fraction of copy bandwidth",
                              value, target, "%"))
    return out


def unlearn_checks(data):
    s2 = data.get("stage2", {}) if isinstance(data, dict) else {}
    return [_check("Stage-2 step: driver speed-up vs naive (ResNet-18)", s2.get("speedup"),
                   STAGE2_TARGET, "x")]


def read_env(work: Path):
    env = {}
    path = work / "env.txt"
    for line in (path.read_text().splitlines() if path.exists() else []):
        key, _, value = line.partition(":")
        if value and key.strip() not in env:
            env[key.strip()] = value.strip()
    return env


def _fmt_value(c):
    if c["value"] is None:
        return "n/a"
    return f"{100 * c['value']:.0f}%" if c["fmt"] == "%" else f"{c['value']:.2f}x"


def _fmt_target(c):
    if not c["target"]:
        return "-"
    return f">= {100 * c['target']:.0f}%" if c["fmt"] == "%" else f">= {c['target']:g}x"


def _step_result(step, log, out):
    if step["rc"] == "skip":
        return {"status": "skipped", "text": f"skipped ({step['note']})"}, {}
    status = "ok" if step["rc"] == "0" else ("timed out" if step["note"] == "timed out" else "FAILED")
    detail, text = {}, ""
    if step["name"].startswith("sanitizer_"):
        detail = sanitizer_result(log)
        text = f"{detail['errors']} errors" if detail["errors"] is not None else "no error summary"
        counts = {k: v for k, v in detail["pytest"].items() if k in ("passed", "failed", "skipped")}
        text += " (tests: " + (", ".join(f"{v} {k}" for k, v in counts.items()) or "none") + ")"
        if detail["findings"]:
            text += ": " + "; ".join(detail["findings"][:2])
    elif step["group"] == "tests" or step["name"].startswith("tests"):
        detail = pytest_result(log)
        keys = ("collected", "passed", "failed", "error", "skipped", "deselected")
        text = ", ".join(f"{detail[k]} {k}" for k in keys if k in detail) or "no pytest summary"
        if "incomplete_at" in detail:
            text += f" (stopped at {detail['incomplete_at']})"
        if detail.get("hard_timeout"):
            text += " (a test hung: traceback in tests.log)"
        if detail["failures"]:
            text += " | " + " ".join(f.split(" ", 1)[1].split("::")[-1] for f in detail["failures"][:3])
    elif step["group"] == "bench":
        text = "JSON written" if (out / f"{step['name']}.json").exists() else "no JSON"
    elif step["name"] == "build":
        detail = build_result(log)
        text = f"{detail['warnings_in_csrc']} compiler warnings in csrc/"
        if detail["warning_sites"]:
            text += ": " + " ".join(detail["warning_sites"][:3])
    return {"status": status, "text": text}, detail


def summarize(work: Path, out: Path):
    env = read_env(work)
    steps = read_steps(work)
    rows, details = [], {}
    for step in steps:
        path = work / f"{step['name']}.log"
        log = path.read_text(errors="replace") if path.exists() else ""
        res, detail = _step_result(step, log, out)
        rows.append({**step, **res})
        details[step["name"]] = detail
    benches = {"bench_w2": w2_checks, "bench_projection": projection_checks,
               "bench_unlearn": unlearn_checks}
    checks = []
    for name, fn in benches.items():
        data = _load(out / f"{name}.json")
        checks += fn(data) if data is not None else [dict(name=f"{name}: no JSON", value=None,
                                                          target=0, ok=None, fmt="x")]
    failed = [r["name"] for r in rows if r["status"] in ("FAILED", "timed out")]
    mode = env.get("mode", "?")
    if mode != "gpu":   # CPU figures of a dry run: the targets are for the H200
        for c in checks:
            c["ok"] = None
    lines = [f"entangle_ext GPU check ({mode}) {env.get('date', '')}",
             f"gpu: {env.get('gpu', 'none')} | torch {env.get('torch', '?')} (CUDA "
             f"{env.get('torch_cuda', '?')}) | nvcc: {env.get('nvcc', 'none')} | python "
             f"{env.get('python', '?')}",
             "", f"{'step':22s} {'status':9s} {'time/cap':>9s}  result"]
    for r in rows:
        lines.append(f"{r['name']:22s} {r['status']:9s} {r['seconds']:>4d}/{r['cap']:<4d}  {r['text']}"[:160])
    head = "benchmark (ratio vs target)" + ("" if mode == "gpu" else ", CPU figures: no verdict")
    lines += ["", f"{head:62s} {'value':>7s} {'target':>8s}"]
    for c in checks:
        verdict = "n/a" if c["ok"] is None else ("ok" if c["ok"] else "BELOW")
        lines.append(f"{c['name'][:62]:62s} {_fmt_value(c):>7s} {_fmt_target(c):>8s}  {verdict}")
    below = [c["name"] for c in checks if c["ok"] is False]
    total = sum(r["seconds"] for r in rows)
    lines += ["", f"total {total} s | steps failed: {', '.join(failed) or 'none'} | "
                  f"benchmarks below target: {len(below)}"]
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    summary = {"env": env, "steps": rows, "details": details, "benchmarks": checks,
               "failed_steps": failed, "below_target": below, "total_seconds": total}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path, help="gpu_check.sh work directory")
    ap.add_argument("--out", required=True, type=Path, help="result directory (benchmark JSON)")
    args = ap.parse_args(argv)
    print(summarize(args.work, args.out), end="")


if __name__ == "__main__":
    main()

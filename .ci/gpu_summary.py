"""OUT/results.json from what .ci/gpu-check left in OUT: the steps' exit status and time,
each test's outcome, time and (when it failed or skipped) its message, and bench/gpu.py's
figures. Prints a short summary. Usage: python .ci/gpu_summary.py OUT"""

import json
import os
import sys
import xml.etree.ElementTree as ET


def tests(path):
    if not os.path.exists(path):
        return []
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                message = (node.get("message") or node.text or "")[:2000]
                break
        out.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                    "seconds": float(case.get("time") or 0), "message": message})
    return out


def main():
    out = sys.argv[1]
    steps = []
    with open(os.path.join(out, "steps.txt")) as f:
        for line in f:
            name, rc, secs = line.split()
            steps.append({"step": name, "exit": int(rc), "seconds": int(secs)})
    results = {"steps": steps, "tests": tests(os.path.join(out, "junit.xml"))}
    bench = os.path.join(out, "bench-gpu.json")
    if os.path.exists(bench):
        with open(bench) as f:
            results["bench_gpu"] = json.load(f)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    counts = {}
    for t in results["tests"]:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    print("gpu-check: steps " + ", ".join(f"{s['step']} {s['exit']}" for s in steps))
    print("gpu-check: tests " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    for t in results["tests"]:
        if t["outcome"] == "failed":
            print(f"gpu-check: FAILED {t['test']}: {t['message'][:300]}")
    print(f"gpu-check: wrote {os.path.join(out, 'results.json')}")


if __name__ == "__main__":
    main()

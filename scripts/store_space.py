#!/usr/bin/env python3
"""Stores a grid sweep's measurements compactly for replaying search strategies without running anything: per
candidate its id, settings and, per workload, every repeat's value of the metric. Standard library only.
Usage: scripts/store_space.py RUN_FOLDER OUT.json [METRIC]   (METRIC: total_token_throughput)"""
import glob
import json
import os
import sys


def main():
    run, out = sys.argv[1], sys.argv[2]
    metric = sys.argv[3] if len(sys.argv) > 3 else "total_token_throughput"
    candidates = {}
    for path in sorted(glob.glob(os.path.join(run, "records", "*", "*.json"))):
        r = json.load(open(path))
        c = candidates.setdefault(r["candidate"]["id"], {"id": r["candidate"]["id"], "settings": r["candidate"]["settings"],
                                                         "samples": {}})
        c["samples"].setdefault(r["workload"]["name"], []).append((r["repeat"], r["metrics"][metric]))
    for c in candidates.values():
        for w, samples in c["samples"].items():
            c["samples"][w] = [v for _, v in sorted(samples)]
    env = json.load(open(glob.glob(os.path.join(run, "records", "*", "*.json"))[0]))["provenance"]["environment"]
    doc = {"metric": metric, "measured_on": {k: env.get(k) for k in ("cpu_model", "engine_cpu_isa", "git_commit")},
           "candidates": sorted(candidates.values(), key=lambda c: int(c["id"][1:]))}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

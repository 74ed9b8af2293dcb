"""How often the verdict told without stall tracing agrees with the eBPF one, row by row.

    python3 compare_basis.py EBPF.jsonl PLAIN.jsonl CONTAINER

EBPF.jsonl and PLAIN.jsonl are `gpuwatch record --format jsonl` of the same run, the second
with --no-ebpf; rows are paired by their second. Prints the agreement and each pair of kinds;
exits 1 under 80 % (the target) or without rows in both."""
import json
import sys


def kinds(path, name):
    got = {}
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        w = next((w for w in r["workloads"] if w["name"] == name), None)
        if w and w.get("verdict"):
            got[round(r["taken_at_unix_ms"] / 1000)] = w["verdict"]["kind"]
    return got


a, b = kinds(sys.argv[1], sys.argv[3]), kinds(sys.argv[2], sys.argv[3])
both = sorted(set(a) & set(b))
agree = sum(a[t] == b[t] for t in both)
print(f"{sys.argv[3]}: rows in both {len(both)}: the verdict without eBPF agrees in {agree} ({agree / max(len(both), 1):.0%})")
pairs = {}
for t in both:
    pairs[(a[t], b[t])] = pairs.get((a[t], b[t]), 0) + 1
for (x, y), n in sorted(pairs.items(), key=lambda kv: -kv[1]):
    print(f"  eBPF {x:<22} without {y:<22} {n}")
sys.exit(0 if both and agree / len(both) >= 0.8 else 1)

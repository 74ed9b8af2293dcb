"""Summarises a `gpuwatch record --format jsonl` file: per-round wall time of the round, of its NVML
calls and of each series fetch (the costs the agent reports about itself)."""
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
col = [r["collection_seconds"] * 1e3 for r in rows[2:]]
nv = [r["nvml_query_seconds"] * 1e3 for r in rows[2:] if r["nvml_query_seconds"] is not None]
fe = [r["series_fetch_seconds"] * 1e3 for r in rows if r.get("series_fetch_seconds")]
print(f"rounds {len(rows)}: collection ms mean {st.mean(col):.3f} median {st.median(col):.3f} max {max(col):.3f}; nvml ms mean {st.mean(nv):.3f}; fetches {len(fe)} ms {[round(x,2) for x in fe]}")
g = rows[-1]["gpus"][0]
print("last busy", g["busy"], "procs", len(g["processes"]), "workloads", [(w["name"], w["gpu"]["busy_fraction"]) for w in rows[-1]["workloads"] if w["gpu"]["processes"]])

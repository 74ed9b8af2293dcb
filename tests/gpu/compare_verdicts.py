"""Compares gpuwatch's verdict snapshots with a DataLoader job's own timing.

    python3 compare_verdicts.py OUT WORKLOAD_ID PHASE...

For each phase, OUT/snap_<phase>.json (a `gpuwatch snapshot --json` taken inside the phase) and
OUT/truth.json (loader_job.py's steps): the verdict, the GPU busy share, the input-bound share
against the job's data-wait fraction over the snapshot's own window, and the expected verdict.
Prints a table; exits 1 if a verdict is wrong or a share is off by more than 5 points."""
import json
import sys

out, workload_id, phases = sys.argv[1], sys.argv[2], sys.argv[3:]
EXPECTED = {"gpu_bound": "GPU-bound", "io_bound": "input-bound: I/O", "cpu_bound": "input-bound: CPU"}
truth = json.load(open(f"{out}/truth.json"))
bad = 0
print(f"{'phase':<10} {'verdict':<18} {'gpu busy':>8} {'trainer wait':>12} {'input-bound':>11} {'job data-wait':>13} {'diff pp':>8} {'SM act':>7}")
for phase in phases:
    s = json.load(open(f"{out}/snap_{phase}.json"))
    end = s["taken_at_unix_ms"] / 1000
    start = end - s["window_seconds"]
    wait = comp = 0.0
    for st in truth["steps"]:  # steps inside the snapshot's window
        if st["t_start"] >= start and st["t_start"] + st["data_wait_s"] + st["compute_s"] <= end:
            wait += st["data_wait_s"]
            comp += st["compute_s"]
    w = next(w for w in s["workloads"] if w["id"] == workload_id)
    v = w["verdict"]
    frac = wait / (wait + comp)
    share = v["input_bound_share"]
    diff = abs(share - frac) * 100
    ok = v["kind"] == EXPECTED[phase] and diff <= 5
    bad += not ok
    sm = v.get("sm_activity_fraction")
    print(f"{phase:<10} {v['kind']:<18} {v['gpu_busy_fraction']:>8.3f} {v['trainer_wait_fraction']:>12.3f} {share:>11.3f} {frac:>13.3f} {diff:>8.1f} {'-' if sm is None else f'{sm:.2f}':>7} {'ok' if ok else 'WRONG'}")
    print("   name", w["name"], "| image", (w.get("container") or {}).get("image"), "| service", (w.get("container") or {}).get("compose_service"))
    print("   loader", v["loader"], "| reads", w["stalls"]["reads"]["count"], "| disk", w["stalls"]["disk"]["count"])
    print("  ", v["advice"])
sys.exit(1 if bad else 0)

"""Packs the steady windows of tests/gpu/real_loops.sh runs into the fixture that
tests/replay_real_loops.rs judges again on every test run: each line one workload's window as
the agent recorded it (its verdict left out), with the job's label and its own shares over the
same window.

    python3 replay_fixture.py OUT.jsonl.gz SOURCE:DIR:JOB,JOB,... [SOURCE:DIR:JOB,...]

SOURCE names the run (it is kept in each line); DIR holds its default.jsonl, cuda_off.jsonl,
no_ebpf.jsonl, job_*.log and truth_*.json; the JOBs are the scenarios to take from it.
"""
import gzip
import json
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import score_real_loops as score  # noqa: E402  (reads sys.argv: set it first)

KEYS = ["copy_s", "cpu_s", "host_idle_s", "sync_s", "data_wait_s"]
out_path, specs = sys.argv[1], sys.argv[2:]
lines = 0
with gzip.open(out_path, "wt") as out:
    for spec in specs:
        source, folder, jobs = spec.split(":", 2)
        score.out = folder
        for mode in score.MODES:
            rows = score.load_rows(mode)
            for job in jobs.split(","):
                steps = score.steps(job)
                for label, start, end in score.phases(job):
                    skip = 0.0 if label == "warmup" else score.SKIP
                    for r in rows:
                        w = next((w for w in r["workloads"] if w["name"] == f"gw-rl-{job}"), None)
                        if not w or not w.get("verdict"):
                            continue
                        b = r["taken_at_unix_ms"] / 1000
                        a = b - (r.get("window_seconds") or 0)
                        if a < start + skip or b > end:
                            continue
                        recorded = w.pop("verdict")["kind"]
                        for k in ("oom_headroom", "config", "container"):
                            w.pop(k, None)
                        own = {k: score.own_share(steps, a, b, k) for k in KEYS}
                        out.write(json.dumps({
                            "source": source, "mode": mode, "job": job, "label": label,
                            "window_seconds": r["window_seconds"],
                            "ebpf_up": r["sources"]["ebpf"]["up"],
                            "ebpf_detail": r["sources"]["ebpf"].get("detail"),
                            "host_cpus": r["host"].get("cpus"),
                            "recorded_kind": recorded, "own": own, "workload": w,
                        }, separators=(",", ":")) + "\n")
                        lines += 1
print(f"{lines} windows")

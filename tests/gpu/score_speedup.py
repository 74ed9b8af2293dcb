"""The agent's speed-up estimate against the job's own: what removing the bottleneck bought.

    python3 score_speedup.py RECORD.jsonl TRUTH.json CONTAINER

TRUTH.json is loader_job.py's step log; its gpu_bound phase (the same model and batch with the
samples in memory) is the job with the bottleneck removed. Per other phase: the phase's steady
rows cut from the recording and given to `gpuwatch report --json` (GPUWATCH names the binary,
default .device/gpuwatch), whose container `speedup` is the run's estimate (time-weighted mean
shares: single 1-s rows of a job stepping every 0.8 s hold all or none of a step's GPU time),
and the real gain (the gpu_bound phase's step rate over this phase's). Exits 1 when a phase's
likely figure is more than 20 % off its real gain."""
import json
import os
import subprocess
import sys
import tempfile

rec, truth_path, name = sys.argv[1:4]
binary = os.environ.get("GPUWATCH", ".device/gpuwatch")
steps = json.load(open(truth_path))["steps"]
phases = {}
for s in steps:
    phases.setdefault(s["phase"], []).append(s)


def rate(ss):
    ss = ss[5:-2]
    return (len(ss) - 1) / (ss[-1]["t_start"] - ss[0]["t_start"])


lines = [line for line in open(rec) if line.strip()]
fixed = rate(phases["gpu_bound"])
missed = False
for phase, ss in phases.items():
    if phase == "gpu_bound":
        continue
    a, b = ss[0]["t_start"] + 2, ss[-1]["t_start"] - 1
    cut = []
    for line in lines:
        r = json.loads(line)
        t = r["taken_at_unix_ms"] / 1000
        if t - (r.get("window_seconds") or 1) >= a and t <= b:
            cut.append(line)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
        f.writelines(cut)
        f.flush()
        report = json.loads(subprocess.run([binary, "report", "--json", f.name], check=True,
                                           capture_output=True, text=True).stdout)
    c = next((c for c in report["containers"] if c["name"] == name), {})
    real = fixed / rate(ss)
    g = c.get("speedup")
    if not g:
        print(f"{phase}: {c.get('verdicts')}; no speed-up estimate")
        missed = True
        continue
    off = g["likely"] / real - 1
    missed |= abs(off) > 0.2
    print(f"{phase}: {c.get('verdicts')}; estimate {g['likely']:.1f}x ({g['low']:.1f}-{g['high']:.1f}) "
          f"over {len(cut)} rows, real {real:.1f}x; likely {off:+.0%} "
          f"({'inside' if g['low'] <= real <= g['high'] else 'outside'} the range)")
sys.exit(1 if missed else 0)

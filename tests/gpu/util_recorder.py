"""Records GPU 0's device utilisation series (nvmlDeviceGetSamples, every record since the last
call) once a second until killed, as [[timestamp_us, percent], ...] in argv[1] (rewritten each
second): the device's own figure, for checking gpuwatch's busy shares against."""
import json
import sys
import time

import pynvml as N

N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
last, series = int(time.time() * 1e6), []
while True:
    time.sleep(1)
    try:
        _, samples = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, last)
    except N.NVMLError:
        continue
    for s in samples:
        if s.timeStamp > last:
            series.append((s.timeStamp, s.sampleValue.uiVal))
    if samples:
        last = max(s.timeStamp for s in samples)
    json.dump(series, open(sys.argv[1] + ".tmp", "w"))
    import os
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])

"""Reads the driver's energy counter of GPU 0 every 100 ms until killed: one line
`unix_seconds millijoules` each, flushed, to the file named.

    python3 energy_counter.py OUT.txt"""
import ctypes
import sys
import time

nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
mj = ctypes.c_ulonglong()
with open(sys.argv[1], "w") as out:
    while True:
        assert nvml.nvmlDeviceGetTotalEnergyConsumption(dev, ctypes.byref(mj)) == 0
        out.write(f"{time.time()} {mj.value}\n")
        out.flush()
        time.sleep(0.1)

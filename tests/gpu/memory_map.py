#!/usr/bin/env python3
"""Where a process's resident memory is: RSS by mapping (the binary, each library, the heap,
anonymous maps), largest first, with its status figures. Usage: memory_map.py PID"""
import collections
import re
import sys

pid = sys.argv[1]
by_mapping = collections.Counter()
name = None
with open(f"/proc/{pid}/smaps") as f:
    for line in f:
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split()
            name = parts[5] if len(parts) > 5 else "[anon]"
        elif line.startswith("Rss:"):
            by_mapping[name] += int(line.split()[1])
with open(f"/proc/{pid}/status") as f:
    status = {k: v.strip() for k, v in (l.split(":", 1) for l in f if ":" in l)}
for field in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "Threads"):
    print(f"{field}: {status.get(field, '?')}")
for mapping, kib in by_mapping.most_common(15):
    print(f"{kib:>8} kB  {mapping}")

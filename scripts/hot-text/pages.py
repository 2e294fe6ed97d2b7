#!/usr/bin/env python3
"""pages.py BIN TRACE... : the functions on the code pages a trace of BIN touched, in the order
the pages were first touched (one mangled name a line). TRACE: file offsets, from uffdtrace.c."""
import subprocess
import sys


def main():
    exe = sys.argv[1]
    segs = []  # executable PT_LOADs: (file offset, vaddr, size)
    for line in subprocess.run(["readelf", "-lW", exe], capture_output=True, text=True).stdout.splitlines():
        p = line.split()
        if p and p[0] == "LOAD" and "E" in p[-2]:
            segs.append((int(p[1], 16), int(p[2], 16), int(p[4], 16)))
    bypage = {}
    for line in subprocess.run(["nm", "-n", "-S", "--defined-only", exe], capture_output=True, text=True).stdout.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            a, s = int(p[0], 16), int(p[1], 16)
            for pg in range(a & ~4095, a + s, 4096):
                bypage.setdefault(pg, []).append(p[3])
    seen = set()
    for t in sys.argv[2:]:
        for line in open(t):
            fo = int(line, 16)
            va = next((v + fo - o for o, v, fs in segs if o <= fo < o + fs + 4096), None)
            for n in bypage.get((va or 0) & ~4095, []):
                if n not in seen:
                    seen.add(n)
                    print(n)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Which pages of a running process's own binary are resident, by ELF section and by crate.

usage: resident-pages.py PID [TOP]   (root: reads /proc/PID/pagemap)

Reads /proc/PID/maps for the mappings of the executable, the present bit of each page
from /proc/PID/pagemap (bit 61 tells a file page from a copied-on-write anonymous one),
and attributes every resident page to the ELF sections it overlaps and, in .text, to the
crates whose functions lie on it (symbol table, `nm -n -S --demangle`). Fault-around maps
pages near each touched one, so a crate's figure is "code on resident pages", not code run.
"""
import collections
import os
import re
import struct
import subprocess
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")


def maps_of(pid, exe):
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or os.path.realpath(parts[5]) != exe:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1], int(parts[2], 16)))
    return out


def load_segments(exe):
    segs = []
    text = subprocess.run(["readelf", "-lW", exe], capture_output=True, text=True).stdout
    for line in text.splitlines():
        p = line.split()
        if p and p[0] == "LOAD":
            off, vaddr, filesz = int(p[1], 16), int(p[2], 16), int(p[4], 16)
            segs.append((off, vaddr, filesz))
    return segs


def sections(exe):
    out = []
    text = subprocess.run(["readelf", "-SW", exe], capture_output=True, text=True).stdout
    for line in text.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*)", line)
        if m and "A" in m.group(4):
            addr, size = int(m.group(2), 16), int(m.group(3), 16)
            if addr and size:
                out.append((addr, addr + size, m.group(1)))
    return out


def crate_of(name):
    # "<T as core::fmt::Debug>::fmt" -> the implementing type's crate
    name = name.lstrip("<&*").replace("dyn ", "").replace("mut ", "")
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(::|$)", name)
    return m.group(1) if m else "?"


def text_symbols(exe):
    out = []
    text = subprocess.run(["nm", "-n", "-S", "--demangle", "--defined-only", exe],
                          capture_output=True, text=True).stdout
    for line in text.splitlines():
        p = line.split(" ", 3)
        if len(p) == 4 and p[2] in "tTwW":
            out.append((int(p[0], 16), int(p[1], 16), crate_of(p[3])))
    return out


def main():
    pid = int(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    exe = os.path.realpath(f"/proc/{pid}/exe")
    segs = load_segments(exe)
    secs = sections(exe)
    by_sec = collections.Counter()
    total_sec = collections.Counter()
    for lo, hi, name in secs:
        total_sec[name] += hi - lo
    resident = []  # (elf vaddr of page, is_file)
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for lo, hi, perms, off in maps_of(pid, exe):
            pm.seek(lo // PAGE * 8)
            raw = pm.read((hi - lo) // PAGE * 8)
            for i in range((hi - lo) // PAGE):
                (e,) = struct.unpack_from("<Q", raw, i * 8)
                if not e >> 63 & 1:
                    continue
                foff = off + i * PAGE
                va = next((v + foff - o for o, v, fs in segs if o <= foff < o + fs + PAGE), None)
                if va is not None:
                    resident.append((va - va % PAGE, bool(e >> 61 & 1), perms))
    per_perm = collections.Counter()
    for va, is_file, perms in resident:
        per_perm[(perms, "file" if is_file else "anon")] += PAGE
        for lo, hi, name in secs:
            a, b = max(lo, va), min(hi, va + PAGE)
            if a < b:
                by_sec[(name, "file" if is_file else "anon")] += b - a
    print(f"{exe}: {len(resident) * PAGE // 1024} KiB resident of the binary's mappings")
    for (perms, kind), n in sorted(per_perm.items()):
        print(f"  mapping {perms} {kind}: {n // 1024} KiB")
    print("by section (resident KiB / section KiB):")
    for (name, kind), n in sorted(by_sec.items(), key=lambda kv: -kv[1]):
        print(f"  {name:20} {kind}: {n / 1024:8.1f} / {total_sec[name] / 1024:8.1f}")
    pages = {va for va, _, _ in resident}
    crates = collections.Counter()
    crates_all = collections.Counter()
    for addr, size, crate in text_symbols(exe):
        crates_all[crate] += size
        p = addr - addr % PAGE
        while p < addr + size:
            if p in pages:
                crates[crate] += min(addr + size, p + PAGE) - max(addr, p)
            p += PAGE
    print(f".text bytes on resident pages by crate (top {top}; KiB resident / KiB in binary):")
    for crate, n in crates.most_common(top):
        print(f"  {crate:28} {n / 1024:8.1f} / {crates_all[crate] / 1024:8.1f}")


if __name__ == "__main__":
    main()

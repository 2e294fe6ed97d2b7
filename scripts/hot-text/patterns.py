#!/usr/bin/env python3
"""patterns.py exact|free NAMES : linker-script input section lines for the functions in NAMES.
exact: one line per function, its own name (ThinLTO's `.llvm.N` suffix globbed), for the
profiling layout; free: the name without its legacy hash (`17h<16 hex>E`), so that the list
survives rebuilds with other dependency versions (all instantiations of a name come along)."""
import re
import sys

mode, seen = sys.argv[1], set()
for n in open(sys.argv[2]):
    n = n.strip()
    b = re.sub(r"(\.llvm\.\d+)+$", "", n)
    glob = b != n
    if mode == "free" and re.search(r"17h[0-9a-f]{16}E$", b):
        b, glob = b[:-17], True
    if b and b not in seen:
        seen.add(b)
        g = "*" if glob else ""
        print(f"    *(.text.{b}{g} .text.unlikely.{b}{g})")

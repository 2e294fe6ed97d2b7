"""Reads `perf script` output of a `perf record --call-graph dwarf`: one block a sample,
blocks apart by a blank line, the block's first line the sample's header (comm, tid) and
each further line one frame, `ADDRESS SYMBOL`. Shared by bench/perf_top.py and
loadgen/scripts/perf_fetch_copies.py, which import it by their own directory's path.
"""

# A bound on the samples read (a long profile is cut, not read whole into memory twice).
MAX_STACKS = 10_000_000


def stacks(path):
    """Yields each sample's frames, leaf first: the symbol of each frame ("?" for a frame
    perf could not name)."""
    text = open(path, errors="replace").read().strip()
    for n, block in enumerate(text.split("\n\n")):
        if n >= MAX_STACKS:
            break
        frames = []
        for line in block.strip().split("\n")[1:]:
            parts = line.strip().split(None, 1)
            frames.append(parts[1] if len(parts) > 1 else "?")
        if frames:
            yield frames

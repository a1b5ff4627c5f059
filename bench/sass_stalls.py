#!/usr/bin/env python3
"""Static issue cost of a kernel's SASS, without a GPU: the stall count ptxas writes into each
instruction's control bits (the cycles the warp waits before it may issue its next instruction:
fixed latencies, and the issue rate of the slower pipes, e.g. 8 cycles per MUFU.EX2 on sm_90),
summed over address ranges. The sum is a lower bound of one warp's time through straight-line
code when nothing else (scoreboards, barriers, the other warps) holds it up; comparing it between
two builds of a kernel tells whether a change can shorten a loop before any GPU time is spent.

  python3 bench/sass_stalls.py FILE --function REGEX [--grep PATTERN] [--loops]
  python3 bench/sass_stalls.py FILE --function REGEX --range 0xb430:0xe390 [--skip 0xbca0:0xcaa0 ...] [--list]

FILE is an object, cubin or executable (disassembled with `cuobjdump -sass`: from $CUOBJDUMP, the
PATH or $CUDA_HOME/bin) or a text file of cuobjdump's output. --grep prints the addresses of the
matching instructions; --loops prints every loop (a branch back to a lower address) that
holds at least 100 instructions, with its range; --range sums [start, end), leaving out the
--skip ranges (branches the case at hand does not take), and counts its instructions by opcode;
--list prints every instruction with its stall count. The kernel can be another library's (a
cubin that `cuobjdump -xelf` took out of it), to set a loop beside ours. Control bits as on
sm_70 to sm_90: stall in bits 41-44 of each instruction's second 64-bit word, then yield, the
write and read barrier indices and the wait mask.
"""
import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
CONTROL_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
FUNCTION = re.compile(r"Function : (\S+)")
CODE_FOR = re.compile(r"code for (sm_\w+)")


def control_fields(word):
    """The scheduling fields of an instruction's second 64-bit word."""
    return {
        "stall": (word >> 41) & 0xF,
        "yield": (word >> 45) & 0x1,
        "write_barrier": (word >> 46) & 0x7,
        "read_barrier": (word >> 49) & 0x7,
        "wait_mask": (word >> 52) & 0x3F,
    }


def parse(text):
    """{function name: [(address, instruction text, stall)]} of cuobjdump -sass output. Where the
    file holds code for several architectures, each name carries its own: "name (sm_90)"."""
    tagged = len(set(CODE_FOR.findall(text))) > 1
    functions, current, pending, arch = {}, None, None, None
    for line in text.splitlines():
        code_for = CODE_FOR.search(line)
        if code_for:
            arch = code_for.group(1)
            continue
        name = FUNCTION.search(line)
        if name:
            current = functions.setdefault(f"{name.group(1)} ({arch})" if tagged else name.group(1), [])
            continue
        m = INSTRUCTION.search(line)
        if m and current is not None:
            pending = (int(m.group(1), 16), m.group(2))
            continue
        c = CONTROL_WORD.match(line)
        if c and pending is not None:
            current.append((pending[0], pending[1], control_fields(int(c.group(1), 16))["stall"]))
            pending = None
    return functions


def opcode(text):
    """The mnemonic of an instruction, its predicate left out."""
    words = text.split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def select(instructions, start, end, skips=()):
    """The instructions in [start, end) outside the skip ranges."""
    return [i for i in instructions if start <= i[0] < end and not any(a <= i[0] < b for a, b in skips)]


def summarize(instructions, start, end, skips=()):
    """(instructions, stall cycles, {opcode: stall cycles}) over [start, end) outside the skips."""
    kept = select(instructions, start, end, skips)
    by_opcode = collections.Counter()
    for _, text, stall in kept:
        by_opcode[opcode(text)] += stall
    return len(kept), sum(i[2] for i in kept), by_opcode


def loops(instructions, least=100):
    """[(start, end)] of the loops whose back branch closes at least `least` instructions: from a
    branch's target to just past the branch, for each branch to a lower address."""
    found = []
    for address, text, _ in instructions:
        target = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            start, end = int(target.group(1), 16), address + 16
            if len(select(instructions, start, end)) >= least:
                found.append((start, end))
    return found


def address_range(text):
    start, end = text.split(":")
    return int(start, 16), int(end, 16)


def disassemble(path):
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\0" not in head:  # already cuobjdump's text
        with open(path) as f:
            return f.read()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool and os.environ.get("CUDA_HOME"):
        tool = os.path.join(os.environ["CUDA_HOME"], "bin", "cuobjdump")
    if not tool or not os.path.exists(tool):
        sys.exit("sass_stalls.py: cuobjdump not found (set CUOBJDUMP, or put it on the PATH)")
    return subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--function", required=True, help="regular expression for the (mangled) kernel name")
    ap.add_argument("--grep", help="print the addresses of the instructions matching this expression")
    ap.add_argument("--loops", action="store_true", help="print the ranges of the kernel's loops")
    ap.add_argument("--range", type=address_range, help="START:END (hex) to sum over")
    ap.add_argument("--skip", type=address_range, action="append", default=[], help="START:END to leave out")
    ap.add_argument("--list", action="store_true", help="print every instruction of the range")
    args = ap.parse_args()

    functions = parse(disassemble(args.file))
    names = [n for n in functions if re.search(args.function, n)]
    if len(names) != 1:
        sys.exit(f"sass_stalls.py: {len(names)} functions match {args.function!r}: {' '.join(names) or '-'}")
    instructions = functions[names[0]]
    if args.grep:
        for address, text, stall in instructions:
            if re.search(args.grep, text):
                print(f"{address:#07x}  {text}")
    if args.loops:
        for start, end in loops(instructions):
            count, stalls, _ = summarize(instructions, start, end)
            print(f"loop {start:#x}:{end:#x}  {count} instructions, {stalls} stall cycles")
    if args.range:
        start, end = args.range
        kept = select(instructions, start, end, args.skip)
        if args.list:
            for address, text, stall in kept:
                print(f"{address:#07x}  {stall:2d}  {text}")
        count, stalls, by_opcode = summarize(kept, start, end)
        counts = collections.Counter(opcode(text) for _, text, _ in kept)
        print(f"{names[0]} [{start:#x}, {end:#x}): {count} instructions, {stalls} stall cycles")
        print(f"  {'opcode':32s} {'count':>5s} {'stall cycles':>12s}")
        for name, n in counts.most_common(24):
            print(f"  {name:32s} {n:5d} {by_opcode[name]:12d}")


if __name__ == "__main__":
    main()

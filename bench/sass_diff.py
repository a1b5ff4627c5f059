#!/usr/bin/env python3
"""Which kernels two builds compile to different machine code: for every kernel (mangled name) of
either file, its instruction count in each and whether its SASS is the same, instruction by
instruction (opcode, operands and ptxas's stall count; addresses left out, so a kernel that only
moved within its file compares equal). "SASS unchanged" claims in the version logs are this check.

  python3 bench/sass_diff.py BEFORE AFTER [--pair REGEX_BEFORE REGEX_AFTER]

BEFORE and AFTER are objects, cubins or executables, or text files of `cuobjdump -sass` output
(disassembled as by sass_stalls.py). --pair compares the one kernel of BEFORE that REGEX_BEFORE
matches with the one of AFTER that REGEX_AFTER matches (a kernel whose template arguments, and so
its mangled name, changed). Exit status 1 when a kernel present in both (or the pair) differs.
"""
import argparse
import re
import signal
import sys

import sass_stalls


def compare(before, after):
    """[(verdict, count before, count after, name)] over the kernels of {name: instructions} pairs;
    verdict: 'same', 'differs', 'before only' or 'after only'."""
    def body(instructions):
        return [(text, stall) for _, text, stall in instructions]

    rows = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            rows.append(("after only" if a is None else "before only", len(a or ()), len(b or ()), name))
        else:
            rows.append(("same" if body(a) == body(b) else "differs", len(a), len(b), name))
    return rows


def paired(before, after, pattern_before, pattern_after):
    """The kernel of `before` that pattern_before matches and the one of `after` that pattern_after
    matches, under the second one's name (for compare)."""
    def only(functions, pattern, side):
        names = [n for n in functions if re.search(pattern, n)]
        if len(names) != 1:
            sys.exit(f"sass_diff.py: {len(names)} kernels of {side} match {pattern!r}: {' '.join(names) or '-'}")
        return names[0]

    a, b = only(before, pattern_before, "BEFORE"), only(after, pattern_after, "AFTER")
    return {b: before[a]}, {b: after[b]}


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--pair", nargs=2, metavar=("REGEX_BEFORE", "REGEX_AFTER"),
                    help="compare these two kernels, whatever their names")
    args = ap.parse_args()
    before = sass_stalls.parse(sass_stalls.disassemble(args.before))
    after = sass_stalls.parse(sass_stalls.disassemble(args.after))
    if args.pair:
        before, after = paired(before, after, *args.pair)
    rows = compare(before, after)
    for verdict, n_before, n_after, name in rows:
        print(f"{verdict:11s} {n_before:6d} {n_after:6d}  {name}")
    sys.exit(1 if any(verdict == "differs" for verdict, *_ in rows) else 0)


if __name__ == "__main__":
    main()

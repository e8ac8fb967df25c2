#!/usr/bin/env python3
"""Panic call sites left in a firmware ELF, by kind and by mote-core line.

The compiled-model runtime is proved panic-free by linking (boards/nopanic).
The ONNX path (import, optimizer, planner, 178 operators) is not: this lists
what the optimizer could not remove from `boards/onnx-an386` (which links
every registered operator through the op table), so the count can only go
down. Each call into one of core's / alloc's panic entry points is
symbolized (llvm-symbolizer, inlined frames) and attributed to the innermost
mote-core source line of its inline chain, else to the outermost frame
(std, a dependency).

    python3 scripts/panic_sites.py ELF [--list] [--max-core N] [--max-div N]

`--max-core N`: exit 1 if more than N sites sit on mote-core lines;
`--max-div N`: exit 1 if more than N integer division / remainder panics
(by zero, or MIN / -1: the integer operations that panic in a release
build) sit on mote-core lines. Needs llvm-objdump and llvm-symbolizer (Debian: llvm).
"""

import argparse
import collections
import json
import re
import subprocess
import sys

# Panic entry points: name fragment (of the mangled symbol) -> kind.
KINDS = [
    ("panic_const_div_by_zero", "division by zero"),
    ("panic_const_rem_by_zero", "remainder by zero"),
    ("panic_const_div_overflow", "division overflow"),
    ("panic_const_rem_overflow", "remainder overflow"),
    ("panic_bounds_check", "index out of bounds"),
    ("slice_index_fail", "slice range"),
    ("slice_start_index_len_fail", "slice range"),
    ("slice_end_index_len_fail", "slice range"),
    ("slice_index_order_fail", "slice range"),
    ("len_mismatch_fail", "copy_from_slice length"),
    ("slice_error_fail", "str slice"),
    ("unwrap_failed", "unwrap"),
    ("expect_failed", "expect"),
    ("assert_failed", "assert (Vec insert/remove, assert_eq)"),
    ("capacity_overflow", "Vec capacity overflow"),
    ("panic_nounwind", "panic (no unwind)"),
    ("9panicking9panic_fmt", "panic! / assert! (formatted)"),
    ("9panicking5panic", "panic! / assert! (message)"),
]
DIV_KINDS = {k for f, k in KINDS if "div" in f or "rem_" in f}


def kind_of(sym):
    for frag, kind in KINDS:
        if frag in sym:
            return kind
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("elf")
    ap.add_argument("--list", action="store_true", help="every mote-core site")
    ap.add_argument("--max-core", type=int)
    ap.add_argument("--max-div", type=int)
    a = ap.parse_args()

    dis = subprocess.run(
        ["llvm-objdump", "-d", "--no-show-raw-insn", a.elf],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    funcs = {}
    for line in dis:
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            k = kind_of(m.group(2))
            if k:
                funcs[int(m.group(1), 16)] = k
    calls = []
    for line in dis:
        m = re.match(r"^\s*([0-9a-f]+):\s+(bl|b\.w|b)\s+0x([0-9a-f]+)", line)
        if m and int(m.group(3), 16) in funcs:
            calls.append((m.group(1), funcs[int(m.group(3), 16)]))
    if not calls:
        print(f"{a.elf}: no panic call sites")
        return 0
    sym = subprocess.run(
        ["llvm-symbolizer", f"--obj={a.elf}", "--inlining", "--output-style=JSON"],
        input="".join(f"0x{addr}\n" for addr, _ in calls),
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    core_sites = []
    by_kind = collections.Counter()
    by_kind_core = collections.Counter()
    for (addr, kind), js in zip(calls, sym):
        frames = json.loads(js).get("Symbol", [])
        where = None
        for fr in frames:
            fn = fr.get("FileName", "")
            m = re.search(r"(?:^|/)(core/src/\S+\.rs)$", fn)
            if m and "/rustc/" not in fn and "/library/" not in fn and "/.cargo/" not in fn:
                where = f"{m.group(1)}:{fr.get('Line', 0)}"
                if not fr.get("Line"):
                    # No line (merged code): name the function instead.
                    fn_name = re.sub(r"::h[0-9a-f]{16}$", "", fr.get("FunctionName", ""))
                    where += f" ({fn_name[-60:]})"
                break
        by_kind[kind] += 1
        if where:
            by_kind_core[kind] += 1
            # What panics: the innermost frame when it is not ours (a std
            # function such as chunks_exact or copy_from_slice, inlined).
            name = frames[0].get("FunctionName", "") if frames else ""
            via = ""
            if "mote_core" not in name:
                name = re.sub(r"::h[0-9a-f]{16}$", "", name)
                while re.search(r"<[^<>]*>", name):
                    name = re.sub(r"<[^<>]*>", "", name)
                via = name.split("::")[-1]
            core_sites.append((where, kind, via, addr))
    total = len(calls)
    print(f"{a.elf}: {total} panic call sites, {len(core_sites)} on mote-core lines")
    print(f"{'kind':<42} {'all':>6} {'mote-core':>10}")
    for kind, n in by_kind.most_common():
        print(f"{kind:<42} {n:>6} {by_kind_core[kind]:>10}")
    if a.list:
        for where, kind, via, addr in sorted(core_sites):
            print(f"  {where:<40} {kind:<36} {via:<20} 0x{addr}")
    div = sum(n for k, n in by_kind_core.items() if k in DIV_KINDS)
    rc = 0
    if a.max_div is not None and div > a.max_div:
        print(f"FAIL: {div} division sites on mote-core lines (at most {a.max_div})")
        rc = 1
    if a.max_core is not None and len(core_sites) > a.max_core:
        print(f"FAIL: {len(core_sites)} sites on mote-core lines (at most {a.max_core})")
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

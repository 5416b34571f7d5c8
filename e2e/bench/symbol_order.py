#!/usr/bin/env python3
"""The link order of sweety-dataplane's functions, from callgrind dumps (standard library only).

Usage: symbol_order.py OBJECT DUMP... > dataplane/symbol-order.txt

Reads callgrind dumps taken with `--demangle=no` (e2e/bench/callgrind.sh with ORDER=, which
makes them: the first after the idle server's probe connections, the next after a few requests
of each cell) and prints the symbol names of OBJECT's functions that ran in them, one a line,
in groups: a line "# dump N" before the functions first run in dump N, each group by
instruction count, highest first. ThinLTO's `.llvm.<hash>` suffix of a promoted local symbol
is left out: it changes with the code of its module, the name before it does not.
dataplane/build.rs places each group's functions together at the start of the code, so the code
an idle dataplane and its requests run shares few 64 KiB windows: the kernel maps 64 KiB around
every fault of a file mapping, which is what an idle dataplane's RSS is mostly made of (issue
23; docs/benchmarks.md, "Idle RSS").
"""

import re
import sys

# ThinLTO's suffix of a local symbol promoted to global, which changes with its module's code.
LLVM_SUFFIX = re.compile(r"\.llvm\.\d+$")
# A cost line: a position (line number, "+N"/"-N" relative, or "*" the same) then counts.
COST = re.compile(r"^[0-9+*-]")
# "fn=(12) name", "fn=(12)" (a name given earlier), or "fn=name" (--compress-strings=no).
NAMED = re.compile(r"^(ob|fn|cob|cfn)=(?:\((\d+)\))?\s*(.*)$")


def self_costs(lines, obj):
    """{function name: self instructions} of the functions of the object named `obj` (a path or
    its last component) in one callgrind dump's lines."""
    names = {"ob": {}, "fn": {}}
    ob = fn = None
    after_call = False
    costs = {}
    for line in lines:
        line = line.rstrip("\n")
        m = NAMED.match(line)
        if m:
            kind, ident, name = m.groups()
            table = names["ob" if kind in ("ob", "cob") else "fn"]
            if ident is not None and name:
                table[ident] = name
            resolved = table.get(ident, name) if ident is not None else name
            if kind == "ob":
                ob = resolved
            elif kind == "fn":
                fn = resolved
            continue
        if line.startswith("calls="):
            after_call = True  # the next cost line is the call's inclusive cost
            continue
        if COST.match(line) and fn is not None:
            if after_call:
                after_call = False
                continue
            fields = line.split()
            if len(fields) < 2 or ob is None:
                continue
            if ob != obj and ob.rsplit("/", 1)[-1] != obj.rsplit("/", 1)[-1]:
                continue
            # Recursion levels are named "f'2", "f'3" (callgrind's --separate-recs).
            base = re.sub(r"'\d+$", "", fn)
            costs[base] = costs.get(base, 0) + int(fields[1])
    return costs


def order(dumps, obj):
    """The names to place, one list per dump: its functions not in an earlier one, by cost."""
    seen, groups = set(), []
    for lines in dumps:
        costs = {}
        for name, cost in self_costs(lines, obj).items():
            name = LLVM_SUFFIX.sub("", name)
            costs[name] = costs.get(name, 0) + cost
        group = []
        for name, _ in sorted(costs.items(), key=lambda kv: (-kv[1], kv[0])):
            # Names valgrind could not read from the symbol table ("0x...") are no symbols.
            if name in seen or name.startswith("0x") or not name:
                continue
            seen.add(name)
            group.append(name)
        groups.append(group)
    return groups


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    dumps = []
    for path in argv[2:]:
        with open(path) as f:
            dumps.append(f.readlines())
    for n, group in enumerate(order(dumps, argv[1]), 1):
        print(f"# dump {n}")
        for name in group:
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

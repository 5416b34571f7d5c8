#!/usr/bin/env python3
"""Generates the README's chart values table from charts/sweety/values.yaml.

A key is documented by the comment block directly above it that starts with `# -- `
(continuation lines are plain `#` comments). The default is the key's value in values.yaml.

Usage: values-table.py            rewrite README.md between <!-- values:start --> and <!-- values:end -->
       values-table.py --check    exit 1 (with a diff hint) if README.md is not current
"""
import json
import pathlib
import re
import sys

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
VALUES = REPO / "charts/sweety/values.yaml"
README = REPO / "README.md"
START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_]+):")


def documented_keys(text):
    """(dotted path, description) for every key with a `# --` comment, in file order."""
    stack, doc, out = [], None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# -- "):
            doc = [stripped[5:]]
            continue
        if stripped.startswith("#"):
            if doc is not None:
                doc.append(stripped.lstrip("#").strip())
            continue
        m = KEY.match(line)
        if not m or stripped.startswith("-"):
            doc = None if not stripped else doc
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        if doc is not None:
            out.append((".".join(k for _, k in stack), " ".join(doc)))
        doc = None
    return out


def lookup(values, path):
    for part in path.split("."):
        values = values[part]
    return values


def table():
    text = VALUES.read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for path, doc in documented_keys(text):
        default = json.dumps(lookup(values, path), separators=(", ", ": "))
        default = default.replace("|", "\\|")
        rows.append(f"| `{path}` | `{default}` | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def undocumented():
    """Top-level keys with no `# --` comment on themselves or on any key below them."""
    text = VALUES.read_text()
    documented = {path for path, _ in documented_keys(text)}
    return [k for k in yaml.safe_load(text)
            if not any(d == k or d.startswith(k + ".") for d in documented)]


def main():
    missing = undocumented()
    if missing:
        sys.exit(f"{VALUES}: keys without a '# -- ' comment: {', '.join(missing)}")
    readme = README.read_text()
    if START not in readme or END not in readme:
        sys.exit(f"{README}: markers {START} / {END} missing")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{table()}\n{END}{tail}"
    if "--check" in sys.argv[1:]:
        if new != readme:
            sys.exit("README.md values table is stale: run e2e/chart/values-table.py")
        return
    README.write_text(new)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Validates every deploy/examples/*.yaml with `sweety-dataplane validate`, so the examples keep
# matching the config schema. An example whose referenced files (`file:` PEMs, static `root:`
# directories) are missing is skipped with a note; any validation error fails the script.
#
# Usage (from anywhere):
#   deploy/examples/check.sh                     # builds the dataplane (debug) with cargo
#   SWEETY_BIN=path/to/sweety-dataplane deploy/examples/check.sh
#
# Paths in the examples are relative to the repository root, so validation runs from there.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"

if [[ -z ${SWEETY_BIN:-} ]]; then
    cargo build --quiet -p sweety-dataplane
    SWEETY_BIN=${CARGO_TARGET_DIR:-$REPO/target}/debug/sweety-dataplane
fi
[[ -x $SWEETY_BIN ]] || { echo "no sweety-dataplane binary at $SWEETY_BIN" >&2; exit 1; }

failed=0 checked=0
for example in deploy/examples/*.yaml; do
    missing=()
    # values of `file:` and `root:` keys, block or flow style, comments stripped
    while read -r ref; do
        [[ -e $ref ]] || missing+=("$ref")
    done < <(sed -E 's/(^|[[:space:]])#.*$//' "$example" |
        grep -oE '\b(file|root):[[:space:]]*[^,}[:space:]]+' |
        sed -E 's/^(file|root):[[:space:]]*//; s/^["'\'']//; s/["'\'']$//')
    if ((${#missing[@]})); then
        echo "$example: skipped, missing ${missing[*]}"
        continue
    fi
    checked=$((checked + 1))
    "$SWEETY_BIN" validate "$example" || failed=1
done

echo "checked $checked example(s)"
((checked > 0)) || { echo "no example could be checked" >&2; exit 1; }
exit "$failed"

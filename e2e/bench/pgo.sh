#!/usr/bin/env bash
# The profile of sweety-dataplane's profile-guided release build (dataplane/sweety.profdata).
#
# Usage:
#   e2e/bench/pgo.sh                  # regenerate dataplane/sweety.profdata from this checkout
#   OUT=/tmp/x.profdata e2e/bench/pgo.sh
#
# What it does: builds an instrumented release dataplane (`-Cprofile-generate`, into its own
# target dir, so that it never replaces anyone's release build), runs run.sh's cells against it
# (Sweety only, one short pass each: the training load), and merges the counters every server
# process wrote at exit into OUT with llvm-profdata of rustc's LLVM major version (Debian:
# `apt-get install llvm-22` for rustc 1.95's LLVM 22). The release build then reads OUT
# (dataplane/release.sh: `cargo build --release -p sweety-dataplane` with `-Cprofile-use`), so LLVM lays
# out, inlines and splits hot/cold code by what these requests ran (issue 23: the proxy path's
# cost is instruction-cache and data misses, not instruction counts).
#
# When: near the end of any change to the request path (h1, h2, h3, proxy, cache, TLS, the
# runtime), together with dataplane/symbol-order.txt (first this profile, then, from the release
# build that reads it, `ORDER=dataplane/symbol-order.txt e2e/bench/callgrind.sh BINARY`). A stale
# profile never breaks a build: a function whose code changed since (its control-flow hash
# differs) or that is new gets no profile and is optimised as without PGO (release.sh turns
# LLVM's mismatch warnings off); only the gain fades (e2e/bench/HISTORY.md, "PGO").
#
# Environment:
#   OUT=dataplane/sweety.profdata    where the merged profile goes (indexed format, the one rustc reads)
#   CELLS=...         the training cells (run.sh names; default below: static H1/H2/H3, every proxy
#                     cell with its 4 KB variant, cache-h2)
#   DUR=2             seconds of load per cell (the instrumented build is ~2x slower; the counts
#                     are what matters, not their number)
#   PORT_BASE=18440   run.sh's ports (base..base+5 on 127.0.0.1)
#   PGO_TARGET_DIR=~/.cache/sweety/target-pgo-gen   the instrumented build's target dir
#   LLVM_PROFDATA=    llvm-profdata to use (default: llvm-profdata-MAJOR of rustc's LLVM, else
#                     llvm-profdata if it is that version)
#   KEEP_WORK=1       keep the raw profiles (printed)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$REPO/dataplane/sweety.profdata}
CELLS=${CELLS:-h1-1k h2-1k h3-1k h1-100k h2-100k h3-100k proxy-h1 proxy-h1s proxy-h1s-4k proxy-h2 proxy-h2-4k proxy-h2c proxy-h2c-4k proxy-h3 proxy-h3-4k cache-h2}
DUR=${DUR:-2}
PGO_TARGET_DIR=${PGO_TARGET_DIR:-$HOME/.cache/sweety/target-pgo-gen}

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
log() { printf '== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
[[ -n $major ]] || die "cannot read rustc's LLVM version (rustc -vV)"
if [[ -z ${LLVM_PROFDATA:-} ]]; then
    LLVM_PROFDATA=$(command -v "llvm-profdata-$major" || command -v llvm-profdata || true)
fi
[[ -n $LLVM_PROFDATA ]] || die "no llvm-profdata-$major (Debian: apt-get install llvm-$major)"
have=$("$LLVM_PROFDATA" --version | sed -n 's/.*LLVM version \([0-9]*\).*/\1/p')
[[ $have == "$major" ]] ||
    die "$LLVM_PROFDATA is LLVM $have, rustc's is $major: its profile format may not match (set LLVM_PROFDATA)"

WORK=$(mktemp -d /tmp/sweety-pgo.XXXXXX)
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    if [[ -n ${KEEP_WORK:-} ]]; then log "raw profiles kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

log "instrumented release build (-Cprofile-generate, target dir $PGO_TARGET_DIR)"
# RUSTFLAGS replaces any build.rustflags: the instrumented build never reads an older profile.
(cd "$REPO" && CARGO_TARGET_DIR=$PGO_TARGET_DIR RUSTFLAGS="-Cprofile-generate=$WORK/raw" \
    cargo build --release --locked -p sweety-dataplane --bin sweety-dataplane)
bin=$PGO_TARGET_DIR/release/sweety-dataplane
cp "$bin" "$WORK/sweety-dataplane-instrumented"

log "training: run.sh, Sweety only, one pass of ${DUR} s per cell: $CELLS"
# Each server process writes its counters at exit (run.sh stops it with SIGTERM, after which main
# returns); %p: one file per process, %m: per binary.
LLVM_PROFILE_FILE="$WORK/raw/sweety-%p-%m.profraw" SWEETY_BIN="$WORK/sweety-dataplane-instrumented" \
    SERVERS=sweety RUNS=1 DUR="$DUR" CELLS="$CELLS" bash "$REPO/e2e/bench/run.sh" --out "$WORK/train.md" >/dev/null
shopt -s nullglob
# Only the servers' files: the build scripts and proc macros the instrumented build ran wrote
# theirs (default_*.profraw) into the same directory.
raw=("$WORK"/raw/sweety-*.profraw)
((${#raw[@]})) || die "the training wrote no profile (did the servers exit cleanly?)"

log "merging ${#raw[@]} raw profiles into $OUT"
"$LLVM_PROFDATA" merge -o "$OUT.tmp" "${raw[@]}"
mv "$OUT.tmp" "$OUT"
"$LLVM_PROFDATA" show "$OUT" | tail -4 >&2
log "$OUT: $(stat -c %s "$OUT") bytes; the training's table: see run.sh's output above"

#!/usr/bin/env bash
# Regenerates what the profile-guided release build reads, in the one order that works:
# dataplane/sweety.profdata (the profile), then dataplane/symbol-order.txt (the link order of
# the hot code, made from the build that reads the new profile), then the final build that
# reads both; and says what changed.
#
# Usage:
#   e2e/bench/pgo.sh                  # both files, from this checkout (commit first: see below)
#   STEPS=profile e2e/bench/pgo.sh    # the profile only
#   STEPS=order e2e/bench/pgo.sh      # the order only, from the build of the committed profile
#
# Steps (each logged with its time; STEPS picks them, default "profile order"):
#   profile  an instrumented release dataplane (`-Cprofile-generate`, its own target dir
#            PGO_TARGET_DIR, so it never replaces anyone's release build), run.sh's cells
#            against it (Sweety only, one short pass each: the training load), and the counters
#            every server process wrote at exit merged into OUT with llvm-profdata of rustc's
#            LLVM major version (Debian: `apt-get install llvm-22` for rustc 1.95's LLVM 22).
#   order    dataplane/release.sh's build (it reads OUT; rustc then lays out, inlines and splits
#            hot/cold code by it), `ORDER=dataplane/symbol-order.txt e2e/bench/callgrind.sh` on
#            that binary (the functions an idle server runs, then those of a few requests of each
#            cell: the list dataplane/build.rs links first, which keeps idle RSS low), and
#            release.sh's build again, which links by the new list (only the dataplane crate is
#            rebuilt: build.rs reruns when the list changes). The order must come from a build
#            of the new profile: PGO inlines, splits and renames code, so a list made before it
#            misses functions the new build runs at idle.
# Then the summary: the commit, each file's size and functions before and after, how much the
# new profile overlaps the old one (llvm-profdata overlap), and whether the final binary starts
# its code with the list (the linker script applied).
#
# Reproducible: the same commit, cells and durations give the same functions and a profile whose
# counts differ by the load only (run.sh's cells run a fixed time, so a loaded machine trains
# fewer requests of the same paths). The script refuses a checkout with uncommitted changes to
# tracked files other than its two outputs (the profile would describe code that no commit has;
# ALLOW_DIRTY=1 skips the check).
#
# When: near the end of any change to the request path (h1, h2, h3, proxy, cache, TLS, the
# runtime), or when the figures of e2e/bench/HISTORY.md ("PGO") decay. A stale profile never
# breaks a build: a function whose code changed since (its control-flow hash differs) or that is
# new gets no profile and is optimised as without PGO (release.sh turns LLVM's mismatch warnings
# off); only the gain fades. The build scripts' time is the two release builds (the first after a
# new profile rebuilds every crate) and the instrumented one (warm after its first build: its
# flags name a fixed directory, not this run's).
#
# Environment:
#   STEPS="profile order"  which steps
#   OUT=dataplane/sweety.profdata    where the merged profile goes (indexed, the form rustc reads;
#                     release.sh reads dataplane/sweety.profdata, so the order step needs that)
#   ORDER_FILE=dataplane/symbol-order.txt   where the link order goes
#   CELLS=...         the training cells (run.sh names; default below: static H1/H2/H3, every proxy
#                     cell with its 4 KB variant, cache-h2)
#   DUR=2             seconds of load per training cell (the instrumented build is ~2x slower; the
#                     counts' shape is what matters, not their number)
#   ORDER_CELLS=      the order's cells (default: callgrind.sh's ORDER default)
#   PORT_BASE=18440   run.sh's and callgrind.sh's ports (base..base+5 on 127.0.0.1)
#   PGO_TARGET_DIR=~/.cache/sweety/target-pgo-gen   the instrumented build's target dir
#   CARGO_TARGET_DIR  the release builds' (default: ~/.cache/sweety/target, as run.sh)
#   LLVM_PROFDATA=    llvm-profdata to use (default: llvm-profdata-MAJOR of rustc's LLVM, else
#                     llvm-profdata if it is that version)
#   KEEP_WORK=1       keep the work dir: raw profiles, the old files, the order's binary
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
STEPS=${STEPS:-profile order}
OUT=${OUT:-$REPO/dataplane/sweety.profdata}
ORDER_FILE=${ORDER_FILE:-$REPO/dataplane/symbol-order.txt}
CELLS=${CELLS:-h1-1k h2-1k h3-1k h1-100k h2-100k h3-100k proxy-h1 proxy-h1s proxy-h1s-4k proxy-h2 proxy-h2-4k proxy-h2c proxy-h2c-4k proxy-h3 proxy-h3-4k cache-h2}
DUR=${DUR:-2}
ORDER_CELLS=${ORDER_CELLS:-}
PGO_TARGET_DIR=${PGO_TARGET_DIR:-$HOME/.cache/sweety/target-pgo-gen}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/sweety/target}

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
log() { printf '== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
want() { [[ " $STEPS " == *" $1 "* ]]; }

for step in $STEPS; do
    [[ $step == profile || $step == order ]] || die "unknown step $step (STEPS: profile, order)"
done
if want order && [[ $(realpath -m "$OUT") != "$REPO/dataplane/sweety.profdata" ]]; then
    die "the order step builds with dataplane/sweety.profdata (release.sh), not OUT=$OUT"
fi
if [[ -z ${ALLOW_DIRTY:-} ]]; then
    dirty=$(cd "$REPO" && git status --porcelain --untracked-files=no -- . \
        ":!$(realpath -m --relative-to="$REPO" "$OUT")" ":!$(realpath -m --relative-to="$REPO" "$ORDER_FILE")")
    [[ -z $dirty ]] || die "uncommitted changes (commit them, or ALLOW_DIRTY=1):
$dirty"
fi

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
    if [[ -n ${KEEP_WORK:-} ]]; then log "work files kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
# The files as they were, for the summary.
[[ -f $OUT ]] && cp "$OUT" "$WORK/old.profdata"
[[ -f $ORDER_FILE ]] && cp "$ORDER_FILE" "$WORK/old-order.txt"
declare -A TOOK

if want profile; then
    start=$SECONDS
    # A fixed -Cprofile-generate directory: the flag is part of every crate's fingerprint, so a
    # per-run one rebuilt all of them each time. The servers write where LLVM_PROFILE_FILE says
    # (below); what lands in this directory is the build scripts' and proc macros' own counts.
    gen_dir=$PGO_TARGET_DIR/profraw
    log "instrumented release build (-Cprofile-generate=$gen_dir, target dir $PGO_TARGET_DIR)"
    # RUSTFLAGS replaces any build.rustflags: the instrumented build never reads an older profile.
    (cd "$REPO" && CARGO_TARGET_DIR=$PGO_TARGET_DIR RUSTFLAGS="-Cprofile-generate=$gen_dir" \
        cargo build --release --locked -p sweety-dataplane --bin sweety-dataplane)
    rm -rf "$gen_dir"
    cp "$PGO_TARGET_DIR/release/sweety-dataplane" "$WORK/sweety-dataplane-instrumented"
    TOOK["instrumented build"]=$((SECONDS - start))

    start=$SECONDS
    log "training: run.sh, Sweety only, one pass of ${DUR} s per cell: $CELLS"
    # Each server process writes its counters at exit (run.sh stops it with SIGTERM, after which
    # main returns); %p: one file per process, %m: per binary.
    LLVM_PROFILE_FILE="$WORK/raw/sweety-%p-%m.profraw" SWEETY_BIN="$WORK/sweety-dataplane-instrumented" \
        SERVERS=sweety RUNS=1 DUR="$DUR" CELLS="$CELLS" bash "$REPO/e2e/bench/run.sh" --out "$WORK/train.md" \
        2> >(tee "$WORK/train.log" >&2) >/dev/null
    shopt -s nullglob
    raw=("$WORK"/raw/sweety-*.profraw)
    shopt -u nullglob
    ((${#raw[@]})) || die "the training wrote no profile (did the servers exit cleanly?)"
    log "merging ${#raw[@]} raw profiles into $OUT"
    "$LLVM_PROFDATA" merge -o "$OUT.tmp" "${raw[@]}"
    mv "$OUT.tmp" "$OUT"
    TOOK["training and merge"]=$((SECONDS - start))
fi

if want order; then
    start=$SECONDS
    log "release build with the profile (dataplane/release.sh, target dir $CARGO_TARGET_DIR)"
    bash "$REPO/dataplane/release.sh" build --locked
    # A copy: the next build replaces the target dir's binary.
    cp "$CARGO_TARGET_DIR/release/sweety-dataplane" "$WORK/sweety-dataplane"
    TOOK["release build, profile"]=$((SECONDS - start))

    start=$SECONDS
    log "link order from that build: ORDER=$ORDER_FILE e2e/bench/callgrind.sh"
    order_env=(-u CELLS ORDER="$ORDER_FILE")
    [[ -n $ORDER_CELLS ]] && order_env+=(CELLS="$ORDER_CELLS")
    env "${order_env[@]}" bash "$REPO/e2e/bench/callgrind.sh" "$WORK/sweety-dataplane"
    TOOK["order, callgrind"]=$((SECONDS - start))

    start=$SECONDS
    log "release build with the profile and the new order"
    bash "$REPO/dataplane/release.sh" build --locked
    TOOK["release build, order"]=$((SECONDS - start))
fi

# The summary.
profile_line() { # profile_line FILE: bytes, functions, total count
    local f=$1
    [[ -f $f ]] || { echo "none"; return; }
    "$LLVM_PROFDATA" show "$f" 2>/dev/null | awk -v b="$(stat -c %s "$f")" '
        /^Total functions:/ { fns = $3 } /^Total count:/ { total = $3 }
        END { printf "%d bytes, %d functions, total count %d\n", b, fns, total }'
}
order_line() { # order_line FILE: functions, of which idle
    local f=$1
    [[ -f $f ]] || { echo "none"; return; }
    echo "$(grep -vc '^#' "$f") functions, $(sed -n '2,/^# dump 2/p' "$f" | grep -vc '^#') of them idle"
}
{
    echo "== pgo.sh summary: $(cd "$REPO" && git rev-parse --short HEAD)$(cd "$REPO" &&
        git diff --quiet HEAD -- . ":!dataplane/sweety.profdata" ":!dataplane/symbol-order.txt" || echo ' (dirty)'), steps: $STEPS"
    for k in "${!TOOK[@]}"; do printf '   %-26s %d s\n' "$k:" "${TOOK[$k]}"; done | sort
    if want profile; then
        echo "profile $OUT"
        echo "   before: $(profile_line "$WORK/old.profdata")"
        echo "   after:  $(profile_line "$OUT")"
        if [[ -f $WORK/old.profdata ]]; then
            "$LLVM_PROFDATA" overlap "$WORK/old.profdata" "$OUT" 2>/dev/null |
                sed -n 's/^ *\(# of functions overlap\|Edge profile overlap\): */   old against new, \1: /p'
        fi
        # A cell that completed few requests trained little more than its handshakes.
        if [[ -f $WORK/train.log ]]; then
            echo "   training (run.sh, ${DUR} s per cell): requests/s, failed, of each cell"
            sed -n 's/^ *sweety *\([^ ]*\) *run 1: \([^ ]* rps\).*\(failed [0-9]*\).*/     \1: \2, \3/p' \
                "$WORK/train.log"
        fi
    fi
    if want order; then
        echo "link order $ORDER_FILE"
        echo "   before: $(order_line "$WORK/old-order.txt")"
        echo "   after:  $(order_line "$ORDER_FILE")"
        if [[ -f $WORK/old-order.txt ]]; then
            echo "   names in both: $(comm -12 <(grep -v '^#' "$WORK/old-order.txt" | sort -u) \
                <(grep -v '^#' "$ORDER_FILE" | sort -u) | wc -l)"
        fi
        bin=$CARGO_TARGET_DIR/release/sweety-dataplane
        first=$(grep -vm1 '^#' "$ORDER_FILE")
        text=$(readelf -SW "$bin" | awk '$2 == ".text" { print $4 }')
        at=$(nm --defined-only "$bin" | awk -v n="$first" '!at && ($3 == n || index($3, n ".llvm.") == 1) { at = $1 } END { print at }')
        if [[ -n $at && -n $text && $((16#$at)) == $((16#$text)) ]]; then
            echo "   the final build starts .text with the list's first function ($first): the order is applied"
        else
            echo "   WARNING: the final build's .text (0x$text) does not start with $first (at 0x${at:-none}): is the order applied?"
        fi
        echo "   binary $bin ($(stat -c %s "$bin") bytes)"
    fi
} >&2

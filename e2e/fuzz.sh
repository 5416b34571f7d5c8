#!/usr/bin/env bash
# Runs every cargo-fuzz target of the repository for a bounded time from its committed corpus.
#
#   e2e/fuzz.sh [SECONDS_TOTAL]      (default 150; FUZZ_SECONDS_PER_TARGET overrides the split)
#
# Discovers `*/fuzz` and `*/*/fuzz` directories holding a cargo-fuzz crate, installs a pinned
# cargo-fuzz into ~/.cache/sweety/tools if absent, builds each crate once on stable Rust without
# sanitizers (`-s none`) but with debug assertions and overflow checks, then runs each target
# from `<dir>/corpus/<target>` (a copy: new inputs do not dirty the tree) with libFuzzer's
# `-timeout=5 -rss_limit_mb=1024 -max_total_time=N`. A crash, a timeout or an out-of-memory
# exits non-zero and leaves the reproducer under $FUZZ_OUT (default ~/.cache/sweety/fuzz-out).
# Builds go to ~/.cache/sweety/fuzz-target, never into the repo. Longer runs: docs/security.md.
set -euo pipefail
cd "$(dirname "$0")/.."

total="${1:-150}"
CARGO_FUZZ_VERSION=0.12.0
tools="$HOME/.cache/sweety/tools"
out="${FUZZ_OUT:-$HOME/.cache/sweety/fuzz-out}"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/sweety/fuzz-target}"
export CARGO_INCREMENTAL=0
export PATH="$tools/bin:$PATH"

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION into $tools"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$tools" --quiet
fi
command -v c++ >/dev/null || { echo "a C++ compiler is needed to build libFuzzer" >&2; exit 1; }

dirs=()
for d in */fuzz */*/fuzz; do
  [ -f "$d/Cargo.toml" ] && grep -q 'cargo-fuzz = true' "$d/Cargo.toml" && dirs+=("${d%/fuzz}")
done
if [ ${#dirs[@]} -eq 0 ]; then
  echo "no fuzz crates found" >&2
  exit 1
fi

# Targets: (crate dir, target) pairs.
targets=()
for crate in "${dirs[@]}"; do
  for t in $(cd "$crate" && cargo fuzz list); do
    targets+=("$crate:$t")
  done
done
per="${FUZZ_SECONDS_PER_TARGET:-$(( total / ${#targets[@]} ))}"
[ "$per" -ge 5 ] || per=5
echo "== ${#targets[@]} fuzz targets, ${per}s each"

flags=(-s none --debug-assertions)
export RUSTFLAGS="${RUSTFLAGS:-} -C overflow-checks=on"
for crate in "${dirs[@]}"; do
  echo "== building $crate/fuzz"
  (cd "$crate" && cargo fuzz build "${flags[@]}" --target-dir "$CARGO_TARGET_DIR")
done

mkdir -p "$out"
failed=()
passed=0
for ct in "${targets[@]}"; do
  crate="${ct%%:*}"
  t="${ct#*:}"
  seeds="$crate/fuzz/corpus/$t"
  work="$out/corpus/${crate//\//_}-$t"
  mkdir -p "$work" "$out/artifacts/$t"
  [ -d "$seeds" ] && cp -n "$seeds"/* "$work"/ 2>/dev/null || true
  echo "== $crate: $t (${per}s)"
  if (cd "$crate" && cargo fuzz run "${flags[@]}" --target-dir "$CARGO_TARGET_DIR" "$t" "$work" -- \
        -max_total_time="$per" -timeout=5 -rss_limit_mb=1024 -max_len=8192 \
        -artifact_prefix="$out/artifacts/$t/" -print_final_stats=1) >"$out/$t.log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$out/$t.log" | tail -2 || true
    passed=$((passed + 1))
  else
    tail -40 "$out/$t.log"
    failed+=("$ct")
  fi
done
echo "fuzz: ${passed} passed, ${#failed[@]} failed"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failing targets: ${failed[*]} (reproducers in $out/artifacts)" >&2
  exit 1
fi

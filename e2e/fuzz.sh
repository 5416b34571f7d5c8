#!/usr/bin/env bash
# Bounded runs of every coverage-guided fuzz target in the repository: each `fuzz/` directory
# in the cargo-fuzz layout (its Cargo.toml has `cargo-fuzz = true`) and each of its targets,
# on stable Rust with the sanitizer off (`-s none`), debug assertions and overflow checks on.
#
#   bash e2e/fuzz.sh [SECONDS_PER_TARGET]      (default 20; FUZZ_TARGETS="a b" runs only those)
#
# Seeds come from the committed `fuzz/seeds/TARGET/` (unit-test and RFC vectors); what a run
# finds goes to a corpus outside the repository (~/.cache/sweety/fuzz/...), so reruns start
# from it. A crash, panic, hang (-timeout=5) or memory blow-up (-rss_limit_mb=1024) fails
# the script and leaves the input under ~/.cache/sweety/fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-20}"
tools="$HOME/.cache/sweety/tools"
cache="$HOME/.cache/sweety/fuzz"
export PATH="$tools/bin:$PATH"
# Pinned like .ci/run's cargo-deny: an unpinned install takes whatever the registry has newest on a
# cold machine (and its minimum Rust with it).
CARGO_FUZZ_VERSION=0.12.0
if [ "$("$tools/bin/cargo-fuzz" --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION into $tools"
  cargo install --locked --root "$tools" cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi

mapfile -t dirs < <(git ls-files '*fuzz/Cargo.toml' | xargs -r grep -l 'cargo-fuzz = true' | xargs -r -n1 dirname | sort)
if [ ${#dirs[@]} -eq 0 ]; then
  echo "no fuzz directories" >&2
  exit 1
fi

# prune_stale DEPS NAME...: of each NAME (a fuzz target, or lib<workspace crate>), keep only the newest build.
# Every source change makes new ~400 MB target binaries under a new hash and cargo never removes the old
# ones: without this the cache grew by GBs per run until the disk was full.
prune_stale() {
  local deps=$1 name newest f; shift
  [ -d "$deps" ] || return 0
  for name in "$@"; do
    # The newest file of the name's builds (mtime), reduced to its "<name>-<hash>" stem.
    newest=$(find "$deps" -maxdepth 1 -regextype posix-extended -regex ".*/$name-[0-9a-f]{16}(\.[a-z]+)?" -printf '%T@ %f\n' |
      sort -rn | head -1 | sed -E 's/^[^ ]* //; s/\.[a-z]+$//')
    [ -n "$newest" ] || continue
    while IFS= read -r f; do
      case $f in "$newest" | "$newest".*) ;; *) rm -f -- "${deps:?}/$f" ;; esac
    done < <(find "$deps" -maxdepth 1 -regextype posix-extended -regex ".*/$name-[0-9a-f]{16}(\.[a-z]+)?" -printf '%f\n')
  done
}

failed=0
for dir in "${dirs[@]}"; do
  name="$(echo "$dir" | tr '/' '_')"
  export CARGO_TARGET_DIR="$cache/target-$name"
  crate="$(dirname "$dir")"
  echo "== $dir: build"
  (cd "$crate" && cargo fuzz build -s none -a)
  deps="$CARGO_TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release/deps"
  # shellcheck disable=SC2046 # one word per name
  prune_stale "$deps" $(cd "$crate" && cargo fuzz list) \
    $(find "$deps" -maxdepth 1 -name 'libsweety_*' -printf '%f\n' | sed -E 's/-[0-9a-f]{16}\..*//' | sort -u)
  for target in $(cd "$crate" && cargo fuzz list); do
    if [ -n "${FUZZ_TARGETS:-}" ] && [[ " $FUZZ_TARGETS " != *" $target "* ]]; then
      continue
    fi
    corpus="$cache/corpus/$name/$target"
    artifacts="$cache/artifacts/$name/$target"
    mkdir -p "$corpus" "$artifacts"
    seeds=()
    [ -d "$dir/seeds/$target" ] && seeds=("$PWD/$dir/seeds/$target")
    echo "== $dir: $target for ${secs}s"
    if ! (cd "$crate" && cargo fuzz run -s none -a "$target" "$corpus" "${seeds[@]}" -- \
      -max_total_time="$secs" -timeout=5 -rss_limit_mb=1024 -max_len=65536 \
      -artifact_prefix="$artifacts/" -print_final_stats=1 2>&1 | tail -n 25); then
      echo "FAIL: $dir $target (inputs in $artifacts)" >&2
      failed=1
    fi
  done
done
exit "$failed"

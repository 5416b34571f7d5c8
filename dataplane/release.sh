#!/usr/bin/env bash
# The release build of sweety-dataplane, profile-guided (issue 23): what the image, the
# benchmarks and the README use.
#
#   dataplane/release.sh                    # cargo build --release -p sweety-dataplane, with the profile
#   dataplane/release.sh run -- run --config FILE    # the same build, then run it
#   dataplane/release.sh build --locked     # more cargo arguments after the subcommand
#
# rustc reads dataplane/sweety.profdata (`-Cprofile-use`), the counts of an instrumented build
# under run.sh's cells (e2e/bench/pgo.sh writes it, never by hand), and LLVM lays out, inlines
# and splits hot and cold code by it. The flags go in by `--config build.rustflags=[...]` on this
# command line only: debug and test builds, and a plain `cargo build --release`, are as before.
# RUSTFLAGS, when set, replaces build.rustflags (cargo's rule), so that build has no profile:
# this script refuses it.
#
# The path in the flag is absolute (cargo runs rustc in each registry package's own directory,
# so a relative one fails for every dependency) and the same from every checkout: a copy of the
# profile named by its content, SWEETY_PGO_DIR/sweety-<sha256 prefix>.profdata (default
# ~/.cache/sweety/pgo), with a fixed old modification time. Cargo keeps a crate fresh only if
# its flags are the ones it was built with and every file of its dep-info (rustc lists the
# profile there) is older than the build; the worktree's own path in the flag made every
# checkout at another path rebuild all ~300 crates. A new profile is a new name, so a new
# flag: everything is rebuilt then, as it must be.
#
# `-p sweety-dataplane` alone matters: the profile names functions by their symbols, whose hashes
# depend on the features cargo unifies over the packages it builds; built with the controller,
# fewer match. A stale profile (code changed since it was made) never breaks a build: a function
# whose control flow changed, or that is new, gets no profile and is compiled as without PGO;
# LLVM's warning for each (`function control flow change detected`) is off. A profile this LLVM
# cannot read is only a warning of rustc; .ci/run checks the committed one.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source=$repo/dataplane/sweety.profdata
[[ -f $source ]] || { echo "release.sh: no $source (e2e/bench/pgo.sh makes it)" >&2; exit 1; }
dir=${SWEETY_PGO_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/sweety/pgo}
sum=$(sha256sum "$source") && sum=${sum:0:16}
profile=$dir/sweety-$sum.profdata
if ! cmp -s "$source" "$profile" 2>/dev/null; then
    mkdir -p "$dir"
    cp "$source" "$profile.tmp.$$"
    touch -d @946684800 "$profile.tmp.$$" # 2000-01-01: older than any build that reads it
    mv -f "$profile.tmp.$$" "$profile"
fi
[[ $profile != *[\"\\]* ]] || { echo "release.sh: the path $profile cannot go in a TOML string" >&2; exit 1; }
[[ -z ${RUSTFLAGS:-} && -z ${CARGO_ENCODED_RUSTFLAGS:-} ]] ||
    { echo "release.sh: RUSTFLAGS is set and would replace the profile's flags; unset it" >&2; exit 1; }
sub=build
if (($#)) && [[ $1 != -* ]]; then sub=$1; shift; fi
cd "$repo"
exec cargo "$sub" --release -p sweety-dataplane --bin sweety-dataplane \
    --config "build.rustflags=[\"-Cprofile-use=$profile\", \"-Cllvm-args=-no-pgo-warn-mismatch\"]" "$@"

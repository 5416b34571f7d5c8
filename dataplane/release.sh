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
# command line only, with the profile's absolute path (cargo runs rustc in each package's own
# directory, so a relative one fails for every dependency): debug and test builds, and a plain
# `cargo build --release`, are as before. RUSTFLAGS, when set, replaces build.rustflags (cargo's
# rule), so that build has no profile: this script refuses it.
#
# `-p sweety-dataplane` alone matters: the profile names functions by their symbols, whose hashes
# depend on the features cargo unifies over the packages it builds; built with the controller,
# fewer match. A stale profile (code changed since it was made) never breaks a build: a function
# whose control flow changed, or that is new, gets no profile and is compiled as without PGO;
# LLVM's warning for each (`function control flow change detected`) is off. A profile this LLVM
# cannot read is only a warning of rustc; .ci/run checks the committed one.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
profile=$repo/dataplane/sweety.profdata
[[ -f $profile ]] || { echo "release.sh: no $profile (e2e/bench/pgo.sh makes it)" >&2; exit 1; }
[[ $profile != *[\"\\]* ]] || { echo "release.sh: the path $profile cannot go in a TOML string" >&2; exit 1; }
[[ -z ${RUSTFLAGS:-} && -z ${CARGO_ENCODED_RUSTFLAGS:-} ]] ||
    { echo "release.sh: RUSTFLAGS is set and would replace the profile's flags; unset it" >&2; exit 1; }
sub=build
if (($#)) && [[ $1 != -* ]]; then sub=$1; shift; fi
cd "$repo"
exec cargo "$sub" --release -p sweety-dataplane --bin sweety-dataplane \
    --config "build.rustflags=[\"-Cprofile-use=$profile\", \"-Cllvm-args=-no-pgo-warn-mismatch\"]" "$@"

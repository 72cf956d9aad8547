#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs (Debian packages, cargo
# tools), checks formatting and lints, runs every test (unit, property, golden, end-to-end with
# real clients, crash, memory, recovery), runs them again with debug assertions and overflow
# checks on (the `checked` profile), runs libiscsi's iSCSI conformance suite against the
# binary (scripts/iscsi-conformance.sh, fails on a regression), runs the README's first command
# from a fresh clone (scripts/readme-check.sh), replays and briefly runs every fuzz target.
# Prints how long each stage took. Usage: scripts/test.sh [--quick]   (--quick: no fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
quick=0; [ "${1:-}" = "--quick" ] && quick=1
stage_start=$SECONDS
declare -a timings=()
stage() {
  local now=$SECONDS
  if [ -n "${current:-}" ]; then timings+=("$(printf '%-42s %5ss' "$current" $((now - stage_start)))"); fi
  current=$1; stage_start=$now
  echo; echo "=== $1"
}
finish() {
  stage done
  echo "=== stage timings"; printf '%s\n' "${timings[@]}"
}
trap 'echo "FAILED in stage: ${current:-?}" >&2' ERR

stage "install packages"
need_pkgs=()
# nbdfuse is part of libnbd-bin on Debian 12 (no package of its own); fuse3 brings fusermount.
# python3 runs bench/results.py check (docs/benchmarks.md tables match bench/results/).
# sqlite3 is the live database of history_clients.rs.
for p in qemu-utils libnbd-bin fio nbdkit libiscsi-bin e2fsprogs curl fuse2fs fuse3 python3 sqlite3; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
# qemu's iSCSI driver (qemu-block-extra) must match qemu-utils; where qemu-utils came from the
# release's backports (version "~bpo<release>"), qemu-block-extra must come from there too.
release=$(. /etc/os-release && echo "${VERSION_CODENAME:-} ${VERSION_ID:-}")
codename=${release% *}; version_id=${release#* }
qemu_ver=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
extra_ver=$(dpkg-query -W -f='${Version}' qemu-block-extra 2>/dev/null || true)
need_extra=0; [ "$qemu_ver" != "$extra_ver" ] && need_extra=1
if [ ${#need_pkgs[@]} -gt 0 ] || [ $need_extra -eq 1 ]; then
  backports="$codename-backports"
  if [[ "$qemu_ver" == *bpo${version_id}* ]] \
    && ! grep -rqsw -- "$backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # Backports from the archive this machine already uses for its release: its configured
    # source (one-line or deb822 form), never a host named here.
    archive=$(scripts/apt-source-uri "$codename")
    echo "deb $archive $backports main" | $SUDO tee "/etc/apt/sources.list.d/$backports.list" >/dev/null
  fi
  $SUDO apt-get update -qq
  [ ${#need_pkgs[@]} -gt 0 ] && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}"
  qemu_ver=$(dpkg-query -W -f='${Version}' qemu-utils)
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "qemu-block-extra=$qemu_ver"
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

stage "format"
cargo fmt --all -- --check
# The benchmark tables of docs/benchmarks.md are rendered from bench/results/, never by hand.
python3 bench/results.py check
# The apt source lookup the install stage uses, on configurations in both forms.
scripts/tests/apt-source-uri.sh

stage "clippy"
cargo clippy --workspace --all-targets --release -- -D warnings

stage "build (release)"
cargo test --workspace --release --no-run

stage "tests"
cargo test --workspace --release

# The tests again with debug assertions and overflow checks on: Cargo.toml's `checked` profile
# (release optimisation, so the checks cost a second build rather than slow tests). Release
# compiles out every `debug_assert!` (e.g. BOSC's per-block queue order check) and lets integer
# arithmetic wrap silently; this stage makes both panic. Library and test targets only: doc
# tests and examples run (or build) in the release stage above. Left out, with the reason:
#   mariner-index-bench: a benchmark harness (its one test runs the benchmarks at a tiny size);
#     it alone pulls redb and fjall into the build, and the BOSC code it drives is tested by
#     mariner-bosc's own tests here.
#   mariner (the end-to-end tests, the server binary under real clients): measured here under
#     load, its checked build adds 317 s and its tests 132 s (all pass), which would take the
#     suite past 30 minutes; the library code it runs is checked by the crates' own tests here.
#     Run it by hand with `cargo test --profile checked -p mariner --tests`.
checked=(-p mariner-disk -p mariner-placement -p mariner-log -p mariner-store -p mariner-bosc
  -p mariner-nbd -p mariner-scsi -p mariner-iscsi -p mariner-node -p mariner-limits -p mariner-sim
  -p mariner-history -p mariner-heap)
stage "build (checked)"
cargo test --profile checked "${checked[@]}" --tests --no-run

stage "tests (debug assertions, overflow checks)"
cargo test --profile checked "${checked[@]}" --tests

stage "README command, fresh clone"
scripts/readme-check.sh

stage "iSCSI conformance (libiscsi)"
MARINER_BIN=target/release/mariner scripts/iscsi-conformance.sh

if [ $quick -eq 0 ]; then
  stage "fuzz (${FUZZ_SECONDS}s per target)"
  command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
  for target in $(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz list); do
    scratch=$(mktemp -d)
    # The B+tree targets open a BOSC engine per input, whose commit pipeline runs on scoped
    # threads: `thread::scope` returns when their closures end, before the threads' own
    # thread-local destructors (std's channel context) have run, and LeakSanitizer checking
    # then reports those as leaks (112 bytes from std::sync::mpmc::context and
    # __cxa_thread_atexit_impl). Leak checks stay on for every other target.
    leaks=1
    case $target in bosc_btree | bosc_router_image) leaks=0 ;; esac
    # New inputs go to a scratch dir; the committed corpus is read-only input.
    (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "$scratch" "corpus/$target" -- \
      -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -detect_leaks=$leaks 2>&1 | tail -3)
    rm -rf "$scratch"
  done
fi
finish

#!/usr/bin/env bash
# scripts/apt-source-uri on apt configurations in both forms (run by scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "apt-source-uri test: $*" >&2; exit 1; }
expect() { # expect ETC SUITE WANT ("" = must fail)
  local got rc=0
  got=$(APT_ETC=$1 scripts/apt-source-uri "$2" 2>/dev/null) || rc=$?
  if [ -z "$3" ]; then [ $rc -ne 0 ] || fail "$1 $2: wanted failure, got '$got'"
  else [ $rc -eq 0 ] && [ "$got" = "$3" ] || fail "$1 $2: wanted '$3', got '$got' (rc $rc)"; fi
}
# One-line form: comments, deb-src before deb, an [options] block with spaces.
mkdir -p "$tmp/one/sources.list.d"
cat >"$tmp/one/sources.list" <<'X'
# deb http://commented.example/debian trixie main
deb-src http://src.example/debian trixie main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://one.example/debian trixie main contrib
deb http://one.example/debian-security trixie-security main
X
expect "$tmp/one" trixie http://one.example/debian
expect "$tmp/one" trixie-security http://one.example/debian-security
expect "$tmp/one" bookworm ""
# deb822 form: a disabled stanza first, deb-src only, several suites, a continued field.
mkdir -p "$tmp/822/sources.list.d"
cat >"$tmp/822/sources.list.d/debian.sources" <<'X'
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

# the archive
Types: deb deb-src
URIs: http://822.example/debian
  http://822-second.example/debian
Suites: bookworm bookworm-updates
Components: main
X
expect "$tmp/822" bookworm http://822.example/debian
expect "$tmp/822" bookworm-updates http://822.example/debian
expect "$tmp/822" bookworm-backports ""
# Nothing configured at all.
mkdir -p "$tmp/none"
expect "$tmp/none" bookworm ""
echo "apt-source-uri: all cases pass"

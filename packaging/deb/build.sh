#!/usr/bin/env bash
# Builds the Debian packages bcd and bcctl into target/debian/:
#
#   packaging/deb/build.sh                       release build of both binaries, then both packages
#   packaging/deb/build.sh --profile dev --no-build --fast
#                                                packages of the binaries a test run already built
#                                                (what .ci/run checks; no second build)
#
# Each binary writes its own shell completions and man pages (`completions SHELL`, `man
# --out-dir`, generated from its clap command line) into packaging/deb/generated/<binary>/ (ignored by git), which the
# packages' asset lists ([package.metadata.deb] in daemon/ and controlplane-lite/Cargo.toml)
# install. cargo-deb is installed at the pinned version below when it is missing or another.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO_DEB_VERSION=3.8.0

usage() {
  echo "usage: $0 [--profile NAME] [--no-build] [--fast]" >&2
  exit 2
}
profile=release
build=1
fast=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --no-build) build=0; shift ;;
    --fast) fast=(--fast); shift ;;
    *) usage ;;
  esac
done
case "$profile" in
  dev|debug) profile=dev; pdir=debug ;;
  *) pdir=$profile ;;
esac
target=${CARGO_TARGET_DIR:-target}

if [ "$(cargo deb --version 2>/dev/null || true)" != "$CARGO_DEB_VERSION" ]; then
  echo "build.sh: installing cargo-deb $CARGO_DEB_VERSION" >&2
  cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION"
fi

if [ "$build" = 1 ]; then
  cargo build --locked --profile "$profile" -p bcd -p controlplane-lite --bins
fi
for bin in bcd bcctl; do
  if [ ! -x "$target/$pdir/$bin" ]; then
    echo "build.sh: $target/$pdir/$bin is missing: build it first (or leave out --no-build)" >&2
    exit 1
  fi
done

# Completions and man pages from the binaries themselves, so they describe exactly these flags.
for bin in bcd bcctl; do
  exe="$target/$pdir/$bin"
  out=packaging/deb/generated/$bin
  rm -rf "$out" && mkdir -p "$out"
  "$exe" completions bash >"$out/$bin.bash"
  "$exe" completions zsh >"$out/_$bin"
  "$exe" completions fish >"$out/$bin.fish"
  "$exe" man --out-dir "$out/man"
  # Debian ships man pages gzipped; -n leaves out name and time (reproducible packages).
  gzip -9n "$out"/man/*.1
done

cargo deb --locked --no-build --profile "$profile" "${fast[@]}" -p bcd
cargo deb --locked --no-build --profile "$profile" "${fast[@]}" -p controlplane-lite
ls -1 "$target"/debian/bcd_*.deb "$target"/debian/bcctl_*.deb

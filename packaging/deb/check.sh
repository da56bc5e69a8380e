#!/usr/bin/env bash
# Installs the bcd and bcctl packages on this machine, checks what an operator relies on, and
# purges them again (CI runs it after packaging/deb/build.sh; needs root):
#
#   packaging/deb/check.sh [target/debian/bcd_*.deb target/debian/bcctl_*.deb]
#
# Checked: `dpkg -i` of both; `systemd-analyze verify` on the installed units; `bcd --version`
# and `bcctl --version`; the user `bcctl`; the state dirs' owners and modes; the conffiles; no
# service enabled or running; completions that bash loads and man pages that are roff; then
# `dpkg --purge` leaves the file system as it found it, but for what Debian keeps on purpose
# (the system user, and the shadow files' backups systemd-sysusers writes when adding it).
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() {
  echo "package check: FAILED: $*" >&2
  exit 1
}
[ "$(id -u)" = 0 ] || fail "needs root (dpkg -i, dpkg --purge)"
if [ $# -gt 0 ]; then
  debs=("$@")
else
  debs=(target/debian/bcd_*.deb target/debian/bcctl_*.deb)
fi
for d in "${debs[@]}"; do [ -f "$d" ] || fail "no package $d (run packaging/deb/build.sh)"; done

# A run that stopped half-way left them installed.
for p in bcd bcctl; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then
    dpkg --purge "$p" >/dev/null
  fi
done

# Everything but dpkg's and apt's own bookkeeping, which records the install by design.
snapshot() {
  find /etc /usr /var/lib /opt -xdev \
    \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/lib/ucf \) -prune -o -print \
    2>/dev/null | LC_ALL=C sort
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
snapshot >"$tmp/before"
had_user=0
getent passwd bcctl >/dev/null && had_user=1

echo "== dpkg -i ${debs[*]}"
dpkg -i "${debs[@]}"

echo "== versions"
bcd --version | grep -Eq '^bcd [0-9]' || fail "bcd --version: $(bcd --version 2>&1)"
bcctl --version | grep -Eq '^bcctl [0-9]' || fail "bcctl --version: $(bcctl --version 2>&1)"
bcd --version
bcctl --version

echo "== systemd-analyze verify (installed units)"
INSTALLED=1 sh packaging/systemd/verify.sh

echo "== user, state dirs, conffiles"
IFS=: read -r _ _ _ _ _ home shell < <(getent passwd bcctl) || fail "no user bcctl"
[ "$home" = /var/lib/bcctl ] || fail "bcctl's home is $home"
case "$shell" in */nologin) ;; *) fail "bcctl's shell is $shell" ;; esac
getent group bcctl >/dev/null || fail "no group bcctl"
want_dir() {
  local got
  got=$(stat -c '%U:%G %a' "$1" 2>/dev/null) || fail "$1 is missing"
  [ "$got" = "$2" ] || fail "$1 is $got, not $2"
  echo "$1 $got"
}
want_dir /var/lib/bcctl "bcctl:bcctl 700"
want_dir /var/lib/bcd "root:root 700"
want_dir /var/lib/bcd-site "root:root 700"
dpkg-query -W -f='${Conffiles}\n' bcd | grep -q '^ /etc/bcd/bcd.toml ' || fail "bcd.toml is no conffile"
dpkg-query -W -f='${Conffiles}\n' bcctl | grep -q '^ /etc/default/bcctl ' || fail "/etc/default/bcctl is no conffile"

echo "== not enabled, not running"
enabled=$(find /etc/systemd/system -name 'bcd*.service' -o -name 'bcctl.service' 2>/dev/null || true)
[ -z "$enabled" ] || fail "enabled on install: $enabled"
for p in /proc/[0-9]*; do
  case "$(readlink "$p/exe" 2>/dev/null || true)" in
    /usr/bin/bcd | /usr/bin/bcctl) fail "started on install: pid ${p#/proc/}" ;;
  esac
done

echo "== completions and man pages"
for b in bcd bcctl; do
  bash -c "source /usr/share/bash-completion/completions/$b && complete -p $b" >/dev/null ||
    fail "bash does not load $b's completions"
  [ -s "/usr/share/zsh/vendor-completions/_$b" ] || fail "no zsh completions for $b"
  [ -s "/usr/share/fish/vendor_completions.d/$b.fish" ] || fail "no fish completions for $b"
  zcat "/usr/share/man/man1/$b.1.gz" | grep -q '^\.TH' || fail "$b.1 is no man page"
done
for page in bcd-agent bcd-site bcctl-serve bcctl-nodes-list; do
  [ -f "/usr/share/man/man1/$page.1.gz" ] || fail "no man page $page(1)"
done
ls /usr/share/bcctl/grafana/*.json /usr/share/bcctl/prometheus/*.yml

echo "== dpkg --purge"
dpkg --purge bcd bcctl
snapshot >"$tmp/after"
left=$(LC_ALL=C comm -13 "$tmp/before" "$tmp/after" | grep -Ev '^/etc/(passwd|group|shadow|gshadow)-$' || true)
gone=$(LC_ALL=C comm -23 "$tmp/before" "$tmp/after" | grep -Ev '^/etc/(passwd|group|shadow|gshadow)-$' || true)
[ -z "$left" ] || fail "left behind after purge:"$'\n'"$left"
[ -z "$gone" ] || fail "removed by install and purge, but not ours:"$'\n'"$gone"
if [ "$had_user" = 0 ]; then
  echo "kept on purge (Debian keeps system users): user and group bcctl"
fi
echo "package check: ok"

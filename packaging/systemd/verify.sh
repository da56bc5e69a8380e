#!/bin/sh
# Checks the unit files with `systemd-analyze verify` (run it in CI). UNIT_DIR overrides where
# the units are read from (tests).
#
# verify refuses a unit whose ExecStart binary does not exist, so the units are copied to a
# temp dir with /usr/bin/bcd and /usr/bin/bcctl replaced by real executables: the built binaries
# when BCD_BIN / BCCTL_BIN name them, else /bin/true. Every other line is checked as shipped.
# INSTALLED=1 checks the units the Debian packages installed, in place and unchanged
# (/usr/lib/systemd/system, with /usr/bin/bcd and /usr/bin/bcctl installed beside them).
set -eu
units="bcd.service bcd-site.service bcctl.service"
if [ "${INSTALLED:-0}" = 1 ]; then
    dir=/usr/lib/systemd/system
    paths=$(for u in $units; do printf '%s/%s ' "$dir" "$u"; done)
    out=$(SYSTEMD_LOG_LEVEL=${SYSTEMD_LOG_LEVEL:-notice} systemd-analyze verify --man=no $paths 2>&1) || status=$?
else
    here=${UNIT_DIR:-$(cd "$(dirname "$0")" && pwd)}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    bcd_bin=${BCD_BIN:-/bin/true}
    bcctl_bin=${BCCTL_BIN:-/bin/true}
    for unit in $units; do
        sed -e "s#/usr/bin/bcd #${bcd_bin} #" -e "s#/usr/bin/bcctl #${bcctl_bin} #" \
            "$here/$unit" >"$tmp/$unit"
    done
    out=$(cd "$tmp" && SYSTEMD_LOG_LEVEL=${SYSTEMD_LOG_LEVEL:-notice} systemd-analyze verify --man=no ./bcd.service ./bcd-site.service ./bcctl.service 2>&1) || status=$?
fi
printf '%s\n' "$out"
# Complaints about units the test host lacks (network-online.target dependencies on a container
# without systemd as PID 1) are not ours; anything mentioning our units is.
if [ "${status:-0}" -ne 0 ] || printf '%s\n' "$out" | grep -E '(bcd|bcd-site|bcctl)\.service' >/dev/null; then
    echo "systemd-analyze verify: FAILED" >&2
    exit 1
fi
echo "systemd-analyze verify: ok"

#!/bin/sh
# Install the RUSEON appliance on a board (or into an image rootfs, run inside its chroot).
#
#   systemd/install.sh [--source PATH] [--wheels DIR] [--lock FILE] [--prefix /opt/ruseon]
#                      [--socket-activation] [--no-enable] [--no-start]
#
# --source PATH        the project to install: a wheel file or a source directory
#                      (default: the checkout this script is in).
# --wheels DIR         install offline from the wheels in DIR (pip --no-index --find-links DIR).
# --lock FILE          the dependencies exactly as FILE pins them (requirements.lock: pip
#                      --require-hashes --no-deps, then pip check), the project without its deps.
# --prefix DIR         where the venv goes (default /opt/ruseon). The unit expects /opt/ruseon.
# --socket-activation  also enable ruseon-http.socket (port 80) and ruseon-rtc.socket (UDP 8189).
# --no-enable          install only; do not enable the units.
# --no-start           do not (re)start the service even when systemd is running.
#
# What it does, idempotently (run it again to upgrade):
#   1. a venv in PREFIX with --system-site-packages, so apt's python3-picamera2 and
#      python3-systemd are importable, and the project pip-installed into it;
#   2. the units into /etc/systemd/system, the sysusers and tmpfiles snippets into
#      /usr/lib/sysusers.d and /usr/lib/tmpfiles.d, then the user and directories created;
#   3. /etc/ruseon/ruseon.toml from the example config, only if it does not exist yet;
#   4. the units enabled, and when systemd is running (not in an image chroot) the service
#      (re)started.
# Needs: python3, python3-venv, systemd (apt: python3-systemd python3-picamera2 on a Pi).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
source_path=$(dirname "$here")
wheels=""
lock=""
prefix=/opt/ruseon
socket_activation=no
enable=yes
start=yes

usage() {
    sed -n '2,17s/^# \{0,1\}//p' "$0"
    exit "${1:-0}"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --source) source_path=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --lock) lock=$2; shift 2 ;;
        --prefix) prefix=$2; shift 2 ;;
        --socket-activation) socket_activation=yes; shift ;;
        --no-enable) enable=no; shift ;;
        --no-start) start=no; shift ;;
        -h|--help) usage 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

step() { echo "install.sh: $*"; }
die() { echo "install.sh: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it writes $prefix, /etc and /usr/lib)"
command -v python3 >/dev/null || die "python3 is missing: apt-get install python3 python3-venv"
python3 -c 'import ensurepip' 2>/dev/null \
    || die "python3-venv is missing: apt-get install python3-venv"
[ -e "$source_path" ] || die "--source $source_path does not exist"
if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then
    die "--wheels $wheels is not a directory"
fi
if [ -n "$lock" ] && [ ! -f "$lock" ]; then
    die "--lock $lock does not exist"
fi

# 1. The venv. Re-running python3 -m venv on an existing venv only refreshes its scripts.
step "venv in $prefix (with system site packages)"
python3 -m venv --system-site-packages "$prefix"
if [ -n "$wheels" ]; then
    set -- --no-index --find-links "$wheels"
else
    set --
fi
# PIP_* would otherwise leak in from the caller; keep the install reproducible.
pip() { PIP_DISABLE_PIP_VERSION_CHECK=1 "$prefix/bin/pip" "$@"; }
if [ -n "$lock" ]; then
    # Exactly the locked wheels, each checked against its hash (a pin that an OS package of the
    # very same version already satisfies, seen through --system-site-packages, stays the OS's).
    step "installing the dependencies pinned in $(basename "$lock") (hashes checked)"
    pip install --quiet --no-cache-dir "$@" --require-hashes --no-deps -r "$lock"
    step "installing $source_path (its dependencies: the lock's)"
    pip install --quiet --no-cache-dir "$@" --force-reinstall --no-deps "$source_path"
    # The lock must hold every dependency at a version the project (and what the lock put in)
    # accepts; what pip check says of the OS's own Python packages is not the lock's business.
    names=$( { echo ruseon-appliance; sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' "$lock"; } \
        | tr 'A-Z_.' 'a-z--')
    broken=$(pip check 2>&1 | awk -v names="$names" '
        BEGIN { n = split(names, list, "\n"); for (i = 1; i <= n; i++) ours[list[i]] = 1 }
        { name = tolower($1); gsub(/[_.]/, "-", name); if (name in ours) print }') || true
    [ -z "$broken" ] || die "the lock does not satisfy the project: $broken"
else
    step "installing $source_path"
    pip install --quiet --no-cache-dir "$@" --upgrade "$source_path"
    # Same version number, new code: replace the project itself without touching its dependencies.
    pip install --quiet --no-cache-dir "$@" --force-reinstall --no-deps "$source_path"
fi
"$prefix/bin/ruseon" --help >/dev/null || die "$prefix/bin/ruseon does not run"

# 2. Units, user, directories.
step "units, sysusers and tmpfiles"
install -d /etc/systemd/system /usr/lib/sysusers.d /usr/lib/tmpfiles.d
install -m 0644 "$here/ruseon.service" "$here/ruseon-http.socket" "$here/ruseon-rtc.socket" \
    /etc/systemd/system/
install -m 0644 "$here/ruseon.sysusers" /usr/lib/sysusers.d/ruseon.conf
install -m 0644 "$here/ruseon.tmpfiles" /usr/lib/tmpfiles.d/ruseon.conf
install -d "$prefix/share/ruseon"
install -m 0644 "$here/README.md" "$prefix/share/ruseon/README.systemd.md"
systemd-sysusers /usr/lib/sysusers.d/ruseon.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/ruseon.conf

# 3. The example config, never overwriting the admin's.
if [ ! -e /etc/ruseon/ruseon.toml ]; then
    step "example config to /etc/ruseon/ruseon.toml"
    example=$("$prefix/bin/python" -c \
        'import pathlib, ruseon_appliance as p; print(pathlib.Path(p.__file__).with_name("ruseon.example.toml"))')
    if [ -f "$example" ]; then
        install -m 0640 -g ruseon "$example" /etc/ruseon/ruseon.toml
    else
        # No example shipped: write the effective defaults so the admin sees every key.
        "$prefix/bin/python" -c \
            'from ruseon_appliance.config import Config, to_toml; print(to_toml(Config()))' \
            > /etc/ruseon/ruseon.toml
        chgrp ruseon /etc/ruseon/ruseon.toml
        chmod 0640 /etc/ruseon/ruseon.toml
    fi
else
    step "keeping the existing /etc/ruseon/ruseon.toml"
fi

# 4. Enable, and start when systemd runs this system (not inside an image chroot).
running=no
if [ -d /run/systemd/system ]; then
    running=yes
    systemctl daemon-reload
fi
if [ "$enable" = yes ]; then
    step "enabling ruseon.service"
    systemctl enable ruseon.service
    if [ "$socket_activation" = yes ]; then
        step "enabling ruseon-http.socket and ruseon-rtc.socket"
        systemctl enable ruseon-http.socket ruseon-rtc.socket
    fi
fi
if [ "$running" = yes ] && [ "$start" = yes ]; then
    if [ "$socket_activation" = yes ]; then
        # A socket unit refuses to start while its service runs: stop, then sockets, then start.
        systemctl stop ruseon.service
        systemctl restart ruseon-http.socket ruseon-rtc.socket
    fi
    step "restarting ruseon.service"
    systemctl restart ruseon.service
fi
step "done"

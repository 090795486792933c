#!/bin/sh
# The appliance layer, applied to a Debian-family rootfs. Both image targets run this:
# rpi-image-gen's layer (a customize hook) for the Raspberry Pi OS image, and `image/build debian`.
#
#   image/layer/apply.sh ROOTFS --wheel FILE [--wheels DIR] [--ssh]
#
# It installs the appliance with the same systemd/install.sh a board uses (run in a chroot, with
# /proc and /dev already mounted by the caller), then adds the image-only parts: the first-boot
# hook that applies ruseon.toml from the boot partition, the mDNS announcement, the console URL,
# and the read-mostly settings (volatile journal). It needs python3, python3-venv and systemd in
# ROOTFS.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$(dirname "$here")")
rootfs=${1:?usage: apply.sh ROOTFS --wheel FILE [--wheels DIR] [--ssh]}
shift
wheel=""
wheels=""
ssh=no
while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --ssh) ssh=yes; shift ;;
        *) echo "apply.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -d "$rootfs/etc" ] || { echo "apply.sh: $rootfs is not a rootfs" >&2; exit 1; }
[ -f "$wheel" ] || { echo "apply.sh: --wheel FILE is required (got '$wheel')" >&2; exit 1; }

say() { echo "apply.sh: $*"; }

# Stage what install.sh needs inside the rootfs; removed at the end.
stage=$rootfs/tmp/ruseon-install
rm -rf "$stage"
mkdir -p "$stage/dist"
cp -r "$repo/systemd" "$stage/systemd"
cp "$wheel" "$stage/dist/"
set -- --source "/tmp/ruseon-install/dist/$(basename "$wheel")" --no-start
if [ -n "$wheels" ]; then
    cp -r "$wheels" "$stage/wheels"
    set -- "$@" --wheels /tmp/ruseon-install/wheels
fi
say "running systemd/install.sh in the rootfs"
chroot "$rootfs" /bin/sh /tmp/ruseon-install/systemd/install.sh "$@"
rm -rf "$stage"

say "first-boot hook, mDNS announcement, console URL, volatile journal"
install -d "$rootfs/usr/lib/ruseon" "$rootfs/boot/firmware" "$rootfs/etc/issue.d" \
    "$rootfs/etc/avahi/services" "$rootfs/etc/systemd/journald.conf.d"
install -m 0755 "$here/ruseon-firstboot" "$rootfs/usr/lib/ruseon/ruseon-firstboot"
install -m 0644 "$here/ruseon-firstboot.service" "$rootfs/etc/systemd/system/"
install -m 0644 "$here/ruseon.issue" "$rootfs/etc/issue.d/ruseon.issue"
install -m 0644 "$here/avahi-ruseon.service" "$rootfs/etc/avahi/services/ruseon.service"
install -m 0644 "$here/journald-volatile.conf" \
    "$rootfs/etc/systemd/journald.conf.d/ruseon-volatile.conf"
chroot "$rootfs" systemctl enable ruseon-firstboot.service ruseon.service
if [ -e "$rootfs/lib/systemd/system/avahi-daemon.service" ]; then
    chroot "$rootfs" systemctl enable avahi-daemon.service
fi
if [ "$ssh" = yes ] && [ -e "$rootfs/lib/systemd/system/ssh.service" ]; then
    chroot "$rootfs" systemctl enable ssh.service
fi
# Nothing but the appliance's state is meant to change at run time: no unattended apt runs.
for timer in apt-daily.timer apt-daily-upgrade.timer; do
    if [ -e "$rootfs/lib/systemd/system/$timer" ]; then
        chroot "$rootfs" systemctl mask "$timer"
    fi
done
say "layer applied to $rootfs"

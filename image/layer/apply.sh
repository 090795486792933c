#!/bin/sh
# The appliance layer, applied to a Debian-family rootfs. Both image targets run this:
# rpi-image-gen's layer (a customize hook) for the Raspberry Pi OS image, and `image/build debian`.
#
#   image/layer/apply.sh ROOTFS --wheel FILE [--wheels DIR] [--lock FILE] [--ssh]
#                        [--admin-user NAME] [--network-manager]
#
# It installs the appliance with the same systemd/install.sh a board uses (run in a chroot, with
# /proc and /dev already mounted by the caller), then adds the image-only parts: the first-boot
# hook that applies ruseon.toml from the boot partition, root filesystem growth on first boot,
# the mDNS announcement, the console URL, and the read-mostly settings (volatile journal).
#
# --ssh              leave the SSH server enabled; without it ssh.service (and ssh.socket) are
#                    disabled, whatever the base enabled, until ruseon.toml brings a key.
# --admin-user NAME  the image's login user (rpi-image-gen's device user1, "pi"): first boot puts
#                    SSH keys there.
# --network-manager  make NetworkManager the one network stack (see network-manager.sh).
# --lock FILE        the pinned, hashed dependency wheels (default: the checkout's
#                    requirements.lock); install.sh installs exactly those. The image records
#                    the lock and the project's commit in /etc/ruseon/build-info.
# It needs python3, python3-venv and systemd in ROOTFS.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$(dirname "$here")")
rootfs=${1:?usage: apply.sh ROOTFS --wheel FILE [--wheels DIR] [--lock FILE] [--ssh] [--admin-user NAME] [--network-manager]}
shift
wheel=""
wheels=""
lock=$repo/requirements.lock
ssh=no
admin_user=""
network_manager=no
while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) wheel=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --lock) lock=$2; shift 2 ;;
        --ssh) ssh=yes; shift ;;
        --admin-user) admin_user=$2; shift 2 ;;
        --network-manager) network_manager=yes; shift ;;
        *) echo "apply.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -d "$rootfs/etc" ] || { echo "apply.sh: $rootfs is not a rootfs" >&2; exit 1; }
[ -f "$wheel" ] || { echo "apply.sh: --wheel FILE is required (got '$wheel')" >&2; exit 1; }
[ -f "$lock" ] || { echo "apply.sh: no lock file $lock (image/build lock writes it)" >&2; exit 1; }
if [ -n "$admin_user" ] && ! chroot "$rootfs" getent passwd "$admin_user" >/dev/null; then
    echo "apply.sh: --admin-user $admin_user has no account in $rootfs" >&2; exit 1
fi

say() { echo "apply.sh: $*"; }

# Stage what install.sh needs inside the rootfs; removed at the end.
stage=$rootfs/tmp/ruseon-install
rm -rf "$stage"
mkdir -p "$stage/dist"
cp -r "$repo/systemd" "$stage/systemd"
cp "$wheel" "$stage/dist/"
cp "$lock" "$stage/requirements.lock"
set -- --source "/tmp/ruseon-install/dist/$(basename "$wheel")" --no-start \
    --lock /tmp/ruseon-install/requirements.lock
if [ -n "$wheels" ]; then
    cp -r "$wheels" "$stage/wheels"
    set -- "$@" --wheels /tmp/ruseon-install/wheels
fi
say "running systemd/install.sh in the rootfs"
chroot "$rootfs" /bin/sh /tmp/ruseon-install/systemd/install.sh "$@"
rm -rf "$stage"

# What the image was built from: the project's version and commit, and the lock (kept whole
# beside it) with the versions it pinned. Read by the service: /api/status shows it to admin.
say "build info: /etc/ruseon/build-info"
install -d "$rootfs/usr/lib/ruseon"
install -m 0644 "$lock" "$rootfs/usr/lib/ruseon/requirements.lock"
commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null) || commit=unknown
dirty=false
if [ "$commit" != unknown ] && [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    dirty=true
fi
{
    echo "# What this image was built from (image/layer/apply.sh); /api/status shows it to admin."
    printf 'version = "%s"
' "$(basename "$wheel" | cut -d- -f2)"
    printf 'commit = "%s"
' "$commit"
    echo "# Uncommitted changes to tracked files were in the build."
    printf 'commit_dirty = %s
' "$dirty"
    printf 'built = "%s"
' "$(date -u ${SOURCE_DATE_EPOCH:+-d "@$SOURCE_DATE_EPOCH"} +%Y-%m-%dT%H:%M:%SZ)"
    printf 'arch = "%s"
' "$(chroot "$rootfs" dpkg --print-architecture)"
    echo 'lock = "/usr/lib/ruseon/requirements.lock"'
    printf 'lock_sha256 = "%s"
' "$(sha256sum "$lock" | cut -d' ' -f1)"
    echo
    echo "# The dependency versions the lock pinned (the wheels in /opt/ruseon)."
    echo "[packages]"
    sed -n 's/^\([A-Za-z0-9_.-]*\)==\([^ ]*\).*/\1 = "\2"/p' "$lock"
} > "$rootfs/etc/ruseon/build-info"
chmod 0644 "$rootfs/etc/ruseon/build-info"

say "first-boot hook, root growth, mDNS announcement, console URL, volatile journal"
install -d "$rootfs/usr/lib/ruseon" "$rootfs/boot/firmware" "$rootfs/etc/issue.d" \
    "$rootfs/etc/avahi/services" "$rootfs/etc/systemd/journald.conf.d"
install -m 0755 "$here/ruseon-firstboot" "$rootfs/usr/lib/ruseon/ruseon-firstboot"
install -m 0644 "$here/ruseon-firstboot.service" "$rootfs/etc/systemd/system/"
install -m 0755 "$here/ruseon-growfs" "$rootfs/usr/lib/ruseon/ruseon-growfs"
install -m 0644 "$here/ruseon-growfs.service" "$rootfs/etc/systemd/system/"
# The image's marker (ruseon_appliance/capture/sources/board.py): on the image, camera.source =
# "auto" never stands a synthetic test picture in for a camera it cannot find.
echo "ruseon image, built from $(basename "$wheel")" > "$rootfs/usr/lib/ruseon/image-release"
if [ -n "$admin_user" ]; then
    # ruseon-firstboot's default for device.admin_user: whose authorized_keys get the keys.
    echo "$admin_user" > "$rootfs/usr/lib/ruseon/admin-user"
fi
install -m 0644 "$here/ruseon.issue" "$rootfs/etc/issue.d/ruseon.issue"
# The image's defaults under /etc/ruseon/ruseon.toml (RTSP and ONVIF on; config.py
# VENDOR_DEFAULTS_PATH): a provisioning file that replaces ruseon.toml keeps them.
install -m 0644 "$here/defaults.toml" "$rootfs/usr/lib/ruseon/defaults.toml"
# `sudo ruseon admin-secret` (the console's hint): on sudo's secure_path.
install -d "$rootfs/usr/local/bin"
ln -sf /opt/ruseon/bin/ruseon "$rootfs/usr/local/bin/ruseon"
install -m 0644 "$here/avahi-ruseon.service" "$rootfs/etc/avahi/services/ruseon.service"
install -m 0644 "$here/journald-volatile.conf" \
    "$rootfs/etc/systemd/journald.conf.d/ruseon-volatile.conf"
chroot "$rootfs" systemctl enable ruseon-firstboot.service ruseon-growfs.service ruseon.service
if [ -e "$rootfs/lib/systemd/system/avahi-daemon.service" ]; then
    chroot "$rootfs" systemctl enable avahi-daemon.service
fi
# The base may have enabled SSH (rpi-image-gen's openssh-server layer does, Debian's postinst
# does): off unless asked for. Disabled, not masked: a key in ruseon.toml turns it on at first boot.
if [ -e "$rootfs/lib/systemd/system/ssh.service" ]; then
    # No host keys in the image (every card would share them): made on the device's first start.
    rm -f "$rootfs"/etc/ssh/ssh_host_*_key "$rootfs"/etc/ssh/ssh_host_*_key.pub
    install -m 0644 "$here/ruseon-ssh-hostkeys.service" "$rootfs/etc/systemd/system/"
    chroot "$rootfs" systemctl enable ruseon-ssh-hostkeys.service
    if [ "$ssh" = yes ]; then
        say "SSH server enabled (--ssh)"
        chroot "$rootfs" systemctl enable ssh.service
    else
        say "SSH server disabled (no --ssh)"
        chroot "$rootfs" systemctl disable ssh.service
        if [ -e "$rootfs/lib/systemd/system/ssh.socket" ]; then
            chroot "$rootfs" systemctl disable ssh.socket
        fi
    fi
fi
if [ "$network_manager" = yes ]; then
    "$here/network-manager.sh" "$rootfs"
fi
# A board without a real-time clock keeps time with systemd-timesyncd: it advances the clock at
# start to the mtime of its clock file (/var/lib/systemd/timesync/clock, saved at every sync and
# every SaveIntervalSec=, 60 s), so the clock never starts much before the last shutdown; and no
# earlier than this build on the first boot (the file seeded here, and /usr/lib/clock-epoch,
# which PID 1 itself advances the clock to). ruseon.service does not wait for time-sync.target:
# the recorder copes with a clock set later.
if [ -e "$rootfs/lib/systemd/system/systemd-timesyncd.service" ] || \
        [ -e "$rootfs/usr/lib/systemd/system/systemd-timesyncd.service" ]; then
    chroot "$rootfs" systemctl enable systemd-timesyncd.service
    install -d -m 0755 "$rootfs/var/lib/systemd/timesync"
    touch "$rootfs/var/lib/systemd/timesync/clock" "$rootfs/usr/lib/clock-epoch"
    if chroot "$rootfs" getent passwd systemd-timesync >/dev/null; then
        chroot "$rootfs" chown systemd-timesync:systemd-timesync \
            /var/lib/systemd/timesync /var/lib/systemd/timesync/clock
    fi
    say "systemd-timesyncd enabled, clock file seeded with the build time"
fi
# Nothing but the appliance's state is meant to change at run time: no unattended apt runs.
for timer in apt-daily.timer apt-daily-upgrade.timer; do
    if [ -e "$rootfs/lib/systemd/system/$timer" ]; then
        chroot "$rootfs" systemctl mask "$timer"
    fi
done
say "layer applied to $rootfs"

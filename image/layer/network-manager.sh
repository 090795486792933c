#!/bin/sh
# Make NetworkManager the one network stack of ROOTFS (the rpi image's appliance layer runs this).
#
#   image/layer/network-manager.sh ROOTFS
#
# rpi-image-gen's trixie-minbase brings systemd-networkd (systemd-net-min) and iwd, and its
# Raspberry Pi device layer writes /etc/systemd/network/01-eth0.network and 02-wlan0.network;
# the appliance adds NetworkManager, whose profile first boot writes for Wi-Fi. Two managers race
# over eth0/wlan0, so the other one is retired the way upstream's own CM5 jig layer does
# (contrib/src/cm5-programming-jig/layer/cm5-jig-desktop.yaml): its .network files removed and
# systemd-networkd*, iwd masked (the packages stay, owned by the suite). The null *.link files
# stay: udev reads them to keep the kernel names eth0/wlan0. NetworkManager drives Wi-Fi with
# wpa_supplicant (its default backend), so the layer installs wpasupplicant.
set -eu
rootfs=${1:?usage: network-manager.sh ROOTFS}
[ -d "$rootfs/etc" ] || { echo "network-manager.sh: $rootfs is not a rootfs" >&2; exit 1; }
rm -f "$rootfs/etc/systemd/network/01-eth0.network" "$rootfs/etc/systemd/network/02-wlan0.network"
# systemctl --root works on the tree itself, with or without binaries for this host's arch.
systemctl --root="$rootfs" --quiet mask \
    systemd-networkd.service systemd-networkd.socket systemd-networkd-wait-online.service \
    iwd.service
systemctl --root="$rootfs" --quiet enable NetworkManager.service
install -d -m 0700 "$rootfs/etc/NetworkManager/system-connections"
echo "network-manager.sh: NetworkManager is the network stack (systemd-networkd and iwd masked)"

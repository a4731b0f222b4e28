#!/usr/bin/env bash
# Makes (once) a minimal Debian 12 root with systemd for tests/tests/systemd.rs, which
# boots it with `systemd-nspawn --boot` and installs Drover's .deb files inside.
# Cached under ${DROVER_TEST_CACHE:-/var/cache/drover-test}/root-<key>, the key a hash
# of the suite, mirror and package list: a second run only prints the path. Needs
# root and debootstrap (scripts/setup.sh installs it). Prints the root's path.
set -euo pipefail
suite=bookworm
mirror=${DROVER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# systemd boots the root; dbus lets systemctl inside talk to it like on a host;
# procps gives the test `ps` and `pgrep` to follow task pids.
packages=systemd,systemd-sysv,dbus,procps
cache=${DROVER_TEST_CACHE:-/var/cache/drover-test}
key=$(printf '%s %s %s\n' "$suite" "$mirror" "$packages" | sha256sum | cut -c1-16)
root="$cache/root-$key"
if [ -f "$root/.drover-complete" ]; then
  echo "$root"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || {
  echo "systemd-root: debootstrap is missing; run scripts/setup.sh" >&2
  exit 2
}
mkdir -p "$cache"
# A half-made root from an interrupted run is made again from scratch.
rm -rf "$root" "$root.tmp"
echo "systemd-root: debootstrap $suite into $root (a few minutes, once)" >&2
debootstrap --variant=minbase --include="$packages" "$suite" "$root.tmp" "$mirror" >&2
# The container has no console login to wait for and no network to configure.
chroot "$root.tmp" systemctl mask getty@tty1.service console-getty.service \
  systemd-networkd-wait-online.service >/dev/null 2>&1 || true
echo drover-test >"$root.tmp/etc/hostname"
rm -rf "$root.tmp/var/cache/apt/archives/"*.deb
touch "$root.tmp/.drover-complete"
mv "$root.tmp" "$root"
echo "$root"

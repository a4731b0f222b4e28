#!/usr/bin/env bash
# Builds Drover's Debian packages with dpkg-deb: drover-master, drover-agent (with
# drover-executor) and drover (the CLI), version from Cargo.toml's workspace version.
#
#   scripts/package.sh [--bin-dir DIR] [--out DIR] [--version-suffix S] [--fast]
#
# --bin-dir   where the four binaries are (default target/release: run
#             scripts/release.sh first); tests package target/debug
# --out       where the .deb files go (default target/debian)
# --version-suffix  appended to the Debian version, e.g. +hotfix1 (an upgrade test
#             bumps it: 0.1.0-1+t2 sorts after 0.1.0-1)
# --fast      gzip -1 instead of xz (tests: quicker, bigger)
#
# Binaries are stripped of debug info. Maintainer scripts, the copyright file and
# the lintian overrides are in packaging/debian/, units in packaging/systemd/,
# default configs (conffiles) in packaging/config/. Prints the .deb paths.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=target/release
out=target/debian
suffix=
compress=(-Zxz)
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --version-suffix) suffix=$2; shift 2 ;;
    --fast) compress=(-Zgzip -z1); shift ;;
    *) echo "package.sh: unknown argument $1 (see the header of $0)" >&2; exit 64 ;;
  esac
done
for b in drover drover-master drover-agent drover-executor; do
  [ -x "$bin_dir/$b" ] || { echo "package.sh: $bin_dir/$b is missing; build it first (scripts/release.sh)" >&2; exit 2; }
done
upstream=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$upstream" ] || { echo "package.sh: no version in Cargo.toml [workspace.package]" >&2; exit 2; }
version="$upstream-1$suffix"
arch=$(dpkg --print-architecture)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# stage NAME: an empty package tree with the docs every package carries.
stage() {
  local d="$work/$1"
  install -d "$d/DEBIAN" "$d/usr/bin" "$d/usr/share/doc/$1"
  install -m 0644 packaging/debian/copyright "$d/usr/share/doc/$1/copyright"
  printf '%s (%s) unstable; urgency=medium\n\n  * Built from the Drover tree by scripts/package.sh.\n\n -- Drover maintainers <drover@example.invalid>  %s\n' \
    "$1" "$version" "$(date -R -u -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")" \
    | gzip -9n >"$d/usr/share/doc/$1/changelog.Debian.gz"
  if [ -f "packaging/debian/$1.lintian-overrides" ]; then
    install -d "$d/usr/share/lintian/overrides"
    install -m 0644 "packaging/debian/$1.lintian-overrides" "$d/usr/share/lintian/overrides/$1"
  fi
}

# bin NAME BINARY: a stripped copy of the binary.
bin() {
  install -m 0755 "$bin_dir/$2" "$work/$1/usr/bin/$2"
  strip --remove-section=.comment --remove-section=.note "$work/$1/usr/bin/$2"
}

# shlibs NAME: the shared-library dependencies of the package's binaries.
shlibs() {
  local files=() f
  for f in "$work/$1"/usr/bin/*; do files+=(-e "$f"); done
  mkdir -p "$work/shlibs/debian"
  printf 'Source: drover\n\nPackage: %s\nArchitecture: any\n' "$1" >"$work/shlibs/debian/control"
  (cd "$work/shlibs" && dpkg-shlibdeps -O "${files[@]}" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

# finish NAME DEPENDS DESCRIPTION LONG: control file (${shlibs} in DEPENDS
# replaced), md5sums, then dpkg-deb.
finish() {
  local d="$work/$1"
  local size depends
  depends=${2//\$\{shlibs\}/$(shlibs "$1")}
  size=$(du -sk --exclude=DEBIAN "$d" | cut -f1)
  {
    echo "Package: $1"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: Drover maintainers <drover@example.invalid>"
    echo "Installed-Size: $size"
    echo "Depends: $depends"
    echo "Section: admin"
    echo "Priority: optional"
    echo "Homepage: https://example.invalid/drover"
    echo "Description: $3"
    echo "$4" | fold -s -w 78 | sed 's/^/ /; s/ *$//'
  } >"$d/DEBIAN/control"
  if [ -d "$d/etc" ]; then
    (cd "$d" && find etc -type f | sed 's|^|/|' | sort) >"$d/DEBIAN/conffiles"
    chmod 0644 "$d/DEBIAN/conffiles"
  fi
  (cd "$d" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | sort | xargs md5sum) >"$d/DEBIAN/md5sums"
  chmod 0644 "$d/DEBIAN/md5sums"
  local deb="$out/${1}_${version}_${arch}.deb"
  dpkg-deb --root-owner-group "${compress[@]}" --build "$d" "$deb" >/dev/null
  echo "$deb"
}

# scripts NAME PREFIX: the maintainer scripts packaging/debian/PREFIX.*.
scripts() {
  local s
  for s in postinst prerm postrm; do
    [ -f "packaging/debian/$2.$s" ] && install -m 0755 "packaging/debian/$2.$s" "$work/$1/DEBIAN/$s"
  done
  return 0
}

# drover-master
stage drover-master
bin drover-master drover-master
install -D -m 0644 packaging/systemd/drover-master.service "$work/drover-master/lib/systemd/system/drover-master.service"
install -D -m 0644 packaging/config/master.toml "$work/drover-master/etc/drover/master.toml"
install -m 0644 docs/operations.md docs/master.md "$work/drover-master/usr/share/doc/drover-master/"
scripts drover-master master
finish drover-master "passwd, init-system-helpers (>= 1.54~), \${shlibs}" "cluster scheduler for bare-metal fleets - master" \
  "The master of a Drover cluster: it stores jobs, tasks and agents in SQLite, schedules tasks onto agents and serves the admin API, the agent API and a web page. Runs as the system user drover under systemd (Type=notify, with a watchdog)."

# drover-agent (with the executor)
stage drover-agent
bin drover-agent drover-agent
bin drover-agent drover-executor
install -D -m 0644 packaging/systemd/drover-agent.service "$work/drover-agent/lib/systemd/system/drover-agent.service"
install -D -m 0644 packaging/config/agent.toml "$work/drover-agent/etc/drover/agent.toml"
install -m 0644 docs/operations.md docs/agent.md docs/executor.md "$work/drover-agent/usr/share/doc/drover-agent/"
scripts drover-agent agent
finish drover-agent "init-system-helpers (>= 1.54~), \${shlibs}" "cluster scheduler for bare-metal fleets - host agent and executor" \
  "The agent of a Drover cluster runs on every host: it registers with the master, starts one sandboxed drover-executor per task (cgroup, task user, health checks, kill escalation) and relays every status. Restarting or upgrading the agent leaves running tasks alone."

# drover (the CLI)
stage drover
bin drover drover
install -m 0644 docs/cli.md "$work/drover/usr/share/doc/drover/"
finish drover "\${shlibs}" "cluster scheduler for bare-metal fleets - command-line client" \
  "The drover command talks to a Drover master's admin API: jobs, tasks, agents, logs, tokens, and a one-host development cluster (drover dev)."

#!/usr/bin/env bash
# Installs what Drover needs on a fresh Debian machine. Safe to run again; a second
# run with everything in place installs nothing.
#
#   scripts/setup.sh --dev   what ./scripts/dev.sh needs beyond Rust: the system
#                            python3 (examples/hello_world.yaml runs /usr/bin/python3).
#                            The build itself needs no system package (protoc comes
#                            with it: scripts/protoc).
#   scripts/setup.sh         what ./scripts/test.sh needs: the above, and iproute2
#                            (multi-host tests in network namespaces), procps, e2fsprogs
#                            and mount (mkfs.ext4, losetup: an ext4 with project quotas on
#                            a loop device), faketime
#                            (libfaketime: the wall clock step tests), binutils (`nm`, for
#                            the executor's layout check), prometheus (the scrape test),
#                            node, npm and chromium (the web UI's build and browser
#                            suite), the packaging and systemd test tools (dpkg-dev,
#                            debootstrap, systemd-container, lintian), etcd-server (the
#                            HA tests start a real 3-member etcd cluster), bind9-dnsutils
#                            (`dig`, for the DNS tests), schemathesis
#                            and its whole dependency tree from PyPI, pinned with hashes
#                            in scripts/requirements-schemathesis.txt, in a virtualenv
#                            under /opt (with python3-venv if needed), and rustfmt and
#                            clippy (rustup).
set -euo pipefail
cd "$(dirname "$0")/.."

full=yes
case "${1:-}" in
--dev) full=no ;;
"") ;;
*)
  echo "usage: scripts/setup.sh [--dev]" >&2
  exit 2
  ;;
esac

need=()
# Task processes run as other users (www-data), who cannot use a python3 under
# /root; the examples call the system /usr/bin/python3.
[ -x /usr/bin/python3 ] || need+=(python3)
installing_prometheus=no
installing_etcd=no
if [ "$full" = yes ]; then
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v pgrep >/dev/null 2>&1 || need+=(procps)
  # The clock step tests preload libfaketime into one master or agent.
  command -v faketime >/dev/null 2>&1 || need+=(faketime)
  # tests/tests/sandbox_attacks.rs makes an ext4 with project quotas on a loop device
  # (the executor's project quota for resources.disk).
  command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
  command -v losetup >/dev/null 2>&1 || need+=(mount)
  # executor/tests/layout.rs reads the executor's symbols with nm.
  command -v nm >/dev/null 2>&1 || need+=(binutils)
  # tests/tests/metrics.rs scrapes the master with a real Prometheus server, which the
  # test starts itself on loopback with a generated config.
  if ! command -v prometheus >/dev/null 2>&1; then
    need+=(prometheus)
    installing_prometheus=yes
  fi
  # The web UI (scripts/ui.sh) builds with node and npm; its browser suite
  # (ui/tests/browser.test.mjs) drives Debian's chromium with playwright-core.
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
  [ -x /usr/bin/chromium ] || need+=(chromium)
  # scripts/package.sh builds the .deb files (dpkg-deb, dpkg-shlibdeps); the
  # systemd test (tests/tests/systemd.rs) makes a Debian root with debootstrap, boots
  # it with systemd-nspawn and checks the packages with lintian.
  command -v dpkg-shlibdeps >/dev/null 2>&1 || need+=(dpkg-dev)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
  command -v lintian >/dev/null 2>&1 || need+=(lintian)
  # The etcd store (master/src/etcd_store.rs) and its tests: tests/tests/ha.rs starts
  # a 3-member etcd cluster on loopback.
  if ! command -v etcd >/dev/null 2>&1; then
    need+=(etcd-server)
    installing_etcd=yes
  fi
  # dig: the DNS tests (tests/tests/dns.rs) ask the master's DNS server with it.
  command -v dig >/dev/null 2>&1 || need+=(bind9-dnsutils)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # A failed install is reported, not fatal: the tests that need a missing tool
    # say so and skip, and the rest still run.
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
      echo "setup: could not install ${need[*]}; tests that need them will say so" >&2
    fi
    # The package starts a system-wide Prometheus where no systemd runs; the tests
    # start their own, so stop the one the install started.
    if [ "$installing_prometheus" = yes ] && [ ! -d /run/systemd/system ]; then
      service prometheus stop >/dev/null 2>&1 || true
    fi
    # Likewise for etcd: the tests start their own cluster on free ports.
    if [ "$installing_etcd" = yes ] && [ ! -d /run/systemd/system ]; then
      service etcd stop >/dev/null 2>&1 || true
    fi
  else
    echo "setup: please install ${need[*]} (needs root); continuing without" >&2
  fi
fi

[ "$full" = yes ] || exit 0

# tests/tests/api_contract.rs runs schemathesis against a live master; it lives in its
# own virtualenv so the system python3 stays untouched. Every package in it is pinned
# with its hash (scripts/requirements-schemathesis.txt); the venv keeps a copy of the
# lock it was made from and is made again when the lock changes.
SCHEMATHESIS_LOCK=scripts/requirements-schemathesis.txt
SCHEMATHESIS_VENV=/opt/drover-schemathesis
if ! cmp -s "$SCHEMATHESIS_LOCK" "$SCHEMATHESIS_VENV/drover-lock.txt" ||
  ! "$SCHEMATHESIS_VENV/bin/schemathesis" --version >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] || [ -w "$(dirname "$SCHEMATHESIS_VENV")" ]; then
    echo "setup: installing schemathesis into $SCHEMATHESIS_VENV from $SCHEMATHESIS_LOCK"
    if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null && [ "$(id -u)" -eq 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null || true
    fi
    rm -rf "$SCHEMATHESIS_VENV"
    if /usr/bin/python3 -m venv "$SCHEMATHESIS_VENV" &&
      "$SCHEMATHESIS_VENV/bin/pip" install -q --disable-pip-version-check \
        --require-hashes --no-deps -r "$SCHEMATHESIS_LOCK" &&
      "$SCHEMATHESIS_VENV/bin/pip" check -q >/dev/null; then
      cp "$SCHEMATHESIS_LOCK" "$SCHEMATHESIS_VENV/drover-lock.txt"
    else
      echo "setup: could not install schemathesis; the API contract test will say so" >&2
    fi
  else
    echo "setup: please run as root to install schemathesis into $SCHEMATHESIS_VENV" >&2
  fi
fi

# rustup reads rust-toolchain.toml; this adds rustfmt and clippy (test.sh's format and
# lint steps) if they are missing.
if command -v rustup >/dev/null 2>&1 &&
  ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

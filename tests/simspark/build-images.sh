#!/usr/bin/env bash
# Builds the two local base images of the simulated-Spark test bench. No image can be pulled here, so both
# come from debootstrap'd Debian bookworm root file systems:
#   sparkfleet-test/simspark:<hash>     a "Spark": systemd as PID 1, python3, Docker (DGX OS ships Docker)
#   sparkfleet-test/python-base:<hash>  python3 (and libnuma1); the base of the stand-in and the real-engine vLLM images
# Each image is tagged with a hash of this script, so a rerun with an unchanged recipe skips the build, and
# root-fs tarballs plus downloaded .debs are cached under $SIMSPARK_CACHE.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${SIMSPARK_CACHE:-$here/../../.cache/simspark}
mirror=${SIMSPARK_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
recipe_hash=$(sha256sum "$0" | cut -c1-12)

spark_image=sparkfleet-test/simspark
python_image=sparkfleet-test/python-base

# What a DGX Spark's OS has that the roles rely on (DGX OS 7 is Ubuntu 24.04; Ubuntu's archive is not
# reachable here, so Debian stands in for it).
# iputils-ping: the fabric link check; openssh-server: sshd -i for the SSH-connected fleet scenario (its
# listening service stays masked: the scenario reaches it through docker exec, not the network); netplan.io and
# udev: DGX OS's network configuration, which spark_fabric_netplan writes and applies (udevd itself does not start
# in a container, whose /sys is read-only; `netplan apply` needs udevadm).
spark_packages=systemd,systemd-sysv,python3,python3-apt,sudo,ca-certificates,gnupg,curl,iproute2,dbus,procps,docker.io,kmod,iputils-ping,openssh-server,netplan.io,udev
# libnuma1: the real vLLM engine for the CPU (its vllm._C links libnuma.so.1), whose test image is built on this one
# (tests/fixtures/build-engine-registry.sh).
python_packages=python3,ca-certificates,libnuma1

mkdir -p "$cache/debs"

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# debootstrap NAME PACKAGES -> $cache/NAME-<hash>.tar (reused when present)
bootstrap_rootfs() {
  local name=$1 packages=$2 tarball="$cache/$1-$recipe_hash.tar"
  if [ -s "$tarball" ]; then
    echo "$tarball"
    return
  fi
  local root
  root=$(mktemp -d "$cache/$name-root.XXXXXX")
  echo "simspark: debootstrap $name ($packages)" >&2
  debootstrap --variant=minbase --include="$packages" --cache-dir="$cache/debs" "$suite" "$root" "$mirror" >&2
  customize_rootfs "$name" "$root"
  tar -C "$root" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$root"
  echo "$tarball"
}

customize_rootfs() {
  local name=$1 root=$2
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  # No package lists in the image, and an old date on their folder: Ansible's apt cache_valid_time takes that
  # date for the last `apt-get update`, so the first apt task on a test host fetches the lists, as on any host
  # whose lists are stale.
  touch -d @0 "$root"/var/lib/apt/lists
  # Each container must get its own machine id at boot.
  : >"$root/etc/machine-id"
  [ "$name" = simspark ] || return 0
  # Units that make no sense (or hang) in a container: consoles, logins, timers that run apt behind our back.
  local unit
  for unit in getty.target console-getty.service getty@tty1.service systemd-logind.service \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer \
    systemd-tmpfiles-clean.timer man-db.timer systemd-remount-fs.service sys-kernel-debug.mount \
    sys-kernel-tracing.mount systemd-firstboot.service ssh.service ssh.socket; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
}

# build_image IMAGE ROOTFS-NAME PACKAGES CMD: import the root fs, then a metadata-only build.
build_image() {
  local image=$1 name=$2 packages=$3 cmd=$4
  if have_image "$image:$recipe_hash"; then
    echo "simspark: $image:$recipe_hash is cached"
  else
    local imported="$image-rootfs:$recipe_hash" tarball
    tarball=$(bootstrap_rootfs "$name" "$packages")
    docker import "$tarball" "$imported" >/dev/null
    # How systemd wants to be run in a container.
    printf '%s\n' "FROM $imported" "ENV container=docker" "STOPSIGNAL SIGRTMIN+3" "CMD $cmd" |
      docker build -q -t "$image:$recipe_hash" - >/dev/null
    docker rmi "$imported" >/dev/null
    echo "simspark: built $image:$recipe_hash"
  fi
  docker tag "$image:$recipe_hash" "$image:latest"
}

build_image "$spark_image" simspark "$spark_packages" '["/lib/systemd/systemd"]'
build_image "$python_image" python-base "$python_packages" '["/usr/bin/python3"]'

#!/usr/bin/env bash
# The Python base image built from Debian's packages, for machines where the Dockerfile's upstream
# base (python:3.11.x-slim from Docker Hub) cannot be pulled: no registry but Debian's mirror.
#
#   bash hack/image/base.sh IMAGE     build it with mmdebstrap and import it into podman as IMAGE
#
# Debian bookworm with python3 (3.11, the lock's minor), python3-venv (the build stage's pip comes
# from its ensurepip wheels), ca-certificates and tzdata (as the upstream slim images have them);
# only Essential packages besides, no apt, no recommends, no documentation but the copyright
# files, no apt lists or caches. About 105 MB; cold about 2.5 minutes on 2 cores (mostly the
# download). How it differs from python:3.11-slim for the Dockerfile: the interpreter is
# /usr/bin/python3 (no `python` command), pip is not installed, and the system interpreter is
# externally managed (PEP 668: /usr/lib/python3.11/EXTERNALLY-MANAGED), so the Dockerfile installs
# into virtualenvs only. Debian's security updates come in with each rebuild: remove the image
# (podman rmi IMAGE) and run `make image` again to take them.
set -euo pipefail

image=${1:?usage: base.sh IMAGE}
suite=bookworm
mirror=http://deb.debian.org/debian
packages=python3,python3-venv,ca-certificates,tzdata

die() { echo "hack/image/base.sh: $*" >&2; exit 1; }
command -v mmdebstrap >/dev/null || die "mmdebstrap is missing: apt-get install -y mmdebstrap"

work=$(mktemp -d "${TMPDIR:-/tmp}/agentrun-base.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
echo "building $image from Debian $suite ($packages) with mmdebstrap ..." >&2
# merged-usr hook: /bin, /lib, /sbin as symlinks into /usr, as Debian has them since bookworm,
# without the usrmerge package (and the perl it needs at run time).
mmdebstrap --variant=essential --include="$packages" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
    "$suite" "$work/rootfs.tar" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $mirror-security $suite-security main" \
    >"$work/mmdebstrap.log" 2>&1 || {
    tail -n 30 "$work/mmdebstrap.log" >&2
    die "mmdebstrap failed (above: its last words; is $mirror reachable, does apt-get update work here?)"
}
# What python:3.11-slim sets; the label records this script's digest so build.sh knows when to rebuild.
podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL dev.agentrun.base.script=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)" \
    --change "LABEL dev.agentrun.base.suite=$suite" \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$image" >/dev/null
echo "$image: $(podman image inspect --format '{{.Size}}' "$image") bytes, $(($(date +%s) - started)) s" >&2

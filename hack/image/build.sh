#!/usr/bin/env bash
# `make image`: agentrun's images built on this machine with Debian's podman (no Docker daemon, no
# registry):
#   localhost/agentrun:dev        the Dockerfile's `runtime` target (the runner and the operator)
#   localhost/agentrun-demo:dev   its `demo` target (runtime + examples/)
#   localhost/agentrun-pause:dev  the pod sandbox image of the real node: hack/image/pause.c built
#                                 with gcc -static, FROM scratch, entrypoint /pause
# each in podman's local store and as an OCI archive <cache>/<name>.oci.tar (podman save
# --format oci-archive; `ctr -n k8s.io images import` loads it), where <cache> is
# ${AGENTRUN_IMAGE_CACHE:-$HOME/.cache/agentrun/image}.
#
#   bash hack/image/build.sh        build what is out of date; prints each image's size and layers
#                                   (stderr), and the cache folder as its last line (stdout)
#   bash hack/image/build.sh dir    print the cache folder without building
#
# Up to date: a digest of every input (Dockerfile, .dockerignore, requirements/, pyproject.toml,
# runner/, operator/, examples/, hack/image/, the base image's id) is stored in the cache next to
# the archives, with the images' ids; when it matches and the store holds those images the script
# returns at once (when the store lost them, or holds other builds under their names, it loads the
# archives). README.md is copied into the build only as the wheel's long description: editing it
# does not rebuild. The builds read a copy of the sources taken at the start, not the work tree.
#
# The base: $PYTHON_IMAGE when set (a registry that serves python:3.11.x-slim), otherwise
# localhost/agentrun-base:bookworm, built from Debian's packages by hack/image/base.sh once (and
# again when base.sh changes, or after `podman rmi` of it to take Debian's security updates).
# The Python packages: pip download --require-hashes of requirements/*.txt on this machine (the
# package registry is reachable here, not from inside the build) into <cache>/wheelhouse, for the
# base's interpreter and glibc; the build itself runs with --network none and installs from that
# folder only, each file checked against the lock's hash (a stale or altered wheelhouse is refused).
#
# What this machine needs, written here: podman, runc and mmdebstrap from Debian (scripts/apt_install.sh);
# /etc/containers/containers.conf.d/50-agentrun.conf with default ulimits at this machine's hard
# limits (podman's defaults are higher, and a container then fails: "setrlimit RLIMIT_NOFILE:
# operation not permitted") and, under cgroup v1/hybrid, the runc runtime (crun refuses hybrid mode).
set -euo pipefail
shopt -s inherit_errexit # a failure inside $(...) ends the script too, not only the substitution

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$ROOT/hack/image"
cache=${AGENTRUN_IMAGE_CACHE:-$HOME/.cache/agentrun/image}
RUNTIME=localhost/agentrun:dev
DEMO=localhost/agentrun-demo:dev
PAUSE=localhost/agentrun-pause:dev
DEBIAN_BASE=localhost/agentrun-base:bookworm
images=("$RUNTIME" "$DEMO" "$PAUSE")
PIP=("${PYTHON:-$ROOT/.venv/bin/python}" -m pip)

die() { echo "hack/image/build.sh: $*" >&2; exit 1; }
say() { echo "image: $*" >&2; }
archive_of() { local name=${1#localhost/}; echo "$cache/${name%%:*}.oci.tar"; }
# The image id (its config's digest) an OCI archive holds: index.json -> the manifest -> its config.
archive_id() {
    python3 - "$1" <<'PY' 2>/dev/null || true
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    blob = lambda digest: json.load(tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1]))
    (manifest,) = json.load(tar.extractfile("index.json"))["manifests"]
    print(blob(manifest["digest"])["config"]["digest"].split(":", 1)[1])
PY
}

setup() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || missing+=(runc)
    [[ -n ${PYTHON_IMAGE:-} ]] || command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    [[ -e /usr/lib/x86_64-linux-gnu/libc.a || -n $(find /usr/lib -name libc.a -print -quit) ]] || missing+=(libc6-dev)
    command -v gcc >/dev/null || missing+=(gcc)
    if ((${#missing[@]})); then
        say "installing ${missing[*]} (Debian) ..."
        bash "$ROOT/scripts/apt_install.sh" "${missing[@]}"
    fi
    [[ $(id -u) == 0 ]] || return 0 # rootless podman reads the user's own containers.conf
    local conf=/etc/containers/containers.conf.d/50-agentrun.conf nofile nproc pid_max runtime="" text
    nofile=$(ulimit -Hn) nproc=$(ulimit -Hu) pid_max=$(</proc/sys/kernel/pid_max)
    [[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
    # podman runs with a process limit of kernel.pid_max (32768 here, below the hard limit of 96367; see
    # /proc/<podman's pid>/limits), and a container may not have more than podman has.
    [[ $nproc == unlimited || $nproc -gt $pid_max ]] && nproc=$pid_max
    [[ -d /sys/fs/cgroup/unified ]] && runtime=$'\n[engine]\n# cgroup v1 (hybrid): crun refuses it ("cgroups in hybrid mode not supported")\nruntime = "runc"'
    text="# Written by agentrun's hack/image/build.sh: podman's default ulimits exceed this machine's hard limits
# (a container then fails: setrlimit RLIMIT_NOFILE: operation not permitted).
[containers]
default_ulimits = [\"nofile=1024:$nofile\", \"nproc=$nproc:$nproc\"]$runtime"
    if [[ ! -f $conf || $(<"$conf") != "$text" ]]; then
        mkdir -p "$(dirname "$conf")"
        printf '%s\n' "$text" >"$conf"
        say "wrote $conf"
    fi
}

base_image() {
    if [[ -n ${PYTHON_IMAGE:-} ]]; then
        podman image exists "$PYTHON_IMAGE" || podman pull --quiet "$PYTHON_IMAGE" >/dev/null ||
            die "cannot pull $PYTHON_IMAGE; unset PYTHON_IMAGE to build a base from Debian's packages"
        echo "$PYTHON_IMAGE"
        return
    fi
    local want have=""
    want=$(sha256sum "$here/base.sh" | cut -d' ' -f1)
    podman image exists "$DEBIAN_BASE" &&
        have=$(podman image inspect --format '{{index .Labels "dev.agentrun.base.script"}}' "$DEBIAN_BASE")
    [[ $have == "$want" ]] || bash "$here/base.sh" "$DEBIAN_BASE"
    echo "$DEBIAN_BASE"
}

# A copy of what the builds read (the build context without .dockerignore's exclusions, and these
# scripts), taken once: the digest and both images are of the same sources even when the work tree
# changes during a build, which takes minutes.
snapshot() {
    tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' --exclude='*.db' --exclude='*.db-*' \
        -cf - Dockerfile .dockerignore requirements pyproject.toml README.md runner operator examples hack/image |
        tar -C "$1" -xf -
}

inputs_digest() {
    local base=$1 src=$2 base_id
    base_id=$(podman image inspect --format '{{.Id}}' "$base" 2>/dev/null || echo absent)
    (
        cd "$src"
        # README.md left out: only the wheel's long description, and edited all the time.
        find Dockerfile .dockerignore requirements pyproject.toml runner operator examples hack/image -type f -print0 |
            LC_ALL=C sort -z | xargs -0 sha256sum
        echo "base $base $base_id"
    ) | sha256sum | cut -d' ' -f1
}

# pip's --platform list for a glibc (manylinux_2_17 .. the base's) on an architecture.
platforms() {
    local glibc_minor=$1 arch=$2 v
    for ((v = glibc_minor; v >= 17; v--)); do echo "--platform=manylinux_2_${v}_$arch"; done
    echo "--platform=manylinux2014_$arch" # pip adds manylinux2010 and manylinux1 to it
}

wheelhouse() {
    local base=$1 facts python glibc arch stamp
    # The base's interpreter decides which files fit: its Python version, glibc and architecture.
    facts=$(podman run --rm --pull=never --network none "$base" python3 -c \
        'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.libc_ver()[1], platform.machine())')
    read -r python glibc arch <<<"$facts"
    [[ $glibc =~ ^2\.([0-9]+)$ ]] || die "the base $base reports glibc '$glibc'; only glibc bases are supported"
    mapfile -t tags < <(platforms "${BASH_REMATCH[1]}" "$arch")
    tags+=(--python-version "$python" --implementation cp --abi "cp${python/./}")
    stamp=$(cat "$ROOT/requirements/build.txt" "$ROOT/requirements/image.txt" <(echo "${tags[*]}") | sha256sum | cut -d' ' -f1)
    if [[ -f $cache/wheelhouse.sha256 && $(<"$cache/wheelhouse.sha256") == "$stamp" ]]; then
        echo "$cache/wheelhouse"
        return
    fi
    [[ -x ${PIP[0]} ]] || die "${PIP[0]} not found: run 'make dev' (its pip downloads the wheelhouse)"
    say "wheelhouse: pip download --require-hashes of requirements/build.txt and image.txt (CPython $python, glibc $glibc, $arch) ..."
    rm -rf "$cache/wheelhouse.partial"
    local lock
    for lock in build.txt image.txt; do
        "${PIP[@]}" download --quiet --disable-pip-version-check --require-hashes --no-deps --only-binary :all: \
            "${tags[@]}" --dest "$cache/wheelhouse.partial" -r "$ROOT/requirements/$lock" >&2 ||
            die "pip download of requirements/$lock failed"
    done
    rm -rf "$cache/wheelhouse"
    mv "$cache/wheelhouse.partial" "$cache/wheelhouse"
    echo "$stamp" >"$cache/wheelhouse.sha256"
    say "wheelhouse: $(find "$cache/wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sh "$cache/wheelhouse" | cut -f1)"
    echo "$cache/wheelhouse"
}

# Tag the new image; the one it replaces goes unless something else still names it.
build_one() {
    local image=$1 old started log
    shift
    old=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    started=$(date +%s)
    log="$cache/build-${image//[\/:]/_}.log"
    say "building $image (podman build --network none, output in $log) ..."
    if ! podman build --pull=never --network none --tag "$image" "$@" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "podman build of $image failed (above: the end of $log)"
    fi
    say "$image built in $(($(date +%s) - started)) s"
    if [[ -n $old && $old != "$(podman image inspect --format '{{.Id}}' "$image")" ]]; then
        podman rmi "$old" >/dev/null 2>&1 || true
    fi
}

build_pause() {
    local context
    context=$(mktemp -d "${TMPDIR:-/tmp}/agentrun-pause.XXXXXX")
    gcc -static -Os -s -Wall -Wextra -Werror -o "$context/pause" "$1"
    # The uid and gid registry.k8s.io/pause runs as: not root, and no file of the pod is theirs.
    printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$context/Containerfile"
    build_one "$PAUSE" --file "$context/Containerfile" "$context"
    rm -rf "$context"
}

report() {
    local image size
    for image in "${images[@]}"; do
        size=$(podman image inspect --format '{{.Size}}' "$image")
        say "$image: $(numfmt --to=si --suffix=B "$size") ($size bytes), archive" \
            "$(numfmt --to=si --suffix=B "$(stat -c %s "$(archive_of "$image")")") (gzip layers)," \
            "$(podman image inspect --format '{{len .RootFS.Layers}}' "$image") layers, newest first:"
        # Each layer with its size and the instruction that made it (metadata-only steps left out).
        podman history --format '{{.Size}}\t{{.CreatedBy}}' --no-trunc "$image" | awk -F'\t' '$1 != "0 B" {
            sub(/^\/bin\/sh -c (#\(nop\) )?/, "", $2); printf "    %9s  %s\n", $1, substr($2, 1, 110) }' >&2
    done
}

build() {
    setup
    mkdir -p "$cache"
    exec 9>"$cache/.build.lock"
    flock 9 # make image and a test fixture may start together
    local base digest started src
    started=$(date +%s)
    base=$(base_image)
    echo "$base" >"$cache/base-image" # for tests/node, which build the Dockerfile on it again
    src=$(mktemp -d "${TMPDIR:-/tmp}/agentrun-image-src.XXXXXX")
    trap "rm -rf -- $(printf %q "$src")" EXIT # expanded now: src is local to this function
    snapshot "$src"
    digest=$(inputs_digest "$base" "$src")
    if [[ -f $cache/inputs.sha256 && $(<"$cache/inputs.sha256") == "$digest" && -f $cache/image-ids ]]; then
        local image all=1 id
        for image in "${images[@]}"; do
            # The store may have lost the image, or hold another build under its name (another checkout,
            # another cache folder): the archive, made from these inputs, is the one to use.
            id=$(awk -v image="$image" '$1 == image {print $2}' "$cache/image-ids")
            [[ -n $id ]] || { all=0; break; }
            if [[ $(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null) != "$id" ]]; then
                [[ -f $(archive_of "$image") ]] || { all=0; break; }
                podman load --quiet --input "$(archive_of "$image")" >/dev/null
                [[ $(podman image inspect --format '{{.Id}}' "$image") == "$id" ]] || { all=0; break; }
                say "loaded $image from its archive"
            fi
        done
        if ((all)); then
            say "up to date (inputs $digest): ${images[*]}"
            echo "$cache"
            return
        fi
    fi
    rm -f "$cache/inputs.sha256" "$cache/image-ids"
    local wheels
    wheels=$(wheelhouse "$base")
    local common=(--build-arg "PYTHON_IMAGE=$base" --build-context "wheelhouse=$wheels"
        --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheelhouse --file "$src/Dockerfile")
    build_one "$RUNTIME" "${common[@]}" --target runtime "$src"
    build_one "$DEMO" "${common[@]}" --target demo "$src"
    build_pause "$src/hack/image/pause.c"
    local image archive
    for image in "${images[@]}"; do
        archive=$(archive_of "$image")
        # An image rebuilt from cached layers is the same image: its archive stays (saving compresses every layer).
        [[ -f $archive && $(archive_id "$archive") == "$(podman image inspect --format '{{.Id}}' "$image")" ]] && continue
        rm -f "$archive.partial"
        podman save --quiet --format oci-archive --output "$archive.partial" "$image"
        mv -f "$archive.partial" "$archive"
    done
    report
    for image in "${images[@]}"; do
        echo "$image $(podman image inspect --format '{{.Id}}' "$image")"
    done >"$cache/image-ids"
    echo "$digest" >"$cache/inputs.sha256"
    say "done in $(($(date +%s) - started)) s"
    echo "$cache"
}

case "${1:-build}" in
build) build ;;
dir) echo "$cache" ;;
*) die "usage: build.sh [build|dir]" ;;
esac

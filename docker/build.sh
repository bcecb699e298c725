#!/usr/bin/env bash
# Builds the two images, moe-operator and moe-runtime, with buildah (no Docker engine, no daemon)
# from docker/operator.Dockerfile and docker/runtime.Dockerfile, the same files `docker build`
# uses, and writes each as an OCI archive with its pinned package list beside it.
#
#   bash docker/build.sh                 # upstream bases from versions.env (python:3.11-slim,
#                                        # lmsysorg/sglang:v0.5.23); needs registry access
#   bash docker/build.sh --local-base    # bases made here (CI): Debian bookworm by debootstrap
#                                        # with Debian's python3, and a stand-in engine image
#   options: --out DIR (default dist/images), --rebuild (ignore the cache)
#
# DIR then holds moe-operator.oci.tar, moe-runtime.oci.tar, moe-{operator,runtime}.packages.txt
# and build.env (archive paths, image names, revision, sizes); the last line printed is
# MOE_IMAGES=DIR. Load or push an archive with skopeo (docs/install.md#images), e.g.
#   skopeo copy oci-archive:dist/images/moe-operator.oci.tar docker://REGISTRY/moe-operator:TAG
#
# Cache: each image under ~/.cache/moe-operator/images/<image>-<key>/ ($MOE_IMAGE_CACHE), key =
# sha256 of its Dockerfile and ignore file, versions.env, this script, the base (the CI base's
# recipe, or an upstream base's digest) and every file of its build context; a hit skips the
# build. The CI bases are cached the same way (docker/ci-base.sh). Nothing needs the cache.
# Needs root: buildah's vfs storage with chroot isolation, and debootstrap for --local-base.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'docker/build.sh: %s\n' "$*" >&2; exit 1; }

base_kind=upstream
out="$repo/dist/images"
rebuild=0
while [ $# -gt 0 ]; do
  case "$1" in
    --local-base) base_kind=local ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    --rebuild) rebuild=1 ;;
    -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || die "run as root (buildah vfs storage with chroot isolation; debootstrap for --local-base)"
command -v buildah >/dev/null || die "needs buildah (Debian package buildah; bash e2e/setup.sh installs it)"
set -a
# shellcheck source=versions.env
. "$repo/docker/versions.env"
set +a
: "${MOE_IMAGE_PREFIX:=ghcr.io/moe-inference}"
MOE_IMAGE_CACHE=${MOE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moe-operator/images}
mkdir -p "$MOE_IMAGE_CACHE" "$out"
out="$(cd "$out" && pwd)"
# One build at a time per cache (two test sessions may ask at once).
exec 9>"$MOE_IMAGE_CACHE/.lock"
flock 9

t_start=$SECONDS
work=""
driver=""
B=()
cleanup() {
  if [ -n "$work" ] && [ -d "$work" ]; then
    [ ${#B[@]} -eq 0 ] || "${B[@]}" rm -a >/dev/null 2>&1 || true
    unmount_under "$work"
    rm -rf "$work"
  fi
}
trap cleanup EXIT
# Whatever is still mounted below a directory (overlay's merged trees), deepest first.
unmount_under() {
  { findmnt -rn -o TARGET | grep -F "$1/" || true; } | sort -r | while read -r target; do umount -l "$target" || true; done
}

# ---- cache -------------------------------------------------------------------------------------
# An entry is a directory KIND-KEY under $MOE_IMAGE_CACHE (KIND: moe-operator, moe-runtime,
# ci-base), written as KIND-KEY.partial and renamed once complete, so an interrupted build leaves
# no entry. Every source change makes a new key: a kind keeps only its most recently used entries.
cache_hit() {  # DIR: a complete entry, marked as just used
  [ -f "$1/.complete" ] || return 1
  touch "$1"
}

cache_commit() {  # DIR KEEP: DIR.partial becomes the entry DIR; its kind keeps KEEP entries
  local dir=$1 keep=$2 kind old
  touch "$dir.partial/.complete"
  rm -rf "$dir" && mv "$dir.partial" "$dir"
  kind=${dir##*/}
  kind=${kind%-*}
  find "$MOE_IMAGE_CACHE" -mindepth 1 -maxdepth 1 -type d -name "$kind-*" -not -name '*.partial' \
    -printf '%T@ %p\n' | sort -rn | tail -n +$((keep + 1)) | cut -d' ' -f2- \
    | while read -r old; do rm -rf "$old"; done
}

# A private, throwaway store; the cache keeps only the archives. Storage driver: overlay where
# the kernel mounts it here (fast: layers are not copied), else vfs, which works on any file
# system but copies the whole file system for every container; MOE_BUILDAH_DRIVER overrides.
# RUN steps see this machine's CA bundle (a copy, bind-mounted over the image's own for the
# step only, never committed), so pip and apt work behind a TLS-inspecting proxy.
ensure_store() {
  [ -z "$work" ] || return 0
  work=$(mktemp -d "${TMPDIR:-/var/tmp}/moe-image-build.XXXXXX")
  driver=${MOE_BUILDAH_DRIVER:-}
  if [ -z "$driver" ]; then
    driver=vfs
    if grep -qw overlay /proc/filesystems; then
      local probe=(buildah --root "$work/probe" --runroot "$work/probe-run" --storage-driver overlay) ctr
      if ctr=$("${probe[@]}" from -q scratch 2>/dev/null) && "${probe[@]}" mount "$ctr" >/dev/null 2>&1; then
        driver=overlay
      fi
      "${probe[@]}" rm -a >/dev/null 2>&1 || true
      unmount_under "$work/probe"
      rm -rf "$work/probe" "$work/probe-run"
    fi
  fi
  B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver "$driver")
  RUN_MOUNTS=()
  local bundle=${MOE_BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
  if [ -f "$bundle" ]; then
    cp "$bundle" "$work/ca-certificates.crt"
    RUN_MOUNTS=(-v "$work/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt")
  fi
}

# Fully qualified reference for a Docker Hub short name (buildah refuses to guess a registry).
qualify() {
  local ref=$1 first=${1%%/*}
  if [[ $ref != */* ]]; then
    echo "docker.io/library/$ref"
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
    echo "docker.io/$ref"
  else
    echo "$ref"
  fi
}

# The files of an image's build context: the `!` lines of its ignore file, minus bytecode.
context_files() {
  local paths
  mapfile -t paths < <(sed -n 's/^!//p' "$repo/docker/$1.Dockerfile.dockerignore")
  (cd "$repo" && find "${paths[@]}" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' | LC_ALL=C sort)
}

image_key() {  # NAME BASE_ID
  {
    printf '%s\n' "$2"
    (cd "$repo" && sha256sum "docker/$1.Dockerfile" "docker/$1.Dockerfile.dockerignore" docker/versions.env docker/build.sh)
    (cd "$repo" && context_files "$1" | tr '\n' '\0' | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

revision() {  # the commit, "-dirty" when the build inputs differ from it
  local rev
  rev=$(git -C "$repo" rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
  if [ -n "$(git -C "$repo" status --porcelain -- docker placement contract runtime operator 2>/dev/null)" ]; then
    rev="$rev-dirty"
  fi
  echo "$rev"
}

# The pinned package list of a built image (docker/packages.py, from its mounted file system);
# for the operator also the five largest entries of its site-packages (what its size is made of).
inspect_image() {  # IMAGE NAME LABEL TREE-GLOB
  local ctr mnt largest=()
  [ "$2" = operator ] && largest=(--largest 5)
  ctr=$("${B[@]}" from -q --pull=never "$1")
  mnt=$("${B[@]}" mount "$ctr")
  python3 "$repo/docker/packages.py" "$mnt" "$3" "$4" "${largest[@]}" 2> >(sed "s/^/==> moe-$2: largest: /" >&2)
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
}

build_image() {  # NAME BASE_ARG BASE_REF KEY [--build-arg K=V ...]
  local name=$1 base_arg=$2 base_ref=$3 key=$4
  shift 4
  local image="$MOE_IMAGE_PREFIX/moe-$name:$MOE_OPERATOR_VERSION"
  local dir="$MOE_IMAGE_CACHE/moe-$name-$key"
  if [ "$rebuild" = 0 ] && cache_hit "$dir"; then
    step "moe-$name: cached ($dir)"
    return
  fi
  ensure_store
  local t0=$SECONDS rev epoch pull=true created
  rev=$(revision)
  epoch=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)
  created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
  [ "$base_kind" = local ] && pull=never
  step "moe-$name: building docker/$name.Dockerfile on $base_ref (revision $rev, $driver storage)"
  "${B[@]}" bud --isolation chroot --format oci --layers=false --pull="$pull" "${RUN_MOUNTS[@]}" \
    -f "$repo/docker/$name.Dockerfile" --ignorefile "$repo/docker/$name.Dockerfile.dockerignore" \
    --build-arg "$base_arg=$base_ref" "$@" \
    --build-arg "MOE_OPERATOR_VERSION=$MOE_OPERATOR_VERSION" \
    --build-arg "MOE_REVISION=$rev" \
    --timestamp "$epoch" \
    --annotation "org.opencontainers.image.title=moe-$name" \
    --annotation "org.opencontainers.image.version=$MOE_OPERATOR_VERSION" \
    --annotation "org.opencontainers.image.revision=$rev" \
    --annotation "org.opencontainers.image.source=https://github.com/moe-operator/moe-operator" \
    --annotation "org.opencontainers.image.created=$created" \
    --annotation "org.opencontainers.image.base.name=$base_ref" \
    -t "$image" "$repo" >"$work/build-$name.log" 2>&1 \
    || { tail -n 30 "$work/build-$name.log" >&2; die "moe-$name: build failed (log above)"; }
  local t_build=$((SECONDS - t0))
  rm -rf "$dir.partial" && mkdir -p "$dir.partial"
  # The archive names the image (index.json ref.name), so podman load, ctr import and kind load
  # tag it as the chart expects.
  "${B[@]}" push -q "$image" "oci-archive:$dir.partial/moe-$name.oci.tar:$image" >/dev/null
  local size archive_mb
  size=$("${B[@]}" images --format '{{.Size}}' "$image" | head -n1)
  archive_mb=$(( $(stat -c %s "$dir.partial/moe-$name.oci.tar") / 1000000 ))
  step "moe-$name: built in ${t_build} s, exported in $((SECONDS - t0 - t_build)) s: image $size, archive $archive_mb MB"
  if [ "$name" = operator ]; then
    inspect_image "$image" "$name" "the operator's virtualenv" "/opt/moe-operator/lib/python3*/site-packages" \
      >"$dir.partial/moe-$name.packages.txt"
  else
    inspect_image "$image" "$name" "the runtime tree engine pods copy" "/opt/moe-runtime" \
      >"$dir.partial/moe-$name.packages.txt"
  fi
  local upper=${name^^}
  {
    echo "MOE_${upper}_IMAGE=$image"
    echo "MOE_${upper}_KEY=$key"
    echo "MOE_${upper}_REVISION=$rev"
    echo "MOE_${upper}_BASE=$base_ref"
    echo "MOE_${upper}_SIZE='$size'"
    echo "MOE_${upper}_ARCHIVE_MB=$archive_mb"
    echo "MOE_${upper}_BUILD_SECONDS=$((SECONDS - t0))"
  } >"$dir.partial/image.env"
  cache_commit "$dir" 3
}

# ---- bases -------------------------------------------------------------------------------------
if [ "$base_kind" = local ]; then
  # shellcheck source=ci-base.sh
  . "$repo/docker/ci-base.sh"
  ci_key=$(ci_base_key)
  python_ref="localhost/moe-ci-python:$ci_key"
  engine_ref="localhost/moe-ci-engine:$ci_key"
  python_id="local:$ci_key"
  engine_id="local:$ci_key"
else
  command -v skopeo >/dev/null || die "needs skopeo to resolve the base images' digests (Debian package skopeo)"
  python_ref=$(qualify "$PYTHON_IMAGE")
  engine_ref=$(qualify "$SGLANG_IMAGE")
  digest() {
    skopeo inspect --override-os linux --override-arch amd64 --format '{{.Digest}}' "docker://$1" 2>/dev/null \
      || die "cannot resolve $1 (no registry access? in CI use --local-base)"
  }
  python_id="$python_ref@$(digest "$python_ref")"
  engine_id="$engine_ref@$(digest "$engine_ref")"
fi
operator_key=$(image_key operator "$python_id")
runtime_key=$(image_key runtime "$engine_id")

need_base=0
for pair in "operator:$operator_key" "runtime:$runtime_key"; do
  [ "$rebuild" = 0 ] && [ -f "$MOE_IMAGE_CACHE/moe-${pair%%:*}-${pair#*:}/.complete" ] || need_base=1
done
if [ "$base_kind" = local ] && [ "$need_base" = 1 ]; then
  ensure_store
  ci_base_load "$ci_key"
fi

# ---- images ------------------------------------------------------------------------------------
build_image operator PYTHON_IMAGE "$python_ref" "$operator_key"
build_image runtime SGLANG_IMAGE "$engine_ref" "$runtime_key" \
  --build-arg "SGLANG_ROUTER_VERSION=$SGLANG_ROUTER_VERSION"

# ---- output ------------------------------------------------------------------------------------
: >"$out/build.env.partial"
for pair in "operator:$operator_key" "runtime:$runtime_key"; do
  name=${pair%%:*}
  dir="$MOE_IMAGE_CACHE/moe-$name-${pair#*:}"
  for f in "moe-$name.oci.tar" "moe-$name.packages.txt"; do
    ln -f "$dir/$f" "$out/$f" 2>/dev/null || cp -f "$dir/$f" "$out/$f"
  done
  cat "$dir/image.env" >>"$out/build.env.partial"
  echo "MOE_${name^^}_ARCHIVE=$out/moe-$name.oci.tar" >>"$out/build.env.partial"
done
[ -n "$driver" ] || ensure_store
echo "MOE_IMAGES_BASE=$base_kind" >>"$out/build.env.partial"
# The storage driver that works here, for whoever loads the archives with buildah (the tests).
echo "MOE_IMAGES_STORAGE_DRIVER=$driver" >>"$out/build.env.partial"
mv "$out/build.env.partial" "$out/build.env"
# shellcheck disable=SC1091
. "$out/build.env"
step "moe-operator: $MOE_OPERATOR_IMAGE, $MOE_OPERATOR_SIZE (archive $MOE_OPERATOR_ARCHIVE_MB MB) on $MOE_OPERATOR_BASE"
step "moe-runtime:  $MOE_RUNTIME_IMAGE, $MOE_RUNTIME_SIZE (archive $MOE_RUNTIME_ARCHIVE_MB MB) on $MOE_RUNTIME_BASE"
step "done in $((SECONDS - t_start)) s; load or push: skopeo copy oci-archive:$out/moe-operator.oci.tar docker://REGISTRY/moe-operator:$MOE_OPERATOR_VERSION"
echo "MOE_IMAGES=$out"

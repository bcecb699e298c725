# Sourced by docker/build.sh for --local-base: the two base images CI builds the Dockerfiles on,
# since no registry can be reached there.
#   moe-ci-python  stands in for python:3.11-slim: Debian minbase with Debian's python3 and venv,
#                  made by debootstrap straight into a buildah container, slimmed like
#                  debian:bookworm-slim (no docs, man pages or locales).
#   moe-ci-engine  stands in for lmsysorg/sglang: moe-ci-python plus pip and the light packages
#                  the runtime tree needs from the engine (docker/ci-engine.Dockerfile).
# Both are cached as OCI archives under $MOE_IMAGE_CACHE/ci-base-<key>/, key = this recipe.
# shellcheck shell=bash

ci_base_key() {
  {
    cat "$repo/docker/ci-base.sh" "$repo/docker/ci-engine.Dockerfile" "$repo/docker/ci-engine-requirements.txt"
    printf '%s\n' "$CI_BASE_SUITE" "$CI_BASE_MIRROR"
  } | sha256sum | cut -c1-16
}

# ci_base_load KEY: the two bases in buildah's store as localhost/moe-ci-{python,engine}:KEY,
# from the cache when it has them, else built (and cached).
ci_base_load() {
  local key=$1 dir="$MOE_IMAGE_CACHE/ci-base-$1"
  local py="localhost/moe-ci-python:$key" engine="localhost/moe-ci-engine:$key"
  if cache_hit "$dir"; then
    step "CI base images from the cache ($dir)"
    _ci_base_tag "$dir/ci-python.oci.tar" "$py"
    _ci_base_tag "$dir/ci-engine.oci.tar" "$engine"
    return
  fi
  command -v debootstrap >/dev/null || die "--local-base needs debootstrap (Debian package debootstrap; bash e2e/setup.sh installs it)"
  local t0=$SECONDS
  step "CI base: debootstrap $CI_BASE_SUITE (minbase + python3) from $CI_BASE_MIRROR"
  local ctr mnt
  ctr=$("${B[@]}" from scratch)
  mnt=$("${B[@]}" mount "$ctr")
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$CI_BASE_SUITE" "$mnt" "$CI_BASE_MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  # Slim like debian:bookworm-slim, for this image and every later apt-get install in it.
  cat >"$mnt/etc/dpkg/dpkg.cfg.d/moe-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
  find "$mnt/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$mnt/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$mnt"/usr/share/man/* "$mnt"/usr/share/info/* "$mnt"/usr/share/locale/* "$mnt"/usr/share/lintian/* \
    "$mnt"/var/lib/apt/lists/* "$mnt"/var/cache/apt/* "$mnt"/var/log/* "$mnt"/tmp/*
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 \
    --label "org.opencontainers.image.title=moe-ci-python" \
    --label "org.opencontainers.image.description=CI stand-in for python:3.11-slim: Debian $CI_BASE_SUITE minbase with Debian's python3" \
    "$ctr"
  "${B[@]}" commit -q --rm "$ctr" "$py" >/dev/null
  step "CI base: stand-in engine image (docker/ci-engine.Dockerfile)"
  "${B[@]}" bud -q --isolation chroot --pull=never --layers=false "${RUN_MOUNTS[@]}" \
    -f "$repo/docker/ci-engine.Dockerfile" --build-arg "BASE_IMAGE=$py" -t "$engine" \
    "$repo/docker" >/dev/null
  rm -rf "$dir.partial" && mkdir -p "$dir.partial"
  # Uncompressed: a cache, never shipped; compressing ~400 MB costs more than it saves.
  "${B[@]}" push -q -D "$py" "oci-archive:$dir.partial/ci-python.oci.tar" >/dev/null
  "${B[@]}" push -q -D "$engine" "oci-archive:$dir.partial/ci-engine.oci.tar" >/dev/null
  cache_commit "$dir" 2
  step "CI base images built in $((SECONDS - t0)) s (cached in $dir)"
}

_ci_base_tag() {
  local id
  id=$("${B[@]}" pull -q "oci-archive:$1")
  "${B[@]}" tag "$id" "$2"
}

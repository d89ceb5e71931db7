#!/usr/bin/env bash
# Make a Debian root filesystem tarball with mmdebstrap (or debootstrap) from the apt source this
# machine is configured with, for `docker import` / `podman import` when no image registry is
# reachable. The source is read from /etc/apt at run time; no mirror is written into this file.
#
#   docker/debian-rootfs.sh OUT.tar PACKAGE[,PACKAGE...] [SETUP-COMMAND]
#
# SETUP-COMMAND runs inside the finished root filesystem (sh -c), e.g. to make a data folder.
# SUITE (default: this machine's VERSION_CODENAME) picks the Debian release.
set -euo pipefail

usage() { echo "usage: $0 OUT.tar PACKAGES [SETUP-COMMAND]" >&2; exit 2; }
[ $# -ge 2 ] || usage
out="$1" packages="$2" setup="${3:-}"
suite="${SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}"
[ -n "$suite" ] || { echo "debian-rootfs: no VERSION_CODENAME in /etc/os-release; set SUITE" >&2; exit 1; }

# One "deb URI SUITE COMPONENTS" line per entry of the machine's apt configuration (one-line
# .list files and deb822 .sources files) whose suite is SUITE or SUITE-updates/-security.
apt_lines() {
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  shopt -s nullglob
  files+=(/etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
  shopt -u nullglob
  [ ${#files[@]} -gt 0 ] || return 0
  awk -v suite="$suite" '
    function want(s) { return s == suite || s == suite "-updates" || s == suite "-security" }
    function flush(   i, j, n, m, u, s) {
      if (types ~ /(^| )deb( |$)/ && uris != "") {
        n = split(uris, u, " "); m = split(suites, s, " ")
        for (i = 1; i <= n; i++) for (j = 1; j <= m; j++)
          if (want(s[j])) print "deb " u[i] " " s[j] " " (comps == "" ? "main" : comps)
      }
      types = uris = suites = comps = ""
    }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[ \t]*$/) { flush(); next }
      if ($0 ~ /^#/) next
      key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
      if (key == "types") types = $0; else if (key == "uris") uris = $0
      else if (key == "suites") suites = $0; else if (key == "components") comps = $0
      next
    }
    FNR == 1 { flush() }
    /^[ \t]*deb[ \t]/ {
      i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
      uri = $i; s = $(i + 1); c = ""
      for (k = i + 2; k <= NF; k++) c = c (c == "" ? "" : " ") $k
      if (want(s)) print "deb " uri " " s " " (c == "" ? "main" : c)
    }
    END { flush() }
  ' "${files[@]}"
}

mapfile -t sources < <(apt_lines | awk '!seen[$0]++')
if [ ${#sources[@]} -eq 0 ]; then
  echo "debian-rootfs: no apt source for '$suite' in /etc/apt (sources.list, sources.list.d)" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="${out%.tar}.partial.tar"
rm -f "$tmp"
if command -v mmdebstrap >/dev/null; then
  hooks=()
  export ROOTFS_SETUP="$setup"
  [ -z "$setup" ] || hooks=(--customize-hook='chroot "$1" sh -c "$ROOTFS_SETUP"')
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/var/cache/apt/*' \
    "${hooks[@]}" "$suite" "$tmp" "${sources[@]}"
elif command -v debootstrap >/dev/null; then
  root="$(mktemp -d)"
  trap 'rm -rf "$root"' EXIT
  mirror="$(echo "${sources[0]}" | awk '{print $2}')"
  debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >/dev/null
  printf '%s\n' "${sources[@]}" >"$root/etc/apt/sources.list"
  [ -z "$setup" ] || chroot "$root" sh -c "$setup"
  rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$tmp" .
else
  echo "debian-rootfs: needs mmdebstrap or debootstrap (apt-get install mmdebstrap)" >&2
  exit 1
fi
mv "$tmp" "$out"

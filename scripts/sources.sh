# shellcheck shell=bash
# The one place that fetches and verifies upstream sources (sourced by the build-*.sh scripts).
# scripts/sources.lock pins every source by content (its header defines the digest); a source
# comes either from a local copy (an offline archive such as ../shared/..., unpacked by the
# caller) or from its URL, and is checked against the same pin either way. Verified sources are
# cached by digest in $SLURM_TPU_SOURCES_CACHE (default /var/cache/slurm-tpu/sources)/<digest>:
# a second build, or another script needing the same tree, costs a lookup.
#
#   sources_assemble PREFIX DEST [LOCAL_ROOT]
#       Lay out every source named PREFIX or PREFIX/... into DEST (the part of the name after
#       PREFIX is its place in DEST), taking each from LOCAL_ROOT/<place> when LOCAL_ROOT is given.
#   sources_digest DIR          the content digest of a tree (sources.lock's definition)
#   sources_key PREFIX          one line per source of PREFIX (name and digest), for cache keys
#
# Env: SLURM_TPU_SOURCES_MIRROR=<base URL or file:///dir>: fetch https://HOST/PATH from
# <base>/PATH instead (a site without GitHub access, and the tests, serve the same files).
# Failures print ONE line on stderr naming the source and return 1 (a digest or content
# problem) or 3 (nothing could be downloaded: no network and no offline copy); nothing
# half-written is left in the cache (each entry is built in a temporary folder and renamed).

SOURCES_LOCK=${SOURCES_LOCK:-$(dirname "${BASH_SOURCE[0]}")/sources.lock}
# The cache, read at each call (a caller or a test may set the variable after sourcing this).
_sources_cache() { echo "${SLURM_TPU_SOURCES_CACHE:-/var/cache/slurm-tpu/sources}"; }

# sources_digest DIR: sha256 of F then L, where F is `sha256sum` output ("<hex>  <path>") for every
# regular file and L is "symlink <path> -> <target>" for every symbolic link, paths relative to
# DIR without "./", each list sorted bytewise (LC_ALL=C) by path. Directories and modes are not part
# of it (a git archive carries no empty folders; tar restores the modes).
sources_digest() {
    local dir=$1
    (
        cd "$dir" || exit 1
        find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum -- || exit 1
        find . -type l -printf 'symlink %P -> %l\n' | LC_ALL=C sort
    ) | sha256sum | cut -c1-64
}

# _sources_lines PREFIX: the lock's lines "name url kind digest" for PREFIX and PREFIX/....
_sources_lines() {
    local prefix=$1 name url kind digest
    [ -f "$SOURCES_LOCK" ] || { echo "sources: no pin file $SOURCES_LOCK" >&2; return 1; }
    while read -r name url kind digest; do
        case $name in '' | '#'*) continue ;; esac
        if [ "$name" = "$prefix" ] || [ "${name#"$prefix"/}" != "$name" ]; then
            echo "$name $url $kind $digest"
        fi
    done <"$SOURCES_LOCK"
}

sources_key() {
    local lines
    lines=$(_sources_lines "$1") || return 1
    [ -n "$lines" ] || { echo "sources: no source named $1 in $SOURCES_LOCK" >&2; return 1; }
    awk '{print $1, $4}' <<<"$lines"
}

# _sources_url URL: URL, or its path under $SLURM_TPU_SOURCES_MIRROR.
_sources_url() {
    local url=$1 mirror=${SLURM_TPU_SOURCES_MIRROR:-}
    if [ -n "$mirror" ]; then
        local path=${url#*://}
        echo "${mirror%/}/${path#*/}"
    else
        echo "$url"
    fi
}

# _sources_check_tree NAME DIR: refuse (one line, status 1) a tree that holds anything but folders,
# regular files and symbolic links (a device node, a FIFO: never in a source archive), or whose
# folders are symlinks; then make it root's and read-only for others, without setuid bits. The digest
# covers only content, so this is what keeps a pinned tree from bringing special files or modes.
_sources_check_tree() {
    local name=$1 dir=$2 odd
    if [ ! -d "$dir" ] || [ -L "$dir" ]; then
        echo "sources: $name: its top folder is not a folder" >&2
        return 1
    fi
    odd=$(find "$dir" ! -type f ! -type d ! -type l -print -quit)
    [ -z "$odd" ] || { echo "sources: $name: refusing it: it holds a special file (${odd#"$dir"/})" >&2; return 1; }
    chmod -R u+rwX,go+rX,go-w,ug-s "$dir"
}

# _sources_no_symlink_on NAME DIR SUB: refuse when a component of DIR/SUB (a nested source's place,
# removed before the digest) is a symlink: the removal would follow it out of DIR.
_sources_no_symlink_on() {
    local name=$1 path=$2 part
    local IFS=/
    for part in $3; do
        path=$path/$part
        [ ! -L "$path" ] || { echo "sources: $name: refusing it: ${path#"$2"/} is a symlink" >&2; return 1; }
    done
}

# _sources_get NAME URL KIND DIGEST LOCAL NESTED...: make <cache>/DIGEST (a tree or a file)
# from LOCAL (a path, or "" to download), without the NESTED sub-paths (sources of their own).
_sources_get() {
    local digest=$4 cache
    cache=$(_sources_cache)
    [ -e "$cache/$digest" ] && return 0
    (umask 022 && mkdir -p "$cache") || { echo "sources: cannot create the cache $cache" >&2; return 1; }
    local tmp rc=0
    tmp=$(mktemp -d "$cache/.part.XXXXXX") || return 1
    _sources_fill "$tmp" "$@" || rc=$?
    # The temporary folder goes whatever happened (on success the rename emptied it).
    rm -rf "$tmp"
    return "$rc"
}

# _sources_fill TMP NAME URL KIND DIGEST LOCAL NESTED...: _sources_get's work, in TMP.
_sources_fill() {
    local tmp=$1 name=$2 url=$3 kind=$4 digest=$5 local_copy=$6
    shift 6
    local entry from actual
    entry=$(_sources_cache)/$digest
    if [ -n "$local_copy" ]; then
        from=$local_copy
        if [ "$kind" = tree ]; then
            [ -d "$local_copy" ] || { echo "sources: $name: no folder $local_copy in the offline copy" >&2; return 1; }
            cp -a "$local_copy" "$tmp/content" || { echo "sources: $name: cannot copy $local_copy" >&2; return 1; }
        else
            [ -f "$local_copy" ] || { echo "sources: $name: no file $local_copy in the offline copy" >&2; return 1; }
            cp "$local_copy" "$tmp/content" || { echo "sources: $name: cannot copy $local_copy" >&2; return 1; }
        fi
    else
        from=$(_sources_url "$url")
        local err
        # --speed-limit/--speed-time: a mirror that stalls (under 1 kB/s for a minute) fails the fetch.
        if ! err=$(curl -fsSL --connect-timeout 20 --speed-limit 1024 --speed-time 60 --retry 2 \
                -o "$tmp/download" "$from" 2>&1 </dev/null); then
            echo "sources: $name: cannot download $from (${err##*curl: }): give the offline archive, or set" \
                 "SLURM_TPU_SOURCES_MIRROR to a copy of the sources" >&2
            return 3
        fi
        if [ "$kind" = tree ]; then
            mkdir "$tmp/unpacked"
            (umask 022 && tar -xzf "$tmp/download" -C "$tmp/unpacked" --no-same-owner --no-same-permissions) 2>/dev/null \
                || { echo "sources: $name: $from is not a gzip tar archive" >&2; return 1; }
            # GitHub's archives hold one folder, <repo>-<ref>/; that folder is the tree.
            local top=("$tmp/unpacked"/*)
            if [ ${#top[@]} != 1 ] || [ ! -d "${top[0]}" ] || [ -L "${top[0]}" ]; then
                echo "sources: $name: $from does not hold exactly one top folder" >&2
                return 1
            fi
            mv "${top[0]}" "$tmp/content"
        else
            mv "$tmp/download" "$tmp/content"
        fi
    fi
    local sub
    if [ "$kind" = tree ]; then
        _sources_check_tree "$name" "$tmp/content" || return 1
        for sub in "$@"; do
            _sources_no_symlink_on "$name" "$tmp/content" "$sub" || return 1
            rm -rf "${tmp:?}/content/$sub"
        done
        actual=$(sources_digest "$tmp/content")
    else
        actual=$(sha256sum <"$tmp/content" | cut -c1-64)
    fi
    if [ "$actual" != "$digest" ]; then
        echo "sources: $name from $from has digest $actual, but scripts/sources.lock pins $digest:" \
             "refusing it (a changed or corrupted copy; fetch it again, or check the pin)" >&2
        return 1
    fi
    # mktemp's folder is 0700: the cached copy is for every user of the machine, and root's alone to change.
    [ "$kind" = tree ] || chmod 0644 "$tmp/content"
    # -T: if another build put the same entry there meanwhile, keep that one.
    mv -T "$tmp/content" "$entry" 2>/dev/null || [ -e "$entry" ]
}

sources_assemble() {
    local prefix=$1 dest=$2 local_root=${3:-}
    local lines
    lines=$(_sources_lines "$prefix") || return 1
    [ -n "$lines" ] || { echo "sources: no source named $prefix in $SOURCES_LOCK" >&2; return 1; }
    local name url kind digest place nested other rc cache
    cache=$(_sources_cache)
    mkdir -p "$dest" || return 1
    while read -r name url kind digest; do
        place=${name#"$prefix"}
        place=${place#/}
        case $kind in tree | file) ;; *) echo "sources: $name: unknown kind $kind in $SOURCES_LOCK" >&2; return 1 ;; esac
        # Sources below this one (enroot's submodules) are pinned and placed on their own.
        nested=()
        while read -r other _; do
            [ "${other#"$name"/}" != "$other" ] && nested+=("${other#"$name"/}")
        done <<<"$lines"
        rc=0
        _sources_get "$name" "$url" "$kind" "$digest" "${local_root:+$local_root${place:+/$place}}" \
            "${nested[@]}" || rc=$?
        [ "$rc" = 0 ] || return "$rc"
        if [ "$kind" = tree ]; then
            mkdir -p "$dest${place:+/$place}" && cp -a "$cache/$digest/." "$dest${place:+/$place}/" || return 1
        else
            mkdir -p "$(dirname "$dest/$place")" && cp "$cache/$digest" "$dest/$place" || return 1
        fi
    done <<<"$lines"
}

# sources_offline FOLDER SUBDIR PATTERN: the offline archive matching PATTERN (a glob; the last in
# name order) in FOLDER when it is given, else in ../shared/SUBDIR or ./shared/SUBDIR (where CI and
# machines without network keep them). Prints nothing when there is none.
sources_offline() {
    local folder=$1 subdir=$2 pattern=$3 candidate found=
    for candidate in ${folder:+"$folder"} ${folder:-"../shared/$subdir" "shared/$subdir"}; do
        # shellcheck disable=SC2206  # the pattern is a glob, on purpose
        local matches=("$candidate"/$pattern)
        [ -f "${matches[-1]}" ] && found=${matches[-1]} && break
    done
    [ -z "$found" ] || echo "$found"
}

# sources_unpack ARCHIVE DIR: unpack an offline archive (../shared/...: a .tar.xz of one top folder)
# into DIR and print that folder, the LOCAL_ROOT to give sources_assemble.
sources_unpack() {
    local archive=$1 dir=$2
    if ! { mkdir -p "$dir" && (umask 022 && tar -xf "$archive" -C "$dir" --no-same-owner --no-same-permissions); }; then
        echo "sources: cannot unpack $archive" >&2
        return 1
    fi
    local top=("$dir"/*)
    if [ ${#top[@]} != 1 ] || [ ! -d "${top[0]}" ]; then
        echo "sources: $archive does not hold exactly one top folder" >&2
        return 1
    fi
    echo "${top[0]}"
}

# sources_tree NAME DEST [ARCHIVE]: DEST holds the source NAME (with the sources below it), taken
# from the offline ARCHIVE when that file exists, else downloaded, checked against the pins either
# way; nothing to do when DEST is there. Assembled beside DEST and renamed: DEST is whole or absent.
# Status as sources_assemble's (3: nothing could be downloaded).
sources_tree() {
    local name=$1 dest=$2 archive=${3:-} part root='' rc=0
    [ -d "$dest" ] && return 0
    mkdir -p "$(dirname "$dest")" && part=$(mktemp -d "$dest.part.XXXXXX") || return 1
    if [ -n "$archive" ] && [ -f "$archive" ]; then
        root=$(sources_unpack "$archive" "$part/offline") || rc=1
    fi
    if [ "$rc" = 0 ]; then
        sources_assemble "$name" "$part/tree" "$root" || rc=$?
    fi
    if [ "$rc" = 0 ]; then
        mv -T "$part/tree" "$dest" 2>/dev/null || [ -d "$dest" ] || rc=1
    fi
    rm -rf "$part"
    return "$rc"
}

# sources_apt PROGRAM PACKAGE...: apt-get install the PACKAGEs that are not installed (as root), or
# one line naming them and a non-zero exit. PROGRAM prefixes the messages.
sources_apt() {
    local program=$1 package missing=()
    shift
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} = 0 ] && return 0
    [ "$(id -u)" = 0 ] || { echo "$program: missing build packages: ${missing[*]} (apt-get install them, or run as root)" >&2; return 1; }
    echo "$program: installing ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"; } >/dev/null || { echo "$program: could not install ${missing[*]}" >&2; return 1; }
}

# sources_releases PROGRAM ARG...: the Slurm releases a build-*.sh script is asked for, in
# $debian and $slurm25 (0 or 1; no argument: --debian), or one line and status 2.
# shellcheck disable=SC2034  # the caller reads them
sources_releases() {
    local program=$1 arg
    shift
    debian=0 slurm25=0
    for arg in "$@"; do
        case $arg in
            --debian) debian=1 ;;
            --slurm25) slurm25=1 ;;
            *) echo "$program: unknown argument $arg (--debian, --slurm25)" >&2; return 2 ;;
        esac
    done
    [ $# -gt 0 ] || debian=1
}

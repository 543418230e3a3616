#!/usr/bin/env bash
# Build the gres/tpu Slurm plugin (gres_tpu.c beside this script) against one Slurm source tree.
#   slurm_plugin/build.sh SLURM_SOURCE_TREE OUTPUT_DIR
#   OUTPUT_DIR may hold "{version}", replaced by the tree's release (22.05.8): one folder per release.
#   env: GRES_NAME=tpu  (the GRES the plugin serves; the .so is gres_<name>.so)
#        SLURM_CONFIGURE_FLAGS="--enable-multiple-slurmd"  (only when the tree is not configured yet:
#        configure it as the installed Slurm was, so the structures the plugin shares match)
# The plugin must come from the very release the daemons run (Slurm refuses a plugin whose
# plugin_version is another release's). Writes OUTPUT_DIR/gres_<name>.so and a stamp
# OUTPUT_DIR/gres_<name>.so.built (release + source checksum); does nothing when both are
# there and current. One line on stderr and a non-zero exit on failure.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "slurm_plugin/build.sh: $*" >&2; exit 1; }
[ $# -eq 2 ] || { echo "usage: slurm_plugin/build.sh SLURM_SOURCE_TREE OUTPUT_DIR" >&2; exit 2; }
tree=$1
out_dir=$2
name=${GRES_NAME:-tpu}
[[ $name =~ ^[a-z][a-z0-9_]{0,30}$ ]] || fail "GRES_NAME '$name' is not a lowercase GRES name"
[ -f "$tree/src/plugins/gres/common/gres_common.c" ] || fail "$tree is not a Slurm source tree (no src/plugins/gres/common/gres_common.c)"
tree=$(cd "$tree" && pwd)
command -v "${CC:-gcc}" >/dev/null || fail "no C compiler (${CC:-gcc}); install gcc"

if [ ! -f "$tree/config.h" ] || [ ! -f "$tree/slurm/slurm_version.h" ]; then
    # Configure writes config.h and slurm/slurm_version.h, which the plugin's headers need;
    # nothing is built beyond that.
    log="$tree/configure-slurm-tpu.log"
    # shellcheck disable=SC2086  # the flags are words
    (cd "$tree" && ./configure ${SLURM_CONFIGURE_FLAGS---enable-multiple-slurmd}) >"$log" 2>&1 \
        || fail "configure failed in $tree (see $log)"
fi
version=$(sed -n 's/^#define SLURM_VERSION_STRING "\(.*\)"$/\1/p' "$tree/config.h")
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || fail "no SLURM_VERSION_STRING in $tree/config.h (configure it again)"

# The release's own common GRES code (22.05: node_config_load and the slurmstepd hand-over
# live there; 25.11 keeps those in libslurmfull, and gres_common.c is linked all the same).
common=("$tree/src/plugins/gres/common/gres_common.c")
stamp="$version $name $(cat "$HERE/gres_tpu.c" "$HERE/build.sh" "${common[@]}" | sha256sum | cut -c1-16)"
out_dir=${out_dir//\{version\}/$version}
so="$out_dir/gres_$name.so"
if [ -f "$so" ] && [ "$(cat "$so.built" 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi
mkdir -p "$out_dir"
tmp=$(mktemp "$out_dir/.gres_$name.XXXXXX")
log="$out_dir/gres_$name.build.log"
# -DSLURM_PLUGIN_DEBUG and -I<tree>: as Slurm's own plugin Makefiles compile. Slurm's symbols
# (xmalloc, bit_*, list_*, env_*) stay undefined: the daemon's libslurmfull provides them.
if ! "${CC:-gcc}" -shared -fPIC -O2 -Wall -Werror=implicit-function-declaration \
        -DHAVE_CONFIG_H -DSLURM_PLUGIN_DEBUG -DGRES_NAME="\"$name\"" -DGRES_ENV_VAR="\"SLURM_JOB_${name^^}S\"" \
        -I"$tree" -I"$tree/slurm" -o "$tmp" "$HERE/gres_tpu.c" "${common[@]}" >"$log" 2>&1; then
    rm -f "$tmp"
    fail "compiling gres_$name.so against Slurm $version failed (see $log)"
fi
chmod 0755 "$tmp"
mv -f "$tmp" "$so"
echo "$stamp" >"$so.built"
rm -f "$log"
echo "slurm_plugin/build.sh: $so (Slurm $version)"

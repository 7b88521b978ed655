#!/bin/sh
# Runs every libFuzzer target in BUILD_DIR for SECONDS each; fails on a finding.
set -eu
dir=$1
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
status=0
for t in "$dir"/fuzz_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    corpus="$here/corpus-$name"
    mkdir -p "$corpus"
    seeds=""
    [ -d "$here/seeds/$name" ] && seeds="$here/seeds/$name"
    echo "fuzz: $name for ${secs}s"
    if ! "$t" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$dir/" "$corpus" $seeds; then
        echo "fuzz: $name found a crash (see $dir/crash-*)" >&2
        status=1
    fi
done
exit $status

#!/bin/sh
# Runs every libFuzzer target in BUILD_DIR for SECONDS each, one after the
# other, and fails when any of them finds something (a crash, a sanitizer
# report, undefined behaviour, a leak, a timeout). Each target starts from
# its committed seeds (tests/fuzz/seeds/<target>/, read only) and its work
# corpus (tests/fuzz/corpus-<target>/, not committed, kept between runs).
# Prints per target the executions, executions per second, seconds run and
# the work corpus's size, then a summary table of all of them.
#
#   sh tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -eu
dir=$1
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
# Undefined behaviour is a finding, not a warning.
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export UBSAN_OPTIONS
status=0
table=$(mktemp)
trap 'rm -f "$table"' EXIT
found=0
for t in "$dir"/fuzz_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    name=$(basename "$t")
    found=$((found + 1))
    corpus="$here/corpus-$name"
    mkdir -p "$corpus"
    seeds=""
    [ -d "$here/seeds/$name" ] && seeds="$here/seeds/$name"
    log="$dir/$name.log"
    echo "fuzz: $name for ${secs}s (log: $log)"
    start=$(date +%s)
    result=ok
    # shellcheck disable=SC2086 # $seeds is one directory or nothing
    if ! "$t" -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
        -artifact_prefix="$dir/$name-" "$corpus" $seeds >"$log" 2>&1; then
        result=FOUND
        status=1
        echo "fuzz: $name found something (artifact: $dir/$name-*):" >&2
        grep -E 'ERROR|runtime error|SUMMARY|Test unit written|deadly signal|timeout' "$log" |
            head -20 >&2 || true
    fi
    end=$(date +%s)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    files=$(find "$corpus" -type f | wc -l | tr -d ' ')
    kib=$(du -sk "$corpus" | cut -f1)
    nseeds=0
    [ -n "$seeds" ] && nseeds=$(find "$seeds" -type f | wc -l | tr -d ' ')
    printf 'fuzz: %s: %s executions, %s exec/s, %ss, corpus %s files (%s KiB), %s seeds: %s\n' \
        "$name" "${execs:-?}" "${rate:-?}" "$((end - start))" "$files" "$kib" "$nseeds" "$result"
    printf '%s %s %s %s %s %s %s\n' "$name" "${execs:-?}" "${rate:-?}" "$((end - start))" \
        "$files" "$nseeds" "$result" >>"$table"
done
if [ "$found" -eq 0 ]; then
    echo "fuzz: no fuzz_* target in $dir (build with -DKVIDX_FUZZ=ON)" >&2
    exit 1
fi
echo
echo "fuzz summary (${secs}s per target):"
printf '%-24s %12s %8s %6s %8s %6s %s\n' target executions exec/s secs corpus seeds result
while read -r n e r s f k res; do
    printf '%-24s %12s %8s %6s %8s %6s %s\n' "$n" "$e" "$r" "$s" "$f" "$k" "$res"
done <"$table"
exit $status

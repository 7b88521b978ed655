#!/bin/sh
# kvidx benchmarks (run by `make bench`). Usage: tests/bench/run.sh [BUILD_DIR]
#
# Every figure that depends on the machine is reported next to a reference
# measured in the same run (nginx for GET, Redis for listing, cJSON for the
# JSON writer), as a ratio. All servers are our own instances on 127.0.0.1
# free ports, stopped by PID at exit; every load is bounded in time/count.
#
# Knobs (environment):
#   BENCH_INDEX_KEYS  keys for bench_index       (default 10000000; ~3 min)
#   BENCH_LIST_KEYS   N keys for the server-CPU run and its listing pages (default 1000000,
#                     multiple of 1000; 10000000 adds ~5 min: see docs/performance.md)
#   BENCH_PUT_BATCHES PUT batches of 1000 timed  (default 200)
#   BENCH_WRK_SECS    duration of each wrk run   (default 5)
#   BENCH_REPS        rounds of each wrk / listing comparison, alternating
#                     kvidx and reference; the best round of each counts (default 2)
#   BENCH_PF_REPS     submit+poll+release cycles of the 1024-key prefetch (default 500);
#                     the 262,144-key ipc prefetch runs BENCH_PF_REPS/25 cycles (>= 8)
#   BENCH_LOOKUP_SECS seconds of each lookup / MGET round (default 3)
#   BENCH_CPU_SECS    seconds of each server-CPU round, kvidx and Redis alternating (default 1.5)
#   BENCH_CPU_ROUNDS  server-CPU rounds per operation; the median counts (default 3)
#   BENCH_TRACE       the trace to replay (default ../shared/traces/mooncake_synthetic_trace.jsonl
#                     beside the repository; the bench fails when it is missing)
#   BENCH_REDIS_KEYS  keys in the Redis source's initial-sync run (default 1000000)
#   BENCH_FS_FILES    files in the fs: source's first-scan run, on tmpfs (default 1000000)
#   BENCH_FS_RENAMES  renames timed until visible in GET (default 10000)
#   BENCH_FLEET_SECS  seconds of each fleet-directory round (default 1.5)
#   BENCH_PIN         1 = server on CPU 0, client on CPU 1 (default 1 if nproc >= 2)
set -u
B=${1:-build-bench}
INDEX_KEYS=${BENCH_INDEX_KEYS:-10000000}
LIST_KEYS=${BENCH_LIST_KEYS:-1000000}
PF_REPS=${BENCH_PF_REPS:-500}
LOOKUP_SECS=${BENCH_LOOKUP_SECS:-3}
CPU_SECS=${BENCH_CPU_SECS:-1.5}
CPU_ROUNDS=${BENCH_CPU_ROUNDS:-3}
FAILED=""
PUT_BATCHES=${BENCH_PUT_BATCHES:-200}
WRK_SECS=${BENCH_WRK_SECS:-5}
REPS=${BENCH_REPS:-2}
NPROC=$(nproc 2>/dev/null || echo 1)
PIN=${BENCH_PIN:-$([ "$NPROC" -ge 2 ] && echo 1 || echo 0)}
command -v taskset >/dev/null 2>&1 || PIN=0
if [ "$PIN" = 1 ]; then SRV="taskset -c 0"; CLI="taskset -c 1"; else SRV=""; CLI=""; fi

TMP=$(mktemp -d /tmp/kvidx-bench.XXXXXX)
PIDS=""
SUMMARY=$TMP/summary
: >"$SUMMARY"
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "== $*"; }
row() { printf '%-44s %16s  %s\n' "$1" "$2" "$3" >>"$SUMMARY"; }
have() { command -v "$1" >/dev/null 2>&1; }
# "name value unit" line -> value
val() { awk -v k="$1" '$1 == k { print $2; exit }' "$2"; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "") print b; else if (b == "") print a; else print (a + 0 >= b + 0 ? a : b) }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
meets_le() { awk -v r="$1" -v t="$2" 'BEGIN { if (r == "n/a" || r == "") print "n/a"; else if (r + 0 <= t + 0) print "MET"; else print "MISSED" }'; }
min() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "") print b; else if (b == "") print a; else print (a + 0 <= b + 0 ? a : b) }'; }
meets() { awk -v r="$1" -v t="$2" 'BEGIN { if (r == "n/a") print "n/a"; else if (r + 0 >= t + 0) print "MET"; else print "MISSED" }'; }
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + $$ % 20000 + ${1:-0}))
}
wait_port() { # port tries
    i=0
    while [ $i -lt "${2:-50}" ]; do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

echo "kvidx bench: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "machine: nproc=$NPROC cpu=\"$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)\" kernel=$(uname -r)"
echo "pinning: $([ "$PIN" = 1 ] && echo 'servers on CPU 0, clients (wrk, bench_http) on CPU 1' || echo none)"

for p in kvidxd bench_index bench_fold bench_json bench_http bench_lookup bench_persist bench_cpu bench_redis_source bench_fs_source bench_fleet; do
    [ -x "$B/$p" ] || { echo "missing $B/$p: build with -DKVIDX_BENCH=ON first" >&2; exit 1; }
done

# ---------------------------------------------------------------- 1. in-process
say "bench_index $INDEX_KEYS (memory per key, put rate, page time)"
timeout 420 "$B/bench_index" "$INDEX_KEYS" | tee "$TMP/index.txt" || echo "bench_index failed or timed out"
for k in rss_per_key_hash32 rss_per_key_hash16 rss_per_key_hash8; do
    row "index: $k @${INDEX_KEYS}" "$(val $k "$TMP/index.txt")" "bytes/key"
done
row "index: put_rate_batch1000 (in-process)" "$(val put_rate_batch1000_hash32 "$TMP/index.txt")" "keys/s"
row "index: page1000 start" "$(val page1000_start "$TMP/index.txt")" "us"
row "index: page1000 deep/start" "$(val page1000_ratio "$TMP/index.txt")" "x"

say "bench_fold"
timeout 120 "$B/bench_fold" | tee "$TMP/fold.txt" || echo "bench_fold failed or timed out"
awk '{ printf "%-44s %16s  %s\n", "fold: " $1, $2, $3 }' "$TMP/fold.txt" >>"$SUMMARY"

say "bench_json 200 (1000-entry KeyListPage: cJSON tree vs jw streaming writer)"
timeout 120 "$B/bench_json" 200 | tee "$TMP/json.txt" || echo "bench_json failed or timed out"
row "json: cJSON per entry" "$(val json_cjson_per_entry "$TMP/json.txt")" "us"
row "json: jw per entry" "$(val json_jw_per_entry "$TMP/json.txt")" "us"
row "json: jw speedup (cJSON/jw)" "$(val json_cjson_over_jw "$TMP/json.txt")" "x"

say "bench_persist $INDEX_KEYS (snapshot restore, journal append per fsync policy vs plain write)"
timeout 300 "$B/bench_persist" "$INDEX_KEYS" | tee "$TMP/persist.txt" || echo "bench_persist failed or timed out"
awk 'NF >= 2 && $2 ~ /^[0-9.]+$/ { printf "%-44s %16s  %s\n", "persist: " $1, $2, $3 }' "$TMP/persist.txt" >>"$SUMMARY"
rs=$(val snapshot_restore_seconds "$TMP/persist.txt")
[ "$INDEX_KEYS" = 10000000 ] && row "persist: 10M restore, fresh process (target<=3)" "${rs:-n/a}" "s $(meets_le "$rs" 3)"

# ---------------------------------------------------------------- 2. GET vs nginx
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }

start_kvidxd() { # -> KPORT, KPID
    KPORT=$(free_port 1)
    $SRV "$B/kvidxd" --set listen=127.0.0.1:"$KPORT" --set log_level=warn >"$TMP/kvidxd.$KPORT.log" 2>&1 &
    KPID=$!
    PIDS="$PIDS $KPID"
    wait_port "$KPORT" || { echo "kvidxd did not start"; cat "$TMP/kvidxd.$KPORT.log"; exit 1; }
}
stop_pid() { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

start_kvidxd
$CLI "$B/bench_http" put "$KPORT" 1 >/dev/null || { echo "initial PUT failed"; exit 1; }
CANON=$("$B/bench_http" zgen 1 | tr -d '\r' | tail -1)
KURL="http://127.0.0.1:$KPORT/v1/keys/$CANON"
BODY=$(python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$KURL" 2>/dev/null ||
    curl -s "$KURL")
echo "GET $KURL -> ${#BODY} bytes: $BODY"

NURL=""
if have nginx; then
    NPORT=$(free_port 2)
    mkdir -p "$TMP/nginx/logs"
    cat >"$TMP/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 1;
error_log $TMP/nginx/logs/error.log warn;
pid $TMP/nginx/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/cb;
    proxy_temp_path $TMP/nginx/px;
    fastcgi_temp_path $TMP/nginx/fc;
    uwsgi_temp_path $TMP/nginx/uw;
    scgi_temp_path $TMP/nginx/sc;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$NPORT;
        location / { default_type application/json; return 200 '$BODY'; }
    }
}
EOF
    $SRV nginx -e "$TMP/nginx/logs/error.log" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" >"$TMP/nginx/out.log" 2>&1 &
    NGPID=$!
    PIDS="$PIDS $NGPID"
    if wait_port "$NPORT"; then
        NURL="http://127.0.0.1:$NPORT/v1/keys/$CANON"
        NB=$(python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$NURL" 2>/dev/null)
        [ "$NB" = "$BODY" ] && echo "nginx answers the same ${#NB}-byte body" || echo "WARNING: nginx body differs: $NB"
    else
        echo "nginx did not start (reference missing):"; cat "$TMP/nginx/out.log" "$TMP/nginx/logs/error.log" 2>/dev/null
    fi
else
    echo "nginx not installed: no GET reference (install nginx-light)"
fi

cat >"$TMP/pipeline.lua" <<'EOF'
init = function(args)
    local r = {}
    for i = 1, 16 do r[i] = wrk.format(nil, wrk.path) end
    req = table.concat(r)
end
request = function() return req end
EOF

wrk_rps() { # label url conns [lua] -> prints req/s
    out=$TMP/wrk.$1.txt
    if [ -n "${4:-}" ]; then
        $CLI timeout $((WRK_SECS + 30)) wrk -t2 -c"$3" -d"${WRK_SECS}s" --latency -s "$4" "$2" >"$out" 2>&1
    else
        $CLI timeout $((WRK_SECS + 30)) wrk -t2 -c"$3" -d"${WRK_SECS}s" --latency "$2" >"$out" 2>&1
    fi
    grep -E 'Requests/sec|Non-2xx|Socket errors| 99%' "$out" | sed "s/^/   [$1] /" >&2
    awk '/Requests\/sec/ { print $2 }' "$out"
}

if have wrk; then
    for mode in c32 c256 p16; do
        case $mode in
        c32) c=32; lua="" ; target=0.85 ;;
        c256) c=256; lua=""; target=0.85 ;;
        p16) c=32; lua=$TMP/pipeline.lua; target=1.00 ;;
        esac
        say "GET /v1/keys/{canonical}: wrk -t2 -c$c -d${WRK_SECS}s --latency ${lua:+(16-deep pipeline)}"
        k=""; n=""; i=0
        while [ $i -lt "$REPS" ]; do
            k=$(max "$k" "$(wrk_rps "kvidx-$mode-r$i" "$KURL" "$c" "$lua")")
            [ -n "$NURL" ] && n=$(max "$n" "$(wrk_rps "nginx-$mode-r$i" "$NURL" "$c" "$lua")")
            i=$((i + 1))
        done
        r=$(ratio "$k" "$n")
        echo "   kvidx $k req/s, nginx ${n:-n/a} req/s, ratio $r (target >= $target: $(meets "$r" "$target"))"
        row "GET $mode: kvidx" "$k" "req/s"
        row "GET $mode: nginx (same body)" "${n:-n/a}" "req/s"
        row "GET $mode: kvidx/nginx (target>=$target)" "$r" "x $(meets "$r" "$target")"
    done
else
    echo "wrk not installed: skipping GET throughput (install wrk)"
fi
stop_pid "$KPID"
[ -n "$NURL" ] && stop_pid "$NGPID"

# ---------------------------------------------------------------- 3. PUT batches
say "PUT /v1/keys: $PUT_BATCHES batches of 1000 new keys, one keep-alive connection (C client)"
start_kvidxd
RSS0=$(rss_kb "$KPID")
$CLI timeout 300 "$B/bench_http" put "$KPORT" "$PUT_BATCHES" 0 | tee "$TMP/put.txt"
row "PUT batch1000 over HTTP" "$(val put_keys_per_s "$TMP/put.txt")" "keys/s (server time incl. loopback)"
row "PUT batch1000 incl. client encoding" "$(val put_keys_per_s_incl_client_encode "$TMP/put.txt")" "keys/s"
PUTIN=$(val put_rate_batch1000_hash32 "$TMP/index.txt")
row "PUT HTTP / in-process put (avg over ${INDEX_KEYS})" "$(ratio "$(val put_keys_per_s "$TMP/put.txt")" "$PUTIN")" "x"

# ---------------------------------------------------------------- 4. server CPU vs Redis
# bench_cpu cmp: the server's own CPU (utime + stime of /proc/PID/stat) per
# operation, kvidxd and Redis on the same core in alternating rounds, bodies
# encoded beforehand; the median round of each side counts. Wall-clock time
# per operation at the client is printed beside it (wall_*). The listing
# pages run over the N keys loaded here (and the same canonical strings in a
# Redis sorted set); then the stores and lookups.
LB=$((LIST_KEYS / 1000))
REST=$((LB - PUT_BATCHES))
say "server CPU: load N=$LIST_KEYS keys (remaining $REST batches) into kvidxd and the same strings into a Redis sorted set"
[ "$REST" -gt 0 ] && $CLI timeout 900 "$B/bench_http" put "$KPORT" "$REST" "$PUT_BATCHES" >/dev/null
RSS1=$(rss_kb "$KPID")
row "daemon: RSS per key after HTTP load of $LIST_KEYS" \
    "$(awk -v a="$RSS0" -v b="$RSS1" -v n="$LIST_KEYS" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.1f", (b - a) * 1024 / n }')" \
    "bytes/key (VmRSS growth of kvidxd; 32-byte hashes)"
if have redis-server && have redis-cli; then
    RPORT=$(free_port 3)
    $SRV redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --dir "$TMP" --logfile "$TMP/redis.log" >/dev/null 2>&1 &
    RPID=$!
    PIDS="$PIDS $RPID"
    if wait_port "$RPORT"; then
        "$B/bench_http" zgen "$LIST_KEYS" | timeout 900 redis-cli -p "$RPORT" --pipe | tail -1
        say "server CPU per operation, kvidxd vs Redis, ${CPU_ROUNDS} rounds of ${CPU_SECS}s each"
        $CLI timeout 900 "$B/bench_cpu" cmp "$KPORT" "$KPID" "$RPORT" "$RPID" "$CPU_SECS" "$CPU_ROUNDS" \
            listfirst listdeep store1000 storeipc lookup1000 lookupipc | tee "$TMP/cpu.txt" ||
            echo "bench_cpu cmp failed or timed out"
        cpu_rows() { # op label target
            row "CPU $2: kvidx" "$(val "cpu_$1_kvidx" "$TMP/cpu.txt")" "us/op server CPU (wall $(val "wall_$1_kvidx" "$TMP/cpu.txt") us)"
            row "CPU $2: redis" "$(val "cpu_$1_redis" "$TMP/cpu.txt")" "us/op server CPU (wall $(val "wall_$1_redis" "$TMP/cpu.txt") us)"
            r=$(val "cpu_$1_ratio" "$TMP/cpu.txt")
            row "CPU $2: redis/kvidx (target>=$3)" "${r:-n/a}" "x $(meets "${r:-n/a}" "$3")"
        }
        cpu_rows listfirst "first page 1000 @$LIST_KEYS vs ZRANGEBYLEX" 1.5
        cpu_rows listdeep "page at 9/10 @$LIST_KEYS vs ZRANGEBYLEX (cursor" 1.5
        d=$(ratio "$(val cpu_listdeep_kvidx "$TMP/cpu.txt")" "$(val cpu_listfirst_kvidx "$TMP/cpu.txt")")
        row "CPU page at 9/10 / first page (target<=1.2)" "$d" "x $(meets_le "$d" 1.2)"
        cpu_rows store1000 "store 1000 (key form) vs MSET 1000" 1.5
        cpu_rows storeipc "store ipc 128x8 vs MSET 1024" 3
        cpu_rows lookup1000 "lookup 1000 (key form) vs MGET 1000" 1.3
        cpu_rows lookupipc "lookup ipc 128x8 vs MGET 1024" 2.5
    else
        echo "redis-server did not start (reference missing)"; cat "$TMP/redis.log" 2>/dev/null
    fi
    stop_pid "$RPID"
else
    echo "redis-server/redis-cli not installed: no server CPU reference (install redis-server redis-tools)"
fi
stop_pid "$KPID"

# ---------------------------------------------------------------- 4b. trace replay
# The Mooncake synthetic trace (../shared/traces beside the repository),
# replayed in order with world size 8 against a fresh kvidxd (ipc-form
# lookup, then an ipc-form store of the chunks after the hit prefix) and a
# fresh Redis (MGET of the chunks x 8 keys, then MSET of the misses). Both
# must find the same hit chunks: the bench fails otherwise.
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TRACE=${BENCH_TRACE:-$ROOT/../shared/traces/mooncake_synthetic_trace.jsonl}
if [ ! -r "$TRACE" ]; then
    echo "trace replay: $TRACE is missing (the traces live in ../shared/traces beside the repository)" >&2
    FAILED="$FAILED trace-missing"
elif have redis-server; then
    say "trace replay: $(wc -l <"$TRACE") requests of $TRACE, world size 8"
    start_kvidxd
    $CLI timeout 600 "$B/bench_cpu" trace kvidx "$KPORT" "$KPID" "$TRACE" 8 | tee "$TMP/trk.txt" ||
        echo "bench_cpu trace kvidx failed"
    stop_pid "$KPID"
    RPORT=$(free_port 6)
    $SRV redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --dir "$TMP" --logfile "$TMP/redis-trace.log" >/dev/null 2>&1 &
    RPID=$!
    PIDS="$PIDS $RPID"
    if wait_port "$RPORT"; then
        $CLI timeout 600 "$B/bench_cpu" trace redis "$RPORT" "$RPID" "$TRACE" 8 | tee "$TMP/trr.txt" ||
            echo "bench_cpu trace redis failed"
    fi
    stop_pid "$RPID"
    hk=$(val trace_kvidx_hit_chunks "$TMP/trk.txt"); hr=$(val trace_redis_hit_chunks "$TMP/trr.txt")
    row "TRACE kvidx server CPU per request" "$(val trace_kvidx_cpu_us "$TMP/trk.txt")" "us (wall $(val trace_kvidx_wall_us "$TMP/trk.txt") us)"
    row "TRACE redis server CPU per request" "$(val trace_redis_cpu_us "$TMP/trr.txt")" "us (wall $(val trace_redis_wall_us "$TMP/trr.txt") us)"
    r=$(ratio "$(val trace_redis_cpu_us "$TMP/trr.txt")" "$(val trace_kvidx_cpu_us "$TMP/trk.txt")")
    row "TRACE redis/kvidx CPU (target>=2)" "$r" "x $(meets "$r" 2)"
    row "TRACE hit chunks kvidx / redis" "$hk / $hr" "$([ -n "$hk" ] && [ "$hk" = "$hr" ] && echo "equal" || echo "DIFFER")"
    row "TRACE resident bytes per key kvidx" "$(val trace_kvidx_rss_per_key "$TMP/trk.txt")" "bytes/key ($(val trace_kvidx_keys "$TMP/trk.txt") keys, 8-byte hashes)"
    row "TRACE resident bytes per key redis" "$(val trace_redis_rss_per_key "$TMP/trr.txt")" "bytes/key ($(val trace_redis_keys "$TMP/trr.txt") keys)"
    if [ -z "$hk" ] || [ "$hk" != "$hr" ]; then
        echo "trace replay: kvidx found ${hk:-?} hit chunks, Redis ${hr:-?}: the answers differ" >&2
        FAILED="$FAILED trace-hits"
    fi
fi

# ---------------------------------------------------------------- 5. lookup and prefetch (issue 5)
# All keys are stored in L1 (tier l1), so a LOOKUP prefetch pins hits only and
# completes in its 201; the cycle measures submit + poll + release of a handle.
say "lookup / LOOKUP prefetch: keys stored in L1; 1024-key key form, 1024-key ipc form (128x1x8), 262,144-key ipc form (4096x8x8)"
start_kvidxd
L=$B/bench_lookup
$CLI timeout 120 "$L" load "$KPORT" key1024 l1 &&
    $CLI timeout 120 "$L" load "$KPORT" ipc128.1.8 l1 &&
    $CLI timeout 120 "$L" load "$KPORT" ipc4096.8.8 l1 || echo "lookup key load failed"

say "prefetch: POST /v1/prefetches (LOOKUP, 1024 keys, key form) -> GET ?wait_ms=1000 -> DELETE, $PF_REPS cycles; cJSON parse of the same body in-process (floor)"
pk=""; i=0
while [ $i -lt "$REPS" ]; do
    $CLI timeout 300 "$L" prefetch "$KPORT" key1024 "$PF_REPS" | tee "$TMP/pf1024.$i.txt"
    r=$(val prefetch_cycle_over_floor "$TMP/pf1024.$i.txt")
    pk=$(min "$pk" "$r")
    [ "$r" = "$pk" ] && cp "$TMP/pf1024.$i.txt" "$TMP/pf1024.txt"
    i=$((i + 1))
done
row "PREFETCH key1024: cycles (submit+poll+release)" "$(val prefetch_cycles_per_s "$TMP/pf1024.txt")" "cycles/s"
row "PREFETCH key1024: cycle, median" "$(val prefetch_cycle_us "$TMP/pf1024.txt")" "us ($(val prefetch_submit_us "$TMP/pf1024.txt")/$(val prefetch_poll_us "$TMP/pf1024.txt")/$(val prefetch_release_us "$TMP/pf1024.txt") submit/poll/release)"
row "PREFETCH key1024: server time per key" "$(val prefetch_ns_per_key "$TMP/pf1024.txt")" "ns/key (incl. loopback)"
row "PREFETCH key1024: cJSON parse floor" "$(val floor_parse_us "$TMP/pf1024.txt")" "us ($(val prefetch_body_bytes "$TMP/pf1024.txt") B body)"
row "PREFETCH key1024: cycle/floor (target<=3)" "$pk" "x $(meets_le "$pk" 3)"

PF_BIG=$((PF_REPS / 25)); [ "$PF_BIG" -lt 8 ] && PF_BIG=8
say "prefetch: 262,144-key ipc form (4096 chunks x 8 groups x 8 ranks), $PF_BIG cycles"
$CLI timeout 300 "$L" prefetch "$KPORT" ipc4096.8.8 "$PF_BIG" | tee "$TMP/pfipc.txt"
row "PREFETCH ipc262144: cycles (submit+poll+release)" "$(val prefetch_cycles_per_s "$TMP/pfipc.txt")" "cycles/s"
row "PREFETCH ipc262144: cycle, median" "$(val prefetch_cycle_us "$TMP/pfipc.txt")" "us ($(val prefetch_submit_us "$TMP/pfipc.txt")/$(val prefetch_poll_us "$TMP/pfipc.txt")/$(val prefetch_release_us "$TMP/pfipc.txt") submit/poll/release)"
row "PREFETCH ipc262144: server time per key" "$(val prefetch_ns_per_key "$TMP/pfipc.txt")" "ns/key (answers $(val prefetch_answer_bytes "$TMP/pfipc.txt") B)"
row "PREFETCH ipc262144: cJSON parse floor" "$(val floor_parse_us "$TMP/pfipc.txt")" "us ($(val prefetch_body_bytes "$TMP/pfipc.txt") B body)"
row "PREFETCH ipc262144: cycle/floor" "$(val prefetch_cycle_over_floor "$TMP/pfipc.txt")" "x (no target)"

if have redis-server && have redis-cli; then
    RPORT=$(free_port 4)
    $SRV redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --dir "$TMP" --logfile "$TMP/redis-mget.log" >/dev/null 2>&1 &
    RPID=$!
    PIDS="$PIDS $RPID"
    wait_port "$RPORT" || { echo "redis-server did not start"; RPORT=""; }
    [ -n "$RPORT" ] && "$L" sgen 1000 | timeout 60 redis-cli -p "$RPORT" --pipe | tail -1
else
    RPORT=""
    echo "redis-server/redis-cli not installed: no MGET reference"
fi
say "POST /v1/lookup (1000 keys key form; 1024 keys ipc form 128x1x8) vs Redis MGET of the same 1000 canonical keys, ${LOOKUP_SECS}s rounds, one keep-alive connection each"
lk=""; li=""; rm=""; i=0
while [ $i -lt "$REPS" ]; do
    $CLI timeout 60 "$L" lookup "$KPORT" key1000 "$LOOKUP_SECS" | tee "$TMP/lk.$i.txt"
    lk=$(max "$lk" "$(val lookup_req_per_s "$TMP/lk.$i.txt")")
    $CLI timeout 60 "$L" lookup "$KPORT" ipc128.1.8 "$LOOKUP_SECS" | tee "$TMP/li.$i.txt"
    li=$(max "$li" "$(val lookup_req_per_s "$TMP/li.$i.txt")")
    if [ -n "$RPORT" ]; then
        $CLI timeout 60 "$L" mget "$RPORT" 1000 "$LOOKUP_SECS" | tee "$TMP/rm.$i.txt"
        rm=$(max "$rm" "$(val mget_req_per_s "$TMP/rm.$i.txt")")
    fi
    i=$((i + 1))
done
"$L" floor key1000 200 >"$TMP/lkfloor.txt"
"$L" floor ipc128.1.8 200 >"$TMP/lifloor.txt"
row "LOOKUP key1000: kvidx" "$lk" "req/s (parse floor $(val floor_parse_us "$TMP/lkfloor.txt") us)"
row "LOOKUP ipc1024 (128x8): kvidx" "$li" "req/s (parse floor $(val floor_parse_us "$TMP/lifloor.txt") us)"
row "LOOKUP redis MGET 1000" "${rm:-n/a}" "req/s"
r=$(ratio "$lk" "$rm")
row "LOOKUP key1000/MGET1000 (target>=1)" "$r" "x $(meets "$r" 1)"
r=$(ratio "$li" "$rm")
row "LOOKUP ipc1024/MGET1000 (target>=3)" "$r" "x $(meets "$r" 3)"
[ -n "$RPORT" ] && stop_pid "$RPID"
curl -s "http://127.0.0.1:$KPORT/metrics" 2>/dev/null | grep -E '^kvidx_lookup_hit_keys_(count|sum)' | sed 's/^/   /'
stop_pid "$KPID"

# ---------------------------------------------------------------- 6. Redis source
# l2_source = redis://: initial sync of BENCH_REDIS_KEYS LMCache keys (SCAN +
# pipelined STRLEN) beside a bare `redis-cli --scan | wc -l` of the same
# server in the same run (target: within 2x), then notification-to-visible
# latency of 10,000 SETs (target p99 <= 20 ms).
REDIS_KEYS=${BENCH_REDIS_KEYS:-1000000}
if have redis-server && have redis-cli; then
    RPORT=$(free_port 5)
    $SRV redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --notify-keyspace-events AKE --dir "$TMP" --logfile "$TMP/redis-src.log" >/dev/null 2>&1 &
    RPID=$!
    PIDS="$PIDS $RPID"
    if wait_port "$RPORT"; then
        say "Redis source: $REDIS_KEYS keys (SET, 100-byte values, prefix lmc); bare scan vs initial sync"
        "$B/bench_redis_source" gen "$REDIS_KEYS" lmc | timeout 300 redis-cli -p "$RPORT" --pipe | tail -1
        rs=""; ks=""; i=0
        while [ $i -lt "$REPS" ]; do
            t0=$(date +%s.%N)
            n=$($CLI timeout 300 redis-cli -p "$RPORT" --scan | wc -l)
            t1=$(date +%s.%N)
            r=$(awk -v n="$n" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
            echo "   redis-cli --scan: $n keys, $r keys/s"
            rs=$(max "$rs" "$r")
            $CLI timeout 300 "$B/bench_redis_source" sync "$RPORT" lmc | tee "$TMP/rsync.txt"
            ks=$(max "$ks" "$(val sync_keys_per_s "$TMP/rsync.txt")")
            i=$((i + 1))
        done
        row "REDIS source initial sync $REDIS_KEYS" "$ks" "keys/s"
        row "REDIS redis-cli --scan | wc -l" "$rs" "keys/s"
        r=$(ratio "$rs" "$ks")
        row "REDIS bare scan / sync (target<=2)" "$r" "x $(meets_le "$r" 2)"
        say "Redis source: notification-to-visible latency, 10000 SETs one at a time"
        $CLI timeout 300 "$B/bench_redis_source" latency "$RPORT" 10000 lmc | tee "$TMP/rlat.txt"
        row "REDIS notify->visible p50" "$(val notify_p50_ms "$TMP/rlat.txt")" "ms"
        p99=$(val notify_p99_ms "$TMP/rlat.txt")
        row "REDIS notify->visible p99 (target<=20)" "$p99" "ms $(meets_le "$p99" 20)"
    else
        echo "redis-server did not start (no Redis source figures)"
    fi
    stop_pid "$RPID"
else
    echo "redis-server/redis-cli not installed: no Redis source figures (install redis-server redis-tools)"
fi

# ---------------------------------------------------------------- 7. fs: source
# l2_source = fs:<dir> on tmpfs (/dev/shm): the first scan of BENCH_FS_FILES
# LMCache-named files beside `find -name '*.data' -printf '%s\n' | wc -l` on
# the same directory in the same run (target <= 1.5x find's time), rename()
# -> visible in GET latency over BENCH_FS_RENAMES renames (target p99 <= 50
# ms), and the daemon's RSS per indexed file. The program creates and
# removes the directory itself and stops the daemons it starts; not pinned
# (the daemon's scan thread and loop may use both CPUs, find has one).
FS_FILES=${BENCH_FS_FILES:-1000000}
FS_RENAMES=${BENCH_FS_RENAMES:-10000}
say "fs: source: $FS_FILES files on tmpfs (first scan vs find), $FS_RENAMES renames until visible"
timeout 900 "$B/bench_fs_source" "$B/kvidxd" "$FS_FILES" "$FS_RENAMES" | tee "$TMP/fs.txt" ||
    echo "bench_fs_source failed or timed out"
row "FS first scan $FS_FILES files" "$(val fs_scan_files_per_s "$TMP/fs.txt")" "files/s ($(val fs_scan_to_ready_seconds "$TMP/fs.txt") s to /readyz 200)"
row "FS find -printf %s | wc -l, same dir" "$(val fs_find_files_per_s "$TMP/fs.txt")" "files/s ($(val fs_find_seconds "$TMP/fs.txt") s)"
r=$(val fs_scan_over_find "$TMP/fs.txt")
row "FS scan time / find time (target<=1.5)" "$r" "x $(meets_le "$r" 1.5)"
row "FS rename->visible in GET p50" "$(val fs_rename_visible_p50_ms "$TMP/fs.txt")" "ms"
p99=$(val fs_rename_visible_p99_ms "$TMP/fs.txt")
row "FS rename->visible in GET p99 (target<=50)" "$p99" "ms $(meets_le "$p99" 50)"
row "FS daemon RSS per indexed file" "$(val fs_rss_bytes_per_file "$TMP/fs.txt")" "bytes/file (32-byte hashes)"

# ---------------------------------------------------------------- 8. fleet directory
# LMCache's coordinator surface (docs/fleet.md): POST /events of 1000-entry
# store batches (the same keys re-stored, without and with 256 token ids an
# entry; and new keys) beside the cJSON parse of the same body and Redis
# MSET of the same 1000 keys; the tokens form of /directory/lookup for a
# 32,768-token prompt at world size 8 beside the parse of its body; resident
# bytes per key, per extra placement and per token id at 1M keys; fencing an
# instance that holds 1M L1 placements (the request's time and how long a
# probe on another connection waits for the loop).
FLEET_SECS=${BENCH_FLEET_SECS:-1.5}
say "fleet directory: /events, /directory/lookup tokens form, memory at 1M keys, fence of 1M L1 placements"
start_kvidxd
FRPORT=0
FRPID=0
if have redis-server; then
    FRPORT=$(free_port 8)
    $SRV redis-server --port "$FRPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
        --dir "$TMP" --logfile "$TMP/redis-fleet.log" >/dev/null 2>&1 &
    FRPID=$!
    PIDS="$PIDS $FRPID"
    wait_port "$FRPORT" || { FRPORT=0; FRPID=0; }
fi
$CLI timeout 900 "$B/bench_fleet" "$KPORT" "$KPID" "$FRPORT" "$FRPID" "$FLEET_SECS" | tee "$TMP/fleet.txt" ||
    { echo "bench_fleet failed or timed out"; FAILED="$FAILED fleet"; }
stop_pid "$KPID"
[ "$FRPID" != 0 ] && stop_pid "$FRPID"
f() { val "$1" "$TMP/fleet.txt"; }
row "fleet /events 1000 entries: entries/s" "$(f events_store1000_entries_per_s)" "entries/s (same keys re-stored)"
row "fleet /events server CPU per entry" "$(f events_store1000_server_cpu_per_entry)" "us (cJSON parse $(f events_store1000_parse_floor_per_entry) us)"
r=$(f events_store1000_vs_parse)
row "fleet /events / parse floor (target<=2)" "$r" "x $(meets_le "$r" 2)"
r=$(f events_store1000_vs_redis_mset)
row "fleet Redis MSET CPU / /events CPU (target>=1)" "$r" "x $(meets "$r" 1) (MSET $(f events_store1000_redis_mset_cpu_per_key) us/key)"
row "fleet /events +256 tokens: entries/s" "$(f events_store1000_tokens256_entries_per_s)" "entries/s ($(f events_store1000_tokens256_server_cpu_per_entry) us CPU/entry)"
r=$(f events_store1000_tokens256_vs_parse)
row "fleet /events +256 tokens / parse (target<=2)" "$r" "x $(meets_le "$r" 2)"
r=$(f events_store1000_tokens256_vs_redis_mset)
row "fleet +256 tokens: MSET CPU / CPU (target>=1)" "$r" "x $(meets "$r" 1)"
row "fleet /events new keys: entries/s" "$(f events_store1000_new_keys_entries_per_s)" "entries/s ($(f events_store1000_new_keys_server_cpu_per_entry) us CPU/entry)"
r=$(f lookup_tokens_vs_parse)
row "fleet lookup 32768 tokens ws8 / parse (<=3)" "$r" "x $(meets_le "$r" 3) ($(f lookup_tokens_server_cpu) us CPU)"
r=$(f resident_per_key_one_placement)
row "fleet RSS/key, 1 placement (target<=120)" "$r" "B $(meets_le "$r" 120) (allocated $(f directory_bytes_per_key_one_placement) B)"
r=$(f resident_per_extra_placement)
row "fleet RSS/extra placement (target<=24)" "$r" "B $(meets_le "$r" 24) (allocated $(f directory_bytes_per_extra_placement) B)"
r=$(f resident_per_token_id)
row "fleet RSS/token id (target<=4.2)" "$r" "B $(meets_le "$r" 4.2) (allocated $(f directory_bytes_per_token_id) B)"
row "fleet fence of 1M L1 placements" "$(f fence_1M_l1_request)" "ms request ($(f fence_1M_l1_probe_wait) ms loop pause seen by a probe)"

echo
echo "================================ summary ================================"
echo "machine: nproc=$NPROC, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), kernel $(uname -r)"
echo "pinning: $([ "$PIN" = 1 ] && echo 'servers CPU 0, clients CPU 1' || echo none); best of $REPS alternating rounds for GET and LIST"
printf '%-44s %16s  %s\n' "figure" "value" "unit"
cat "$SUMMARY"
if [ -n "$FAILED" ]; then
    echo "bench FAILED:$FAILED" >&2
    exit 1
fi

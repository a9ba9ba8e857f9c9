# Shared by scripts/bench-etcd-cost, scripts/bench-scale and
# scripts/bench-machine-ids (sourced, not run): free ports, one etcd member
# with its own metrics URL, Prometheus text scraped without curl, medians,
# CPU time of a process, and the cleanup of what the script started.
#
# The sourcing script sets `work` (a temp dir) before calling start_etcd,
# and keeps every process it starts in `pids` (killed on exit).

pids=()
bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${work:-}" ] && rm -rf "$work"
}

port=${BENCH_FIRST_PORT:-24000}
# take_port: sets $port to the next free port (no subshells: the counter must persist).
take_port() { port=$((port + 1)); while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.10g\n", m }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "n/a"; else printf "%.3f", a / b }'; }
# Reads one series of snowkeep-bench's Prometheus output (the first line
# starting with it).
series() { awk -v s="$1" 'index($0, s) == 1 { print $NF; exit }' "$2"; }

# scrape HOST:PORT PATH: prints the body of GET http://HOST:PORT/PATH, over
# bash's /dev/tcp (HTTP/1.0, so the server closes when done), in at most 10 s.
scrape() {
  local host=${1%:*} p=${1##*:}
  timeout 10 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: %s:%s\r\n\r\n" "$2" "$0" "$1" >&3
    tr -d "\r" <&3 | sed "1,/^\$/d"' "$host" "$p" "$2"
}
# metric NAME FILE: the sum of every series of NAME (exact name, any labels,
# or only those whose labels contain the string LABELS when given as $3).
metric() {
  awk -v n="$1" -v l="${3:-}" '
    index($0, n) == 1 {
      rest = substr($0, length(n) + 1)
      if (rest !~ /^[ {]/) next
      if (l != "" && index(rest, l) == 0) next
      s += $NF; found = 1
    }
    END { if (found) printf "%.6f\n", s; else print "nan" }' "$2"
}

# cpu_ticks PID: user + system clock ticks the process has used so far.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# machine_ticks: "busy total" clock ticks of all CPUs since boot.
machine_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat; }
clk_tck=$(getconf CLK_TCK)

# start_etcd NAME: one etcd member in $work/NAME with free client, peer and
# metrics ports; waits until it has a leader. Sets ETCD_PID, ETCD_CLIENT
# (http://127.0.0.1:PORT) and ETCD_METRICS (127.0.0.1:PORT, for scrape).
start_etcd() {
  local name=$1 client peer metrics deadline
  take_port; client=$port; take_port; peer=$port; take_port; metrics=$port
  etcd --name "$name" --data-dir "$work/$name" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$name=http://127.0.0.1:$peer" \
    --listen-metrics-urls "http://127.0.0.1:$metrics" --log-level warn 2>"$work/$name.log" &
  ETCD_PID=$!
  pids+=("$ETCD_PID")
  ETCD_CLIENT="http://127.0.0.1:$client"
  ETCD_METRICS="127.0.0.1:$metrics"
  deadline=$(( $(now_ms) + 30000 ))
  # awk reads the whole body (grep -q would end the pipe early: pipefail).
  until [ "$(scrape "$ETCD_METRICS" /metrics 2>/dev/null | awk '$1 == "etcd_server_has_leader" { print $2 }')" = 1 ]; do
    if [ "$(now_ms)" -gt "$deadline" ] || ! kill -0 "$ETCD_PID" 2>/dev/null; then
      echo "etcd $name did not get a leader within 30 s; its log:" >&2
      cat "$work/$name.log" >&2
      exit 1
    fi
    sleep 0.2
  done
}

# stop_pid PID: SIGTERM, then wait for it (a snowkeep server releases its
# machine ids on the way out).
stop_pid() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# build_note: the commit measured, marked when the tree has changes.
build_note() {
  local c
  c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then c="$c+changes"; fi
  echo "$c"
}

machine_note() {
  echo "$(nproc) cores · $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo) · load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
}

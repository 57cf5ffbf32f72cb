#!/bin/bash
# Publish throughput of an R1 and an R3 stream on one 3-node holdfast
# cluster (all on 127.0.0.1), measured alternately with `nats bench js pub`
# for each sync mode: `make bench-cluster`. Usage: r1-r3.sh HOLDFAST [ROUNDS] [MSGS]
set -euo pipefail
holdfast=$(realpath "$1"); rounds=${2:-3}; msgs=${3:-20000}
work=$(mktemp -d); trap 'pkill -f "holdfast run --config $work" || true; rm -rf "$work"' EXIT
nats() { go tool nats -s nats://127.0.0.1:14221 "$@"; }
for sync in always 2m; do
  pkill -f "holdfast run --config $work" || true; sleep 1; rm -rf "$work"/store*
  for i in 1 2 3; do
    routes=""; for j in 1 2 3; do [ "$j" != "$i" ] && routes+="\"nats-route://127.0.0.1:1622$j\", "; done
    cat > "$work/n$i.toml" <<CONF
[server]
name = "n$i"
port = 1422$i
[jetstream]
store_dir = "$work/store$i"
max_file_store = "4GiB"
sync = "$sync"
[cluster]
name = "bench"
listen = "127.0.0.1:1622$i"
routes = [${routes%, }]
[streams.R3]
subjects = ["r3.*"]
replicas = 3
max_msgs = -1
[streams.R1]
subjects = ["r1.*"]
replicas = 1
max_msgs = -1
[http]
listen = ""
CONF
    "$holdfast" run --config "$work/n$i.toml" > "$work/log$i" 2>&1 &
  done
  for i in 1 2 3; do
    for _ in $(seq 120); do grep -q "holdfast ready" "$work/log$i" && break; sleep 1; done
    grep -q "holdfast ready" "$work/log$i" || { echo "node $i did not start:"; tail -20 "$work/log$i"; exit 1; }
  done
  for round in $(seq "$rounds"); do
    for r in R1 R3; do
      subj=$(echo "$r" | tr A-Z a-z).bench
      a=$(nats bench js pub async "$subj" --stream "$r" --msgs "$msgs" --size 128 --no-progress --batch 500 2>&1 | grep -o 'stats: [0-9,]* msgs/sec' | head -1)
      s=$(nats bench js pub sync "$subj" --stream "$r" --msgs $((msgs / 10)) --size 128 --no-progress 2>&1 | grep -o 'stats: [0-9,]* msgs/sec' | head -1)
      echo "sync=$sync round=$round $r: async ${a#stats: }, sync ${s#stats: }"
    done
  done
done

#!/bin/sh
# Starts an example's holdfast processes in the background, waits until
# each is ready and prints its status (make demo-cluster, make demo-edge);
# `stop` stops them (make demo-stop). Logs go to data/NAME.log, the
# processes to data/demo.pids.
#
#   examples/demo.sh cluster|edge|stop
#
# HOLDFAST is the binary (default bin/holdfast); DEMO_DIR the directory with
# examples/ and data/ (default: the repository's root).
set -eu
cd "${DEMO_DIR:-$(dirname "$0")/..}"
bin=${HOLDFAST:-bin/holdfast}
pids=data/demo.pids

case ${1:-} in
cluster) configs="examples/cluster/node1.toml examples/cluster/node2.toml examples/cluster/node3.toml" ;;
edge) configs="examples/edge-hub/hub.toml examples/edge-hub/edge.toml" ;;
stop)
	[ -s "$pids" ] || { echo "no demo runs (no $pids)"; exit 0; }
	while read -r pid config; do
		kill "$pid" 2>/dev/null && echo "stopping $config (pid $pid)" || true
	done <"$pids"
	while read -r pid config; do
		while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
	done <"$pids"
	rm -f "$pids"
	echo "stopped; the stores stay in data/ (remove them to start anew)"
	exit 0
	;;
*) echo "usage: $0 cluster|edge|stop" >&2; exit 2 ;;
esac

if [ -s "$pids" ]; then
	echo "a demo runs already ($pids): make demo-stop first" >&2
	exit 2
fi
[ -x "$bin" ] || { echo "$bin is missing: make build" >&2; exit 2; }
mkdir -p data
for config in $configs; do
	log=data/$(basename "$config" .toml).log
	"$bin" run --config "$config" >"$log" 2>&1 &
	echo "$! $config" >>"$pids"
	echo "started $config (pid $!), log $log"
done
for config in $configs; do
	log=data/$(basename "$config" .toml).log
	waited=0
	until grep -q "holdfast ready" "$log"; do
		if [ "$waited" -ge 900 ]; then
			echo "$config is not ready after 3 minutes: see $log; make demo-stop" >&2
			exit 1
		fi
		sleep 0.2
		waited=$((waited + 1))
	done
done
for config in $configs; do
	echo
	echo "== $config"
	"$bin" status --config "$config" || true
done
echo
echo "logs: data/*.log; stop: make demo-stop"

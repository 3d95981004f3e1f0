#!/bin/sh
# The node rows' memory figure with a network namespace per sandbox, which tools/bench does not
# make (1,000 namespaces take minutes here). As root, from the repository root, after make build:
#   unshare -rnm sh tools/bench/node-netns.sh 100
# unshare gives it a network and mount namespace of its own: its namespaces, its tmpfs over
# /run/netns and egressd end with it.
# A node egressd; RSS empty, then with N sandboxes each in a network namespace of its
# own (listener 127.0.0.1:15002 inside it), then with N more on 127.78.x.y addresses
# in egressd's own namespace (no netns), for the same per-sandbox figure both ways.
set -e
N=${1:-100}
ip link set lo up
mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns
BIN=$(pwd)/bin/egressd; D=$(mktemp -d); trap 'rm -rf "$D"' EXIT; cd "$D"
cat > node.yaml <<YAML
version: 1
environment: env_node
admin: {address: "127.0.0.1:0"}
node: {api_socket: run/node.sock, max_sandboxes: 5000}
credentials: {backend: file, file: creds.json}
log: {level: warn}
state_dir: state
YAML
echo '{}' > creds.json; chmod 600 creds.json
"$BIN" run --config node.yaml > log 2> err &
while [ ! -S run/node.sock ]; do sleep 0.2; done; sleep 2
W=$(pgrep -P $! | head -1); [ -n "$W" ] || W=$!
rss() { awk '/VmRSS/{print $2}' /proc/$W/status; }
put() { curl -s -o /dev/null -w '%{http_code}' --unix-socket run/node.sock -X PUT "http://node/v1/sandboxes/$1" --data "$2"; }
E=$(rss); echo "empty node: ${E} KiB (worker pid $W)"
t0=$(date +%s.%N)
i=1; while [ $i -le $N ]; do
  ip netns add sbx-$i; ip -n sbx-$i link set lo up
  c=$(put sbx-$i "{\"netns\": \"/run/netns/sbx-$i\", \"listeners\": [{\"name\": \"sbx\", \"address\": \"127.0.0.1:15002\", \"mode\": \"proxy\"}], \"environment\": {\"network\": {\"allowlist\": [{\"domain\": \"example.com\"}]}}}")
  [ "$c" = 201 ] || { echo "PUT sbx-$i: $c"; cat err log | tail -3; exit 1; }
  i=$((i+1))
done
t1=$(date +%s.%N); sleep 2; A=$(rss)
echo "with $N netns sandboxes: ${A} KiB: $(( (A-E)/N )) KiB each (namespaces and PUTs took $(echo "$t1 - $t0" | bc) s)"
i=1; while [ $i -le $N ]; do
  c=$(put lo-$i "{\"listeners\": [{\"name\": \"sbx\", \"address\": \"127.78.$((i/250)).$((i%250+1)):0\", \"mode\": \"proxy\"}], \"environment\": {\"network\": {\"allowlist\": [{\"domain\": \"example.com\"}]}}}")
  [ "$c" = 201 ] || { echo "PUT lo-$i: $c"; exit 1; }
  i=$((i+1))
done
sleep 2; B=$(rss)
echo "plus $N loopback-address sandboxes: ${B} KiB: $(( (B-A)/N )) KiB each"
kill $!; wait 2>/dev/null || true

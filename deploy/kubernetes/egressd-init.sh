#!/bin/sh
# egressd-init: installs egressd's redirect rules in a pod's network namespace.
# The pod's init container runs it (like Istio's istio-init), with NET_ADMIN
# and NET_RAW, before egressd and the agent start.
#
# In a pod every container shares one network namespace, so the rules live
# in the OUTPUT chains, for traffic the pod's own processes send:
#
#   nat    OUTPUT -> EGRESSD_OUTPUT (inserted first in OUTPUT, so it comes
#          before a service mesh's chain whichever init container ran first)
#            egressd's own traffic (uid EGRESSD_UID), the mesh sidecar's
#              (EGRESSD_MESH_UID) and traffic to the pod's own addresses (out
#              through lo): untouched, so a mesh's rules further down OUTPUT
#              see egressd's upstream connections and send them through the mesh
#            TCP 80/443 (EGRESSD_REDIRECT_PORTS) -> REDIRECT to EGRESSD_TPROXY_PORT
#            UDP and TCP 53                     -> REDIRECT to EGRESSD_DNS_PORT
#   filter OUTPUT -> EGRESSD_OUTPUT
#            uid EGRESSD_UID: ACCEPT (egressd dials upstreams, Vault, DNS)
#            from egressd's own ports (admin, health, transparent, DNS, hooks
#              and EGRESSD_OTHER_PORTS), any other uid: DROP, but for TCP resets.
#              A process that binds one of them (before egressd starts, or
#              while it is down) gets its SYN-ACKs and answers dropped: no
#              connection to it completes, nothing it says reaches the
#              runtime, the agent or kubelet. Resets pass: those of the REJECT
#              rules below come from these ports too, and a reset carries no
#              answer.
#            loopback to EGRESSD_ADMIN_PORT: REJECT (the admin API is not the
#              sandbox's, nor the mesh sidecar's)
#            uid EGRESSD_MESH_UID (when set): ACCEPT (the mesh sidecar dials
#              what egressd sent it, its control plane, and probes the health port)
#            loopback to EGRESSD_HEALTH_PORT (when set): REJECT (probes and
#              Prometheus arrive from outside the pod and are unaffected)
#            loopback to EGRESSD_HOOKS_PORT (when set): ACCEPT for uid
#              EGRESSD_RUNTIME_UID only, REJECT for every other uid (traffic of
#              a hooks listener is hook traffic, which egressd signs: only the
#              agent runtime may send it, never the sandbox's tools)
#            loopback, and the traffic REDIRECTed to egressd (conntrack state
#              DNAT, to the transparent or DNS port): ACCEPT. Only that: a mesh's
#              REDIRECT (the agent's other ports to Envoy) is DNAT too, and is
#              refused here, so the mesh is no way around egressd
#            replies on connections made to the pod: ACCEPT
#            everything else: REJECT (TCP with a reset, so connect() fails at once)
#
# REDIRECT in OUTPUT rewrites the destination to 127.0.0.1 (IPv4) or ::1
# (IPv6), so egressd's transparent listeners are 127.0.0.1:14002 and
# [::1]:14002 and dns.listen is 127.0.0.1:14053. (In the gateway-namespace
# model of deploy/netns the redirect is a DNAT on another interface, and the
# listener must be on that interface's address instead.)
#
# The exclusion is by UID: egressd must run as EGRESSD_UID and the agent
# must not (nor as EGRESSD_MESH_UID), nor have NET_ADMIN (it could then undo
# these rules). The defaults keep clear of Istio's: uid 1337 and ports
# 15000-15090 are istio-proxy's (docs/kubernetes.md).
#
# Idempotent: the chains are flushed and refilled, the jumps added once.
#
# Environment (defaults in brackets):
#   EGRESSD_UID             egressd's UID, excluded from every rule [1555]
#   EGRESSD_TPROXY_PORT     transparent listener port [14002]
#   EGRESSD_DNS_PORT        DNS guard port [14053]
#   EGRESSD_ADMIN_PORT      admin port, closed to the sandbox [14000]
#   EGRESSD_HEALTH_PORT     the health port (admin.health_address), closed to
#                           every uid of the pod but egressd's and the mesh's;
#                           empty: none [""]
#   EGRESSD_MESH_UID        a service mesh sidecar's uid whose traffic is left to
#                           the mesh (Istio's istio-proxy: 1337); neither 0 nor
#                           EGRESSD_UID nor EGRESSD_RUNTIME_UID; empty: no mesh [""]
#   EGRESSD_HOOKS_PORT      the hooks listener's port, open to the runtime only;
#                           empty: no hooks listener [""]
#   EGRESSD_RUNTIME_UID     the agent runtime's UID, the only one (with egressd's)
#                           that may connect to EGRESSD_HOOKS_PORT; required
#                           with it, and neither 0 nor EGRESSD_UID [""]
#   EGRESSD_OTHER_PORTS     egressd's other listener ports (an explicit proxy
#                           listener), comma-separated: only egressd may answer
#                           from them, as from the ports above [""]
#   EGRESSD_REDIRECT_PORTS  TCP ports sent to egressd [80,443]
#   EGRESSD_IPV6            1: ip6tables too, failing if it fails; 0: skip;
#                           auto: ip6tables when the kernel has IPv6 [auto]
#   EGRESSD_IPTABLES        iptables or iptables-legacy, matching the node [iptables]
set -eu

EGRESSD_UID=${EGRESSD_UID:-1555}
TPROXY_PORT=${EGRESSD_TPROXY_PORT:-14002}
DNS_PORT=${EGRESSD_DNS_PORT:-14053}
ADMIN_PORT=${EGRESSD_ADMIN_PORT:-14000}
HEALTH_PORT=${EGRESSD_HEALTH_PORT:-}
MESH_UID=${EGRESSD_MESH_UID:-}
REDIRECT_PORTS=${EGRESSD_REDIRECT_PORTS:-80,443}
HOOKS_PORT=${EGRESSD_HOOKS_PORT:-}
RUNTIME_UID=${EGRESSD_RUNTIME_UID:-}
OTHER_PORTS=${EGRESSD_OTHER_PORTS:-}
IPV6=${EGRESSD_IPV6:-auto}
IPTABLES=${EGRESSD_IPTABLES:-iptables}
IP6TABLES=$(echo "$IPTABLES" | sed 's/^iptables/ip6tables/')
CHAIN=EGRESSD_OUTPUT

if [ -n "$HOOKS_PORT" ]; then
  case $RUNTIME_UID in
    ''|*[!0-9]*) echo "egressd-init: EGRESSD_HOOKS_PORT needs EGRESSD_RUNTIME_UID, the agent runtime's numeric uid" >&2; exit 1 ;;
  esac
  if [ "$RUNTIME_UID" = 0 ] || [ "$RUNTIME_UID" = "$EGRESSD_UID" ]; then
    echo "egressd-init: EGRESSD_RUNTIME_UID must be the runtime's own uid, not 0 or egressd's $EGRESSD_UID" >&2
    exit 1
  fi
fi

if [ -n "$MESH_UID" ]; then
  case $MESH_UID in
    *[!0-9]*) echo "egressd-init: EGRESSD_MESH_UID must be the mesh sidecar's numeric uid (Istio: 1337)" >&2; exit 1 ;;
  esac
  if [ "$MESH_UID" = 0 ] || [ "$MESH_UID" = "$EGRESSD_UID" ] || [ "$MESH_UID" = "$RUNTIME_UID" ]; then
    echo "egressd-init: EGRESSD_MESH_UID $MESH_UID must be the mesh sidecar's own uid, not 0, egressd's or the runtime's" >&2
    exit 1
  fi
fi

# OWN_PORTS: every TCP port egressd listens on; only its uid may send from them.
OWN_PORTS=$ADMIN_PORT,$TPROXY_PORT,$DNS_PORT
[ -z "$HEALTH_PORT" ] || OWN_PORTS=$OWN_PORTS,$HEALTH_PORT
[ -z "$HOOKS_PORT" ] || OWN_PORTS=$OWN_PORTS,$HOOKS_PORT
[ -z "$OTHER_PORTS" ] || OWN_PORTS=$OWN_PORTS,$OTHER_PORTS
case $OWN_PORTS in
  *[!0-9,]*|*,,*|*,) echo "egressd-init: EGRESSD_OTHER_PORTS: want ports separated by commas: $OTHER_PORTS" >&2; exit 1 ;;
esac

# ensure_chain TOOL TABLE: create CHAIN empty (or empty it) and jump to it
# first thing in OUTPUT.
ensure_chain() {
  if "$1" -w -t "$2" -S "$CHAIN" >/dev/null 2>&1; then
    "$1" -w -t "$2" -F "$CHAIN"
  else
    "$1" -w -t "$2" -N "$CHAIN"
  fi
  "$1" -w -t "$2" -C OUTPUT -j "$CHAIN" 2>/dev/null || "$1" -w -t "$2" -I OUTPUT 1 -j "$CHAIN"
}

# rules TOOL: one family's rules.
rules() {
  ipt=$1
  ensure_chain "$ipt" nat
  "$ipt" -w -t nat -A "$CHAIN" -m owner --uid-owner "$EGRESSD_UID" -j RETURN
  [ -z "$MESH_UID" ] || "$ipt" -w -t nat -A "$CHAIN" -m owner --uid-owner "$MESH_UID" -j RETURN
  "$ipt" -w -t nat -A "$CHAIN" -o lo -j RETURN
  "$ipt" -w -t nat -A "$CHAIN" -p tcp -m multiport --dports "$REDIRECT_PORTS" -j REDIRECT --to-ports "$TPROXY_PORT"
  "$ipt" -w -t nat -A "$CHAIN" -p udp --dport 53 -j REDIRECT --to-ports "$DNS_PORT"
  "$ipt" -w -t nat -A "$CHAIN" -p tcp --dport 53 -j REDIRECT --to-ports "$DNS_PORT"

  ensure_chain "$ipt" filter
  "$ipt" -w -A "$CHAIN" -m owner --uid-owner "$EGRESSD_UID" -j ACCEPT
  # No squatter: what leaves egressd's ports and is not egressd's is dropped.
  "$ipt" -w -A "$CHAIN" -p tcp -m multiport --sports "$OWN_PORTS" ! --tcp-flags RST RST -j DROP
  "$ipt" -w -A "$CHAIN" -p udp --sport "$DNS_PORT" -j DROP
  "$ipt" -w -A "$CHAIN" -o lo -p tcp --dport "$ADMIN_PORT" -j REJECT --reject-with tcp-reset
  [ -z "$MESH_UID" ] || "$ipt" -w -A "$CHAIN" -m owner --uid-owner "$MESH_UID" -j ACCEPT
  [ -z "$HEALTH_PORT" ] || "$ipt" -w -A "$CHAIN" -o lo -p tcp --dport "$HEALTH_PORT" -j REJECT --reject-with tcp-reset
  if [ -n "$HOOKS_PORT" ]; then
    "$ipt" -w -A "$CHAIN" -o lo -p tcp --dport "$HOOKS_PORT" -m owner --uid-owner "$RUNTIME_UID" -j ACCEPT
    "$ipt" -w -A "$CHAIN" -o lo -p tcp --dport "$HOOKS_PORT" -j REJECT --reject-with tcp-reset
  fi
  "$ipt" -w -A "$CHAIN" -o lo -j ACCEPT
  # The REDIRECTed traffic. Matching it by -o lo does not work: the filter
  # chain still sees the interface the packet was routed to before the nat
  # chain rewrote its destination; the port it sees is the rewritten one. A
  # mesh's REDIRECT is DNAT too, so the port decides: egressd's, or refused.
  "$ipt" -w -A "$CHAIN" -p tcp --dport "$TPROXY_PORT" -m conntrack --ctstate DNAT -j ACCEPT
  "$ipt" -w -A "$CHAIN" -p tcp --dport "$DNS_PORT" -m conntrack --ctstate DNAT -j ACCEPT
  "$ipt" -w -A "$CHAIN" -p udp --dport "$DNS_PORT" -m conntrack --ctstate DNAT -j ACCEPT
  "$ipt" -w -A "$CHAIN" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
  "$ipt" -w -A "$CHAIN" -p tcp -j REJECT --reject-with tcp-reset
  "$ipt" -w -A "$CHAIN" -j REJECT
}

rules "$IPTABLES"
case $IPV6 in
  1) rules "$IP6TABLES" ;;
  0) echo "egressd-init: EGRESSD_IPV6=0: no IPv6 rules" >&2 ;;
  auto)
    if [ -e /proc/net/if_inet6 ]; then
      rules "$IP6TABLES"
    else
      echo "egressd-init: the kernel has no IPv6; no IPv6 rules" >&2
    fi
    ;;
  *) echo "egressd-init: EGRESSD_IPV6 must be 0, 1 or auto" >&2; exit 1 ;;
esac
hooks=""
[ -z "$HOOKS_PORT" ] || hooks="; hooks :$HOOKS_PORT for uid $RUNTIME_UID only"
[ -z "$MESH_UID" ] || hooks="$hooks; mesh uid $MESH_UID left to the mesh"
echo "egressd-init: TCP $REDIRECT_PORTS -> :$TPROXY_PORT, DNS -> :$DNS_PORT; uid $EGRESSD_UID excluded$hooks; only uid $EGRESSD_UID answers from TCP $OWN_PORTS and UDP $DNS_PORT"

#!/usr/bin/env bash
# cluster.sh — a 3-node RabbitMQ cluster, a Redis primary with two
# replicas watched by three Sentinels, and a Redis Cluster of three
# primaries and three replicas (6501-6506), all on loopback, on ports of their own
# (never the shared single servers of scripts/services.sh, which this script
# never stops), with their data under .data/cluster/.
#
#   scripts/cluster.sh up              install what is missing, start what is down, join, wait for health
#   scripts/cluster.sh env             print export lines for a shell (IDEMQ_AMQP_URLS, IDEMQ_REDIS_SENTINELS, ...)
#   scripts/cluster.sh status          say what is listening, the cluster's members and the Redis primary
#   scripts/cluster.sh down            stop the cluster's servers (only those: by node name, port and pid file)
#   scripts/cluster.sh down-now        the same with kill -9 (a test's throwaway cluster)
#   scripts/cluster.sh up-rabbit|up-redis|up-redis-cluster   start one part only (no installing)
#
# Faults (make cluster-chaos, the cluster tests):
#   scripts/cluster.sh kill N          kill -9 RabbitMQ node N (1..3)
#   scripts/cluster.sh stop N          stop node N gracefully (rabbitmqctl stop)
#   scripts/cluster.sh start N         start node N and wait until it runs in the cluster
#   scripts/cluster.sh leader QUEUE    print the index of the node leading quorum queue QUEUE
#   scripts/cluster.sh kill-leader QUEUE [SECS]   kill -9 the leader of QUEUE, restart it after SECS (default 2)
#   scripts/cluster.sh outage N SECS   stop node N for SECS, then start it
#   scripts/cluster.sh rolling         restart the nodes one at a time, each once no quorum queue depends on it
#   scripts/cluster.sh redis-failover  kill -9 the Redis primary, wait for Sentinel to promote a replica,
#                                      restart the old primary (it comes back as a replica)
#   scripts/cluster.sh redis-cluster-kill [KEY]   kill -9 the Redis Cluster primary serving KEY, wait for
#                                      its replica to take over, restart it (it comes back as a replica)
#   scripts/cluster.sh wait-quorum     wait until every node runs and no quorum queue is short of members
#
# Everything can be moved (the cluster tests run a private cluster of their
# own with it): IDEMQ_CLUSTER_DIR (data), IDEMQ_CLUSTER_NAME (node name
# prefix), IDEMQ_CLUSTER_AMQP_PORTS, IDEMQ_CLUSTER_DIST_PORTS,
# IDEMQ_CLUSTER_MGMT_PORTS, IDEMQ_CLUSTER_REDIS_PORTS (primary first),
# IDEMQ_CLUSTER_SENTINEL_PORTS: space-separated lists of three ports.
# IDEMQ_CLUSTER_LOG_LEVEL sets the nodes' log level (default info).
# IDEMQ_CLUSTER_MGMT=1 enables the management plugin (off by default: its
# statistics cost CPU the 2-core machines do not have to spare).
set -euo pipefail

# shellcheck source=services.sh
source "$(dirname "${BASH_SOURCE[0]}")/services.sh"
log() { printf 'cluster: %s\n' "$*" >&2; }
die() { printf 'cluster: ERROR: %s\n' "$*" >&2; exit 1; }

CDIR="${IDEMQ_CLUSTER_DIR:-$DATA/cluster}"
CNAME="${IDEMQ_CLUSTER_NAME:-idemqc}"
read -r -a AMQP_PORTS <<<"${IDEMQ_CLUSTER_AMQP_PORTS:-5701 5702 5703}"
read -r -a DIST_PORTS <<<"${IDEMQ_CLUSTER_DIST_PORTS:-25701 25702 25703}"
read -r -a MGMT_PORTS <<<"${IDEMQ_CLUSTER_MGMT_PORTS:-15701 15702 15703}"
read -r -a REDIS_PORTS <<<"${IDEMQ_CLUSTER_REDIS_PORTS:-6401 6402 6403}"
read -r -a SENT_PORTS <<<"${IDEMQ_CLUSTER_SENTINEL_PORTS:-26401 26402 26403}"
read -r -a RC_PORTS <<<"${IDEMQ_CLUSTER_REDIS_CLUSTER_PORTS:-6501 6502 6503 6504 6505 6506}"
MASTER="${IDEMQ_CLUSTER_REDIS_MASTER:-idemq}"
SHARED_PORTS=" $AMQP_PORT $REDIS_PORT $PG_PORT $MYSQL_PORT $RABBIT_DIST_PORT 15672 "

for p in "${AMQP_PORTS[@]}" "${DIST_PORTS[@]}" "${MGMT_PORTS[@]}" "${REDIS_PORTS[@]}" "${SENT_PORTS[@]}" "${RC_PORTS[@]}"; do
	[[ "$SHARED_PORTS" != *" $p "* ]] || die "port $p belongs to the shared servers; pick another"
done

node() { printf '%s%d@localhost' "$CNAME" "$1"; }
ndir() { printf '%s/rabbit%d' "$CDIR" "$1"; }
ctl() {
	local i=$1
	shift
	rabbitmqctl -q -n "$(node "$i")" "$@"
}

# A node "runs" when its Erlang node answers and its AMQP port accepts.
node_up() { ctl "$1" status >/dev/null 2>&1 && listening "${AMQP_PORTS[$(($1 - 1))]}"; }

node_pid() {
	local f
	f="$(ndir "$1")/pid"
	[ -s "$f" ] && cat "$f"
}

start_node() {
	local i=$1 dir
	if node_up "$i"; then
		log "RabbitMQ node $(node "$i") already runs; reusing it"
		return
	fi
	listening "${AMQP_PORTS[$((i - 1))]}" && die "port ${AMQP_PORTS[$((i - 1))]} is taken by something that is not $(node "$i")"
	dir="$(ndir "$i")"
	mkdir -p "$dir/mnesia" "$dir/log"
	local plugins="[]."
	if [ "${IDEMQ_CLUSTER_MGMT:-0}" = 1 ]; then plugins="[rabbitmq_management]."; fi
	printf '%s\n' "$plugins" >"$dir/enabled_plugins"
	cat >"$dir/rabbitmq.conf" <<-EOF
		listeners.tcp.1 = 127.0.0.1:${AMQP_PORTS[$((i - 1))]}
		management.tcp.ip = 127.0.0.1
		management.tcp.port = ${MGMT_PORTS[$((i - 1))]}
		# A node that lost its peers pauses instead of serving a minority.
		cluster_partition_handling = pause_minority
		# Quorum queues: small Raft segments and WAL, this is a laptop-sized cluster.
		raft.wal_max_size_bytes = 16777216
		# IDEMQ_CLUSTER_LOG_LEVEL=debug for a post-mortem (dead-letter workers, elections).
		log.file.level = ${IDEMQ_CLUSTER_LOG_LEVEL:-info}
	EOF
	chown -R rabbitmq: "$dir"
	rm -f "$dir/pid"
	[ -f "$dir/log/console.log" ] && mv -f "$dir/log/console.log" "$dir/log/console.log.1"
	log "starting RabbitMQ node $(node "$i") (AMQP ${AMQP_PORTS[$((i - 1))]}, data in $dir)"
	# +sbwt none: the schedulers do not spin while idle (three nodes on two cores).
	env RABBITMQ_NODENAME="$(node "$i")" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT="${AMQP_PORTS[$((i - 1))]}" RABBITMQ_DIST_PORT="${DIST_PORTS[$((i - 1))]}" \
		RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
		RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
		RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none" \
		setsid nohup rabbitmq-server >"$dir/log/console.log" 2>&1 </dev/null &
}

# node_up_or_failed I — node I runs, or its boot failed (then the wait ends
# at once: the failure is in console.log).
node_up_or_failed() {
	node_up "$1" || grep -q 'init terminating in do_boot' "$(ndir "$1")/log/console.log" 2>/dev/null
}

wait_node() {
	local i=$1
	if ! wait_for "${2:-180}" "RabbitMQ node $(node "$i")" node_up_or_failed "$i" || ! node_up "$i"; then
		tail -n 40 "$(ndir "$i")/log/console.log" >&2 || true
		die "RabbitMQ node $(node "$i") did not become healthy"
	fi
}

# in_cluster I — node I counts node 1 among its running peers.
in_cluster() {
	ctl "$1" cluster_status --formatter json 2>/dev/null | tr -d ' \n' |
		grep -o '"running_nodes":\[[^]]*\]' | grep -q "\"$(node 1)\""
}

join_node() {
	local i=$1
	if in_cluster "$i"; then
		return
	fi
	log "joining $(node "$i") to $(node 1)"
	ctl "$i" stop_app >/dev/null 2>&1
	ctl "$i" reset >/dev/null 2>&1
	ctl "$i" join_cluster "$(node 1)" >"$(ndir "$i")/log/join.log" 2>&1 || die "join_cluster $(node "$i") -> $(node 1) failed"
	ctl "$i" start_app >/dev/null 2>&1
	wait_for 60 "$(node "$i") in the cluster" in_cluster "$i" || die "$(node "$i") did not join"
}

up_rabbit_cluster() {
	local i
	for i in 1 2 3; do start_node "$i"; done
	for i in 1 2 3; do wait_node "$i"; done
	for i in 2 3; do join_node "$i"; done
}

# ---- Redis: a primary, two replicas, three Sentinels ----

rdir() { printf '%s/redis' "$CDIR"; }

redis_conf() {
	local i=$1 port=${REDIS_PORTS[$(($1 - 1))]} dir
	dir="$(rdir)"
	[ -s "$dir/redis$i.conf" ] && return
	cat >"$dir/redis$i.conf" <<-EOF
		port $port
		bind 127.0.0.1
		daemonize yes
		dir $dir
		dbfilename dump$i.rdb
		appendfilename appendonly$i.aof
		appenddirname appendonly$i
		pidfile $dir/redis$i.pid
		logfile $dir/redis$i.log
		save ""
		# A primary killed and restarted before Sentinel notices must not come
		# back empty (its replicas would copy the empty data set): keep an AOF.
		appendonly yes
		appendfsync everysec
		replica-announce-ip 127.0.0.1
	EOF
	if ((i > 1)); then
		echo "replicaof 127.0.0.1 ${REDIS_PORTS[0]}" >>"$dir/redis$i.conf"
	fi
}

sentinel_conf() {
	local i=$1 port=${SENT_PORTS[$(($1 - 1))]} dir
	dir="$(rdir)"
	[ -s "$dir/sentinel$i.conf" ] && return
	cat >"$dir/sentinel$i.conf" <<-EOF
		port $port
		bind 127.0.0.1
		daemonize yes
		dir $dir
		pidfile $dir/sentinel$i.pid
		logfile $dir/sentinel$i.log
		sentinel announce-ip 127.0.0.1
		sentinel monitor $MASTER 127.0.0.1 ${REDIS_PORTS[0]} 2
		sentinel down-after-milliseconds $MASTER 2000
		sentinel failover-timeout $MASTER 10000
		sentinel parallel-syncs $MASTER 1
	EOF
}

redis_ping() { redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; }

start_redis() {
	local i=$1 port=${REDIS_PORTS[$(($1 - 1))]}
	if redis_ping "$port"; then return; fi
	redis_conf "$i"
	chown -R redis: "$(rdir)"
	runuser -u redis -- redis-server "$(rdir)/redis$i.conf"
	wait_for 30 "Redis $port" redis_ping "$port" || die "Redis on $port did not start"
}

start_sentinel() {
	local i=$1 port=${SENT_PORTS[$(($1 - 1))]}
	if redis_ping "$port"; then return; fi
	sentinel_conf "$i"
	chown -R redis: "$(rdir)"
	runuser -u redis -- redis-server "$(rdir)/sentinel$i.conf" --sentinel
	wait_for 30 "Sentinel $port" redis_ping "$port" || die "Sentinel on $port did not start"
}

# primary_port — the port of the primary, as the Sentinels see it.
primary_port() {
	local p
	for p in "${SENT_PORTS[@]}"; do
		redis-cli -p "$p" sentinel get-master-addr-by-name "$MASTER" 2>/dev/null | sed -n 2p | grep . && return 0
	done
	return 1
}

# replication_ok — the primary (per Sentinel) is a primary with two replicas online.
replication_ok() {
	local pp
	pp="$(primary_port)" || return 1
	redis-cli -p "$pp" info replication | tr -d '\r' | grep -q '^role:master' &&
		[ "$(redis-cli -p "$pp" info replication | tr -d '\r' | grep -c '^slave[0-9]*:.*state=online')" -ge 2 ]
}

# sentinels_ok — every Sentinel knows the two others.
sentinels_ok() {
	local p
	for p in "${SENT_PORTS[@]}"; do
		[ "$(redis-cli -p "$p" sentinel master "$MASTER" 2>/dev/null | tr -d '\r' | sed -n '/^num-other-sentinels$/{n;p}')" = 2 ] || return 1
	done
}

up_redis_sentinel() {
	mkdir -p "$(rdir)"
	local i
	for i in 1 2 3; do start_redis "$i"; done
	for i in 1 2 3; do start_sentinel "$i"; done
	wait_for 60 "Redis replication" replication_ok || die "Redis replicas did not sync"
	wait_for 60 "Sentinels" sentinels_ok || die "the Sentinels did not find each other"
}

# ---- Redis Cluster: three primaries, three replicas ----

rcdir() { printf '%s/redis-cluster' "$CDIR"; }

start_rc_node() {
	local port=$1 dir
	dir="$(rcdir)/$port"
	if redis_ping "$port"; then return; fi
	mkdir -p "$dir"
	chown -R redis: "$(rcdir)"
	# The bus port is the port + 10000 (kept below 65536 by the defaults).
	runuser -u redis -- redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" \
		--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
		--appendonly yes --appendfsync everysec --save "" --daemonize yes \
		--pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --repl-diskless-sync-delay 0
	wait_for 30 "Redis Cluster node $port" redis_ping "$port" || die "Redis Cluster node $port did not start"
}

# rc_ok — the cluster serves all 16384 slots and every replica is in sync.
rc_ok() {
	local p
	redis-cli -p "${RC_PORTS[0]}" cluster info 2>/dev/null | tr -d '\r' | grep -q '^cluster_state:ok' || return 1
	redis-cli -p "${RC_PORTS[0]}" cluster info | tr -d '\r' | grep -q '^cluster_slots_ok:16384' || return 1
	for p in "${RC_PORTS[@]}"; do
		redis_ping "$p" || continue
		if redis-cli -p "$p" info replication | tr -d '\r' | grep -q '^role:slave'; then
			redis-cli -p "$p" info replication | tr -d '\r' | grep -q '^master_link_status:up' || return 1
		fi
	done
}

up_redis_cluster() {
	local p addrs=()
	for p in "${RC_PORTS[@]}"; do
		start_rc_node "$p"
		addrs+=("127.0.0.1:$p")
	done
	if ! redis-cli -p "${RC_PORTS[0]}" cluster info | tr -d '\r' | grep -q '^cluster_known_nodes:6'; then
		redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >/dev/null || die "redis-cli --cluster create failed"
	fi
	wait_for 60 "the Redis Cluster" rc_ok || die "the Redis Cluster is not ok"
}

# rc_primary_of KEY [PORT] — the port of the primary serving KEY's slot,
# as the node on PORT (default the first) sees it.
rc_primary_of() {
	local q=${2:-${RC_PORTS[0]}} slot
	slot="$(redis-cli -p "$q" cluster keyslot "$1" 2>/dev/null | tr -d '\r')" || return 1
	[ -n "$slot" ] || return 1
	redis-cli -p "$q" cluster nodes | tr -d '\r' | awk -v s="$slot" '
		$3 ~ /master/ && $3 !~ /fail/ { for (i = 9; i <= NF; i++) { n = split($i, r, "-"); if (n == 1) r[2] = r[1]; if (s + 0 >= r[1] + 0 && s + 0 <= r[2] + 0) { split($2, a, "@"); n = split(a[1], b, ":"); print b[n]; exit } } }'
}

# redis_cluster_kill [KEY] — kill -9 the primary serving KEY (default
# "idemq"), wait until another node serves its slot and the cluster is ok,
# restart it (it comes back as a replica).
redis_cluster_kill() {
	local key=${1:-idemq} port pid
	port="$(rc_primary_of "$key")" || die "no primary found"
	[ -n "$port" ] || die "no primary serves $key"
	pid="$(cat "$(rcdir)/$port/redis.pid")"
	kill -9 "$pid"
	log "killed the Redis Cluster primary on $port"
	wait_for 60 "a replica to take over from $port" rc_took_over "$key" "$port" || die "no replica took over from $port"
	start_rc_node "$port"
	wait_for 60 "the Redis Cluster" rc_ok || die "the Redis Cluster did not come back whole"
	echo "$port"
}

# rc_took_over KEY PORT — a node other than PORT serves KEY's slot, as
# another node sees it, and that node's cluster is ok.
rc_took_over() {
	local p now
	for p in "${RC_PORTS[@]}"; do
		[ "$p" = "$2" ] && continue
		redis_ping "$p" || continue
		now="$(rc_primary_of "$1" "$p")" || return 1
		[ -n "$now" ] && [ "$now" != "$2" ] || return 1
		redis-cli -p "$p" cluster info | tr -d '\r' | grep -q '^cluster_state:ok'
		return
	done
	return 1
}

redis_index() {
	local port=$1 i
	for i in 1 2 3; do
		[ "${REDIS_PORTS[$((i - 1))]}" = "$port" ] && echo "$i" && return
	done
	return 1
}

redis_failover() {
	local old idx pid
	old="$(primary_port)" || die "no Sentinel knows the primary"
	idx="$(redis_index "$old")"
	pid="$(cat "$(rdir)/redis$idx.pid")"
	log "kill -9 Redis primary on $old (pid $pid)"
	kill -9 "$pid"
	local deadline=$((SECONDS + 60)) now
	while :; do
		now="$(primary_port || true)"
		if [ -n "$now" ] && [ "$now" != "$old" ] && redis_ping "$now" &&
			redis-cli -p "$now" info replication | tr -d '\r' | grep -q '^role:master'; then
			break
		fi
		((SECONDS < deadline)) || die "Sentinel did not promote a replica within 60s"
		sleep 0.2
	done
	log "Sentinel promoted $now"
	start_redis "$idx"
	wait_for 60 "Redis replication after the failover" replication_ok || die "Redis did not resync after the failover"
}

# ---- queues and faults ----

node_index() {
	local name=$1 i
	for i in 1 2 3; do
		[ "$(node "$i")" = "$name" ] && echo "$i" && return
	done
	return 1
}

# leader QUEUE — index of the node leading a quorum queue (asks every node
# that runs until one answers).
leader() {
	local q=$1 i name
	for i in 1 2 3; do
		name="$(ctl "$i" list_queues name leader --no-table-headers 2>/dev/null | awk -v q="$q" '$1 == q {print $2}')" || continue
		[ -n "$name" ] || continue
		node_index "$name" && return
	done
	return 1
}

kill_node() {
	local i=$1 pid
	pid="$(node_pid "$i")" || die "no pid file for $(node "$i")"
	log "kill -9 $(node "$i") (pid $pid)"
	kill -9 "$pid" 2>/dev/null || true
	local deadline=$((SECONDS + 30))
	while kill -0 "$pid" 2>/dev/null; do
		((SECONDS < deadline)) || die "$(node "$i") survived kill -9"
		sleep 0.1
	done
}

stop_node() {
	log "stopping $(node "$1")"
	ctl "$1" stop >/dev/null 2>&1 || true
}

# quorum_ok — every node runs and counts the two others as running.
quorum_ok() {
	local i
	for i in 1 2 3; do
		node_up "$i" || return 1
		[ "$(ctl "$i" cluster_status --formatter json 2>/dev/null | tr -d ' \n' |
			grep -o '"running_nodes":\[[^]]*\]' | grep -o '@localhost' | wc -l)" = 3 ] || return 1
	done
}

wait_quorum() { wait_for "${1:-180}" "all three nodes running" quorum_ok || die "the cluster did not come back whole"; }

# not_critical I — stopping node I would leave every quorum queue a majority.
not_critical() { rabbitmq-queues -q -n "$(node "$1")" check_if_node_is_quorum_critical >/dev/null 2>&1; }

restart_node() {
	start_node "$1"
	wait_node "$1"
	wait_quorum
}

rolling() {
	local i
	for i in 1 2 3; do
		wait_for 120 "$(node "$i") not quorum-critical" not_critical "$i" || die "$(node "$i") stays quorum-critical"
		stop_node "$i"
		restart_node "$i"
	done
}

print_cluster_env() {
	local urls="" sents="" i
	for i in 0 1 2; do
		urls+="${urls:+,}amqp://guest:guest@127.0.0.1:${AMQP_PORTS[$i]}/"
		sents+="${sents:+,}127.0.0.1:${SENT_PORTS[$i]}"
	done
	cat <<-EOF
		export IDEMQ_AMQP_URLS='$urls'
		export IDEMQ_CLUSTER_NODES='$(node 1),$(node 2),$(node 3)'
		export IDEMQ_REDIS_SENTINELS='$sents'
		export IDEMQ_REDIS_MASTER='$MASTER'
		export IDEMQ_REDIS_CLUSTER='$(printf '127.0.0.1:%s,' "${RC_PORTS[@]}" | sed 's/,$//')'
	EOF
}

cluster_status() {
	local i
	for i in 1 2 3; do
		if node_up "$i"; then echo "rabbitmq $(node "$i"): running on 127.0.0.1:${AMQP_PORTS[$((i - 1))]}"; else echo "rabbitmq $(node "$i"): down"; fi
	done
	for i in 1 2 3; do
		if redis_ping "${REDIS_PORTS[$((i - 1))]}"; then
			echo "redis 127.0.0.1:${REDIS_PORTS[$((i - 1))]}: $(redis-cli -p "${REDIS_PORTS[$((i - 1))]}" info replication | tr -d '\r' | grep '^role:')"
		else echo "redis 127.0.0.1:${REDIS_PORTS[$((i - 1))]}: down"; fi
	done
	for i in 1 2 3; do
		if redis_ping "${SENT_PORTS[$((i - 1))]}"; then echo "sentinel 127.0.0.1:${SENT_PORTS[$((i - 1))]}: up"; else echo "sentinel 127.0.0.1:${SENT_PORTS[$((i - 1))]}: down"; fi
	done
	echo "redis primary (per Sentinel): $(primary_port || echo unknown)"
	for i in "${RC_PORTS[@]}"; do
		if redis_ping "$i"; then
			echo "redis cluster 127.0.0.1:$i: $(redis-cli -p "$i" info replication | tr -d '\r' | grep '^role:')"
		else echo "redis cluster 127.0.0.1:$i: down"; fi
	done
}

# cluster_down [now] — stop the nodes (gracefully, or with kill -9 when
# "now": the tests throw the data away), the Redis servers and Sentinels.
cluster_down() {
	local i f pid
	for i in 1 2 3; do
		[ "${1:-}" = now ] || ctl "$i" stop >/dev/null 2>&1 || true
		pid="$(node_pid "$i" || true)"
		if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
	done
	for f in "$(rdir)"/sentinel?.pid "$(rdir)"/redis?.pid "$(rcdir)"/*/redis.pid; do
		[ -s "$f" ] || continue
		pid="$(cat "$f")"
		kill -9 "$pid" 2>/dev/null || true
		rm -f "$f"
	done
	log "stopped"
}

idx_arg() {
	case "${1:-}" in
	1 | 2 | 3) echo "$1" ;;
	*) die "want a node index 1..3, got '${1:-}'" ;;
	esac
}

case "${1:-up}" in
up)
	mkdir -p "$CDIR"
	need rabbitmq-server rabbitmq-server
	need redis-server redis-server
	if ((${#need_pkgs[@]})); then install_missing; fi
	up_rabbit_cluster
	up_redis_sentinel
	up_redis_cluster
	log "up: 3 RabbitMQ nodes (${AMQP_PORTS[*]}), Redis ${REDIS_PORTS[*]}, Sentinels ${SENT_PORTS[*]}, Redis Cluster ${RC_PORTS[*]}"
	;;
up-redis-cluster)
	mkdir -p "$CDIR"
	up_redis_cluster
	;;
up-rabbit)
	mkdir -p "$CDIR"
	up_rabbit_cluster
	;;
up-redis)
	mkdir -p "$CDIR"
	up_redis_sentinel
	;;
env) print_cluster_env ;;
status) cluster_status ;;
down) cluster_down ;;
down-now) cluster_down now ;;
kill) kill_node "$(idx_arg "${2:-}")" ;;
stop) stop_node "$(idx_arg "${2:-}")" ;;
start) restart_node "$(idx_arg "${2:-}")" ;;
leader) leader "${2:?queue}" || die "no node leads ${2}" ;;
kill-leader)
	i="$(leader "${2:?queue}")" || die "no node leads $2"
	kill_node "$i"
	sleep "${3:-2}"
	restart_node "$i"
	echo "$i"
	;;
outage)
	i="$(idx_arg "${2:-}")"
	stop_node "$i"
	sleep "${3:?seconds}"
	restart_node "$i"
	;;
rolling) rolling ;;
redis-failover) redis_failover ;;
redis-cluster-kill) redis_cluster_kill "${2:-}" ;;
redis-primary) primary_port ;;
wait-quorum) wait_quorum "${2:-180}" ;;
*) die "usage: $0 up|env|status|down|kill N|stop N|start N|leader Q|kill-leader Q [S]|outage N S|rolling|redis-failover|wait-quorum" ;;
esac

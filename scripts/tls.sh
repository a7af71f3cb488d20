#!/usr/bin/env bash
# tls.sh — a RabbitMQ node, a Redis server and a PostgreSQL cluster with TLS
# listeners, as production runs them, on loopback ports of their own (never
# the shared plain servers of scripts/services.sh, which this script never
# touches), with a throwaway CA and certificates generated here (openssl) and
# everything under .data/tls/.
#
#   scripts/tls.sh up        generate the certificates if missing, start what is down, wait for health
#   scripts/tls.sh certs     only generate the certificates
#   scripts/tls.sh env       print export lines (IDEMQ_AMQP_URL=amqps://..., IDEMQ_REDIS_URL=rediss://...,
#                            IDEMQ_POSTGRES_URL=...sslmode=verify-full, IDEMQ_AMQP_CA, IDEMQ_REDIS_CA)
#   scripts/tls.sh status    say what is listening
#   scripts/tls.sh down      stop these servers (only these: by node name, pid file and data folder)
#   scripts/tls.sh down-now  the same with kill -9 (a test's throwaway servers)
#
# The certificates (in $IDEMQ_TLS_DIR/certs):
#   ca.pem           the throwaway CA that signed server.pem
#   server.pem/.key  the servers' certificate, for DNS:localhost and IP:127.0.0.1
#   wrong-ca.pem     another CA, that signed nothing here (a client given it must refuse the servers)
#
# RabbitMQ and Redis listen with TLS only (no plain-text port). PostgreSQL
# has ssl=on and, as initdb leaves it, also accepts plain text: a client that
# fell back to plain text would get in, so sslmode=verify-full refusing a
# wrong CA shows there is no fallback.
#
# Everything can be moved (the TLS fault test runs its own): IDEMQ_TLS_DIR
# (data and certificates), IDEMQ_TLS_NAME (the RabbitMQ node name prefix),
# IDEMQ_TLS_AMQP_PORT (5771), IDEMQ_TLS_DIST_PORT (25771),
# IDEMQ_TLS_REDIS_PORT (6471), IDEMQ_TLS_PG_PORT (5471).
set -euo pipefail

# shellcheck source=services.sh
source "$(dirname "${BASH_SOURCE[0]}")/services.sh"
log() { printf 'tls: %s\n' "$*" >&2; }
die() { printf 'tls: ERROR: %s\n' "$*" >&2; exit 1; }

TDIR="${IDEMQ_TLS_DIR:-$DATA/tls}"
TNAME="${IDEMQ_TLS_NAME:-idemqtls}"
T_AMQP="${IDEMQ_TLS_AMQP_PORT:-5771}"
T_DIST="${IDEMQ_TLS_DIST_PORT:-25771}"
T_REDIS="${IDEMQ_TLS_REDIS_PORT:-6471}"
T_PG="${IDEMQ_TLS_PG_PORT:-5471}"
CERTS="$TDIR/certs"
NODE="$TNAME@localhost"
SHARED_PORTS=" $AMQP_PORT $REDIS_PORT $PG_PORT $MYSQL_PORT $RABBIT_DIST_PORT 15672 "

for p in "$T_AMQP" "$T_DIST" "$T_REDIS" "$T_PG"; do
	[[ "$SHARED_PORTS" != *" $p "* ]] || die "port $p belongs to the shared servers; pick another"
done
[ "$(id -u)" = 0 ] || die "run as root (the servers run as their own users: rabbitmq, redis, postgres)"

# ---- certificates ----

gen_certs() {
	if [ -s "$CERTS/ca.pem" ] && [ -s "$CERTS/server.pem" ] && [ -s "$CERTS/wrong-ca.pem" ]; then
		return
	fi
	command -v openssl >/dev/null || die "openssl not found"
	mkdir -p "$CERTS"
	chmod 755 "$TDIR" "$CERTS"
	log "generating a throwaway CA and a server certificate (localhost, 127.0.0.1) in $CERTS"
	local ca_ext=(-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign")
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
		-subj "/CN=idemq throwaway CA" "${ca_ext[@]}" -keyout "$CERTS/ca.key" -out "$CERTS/ca.pem" 2>/dev/null
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
		-subj "/CN=idemq wrong CA" "${ca_ext[@]}" -keyout "$CERTS/wrong-ca.key" -out "$CERTS/wrong-ca.pem" 2>/dev/null
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-subj "/CN=localhost" -keyout "$CERTS/server.key" -out "$CERTS/server.csr" 2>/dev/null
	printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
		"extendedKeyUsage=serverAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1" >"$CERTS/server.ext"
	openssl x509 -req -in "$CERTS/server.csr" -CA "$CERTS/ca.pem" -CAkey "$CERTS/ca.key" -CAcreateserial \
		-days 30 -extfile "$CERTS/server.ext" -out "$CERTS/server.pem" 2>/dev/null
	openssl verify -CAfile "$CERTS/ca.pem" "$CERTS/server.pem" >/dev/null || die "the generated server certificate does not verify"
	chmod 644 "$CERTS"/*.pem
	chmod 600 "$CERTS"/*.key
}

# own_certs USER DIR — a copy of the server certificate and key USER can
# read (PostgreSQL wants its key private to its owner).
own_certs() {
	local user=$1 dir=$2
	mkdir -p "$dir"
	cp "$CERTS/ca.pem" "$CERTS/server.pem" "$CERTS/server.key" "$dir/"
	chmod 600 "$dir/server.key"
	chown -R "$user:" "$dir"
}

# ---- RabbitMQ ----

rdir() { printf '%s/rabbitmq' "$TDIR"; }
rabbit_up() { rabbitmqctl -q -n "$NODE" status >/dev/null 2>&1 && listening "$T_AMQP"; }
rabbit_up_or_failed() { rabbit_up || grep -q 'init terminating in do_boot' "$(rdir)/log/console.log" 2>/dev/null; }

up_rabbit() {
	if rabbit_up; then
		log "RabbitMQ node $NODE already runs; reusing it"
		return
	fi
	listening "$T_AMQP" && die "port $T_AMQP is taken by something that is not $NODE"
	local dir
	dir="$(rdir)"
	mkdir -p "$dir/mnesia" "$dir/log"
	own_certs rabbitmq "$dir/certs"
	printf '[].\n' >"$dir/enabled_plugins"
	# No RABBITMQ_NODE_PORT: it would add a plain-text listener.
	cat >"$dir/rabbitmq.conf" <<-EOF
		listeners.tcp = none
		listeners.ssl.default = 127.0.0.1:$T_AMQP
		ssl_options.cacertfile = $dir/certs/ca.pem
		ssl_options.certfile = $dir/certs/server.pem
		ssl_options.keyfile = $dir/certs/server.key
		ssl_options.verify = verify_none
		ssl_options.fail_if_no_peer_cert = false
	EOF
	chown -R rabbitmq: "$dir"
	rm -f "$dir/pid"
	log "starting RabbitMQ node $NODE (amqps on $T_AMQP, data in $dir)"
	env RABBITMQ_NODENAME="$NODE" RABBITMQ_DIST_PORT="$T_DIST" \
		RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
		RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none" \
		setsid nohup rabbitmq-server >"$dir/log/console.log" 2>&1 </dev/null &
}

wait_rabbit() {
	if ! wait_for 180 "RabbitMQ (amqps) on $T_AMQP" rabbit_up_or_failed || ! rabbit_up; then
		tail -n 40 "$(rdir)/log/console.log" >&2 || true
		die "RabbitMQ node $NODE did not become healthy"
	fi
}

# ---- Redis ----

redis_ping() {
	redis-cli --tls --cacert "$CERTS/ca.pem" -h 127.0.0.1 -p "$T_REDIS" ping 2>/dev/null | grep -q PONG
}

up_redis_tls() {
	if redis_ping; then
		log "Redis (TLS) already runs on $T_REDIS; reusing it"
		return
	fi
	listening "$T_REDIS" && die "port $T_REDIS is taken by something that is not our Redis"
	local dir="$TDIR/redis"
	own_certs redis "$dir/certs"
	chown redis: "$dir"
	log "starting Redis (rediss on $T_REDIS, data in $dir)"
	runuser -u redis -- redis-server --port 0 --tls-port "$T_REDIS" --bind 127.0.0.1 --daemonize yes \
		--tls-cert-file "$dir/certs/server.pem" --tls-key-file "$dir/certs/server.key" \
		--tls-ca-cert-file "$dir/certs/ca.pem" --tls-auth-clients no \
		--dir "$dir" --save "" --appendonly no --logfile "$dir/redis.log" --pidfile "$dir/redis.pid" ||
		die "redis-server did not start (built without TLS?)"
	wait_for 30 "Redis (rediss) on $T_REDIS" redis_ping || {
		tail -n 20 "$dir/redis.log" >&2 || true
		die "Redis with TLS did not become healthy"
	}
}

# ---- PostgreSQL ----

pgdir() { printf '%s/postgres' "$TDIR"; }
pg_tls_ready() { "$(pg_bin pg_isready)" -q -h 127.0.0.1 -p "$T_PG"; }

up_postgres_tls() {
	local dir
	dir="$(pgdir)"
	if [ -s "$dir/pgdata/postmaster.pid" ] && pg_tls_ready; then
		log "PostgreSQL (TLS) already runs on $T_PG; reusing it"
		return
	fi
	listening "$T_PG" && die "port $T_PG is taken by something that is not our PostgreSQL"
	mkdir -p "$dir"
	chown postgres: "$dir"
	if [ ! -s "$dir/pgdata/PG_VERSION" ]; then
		rm -rf "$dir/pgdata"
		(cd / && runuser -u postgres -- "$(pg_bin initdb)" -D "$dir/pgdata" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1) ||
			{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
	fi
	own_certs postgres "$dir/certs"
	log "starting PostgreSQL (ssl=on on $T_PG, data in $dir/pgdata)"
	(cd / && runuser -u postgres -- "$(pg_bin pg_ctl)" -D "$dir/pgdata" -l "$dir/postgres.log" -w -t 60 \
		-o "-p $T_PG -k $dir -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off -c shared_buffers=16MB -c ssl=on -c ssl_cert_file=$dir/certs/server.pem -c ssl_key_file=$dir/certs/server.key" start >/dev/null) ||
		{ tail -n 40 "$dir/postgres.log" >&2; die "PostgreSQL did not start"; }
	wait_for 60 "PostgreSQL (ssl) on $T_PG" pg_tls_ready || die "PostgreSQL did not become ready"
}

# ---- all ----

print_tls_env() {
	cat <<-EOF
		export IDEMQ_AMQP_URL='amqps://guest:guest@localhost:$T_AMQP/'
		export IDEMQ_AMQP_CA='$CERTS/ca.pem'
		export IDEMQ_REDIS_URL='rediss://localhost:$T_REDIS/0'
		export IDEMQ_REDIS_CA='$CERTS/ca.pem'
		export IDEMQ_POSTGRES_URL='postgres://postgres@localhost:$T_PG/postgres?sslmode=verify-full&sslrootcert=$CERTS/ca.pem'
	EOF
}

tls_status() {
	local name port
	for pair in "rabbitmq(amqps):$T_AMQP" "redis(rediss):$T_REDIS" "postgres(ssl):$T_PG"; do
		name=${pair%%:*} port=${pair##*:}
		if listening "$port"; then echo "$name: listening on 127.0.0.1:$port"; else echo "$name: down"; fi
	done
}

tls_down() {
	local pid
	[ "${1:-}" = now ] || rabbitmqctl -q -n "$NODE" stop >/dev/null 2>&1 || true
	if [ -s "$(rdir)/pid" ]; then
		pid="$(cat "$(rdir)/pid")"
		kill -9 "$pid" 2>/dev/null || true
	fi
	if [ -s "$TDIR/redis/redis.pid" ]; then
		kill -9 "$(cat "$TDIR/redis/redis.pid")" 2>/dev/null || true
		rm -f "$TDIR/redis/redis.pid"
	fi
	if [ -d "$(pgdir)/pgdata" ]; then
		local mode=fast
		[ "${1:-}" = now ] && mode=immediate
		(cd / && runuser -u postgres -- "$(pg_bin pg_ctl)" -D "$(pgdir)/pgdata" -m "$mode" -w -t 30 stop >/dev/null 2>&1) || true
	fi
	log "stopped"
}

case "${1:-up}" in
up)
	gen_certs
	up_rabbit # boots in the background while Redis and PostgreSQL start
	up_redis_tls
	up_postgres_tls
	wait_rabbit
	;;
certs) gen_certs ;;
env) print_tls_env ;;
status) tls_status ;;
down) tls_down ;;
down-now) tls_down now ;;
*) die "usage: $0 up|certs|env|status|down|down-now" ;;
esac

#!/usr/bin/env bash
# services.sh — install (from Debian's packages), start and health-check the
# real servers idemq's tests, demo and benchmarks use, all on loopback, with
# their data under a git-ignored folder.
#
#   scripts/services.sh up       install what is missing, start what is down, wait for health
#   scripts/services.sh env      print export lines for a shell
#   scripts/services.sh status   say what is listening
#   scripts/services.sh down     stop the servers this script started
#
# A server that is already listening and healthy on its port is reused, so a
# second "up" is a no-op. Works as root on a fresh Debian 12 machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${IDEMQ_DATA_DIR:-$ROOT/.data}"

AMQP_PORT="${IDEMQ_AMQP_PORT:-5672}"
REDIS_PORT="${IDEMQ_REDIS_PORT:-6379}"
PG_PORT="${IDEMQ_PG_PORT:-5432}"
MYSQL_PORT="${IDEMQ_MYSQL_PORT:-3306}"
RABBIT_NODE="${IDEMQ_RABBITMQ_NODE:-rabbit@localhost}"
RABBIT_DIST_PORT="${IDEMQ_RABBITMQ_DIST_PORT:-25672}"
MGMT_PORT="${IDEMQ_RABBITMQ_MGMT_PORT:-15672}"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: ERROR: %s\n' "$*" >&2; exit 1; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for SECONDS DESCRIPTION COMMAND... — poll COMMAND until it succeeds.
wait_for() {
	local secs=$1 what=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			return 1
		fi
		sleep 0.5
	done
	log "$what is ready"
}

# svc_dir USER NAME — a data folder for NAME owned by USER. The folder lives
# under $DATA unless USER cannot reach it there (for example a clone under
# /root, which is mode 700): then it falls back to /var/tmp/idemq-data.
svc_dir() {
	local user=$1 name=$2
	local dir="$DATA/$name"
	mkdir -p "$dir"
	chown -R "$user:" "$dir"
	if ! runuser -u "$user" -- test -w "$dir" 2>/dev/null; then
		local key
		key="$(printf '%s' "$ROOT" | md5sum | cut -c1-8)"
		dir="/var/tmp/idemq-data-$key/$name"
		mkdir -p "$dir"
		chmod 755 "$(dirname "$dir")"
		chown -R "$user:" "$dir"
	fi
	printf '%s\n' "$dir"
}

need_pkgs=()
need() { command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2"); }

install_missing() {
	need rabbitmq-server rabbitmq-server
	need redis-server redis-server
	need mariadbd mariadb-server
	need mariadb mariadb-client
	need chromium chromium # the console's browser tests (headless)
	need node nodejs       # the gate's Node consumer test (gate/testdata/node-consumer; it runs npm ci)
	need npm npm
	need prometheus prometheus # metrics/ scrape test (a private server per test)
	need promtool prometheus # alert rules check
	if ((${#need_pkgs[@]})); then
		[ "$(id -u)" = 0 ] || die "missing ${need_pkgs[*]}; run as root or install them"
		log "installing ${need_pkgs[*]} from Debian's packages"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
	fi
	command -v initdb >/dev/null || [ -x /usr/lib/postgresql/15/bin/initdb ] || die "PostgreSQL 15 (initdb) not found"
}

pg_bin() {
	if command -v "$1" >/dev/null; then command -v "$1"; else echo "/usr/lib/postgresql/15/bin/$1"; fi
}

rabbit_healthy() { rabbitmqctl -q -n "$RABBIT_NODE" status >/dev/null 2>&1 && listening "$AMQP_PORT"; }

up_rabbitmq() {
	if listening "$AMQP_PORT"; then
		log "RabbitMQ already listening on $AMQP_PORT; reusing it"
		return
	fi
	local dir
	dir="$(svc_dir rabbitmq rabbitmq)"
	mkdir -p "$dir/mnesia" "$dir/log"
	chown -R rabbitmq: "$dir"
	# The management plugin (HTTP API on loopback): the consumer's
	# ManagementURL reads a queue's delivery limit from it, and its tests
	# set policies through it.
	echo '[rabbitmq_management].' >"$dir/enabled_plugins"
	printf 'management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %s\n' "$MGMT_PORT" >"$dir/rabbitmq.conf"
	chown rabbitmq: "$dir/enabled_plugins" "$dir/rabbitmq.conf"
	log "starting RabbitMQ (data in $dir)"
	env RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
		RABBITMQ_NODENAME="$RABBIT_NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_DIST_PORT="$RABBIT_DIST_PORT" \
		RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
		nohup rabbitmq-server >"$dir/log/console.log" 2>&1 </dev/null &
	wait_for 120 "RabbitMQ" rabbit_healthy || {
		tail -n 40 "$dir/log/console.log" >&2 || true
		die "RabbitMQ did not become healthy"
	}
}

# up_rabbitmq_management enables the management plugin on a running
# broker that lacks it (one started before this script enabled it): online,
# no restart.
up_rabbitmq_management() {
	if listening "$MGMT_PORT"; then
		return
	fi
	log "enabling the RabbitMQ management plugin (online)"
	rabbitmq-plugins -q -n "$RABBIT_NODE" enable rabbitmq_management >/dev/null ||
		die "could not enable rabbitmq_management on $RABBIT_NODE"
	wait_for 60 "RabbitMQ management API" listening "$MGMT_PORT" ||
		die "the management API is not listening on $MGMT_PORT"
}

up_redis() {
	if listening "$REDIS_PORT"; then
		log "Redis already listening on $REDIS_PORT; reusing it"
		return
	fi
	local dir
	dir="$(svc_dir redis redis)"
	log "starting Redis (data in $dir)"
	runuser -u redis -- redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes \
		--dir "$dir" --save "" --appendonly no --logfile "$dir/redis.log" \
		--pidfile "$dir/redis.pid"
	wait_for 30 "Redis" redis-cli -p "$REDIS_PORT" ping || die "Redis did not become healthy"
}

pg_ready() { "$(pg_bin pg_isready)" -q -h 127.0.0.1 -p "$PG_PORT"; }

up_postgres() {
	if listening "$PG_PORT"; then
		log "PostgreSQL already listening on $PG_PORT; reusing it"
		wait_for 30 "PostgreSQL" pg_ready || die "PostgreSQL on $PG_PORT is not ready"
		return
	fi
	local dir
	dir="$(svc_dir postgres postgres)"
	if [ ! -s "$dir/pgdata/PG_VERSION" ]; then
		log "initialising PostgreSQL in $dir/pgdata"
		rm -rf "$dir/pgdata"
		(cd / && runuser -u postgres -- "$(pg_bin initdb)" -D "$dir/pgdata" -A trust -U postgres -E UTF8 >"$dir/initdb.log" 2>&1) ||
			{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
	fi
	log "starting PostgreSQL (data in $dir/pgdata)"
	(cd / && runuser -u postgres -- "$(pg_bin pg_ctl)" -D "$dir/pgdata" -l "$dir/postgres.log" -w -t 60 \
		-o "-p $PG_PORT -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on" start >/dev/null) ||
		{ tail -n 40 "$dir/postgres.log" >&2; die "PostgreSQL did not start"; }
	wait_for 60 "PostgreSQL" pg_ready || die "PostgreSQL did not become ready"
}

mysql_ready() { mariadb --protocol=TCP -h 127.0.0.1 -P "$MYSQL_PORT" -uidemq -pidemq -e 'SELECT 1'; }

up_mariadb() {
	if listening "$MYSQL_PORT"; then
		log "MariaDB already listening on $MYSQL_PORT; reusing it"
		return
	fi
	local dir
	dir="$(svc_dir mysql mariadb)"
	if [ ! -d "$dir/db/mysql" ]; then
		log "initialising MariaDB in $dir/db"
		rm -rf "$dir/db"
		mariadb-install-db --user=mysql --datadir="$dir/db" --skip-test-db \
			--auth-root-authentication-method=socket >"$dir/install.log" 2>&1 ||
			{ cat "$dir/install.log" >&2; die "mariadb-install-db failed"; }
	fi
	log "starting MariaDB (data in $dir/db)"
	nohup mariadbd --user=mysql --datadir="$dir/db" --socket="$dir/mysqld.sock" \
		--pid-file="$dir/mysqld.pid" --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
		--max-connections=500 --log-error="$dir/error.log" >/dev/null 2>&1 </dev/null &
	wait_for 60 "MariaDB socket" mariadb --socket="$dir/mysqld.sock" -uroot -e 'SELECT 1' ||
		{ tail -n 40 "$dir/error.log" >&2; die "MariaDB did not start"; }
	mariadb --socket="$dir/mysqld.sock" -uroot <<-'SQL'
		CREATE USER IF NOT EXISTS 'idemq'@'%' IDENTIFIED BY 'idemq';
		CREATE USER IF NOT EXISTS 'idemq'@'localhost' IDENTIFIED BY 'idemq';
		GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'%' WITH GRANT OPTION;
		GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'localhost' WITH GRANT OPTION;
		FLUSH PRIVILEGES;
	SQL
	wait_for 30 "MariaDB" mysql_ready || die "MariaDB did not accept the idemq user"
}

print_env() {
	cat <<-EOF
		export IDEMQ_AMQP_URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/'
		export IDEMQ_REDIS_URL='redis://127.0.0.1:$REDIS_PORT/0'
		export IDEMQ_POSTGRES_URL='postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable'
		export IDEMQ_MYSQL_URL='idemq:idemq@tcp(127.0.0.1:$MYSQL_PORT)/'
		export IDEMQ_RABBITMQ_NODE='$RABBIT_NODE'
		export IDEMQ_RABBITMQ_MGMT_URL='http://guest:guest@127.0.0.1:$MGMT_PORT'
	EOF
}

status() {
	local name port
	for pair in "rabbitmq:$AMQP_PORT" "rabbitmq-management:$MGMT_PORT" "redis:$REDIS_PORT" "postgres:$PG_PORT" "mariadb:$MYSQL_PORT"; do
		name=${pair%%:*} port=${pair##*:}
		if listening "$port"; then echo "$name: listening on 127.0.0.1:$port"; else echo "$name: down"; fi
	done
}

down() {
	rabbitmqctl -q -n "$RABBIT_NODE" stop >/dev/null 2>&1 || true
	redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
	for d in "$DATA/postgres/pgdata" /var/tmp/idemq-data-*/postgres/pgdata; do
		[ -d "$d" ] && runuser -u postgres -- "$(pg_bin pg_ctl)" -D "$d" -m fast stop >/dev/null 2>&1 || true
	done
	for p in "$DATA/mariadb/mysqld.pid" /var/tmp/idemq-data-*/mariadb/mysqld.pid; do
		[ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true
	done
	log "stopped"
}

# Sourced (scripts/cluster.sh reuses the helpers above): define, do not run.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

case "${1:-up}" in
up)
	mkdir -p "$DATA"
	install_missing
	up_rabbitmq
	up_rabbitmq_management
	up_redis
	up_postgres
	up_mariadb
	;;
env) print_env ;;
status) status ;;
down) down ;;
*) die "usage: $0 up|env|status|down" ;;
esac

# idemq — make targets. See README.md.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
ENV := eval "$$(scripts/services.sh env)"
TEST_TIMEOUT ?= 15m

.PHONY: services env status down cluster cluster-env cluster-status cluster-down cluster-chaos cluster-chaos-retries tls tls-env tls-down test test-fake test-unit fuzz demo chaos chaos-retries broker-bugs quickstart orders bench bench-side bench-smoke bench-scale bench-report vet fmt

services: ## install (Debian packages) and start RabbitMQ, Redis, PostgreSQL, MariaDB on loopback
	@scripts/services.sh up

env: ## print export lines for a shell: eval $$(make -s env)
	@scripts/services.sh env

status:
	@scripts/services.sh status

down:
	@scripts/services.sh down

cluster: ## a 3-node RabbitMQ cluster (AMQP 5701-5703), Redis with 2 replicas and 3 Sentinels (6401-6403, 26401-26403) and a Redis Cluster of 3 primaries + 3 replicas (6501-6506), data in .data/cluster
	@scripts/cluster.sh up
	@echo 'eval "$$(scripts/cluster.sh env)" points idemq at it'

cluster-env: ## export lines for the cluster: IDEMQ_AMQP_URLS, IDEMQ_REDIS_SENTINELS, IDEMQ_REDIS_MASTER, IDEMQ_REDIS_CLUSTER
	@scripts/cluster.sh env

cluster-status:
	@scripts/cluster.sh status

cluster-down: ## stop the cluster's servers (never the shared single ones)
	@scripts/cluster.sh down

tls: ## RabbitMQ (amqps 5771), Redis (rediss 6471), PostgreSQL (ssl 5471) with TLS and a throwaway CA, data in .data/tls
	@scripts/tls.sh up
	@echo 'eval "$$(scripts/tls.sh env)" points idemq at them'

tls-env: ## export lines for the TLS servers: amqps:// and rediss:// URLs, IDEMQ_AMQP_CA, IDEMQ_REDIS_CA, verify-full PostgreSQL URL
	@scripts/tls.sh env

tls-down: ## stop the TLS servers (never the shared ones)
	@scripts/tls.sh down

CLUSTER_ENV := eval "$$(scripts/cluster.sh env)"
cluster-chaos: services cluster ## the bank demo against the cluster: leader kills, a rolling restart, a node outage past the reconnect backoff, a Redis primary failover; then the dedup mode on a Redis Cluster through two primary kills
	$(GO) build -o bin/bank ./examples/bank
	@mkdir -p .data
	$(ENV) && $(CLUSTER_ENV) && bin/bank demo --amqp-urls "$$IDEMQ_AMQP_URLS" --redis-sentinels "$$IDEMQ_REDIS_SENTINELS" \
		--redis-master "$$IDEMQ_REDIS_MASTER" --messages 3000 --kills 2 --cuts 0 --proxy-cuts 0 --redis-restarts 0 \
		--crash-rate 0.002 --fail-rate 0.1 --timeout 15m --cluster-faults leader-kill,rolling,outage,leader-kill,redis-failover \
		--json .data/cluster-chaos.json $(DEMO_ARGS)
	$(ENV) && $(CLUSTER_ENV) && bin/bank demo --amqp-urls "$$IDEMQ_AMQP_URLS" --redis-cluster "$$IDEMQ_REDIS_CLUSTER" \
		--modes dedup --messages 3000 --kills 2 --cuts 0 --proxy-cuts 0 --redis-restarts 0 \
		--crash-rate 0.002 --fail-rate 0.1 --timeout 15m --cluster-faults redis-cluster-kill,leader-kill,redis-cluster-kill \
		--json .data/cluster-chaos-redis-cluster.json $(DEMO_ARGS)

vet:
	$(GO) vet ./...
	$(GO) vet -tags faults,brokerbugs ./...

fmt:
	gofmt -w .

test: services vet ## start services, run every test with the race detector
	$(ENV) && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(ENV) && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags faults -p 1 -run '^TestFault' ./...
	$(ENV) && cd bench && $(GO) vet ./... && $(GO) test -race -count=1 -run '^Test' -bench . -benchtime=200x -timeout 10m ./...

# The tests that reach RabbitMQ, run again on the in-memory fake
# (idemqtest/fakemq) under IDEMQ_TEST_BROKER=fake (internal/testenv): the
# same tests, which pass on both, prove the fake honours what idemq relies
# on. Tests that need what the fake does not model skip with "real RabbitMQ
# only" and their reason. CI=true: a test that cannot reach the fake fails.
# Redis and the databases are the real ones (make services).
FAKE_PKGS := . ./retry ./gate ./outbox ./deadletter
test-fake: ## the broker tests on the in-memory fake instead of RabbitMQ
	$(ENV) && CI=true IDEMQ_TEST_BROKER=fake $(GO) test -race -count=1 -timeout 5m -run '^Test' $(FAKE_PKGS)

# Every fuzz target of the module, as "package FuzzName". make fuzz runs each
# for FUZZTIME on top of its seed corpus; make test runs the seed corpora
# (plain go test), which hold every input a fuzz run has failed on. The
# random run is not part of make test: it still finds new inputs within
# seconds on some targets, which would make CI red by chance.
FUZZ_TARGETS := \
	. FuzzMessageID \
	. FuzzFromJSONField \
	./internal/frame FuzzContentHeaderPayloadSize \
	./retry FuzzParseXDeath \
	./retry FuzzAttemptHeaders \
	./internal/release FuzzDue \
	./topology FuzzParseTopology \
	./outbox FuzzDecodeHeaders \
	./internal/redact FuzzRedactDSN \
	./internal/redact FuzzRedactURL \
	./internal/mgmt FuzzResolve \
	./examples/bank FuzzParseTransfer
FUZZTIME ?= 4s
fuzz: ## a short run of every fuzz target (FUZZTIME each; make fuzz FUZZTIME=5m for a long one)
	@set -e; set -- $(FUZZ_TARGETS); while [ $$# -gt 0 ]; do \
		echo "fuzz $$1 $$2 ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$2$$" -fuzztime $(FUZZTIME) "$$1" >/tmp/idemq-fuzz.$$$$.log 2>&1 || { cat /tmp/idemq-fuzz.$$$$.log; rm -f /tmp/idemq-fuzz.$$$$.log; exit 1; }; \
		rm -f /tmp/idemq-fuzz.$$$$.log; shift 2; \
	done

test-unit:
	$(GO) test -race -count=1 ./internal/...

DEMO_ARGS ?=
demo: services ## the bank demo: none, dedup and inbox under kill -9, resends and connection cuts
	$(GO) build -o bin/bank ./examples/bank
	$(ENV) && bin/bank demo $(DEMO_ARGS)

chaos: services ## the long fault run: more messages, kills, cuts, broker restarts while transient failures wait in retry queues, PostgreSQL outages of 30s (stopped, stalled, refusing with a server error; a consumer killed in each) and Redis outages of 30s, consumers frozen past their lease; then every store's linearizability histories $(LINCHECK_COUNT) times over (restarts, crashes, cuts, stalls past the lease)
	$(GO) build -o bin/bank ./examples/bank
	$(ENV) && bin/bank demo --messages 20000 --kills 20 --cuts 5 --broker-restarts 3 --fail-rate 0.1 --crash-rate 0.002 --timeout 10m \
		--db-outages 3 --db-outage-shapes stop,stall,refuse --db-outage-duration 30s --redis-outages 2 --redis-outage-duration 30s \
		--freezes 3 $(DEMO_ARGS)
	$(ENV) && CI=true $(GO) test -race -count=$(LINCHECK_COUNT) -timeout 20m -run 'Linearizab' ./dedup/...
	$(ENV) && CI=true $(GO) test -race -count=$(LINCHECK_COUNT) -timeout 30m -run '//Linearizable' ./dedup/...
	$(ENV) && CI=true $(GO) test -race -count=$(LINCHECK_COUNT) -timeout 30m -run '/Linearizable' ./dedup/...

# make chaos checks the stores' histories this many times over (make test: once).
LINCHECK_COUNT ?= 10

RETRY_MESSAGES ?= 3000
RETRY_RESTARTS ?= 8
CLUSTER_RETRY_MESSAGES ?= 1500
CLUSTER_RETRY_KILLS ?= 3
broker-bugs: services ## probes of RabbitMQ defects idemq works around (not idemq's tests; fails while the broker has them): deleting at-least-once retry queues right after a restart; the TTL + dead-letter retry route measured through restarts (late and lost per row)
	$(ENV) && $(GO) test -race -count=1 -timeout 10m -tags faults,brokerbugs -v -run '^TestBroker' ./topology
	$(ENV) && IDEMQ_FAULT_DEADLETTER_ROUTE=1 $(GO) test -race -count=1 -timeout 20m -tags faults -v -run '^TestFaultRetryQueuesSurviveBrokerRestarts$$' ./topology

chaos-retries: services ## the retry policy's fault test, longer: RETRY_MESSAGES messages failing twice each, RETRY_RESTARTS restarts of a private broker while they wait in quorum retry queues, quorum and classic work queues
	$(ENV) && IDEMQ_FAULT_RETRY_MESSAGES=$(RETRY_MESSAGES) IDEMQ_FAULT_RETRY_RESTARTS=$(RETRY_RESTARTS) IDEMQ_FAULT_RETRY_WORK_TYPES=all \
		$(GO) test -race -count=1 -timeout 30m -tags faults -v -run '^TestFaultDelayedRetriesThroughBrokerRestarts$$' ./retry

cluster-chaos-retries: services ## TestClusterRetryNodeLoss at larger sizes (make test runs its defaults in TestFaultClusterNodeLoss; its losses on 3.10.8 were false publish confirms in idemq's publisher, fixed, docs/RABBITMQ_VERSIONS.md): CLUSTER_RETRY_MESSAGES messages per case, CLUSTER_RETRY_KILLS node losses per case while deliveries wait in quorum retry queues (private 3-node cluster)
	$(ENV) && IDEMQ_FAULT_CLUSTER_RETRY_MESSAGES=$(CLUSTER_RETRY_MESSAGES) IDEMQ_FAULT_CLUSTER_RETRY_KILLS=$(CLUSTER_RETRY_KILLS) \
		$(GO) test -race -count=1 -timeout 60m -tags faults -v -run '^TestClusterRetryNodeLoss$$' .

quickstart: services
	$(ENV) && $(GO) run ./examples/quickstart

orders: services ## the combined example: outbox → relay → consumer (retry policy, guard, inbox); make test builds and runs it too
	$(ENV) && $(GO) run ./examples/orders

BENCH_N ?= 100000
BENCH_COUNT ?= 3
bench: services ## consume throughput against raw amqp091-go; writes docs/BENCHMARKS.md
	$(ENV) && cd bench && $(GO) test -run '^$$' -bench . -benchtime=$(BENCH_N)x -count=$(BENCH_COUNT) -timeout 90m . | tee ../docs/bench-raw.txt
	$(ENV) && cd bench && $(GO) run ./report -in ../docs/bench-raw.txt -out ../docs/BENCHMARKS.md -charts ../docs -cmd "make bench BENCH_N=$(BENCH_N) BENCH_COUNT=$(BENCH_COUNT)"

bench-side: services ## issue 20's ratios: raw baselines, no dedup, Redis dedup at the defaults, interleaved BENCH_COUNT times (BENCH_N messages)
	$(ENV) && cd bench && $(GO) test -c -o bench-side.test . && : > ../docs/bench-side-raw.txt && \
	  export IDEMQ_BENCH_BEAM_PID=$$(pgrep -o beam.smp) IDEMQ_BENCH_REDIS_PID=$$(pgrep -o redis-server) && \
	  for i in $$(seq $(BENCH_COUNT)); do uptime; ./bench-side.test -test.run '^$$' -test.bench '^BenchmarkSideBySide$$' -test.benchtime=$(BENCH_N)x -test.count=1 -test.timeout 30m | tee -a ../docs/bench-side-raw.txt; done; \
	  rm -f bench-side.test
	$(ENV) && cd bench && $(GO) run ./report -in ../docs/bench-side-raw.txt -out /dev/null -baseline SideBySide/raw-ack-each -cmd "make bench-side BENCH_N=$(BENCH_N) BENCH_COUNT=$(BENCH_COUNT)" | sed -n '/^## Other/,/^## Machine/p'

bench-smoke: services ## the benchmark harness on tiny counts, so it cannot rot (the scale run's TestScale on 2000 messages, the report tool's tests)
	$(ENV) && cd bench && $(GO) test -race -count=1 -run '^Test' -bench . -benchtime=200x -timeout 10m ./...

# The scale run (issue 20): SCALE_N persistent messages through a raw
# consumer, the idemq consumer with Redis dedup (default configuration) and
# the batch inbox on PostgreSQL with its purge running, one after the other
# (bench/scale_test.go). Each case stops by itself after SCALE_TIMEOUT and
# removes its queue, Redis keys and database. Writes docs/bench-scale-raw.txt,
# then the scale section of docs/BENCHMARKS.md and the charts (docs/*.svg);
# the tables above it, from docs/bench-raw.txt, are not rewritten.
SCALE_N ?= 1000000
SCALE_TIMEOUT ?= 30m
bench-scale: services ## 1M messages through the consumer (Redis dedup, batch inbox + purge): throughput per slice, RSS, Redis memory, inbox table size
	$(ENV) && cd bench && IDEMQ_SCALE_MESSAGES=$(SCALE_N) IDEMQ_SCALE_TIMEOUT=$(SCALE_TIMEOUT) IDEMQ_SCALE_OUT=../docs/bench-scale-raw.txt \
		$(GO) test -count=1 -v -run '^TestScale$$' -timeout 150m .
	$(MAKE) -s bench-report BENCH_REPORT_CMD="make bench-scale SCALE_N=$(SCALE_N)"

BENCH_REPORT_CMD ?= make bench-report
bench-report: ## the charts (docs/*.svg) and the scale section of docs/BENCHMARKS.md from the existing raw files, without running anything
	cd bench && $(GO) run ./report -tables=false -in ../docs/bench-raw.txt -scale ../docs/bench-scale-raw.txt -scale-cmd "$(BENCH_REPORT_CMD)" -out ../docs/BENCHMARKS.md -charts ../docs

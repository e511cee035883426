# The two commands of the README: `make run` (start a local 3-node cluster) and `make test` (run the tests).
# Both create the virtualenv in .venv and install raftmq into it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run run-single test test-cluster test-groups lint bench chaos chaos-groups chaos-compose proto clean system-packages interop

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

# The system packages the default suite needs beyond Python and iproute2, installed as root when
# missing (without root the tests that need them skip, and this does nothing); a fresh Debian
# machine has neither: iptables, for the chaos tests' packet-loss nemesis inside network
# namespaces; chromium, for tests/integration/test_ui_browser.py (the web UI in headless Chromium;
# the apt-get took 11 s here).
system-packages:
	@for pkg in iptables chromium; do \
	  if [ "$$(id -u)" = 0 ] && ! command -v $$pkg >/dev/null && command -v apt-get >/dev/null; then \
	    echo "installing $$pkg (apt-get) for the tests"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$pkg >/dev/null \
	    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$pkg >/dev/null; }; \
	  fi; \
	done

run: $(STAMP)
	$(BIN)/raftmq cluster up

run-single: $(STAMP)
	$(BIN)/raftmq server

test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q tests/cluster

# Issue 34's check: the whole suite with three Raft groups per node (the node fixtures, the local
# Cluster, the chaos backend and the Spark tests' nodes read RAFTMQ_RAFT_GROUPS; unit tests run as always).
test-groups: $(STAMP)
	RAFTMQ_RAFT_GROUPS=3 $(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

test: $(STAMP) system-packages
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m mypy

proto: $(STAMP)
	$(BIN)/pip install --quiet grpcio-tools
	$(BIN)/python -m grpc_tools.protoc -I ops/proto --python_out=ops/proto --grpc_python_out=ops/proto ops/proto/admin.proto
	sed -i 's/^import admin_pb2 as/from . import admin_pb2 as/' ops/proto/admin_pb2_grpc.py

chaos: $(STAMP) system-packages
	$(BIN)/raftmq chaos run --backend netns --duration 300 --nemesis kill,leader-kill,pause,partition,bridge,loss,restart-all,corrupt,truncate,corrupt-and-kill,truncate-and-kill --out chaos-run

# Issue 34: the same with every node started with raft_groups = 3 (the metadata group, queue groups 1
# and 2 in worker processes); docs/chaos/README.md holds a run's figures.
chaos-groups: $(STAMP) system-packages
	$(BIN)/raftmq chaos run --backend netns --duration 300 --groups 3 --nemesis kill,leader-kill,pause,partition,bridge,loss,restart-all,corrupt,truncate,corrupt-and-kill,truncate-and-kill --out chaos-run

chaos-compose: $(STAMP)
	docker/make-base-image.sh
	RAFTMQ_BASE_IMAGE=raftmq-base:bookworm $(BIN)/raftmq chaos run --backend compose --duration 300 --nemesis kill,leader-kill,pause,partition,bridge,loss,restart-all,corrupt,truncate,corrupt-and-kill,truncate-and-kill --fault-seconds 5 --quiet-seconds 5 --out chaos-run

# The AMQP 1.0 client libraries' own examples and suites (Proton, rhea, cli-proton-python,
# rabbitmq-amqp-python-client), unmodified, against a fresh raftmq; prints passed/failed/hung/skipped
# per suite (tests/interop/README.md).  Not part of `make test`: it needs the upstream mirrors, node
# and npm, and takes about 25 minutes.  ARGS: suites (proton rhea cli rmq), --cluster, -k NAME.
interop: $(STAMP)
	$(BIN)/python -m tests.interop $(ARGS)

bench: $(STAMP)
	$(BIN)/python bench/throughput.py $(ARGS)

clean:
	rm -rf $(VENV) data

# delta-mirror developer tasks. Everything runs in the repo's own virtualenv (.venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The Delta LogStore jar (see `jar` below)
LOGSTORE_JAR := include/delta_mirror/spark/jars/delta-mirror-logstore.jar
LOGSTORE_SRC := jvm/logstore/pom.xml $(shell find jvm/logstore/src -type f 2>/dev/null)
MVN ?= mvn
# delta-kernel-java as an independent reader (see `kernel-jar` below)
KERNEL_JAR := include/delta_mirror/jobs/validate/jars/delta-mirror-kernel-reader.jar
KERNEL_SRC := jvm/kernel-reader/pom.xml $(shell find jvm/kernel-reader/src -type f 2>/dev/null)
# The package's version (pyproject.toml), also the jars' Maven version (`-Drevision`, jvm/*/pom.xml):
# `make jar`/`make kernel-jar` install them as $(MAVEN_GROUP):<artifact>:$(PACKAGE_VERSION) into the
# local Maven repository M2_REPO, which is also Maven's cache for the builds (e.g.
# `make jar M2_REPO=$$HOME/.m2/repository`, where Spark's --packages looks; docs/spark-jars.md).
PACKAGE_VERSION := $(shell sed -n 's/^version *= *"\([^"]*\)".*/\1/p' pyproject.toml | head -n 1)
M2_REPO ?= $(CURDIR)/.cache/m2
MAVEN_GROUP := io.github.deltamirror
M2_DIR = $(abspath $(M2_REPO))/$(subst .,/,$(MAVEN_GROUP))/$(1)/$(PACKAGE_VERSION)/$(1)-$(PACKAGE_VERSION).jar
LOGSTORE_M2 := $(call M2_DIR,delta-mirror-logstore)
KERNEL_M2 := $(call M2_DIR,delta-mirror-kernel-reader)
# The version the jars in include/ were built with: a new one rebuilds them (the file changes only then)
JAR_VERSION := .cache/jar-version
# The wheel and sdist of `make dist`
DIST_DIR ?= dist
# The apache-spark provider (SparkSubmitOperator) goes in with --no-deps: it requires pyspark-client,
# which installs a client-only `pyspark` package over the full pyspark 4.2.0 we need (README, Spark).
SPARK_PROVIDER := apache-airflow-providers-apache-spark==6.3.4

.PHONY: venv jar kernel-jar dist emulators services test check lint docs demo airflow print-local-env cluster cluster-down cluster-status cluster-chaos bench bench-cluster chaos chaos-failover clean distclean

# Re-installs only when pyproject.toml or requirements.txt changed (or the venv is new).
# Also builds the LogStore and kernel reader jars, so `make test` and `make demo` have them.
venv: $(STAMP) $(LOGSTORE_JAR) $(KERNEL_JAR)

$(VENV)/pyvenv.cfg:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/pyvenv.cfg pyproject.toml requirements.txt
	@echo "installing into $(VENV): Airflow, Spark and the test tools, about 1.7 GB; the first time takes 2-5 minutes"
	$(PY) -m pip install -q -e '.[test,docs,all]' -r requirements.txt
	@# setuptools leaves the build's metadata in include/, which is on sys.path: a second delta-mirror
	@# distribution whose entry points Airflow would load again ("Plugin 'delta_mirror' already registered")
	rm -rf include/delta_mirror.egg-info
	$(PY) -m pip install -q --no-deps $(SPARK_PROVIDER)
	touch $@

# The Delta LogStore of Spark writers through the SQL authority (jvm/logstore, docs/commit-service.md),
# built with Maven (its JUnit tests run) only when its sources changed; Maven's repository is cached in
# .cache/m2. Without Maven or javac the jar is not built and the tests that need it are skipped.
# Then installed into the local Maven repository (M2_REPO, above) when that lacks this build.
jar: $(LOGSTORE_JAR) $(LOGSTORE_M2)

$(JAR_VERSION): FORCE
	@test -n "$(PACKAGE_VERSION)" || { echo "error: no version = \"...\" in pyproject.toml" >&2; exit 1; }
	@mkdir -p $(@D); [ "$$(cat $@ 2>/dev/null)" = "$(PACKAGE_VERSION)" ] || echo "$(PACKAGE_VERSION)" > $@

FORCE:

# Install jar $(1) as $(MAVEN_GROUP):$(2):$(PACKAGE_VERSION) into M2_REPO with a pom of its own that
# has no dependencies (the LogStore's are all provided by Spark, the kernel reader's are inside it);
# touched, since Maven keeps the jar's time in milliseconds (older than the jar: installed again each
# time). Nothing when the jar was not built (no Maven: the jar rule said so).
MAVEN_INSTALL = if [ -f $(1) ]; then \
	echo "installing $(1) into $(abspath $(M2_REPO)) as $(MAVEN_GROUP):$(2):$(PACKAGE_VERSION)"; \
	pom=$$(mktemp) && printf '%s\n' '<?xml version="1.0" encoding="UTF-8"?>' \
		'<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>' \
		'<groupId>$(MAVEN_GROUP)</groupId><artifactId>$(2)</artifactId><version>$(PACKAGE_VERSION)</version>' \
		'<packaging>jar</packaging><name>$(3)</name></project>' > $$pom && \
	$(MVN) -B -q -Dstyle.color=never -Dmaven.repo.local=$(abspath $(M2_REPO)) \
		org.apache.maven.plugins:maven-install-plugin:3.1.2:install-file -Dfile=$(1) -DpomFile=$$pom; \
	status=$$?; rm -f $$pom; [ $$status -ne 0 ] || touch $@; exit $$status; \
	fi

$(LOGSTORE_M2): $(LOGSTORE_JAR)
	@$(call MAVEN_INSTALL,$<,delta-mirror-logstore,delta-mirror LogStore)

$(LOGSTORE_JAR): $(LOGSTORE_SRC) $(JAR_VERSION)
	@if ! command -v $(MVN) >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then \
		echo "warning: $@ not built: it needs Maven and a JDK 17 (apt-get install maven openjdk-17-jdk-headless); the tests that need it are skipped" >&2; \
	else \
		echo "building $@ (mvn package, tests included)"; \
		(cd jvm/logstore && $(MVN) -B -q -Dstyle.color=never -Dmaven.repo.local=$(abspath $(M2_REPO)) \
			-Drevision=$(PACKAGE_VERSION) package) && \
		mkdir -p $(@D) && cp jvm/logstore/target/delta-mirror-logstore.jar $@.tmp && mv -f $@.tmp $@; \
	fi

# delta-kernel-java (the kernel Trino and Flink build on) as a reader for `validate --reader kernel-java`
# and the corpus tests (jvm/kernel-reader): one shaded jar with the kernel, its default engine and the
# Hadoop client, built like the LogStore jar (JUnit tests run; .cache/m2; skipped without Maven/javac).
kernel-jar: $(KERNEL_JAR) $(KERNEL_M2)

$(KERNEL_M2): $(KERNEL_JAR)
	@$(call MAVEN_INSTALL,$<,delta-mirror-kernel-reader,delta-mirror kernel reader)

# After the LogStore jar (order only), and after its install when `make jar` runs too: two Maven
# processes must not fill the same local repository at once (`make -j`).
$(KERNEL_JAR): $(KERNEL_SRC) $(JAR_VERSION) | $(LOGSTORE_JAR) $(if $(filter jar,$(MAKECMDGOALS)),$(LOGSTORE_M2))
	@if ! command -v $(MVN) >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then \
		echo "warning: $@ not built: it needs Maven and a JDK 17 (apt-get install maven openjdk-17-jdk-headless); the kernel-java reader and its tests are skipped" >&2; \
	else \
		echo "building $@ (mvn package, tests included)"; \
		(cd jvm/kernel-reader && $(MVN) -B -q -Dstyle.color=never -Dmaven.repo.local=$(abspath $(M2_REPO)) \
			-Drevision=$(PACKAGE_VERSION) package) && \
		mkdir -p $(@D) && cp jvm/kernel-reader/target/delta-mirror-kernel-reader.jar $@.tmp && mv -f $@.tmp $@; \
	fi

# The wheel and the sdist into DIST_DIR, both with the two jars inside (package data: built, never
# committed; the build fails without them). `python -m build` (the `build` package in the venv)
# builds the sdist, then the wheel from it, in an isolated environment with pyproject's setuptools.
dist: $(LOGSTORE_JAR) $(KERNEL_JAR)
	@for jar in $^; do [ -f $$jar ] || { echo "error: $$jar is not built: make dist needs Maven and a JDK 17" >&2; exit 1; }; done
	@$(PY) -c "import build" 2>/dev/null || { echo "error: make dist needs the build package: $(PY) -m pip install build" >&2; exit 1; }
	@# the sdist step writes include/delta_mirror.egg-info, which must not stay on sys.path (see $(STAMP))
	$(PY) -m build --outdir $(DIST_DIR) .; status=$$?; rm -rf include/delta_mirror.egg-info; exit $$status

# A service install that failed: under CI=true the run fails with the reason (every test must run
# there); elsewhere a warning, and the tests that need the service skip with the reason.
CI_OR_WARN = || if [ "$${CI:-}" = true ] || [ "$${CI:-}" = 1 ]; then \
	echo "error: $(1) (CI=true: the tests that need it cannot run)" >&2; exit 1; \
	else echo "warning: $(1): the tests that need it are skipped" >&2; fi

# Azurite, fake-gcs-server and MinIO for the Azure, GCS and MinIO tests, into .cache/npm and
# .cache/go/bin (pinned versions; skipped when present). Needs npm and Go >= 1.26.
emulators:
	@bash scripts/install-emulators.sh $(call CI_OR_WARN,make emulators: a storage server is not installed)

# What `make cluster` runs beyond the venv: redis-server from Debian (as root) and the storage servers.
services:
	@bash scripts/install-services.sh $(call CI_OR_WARN,make services: a cluster service is not installed)

# PYTEST_WORKERS pytest-xdist processes for `make test` (0, the default: one process). With
# --dist loadgroup the tests of Spark, the JVMs, the cluster, the Airflow servers, e2e and packaging
# share one worker (tests/conftest.py, _ONE_WORKER) and every other service is started per worker on
# free ports; pytest 9.2 drops those groups silently (pytest-xdist issue 1386), so it stays opt-in
# (docs/development.md has the figures).
PYTEST_WORKERS ?= 0
XDIST = $(if $(filter-out 0,$(1)),-n $(1) --dist loadgroup)
# PYTEST_SHARDS=2 (the default): two plain pytest processes at once (scripts/test_shards.py): the
# tests conftest.py marks one_process (the xdist group above) in one, the rest in the other;
# PYTEST_SHARDS=1 runs one process (docs/development.md has the figures).
PYTEST_SHARDS ?= 2
test: venv emulators
ifeq ($(filter-out 0 1,$(PYTEST_SHARDS)),)
	$(PY) -m pytest -q -ra $(call XDIST,$(PYTEST_WORKERS)) $(PYTEST_ARGS)
else
	$(PY) scripts/test_shards.py $(PYTEST_SHARDS) -- -q -ra $(PYTEST_ARGS)
endif

# The commit service's fuzz suite and slow-client soak (tests/service/test_fuzz_commit.py) for
# DELTA_MIRROR_FUZZ_SECONDS (10 minutes by default); `make test` runs its short profile. Prints the
# figures docs/commit-service.md ("Security") quotes.
.PHONY: fuzz
fuzz:
	DELTA_MIRROR_FUZZ_SECONDS=$${DELTA_MIRROR_FUZZ_SECONDS:-600} $(PY) -m pytest -q -s tests/service/test_fuzz_commit.py $(PYTEST_ARGS)

# The inner loop before every commit (docs/development.md): `lint`, then every test that needs no
# service and takes well under a second or two, on SQLite. tests/conftest.py marks `service` each
# test that needs a server, a JVM or a cluster (PostgreSQL, MariaDB, S3, the emulators, Spark,
# kernel-java, an Airflow server, the cluster, packaging) from the fixtures it requests, and `slow`
# the DAG runs in Airflow (and the few marked by hand); `make test` runs those, the DuckDB params
# of the store tests and the corpus sweeps too. CHECK_WORKERS pytest-xdist processes (0: one).
CHECK_TESTS := not service and not slow and not duckdb and not corpus
CHECK_WORKERS ?= 2
check: lint
	$(PY) -m pytest -q -m "$(CHECK_TESTS)" $(if $(filter-out 0,$(CHECK_WORKERS)),-n $(CHECK_WORKERS)) $(PYTEST_ARGS)

# ruff (pyflakes, bugbear, complexity <= 12, SIM, RUF) and formatting; mypy --strict on the package
# (Airflow glue included) and on the tests and benchmarks (tests/airflow and tests/spark each have a
# conftest.py, as tests/ has: one module name, so those two are checked on their own). .ci/run runs it.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --strict include/delta_mirror
	$(PY) -m mypy --explicit-package-bases tests benchmarks
	$(PY) -m mypy tests/airflow/conftest.py
	$(PY) -m mypy tests/spark/conftest.py

# The docs site (mkdocs, material theme; mkdocs.yml) into site/. --strict: a warning fails it, and
# mkdocs.yml makes a link to a missing page or heading a warning (tests/docs/ runs the same build).
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

# The embedded default: SQLite store in .delta-mirror/, Airflow's SQLite metadata DB in .airflow/,
# the "Delta Mirror" page from plugins/. The UI listens on AIRFLOW_HOST:AIRFLOW_PORT, 127.0.0.1 by
# default (`make airflow AIRFLOW_HOST=0.0.0.0` to reach it from another machine). This is the one
# definition: the browser test (tests/airflow/test_ui_plugin.py) reads it with `make -s print-local-env`.
AIRFLOW_HOST ?= 127.0.0.1
AIRFLOW_PORT ?= 8080
# Tasks reach the API server's execution API at this URL (Airflow's default is localhost:8080, so
# without it no task runs on another port); 127.0.0.1 when the UI listens on every interface.
AIRFLOW_EXEC_HOST := $(if $(filter 0.0.0.0 ::,$(AIRFLOW_HOST)),127.0.0.1,$(AIRFLOW_HOST))
LOCAL_ENV := AIRFLOW_HOME=$(CURDIR)/.airflow AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__API__HOST=$(AIRFLOW_HOST) AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://$(AIRFLOW_EXEC_HOST):$(AIRFLOW_PORT)/execution/ \
	DELTA_MIRROR_HOME=$(CURDIR)/.delta-mirror \
	DELTA_MIRROR_CONFIG=$(CURDIR)/config/delta_mirror.yaml PATH=$(CURDIR)/$(VENV)/bin:$$PATH

demo: venv
	$(LOCAL_ENV) $(PY) -m delta_mirror.dev.demo prepare airflow show

# The Airflow UI with the project's DAGs; when it is ready scripts/airflow-local.sh prints the URL,
# the user (admin) and the file that keeps the generated password.
airflow: venv
	$(LOCAL_ENV) scripts/airflow-local.sh

# LOCAL_ENV, one VAR=value a line (for tests and scripts that start what `make airflow` starts).
print-local-env:
	@printf '%s\n' $(LOCAL_ENV)

# The docker-compose.yaml topology as plain processes on 127.0.0.1 (docker/stack.yaml, stack.env):
# PostgreSQL, Redis, MinIO, an SMTP catcher, Spark master + worker, Airflow with CeleryExecutor
# (2 triggerers, 2 Celery workers), 2 commit-service replicas. State, logs, data under .cluster/.
# CLUSTER_ARGS: e.g. --port-base 23000, --workers 1, --skip mailpit.
CLUSTER_ARGS ?=
cluster: venv services
	$(PY) -m delta_mirror.dev.cluster up $(CLUSTER_ARGS)

cluster-down:
	$(PY) -m delta_mirror.dev.cluster down

cluster-status:
	$(PY) -m delta_mirror.dev.cluster status

# Every figure; `make bench BENCH=commit_service` runs only the named ones (comma-separated,
# benchmarks/run.py's FIGURES) and updates just those in bench-results/latest.json.
bench: venv
	PYTHONPATH=$(CURDIR)/tests $(PY) benchmarks/run.py $(if $(BENCH),--only $(BENCH))

# Fault injection at scale (S3 proxy faults, SIGKILLs, PostgreSQL restarts, races, external writers,
# read-only / full targets); one JSON object, also in bench-results/chaos.json. Needs root for tmpfs.
chaos: venv
	PYTHONPATH=$(CURDIR)/tests $(PY) tests/chaos/run.py

# The store's PostgreSQL primary SIGKILLed under load and its standby promoted (tests/chaos/failover.py),
# synchronous and asynchronous replication: acknowledged commits lost, versions duplicated or
# published with other bytes, time to commit and to publish again; JSON in bench-results/chaos-failover.json.
chaos-failover: venv
	PYTHONPATH=$(CURDIR)/tests:$(CURDIR)/tests/chaos $(PY) tests/chaos/failover.py

# Lose one of each cluster service while commits flow (tests/chaos/cluster_chaos.py): a triggerer,
# a Celery worker mid-task, Redis, a commit-service replica under a Spark writer, PostgreSQL; the
# recovery time per fault, JSON in bench-results/cluster-chaos.json. Its own cluster on free ports.
cluster-chaos: venv services
	PYTHONPATH=$(CURDIR)/tests:$(CURDIR)/tests/chaos $(PY) tests/chaos/cluster_chaos.py

# 1,000 event tables on a two-triggerer cluster at 1 and 10 commits/s, then a triggerer SIGKILLed
# (benchmarks/fleet_cluster.py); JSON in bench-results/cluster-fleet.json.
bench-cluster: venv services
	PYTHONPATH=$(CURDIR)/tests $(PY) benchmarks/fleet_cluster.py

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist include/*.egg-info test-artifacts bench-results .airflow .delta-mirror \
		jvm/logstore/target $(LOGSTORE_JAR) jvm/kernel-reader/target $(KERNEL_JAR)
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

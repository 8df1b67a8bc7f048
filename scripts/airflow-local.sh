#!/usr/bin/env bash
# `make airflow`: `airflow standalone` in the environment the Makefile sets (LOCAL_ENV), and, once the
# UI answers, the three things a first-time user needs at the end of the start-up output (not 118
# lines up): the URL, the user and the file with the generated password. The browser test
# (tests/airflow/test_ui_plugin.py) starts Airflow through this script with `make -s print-local-env`.
set -u

host="${AIRFLOW__API__HOST:-127.0.0.1}"
port="${AIRFLOW__API__PORT:-8080}"
home="${AIRFLOW_HOME:?AIRFLOW_HOME is not set: start this through make airflow}"
case "$host" in
    0.0.0.0 | "::") browse="localhost" ;;
    *) browse="$host" ;;
esac
url="http://$browse:$port"

# Airflow's scheduler and triggerer without their log servers, which would listen on every interface
# (scripts/airflow-local-bin/airflow; the API server reads the log files on this machine).
DELTA_MIRROR_REAL_AIRFLOW="$(command -v airflow)" || { echo "airflow is not on PATH: run make venv" >&2; exit 1; }
export DELTA_MIRROR_REAL_AIRFLOW
PATH="$(cd "$(dirname "$0")" && pwd)/airflow-local-bin:$PATH"
export PATH

airflow standalone &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 130' INT TERM

# Ready = the UI answers and reports every component healthy (scheduler, dag-processor, triggerer).
# No fixed timeout: the first start (database migration) takes seconds to minutes with the machine's
# load; wait while Airflow runs, stop waiting when it exits.
ready="import json, urllib.request as u
h = json.load(u.build_opener(u.ProxyHandler({})).open('$url/api/v2/monitor/health', timeout=5))
assert all(c.get('status') == 'healthy' for c in h.values() if isinstance(c, dict)) and 'scheduler' in h"
while kill -0 "$child" 2>/dev/null; do
    if python -c "$ready" >/dev/null 2>&1; then
        sleep 4 # after standalone's own "Airflow is ready" lines, so this is the last thing on screen
        break
    fi
    sleep 2
done

if kill -0 "$child" 2>/dev/null; then
    cat <<EOF

==> Airflow UI: $url  (the Delta Mirror page: $url/plugin/delta-mirror)
    user: admin   password: in $home/simple_auth_manager_passwords.json.generated
    listening on $host:$port (make airflow AIRFLOW_HOST=0.0.0.0 to reach it from other machines)
    the DAGs start paused: unpause one in the UI to let the scheduler run it; Ctrl-C stops Airflow

EOF
fi
wait "$child"

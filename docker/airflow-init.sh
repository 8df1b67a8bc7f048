#!/usr/bin/env bash
# One-shot init of the Compose stack (service airflow-init, run as root by docker-compose.yaml):
# Airflow metadata DB, the UI admin user, the delta-mirror store schema, the log volume's owner.
# Idempotent: it runs at every `docker compose up`.
set -euo pipefail

echo "== waiting for the Airflow metadata database"
for attempt in $(seq 1 30); do
    if airflow db check >/dev/null 2>&1; then
        break
    fi
    if [ "$attempt" -eq 30 ]; then
        airflow db check
    fi
    sleep 2
done

echo "== airflow $(airflow version): db migrate"
airflow db migrate

echo "== admin user ${AIRFLOW_ADMIN_USER}"
# `users create` reports an existing user and exits 0; the list check covers versions that fail instead.
if ! airflow users create --username "${AIRFLOW_ADMIN_USER}" --password "${AIRFLOW_ADMIN_PASSWORD}" \
    --firstname Airflow --lastname Admin --email admin@delta-mirror.local --role Admin; then
    airflow users list | grep -qw -- "${AIRFLOW_ADMIN_USER}"
fi

echo "== delta-mirror store schema (DELTA_MIRROR_STORE)"
delta-mirror init

echo "== table config ${DELTA_MIRROR_CONFIG}"
python - <<'PY'
from delta_mirror.table_config import load_config

cfg = load_config()
for name, table in sorted(cfg.tables.items()):
    print(f"  {name}: store={table.store_conn_id} s3={table.aws_conn_id} smtp={table.notify.smtp_conn_id}")
PY

echo "== connections defined by environment"
env | sed -n 's/^AIRFLOW_CONN_\([A-Z0-9_]*\)=.*/  \1/p' | tr '[:upper:]' '[:lower:]'

echo "== log volume owner ${AIRFLOW_UID:-50000}:0"
mkdir -p /opt/airflow/logs
chown -R "${AIRFLOW_UID:-50000}:0" /opt/airflow/logs
echo "done"

#!/usr/bin/env bash
# One-shot init of the Compose stack (service airflow-init, run as root by docker-compose.yaml):
# Airflow metadata DB, the UI admin's password (Simple auth manager), the delta-mirror store schema,
# the bucket, the volumes' owner. What `make cluster` does before Airflow starts, in a container.
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

echo "== admin user ${AIRFLOW_ADMIN_USER} (Simple auth manager: ${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS})"
# The Simple auth manager reads {"user": "password"} from this file (and would generate a password for
# a user missing from it); the API server opens it read-write, as the Airflow user.
passwords="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE}"
mkdir -p "$(dirname "$passwords")"
python - "$passwords" <<'PY'
import json, os, sys

path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    json.dump({os.environ["AIRFLOW_ADMIN_USER"]: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, f)
PY
chown -R "${AIRFLOW_UID:-50000}:0" "$(dirname "$passwords")"

echo "== delta-mirror store schema (DELTA_MIRROR_STORE)"
delta-mirror init

echo "== bucket ${BUCKET} on ${AWS_ENDPOINT_URL}"
python - <<'PY'
import os

import boto3
from botocore.exceptions import ClientError

s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"])
try:
    s3.create_bucket(Bucket=os.environ["BUCKET"])
except ClientError as exc:
    if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
        raise
print("  " + ", ".join(sorted(b["Name"] for b in s3.list_buckets()["Buckets"])))
PY

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

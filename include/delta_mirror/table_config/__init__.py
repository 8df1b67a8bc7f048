"""The table config file: which tables the orchestration runs, how often, and who is told.

A YAML file (``DELTA_MIRROR_CONFIG``, default ``config/delta_mirror.yaml``) with ``defaults`` and
``tables``; every table inherits the defaults and may override any of them. The file is read at
each DAG parse, so edits take effect without a restart. Unknown keys and bad values are refused with
a message naming the table and the key: a typo must not silently disable an alert.

```yaml
defaults:
  schedule: "*/5 * * * *"        # cron, a duration ("10m"), "@hourly", "event" or null (manual)
  owner: data-platform
  retries: 3
  retry_delay: 30s
  retry_exponential_backoff: 2.0   # multiplier; 0 disables
  max_retry_delay: 10m
  lag_slo: 15m                     # monitor emails / `delta-mirror health` fails when lag exceeds this
  lag_history_retention: 14d       # lag samples (dl_lag_samples) older than this are pruned
  failure_grace: 5m                # `health` fails once publish attempts have failed this long...
  failure_grace_attempts: 2        # ...or this many times in a row (whichever comes first)
  deadline: 30m                    # DeadlineAlert: the table's DAG run must finish within this
  notify:
    email: [oncall@example.com]
    smtp_conn_id: smtp_default
    notifier: null                 # or an Airflow notifier class path, e.g. ...SlackNotifier
    notifier_kwargs: {}
  checkpoint:
    engine: local                  # local, spark, or auto (Spark from spark_threshold_files on)
    spark_threshold_files: 2000000
    spark: {conn_id: spark_default, master: "local[2]", partitions: 8, conf: {spark.driver.memory: 4g}}
  # fleet knobs (docs/scaling.md): how many runs/tasks of a table at once, and where its tasks queue
  max_active_runs: 1               # runs of the table's DAG at once (commits meanwhile wait or coalesce)
  max_active_tasks: null           # tasks of one table's runs at once (null: Airflow's default)
  pool: null                       # an Airflow pool for the table's tasks (null: default_pool)
  priority_weight: 1               # higher runs first when pool slots are short
  # the per-run work (docs/scaling.md "A commit costs what publishing costs")
  tasks: null                      # single: one `sync` task; steps: publish → checkpoint → validate →
                                   # metrics (null: single for `schedule: event`, steps otherwise)
  validate_every: 10m              # `sync` validates the versions published since the last
                                   # validation at most this often (0: every run; a failure: next run)
  publish_in: null                 # `schedule: event` only. triggerer (the default for event tables):
                                   # the watcher publishes each commit (no run unless a checkpoint is
                                   # due or publishing failed; validation: the monitor DAG); task: the
                                   # DAG run publishes it (one task process per commit)
tables:
  sales:
    schedule: event
    poll_interval: 5s
    priority_weight: 10
    asset_uri: null                # the URI of the table's Airflow asset (docs/assets.md);
                                   # null: x-delta-mirror://<store_conn_id or default>/<table>
```
"""

from __future__ import annotations

from delta_mirror.table_config.model import (
    CheckpointEngine,
    CheckpointSettings,
    ConfigError,
    MirrorConfig,
    Notify,
    TableConfig,
    parse_duration,
)
from delta_mirror.table_config.parse import default_config_path, load_config, parse_config

__all__ = [
    "CheckpointEngine",
    "CheckpointSettings",
    "ConfigError",
    "MirrorConfig",
    "Notify",
    "TableConfig",
    "default_config_path",
    "load_config",
    "parse_config",
    "parse_duration",
]

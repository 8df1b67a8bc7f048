-- Runs once, when the PostgreSQL data volume is first initialised (/docker-entrypoint-initdb.d).
-- The Airflow metadata database "airflow" comes from POSTGRES_DB; this creates the delta-mirror
-- store: its own role and database (the Airflow connection delta_mirror_store and DELTA_MIRROR_STORE
-- in docker-compose.yaml point here). The schema is created by `delta-mirror init` (airflow-init).
CREATE ROLE delta_mirror LOGIN PASSWORD 'delta_mirror';
CREATE DATABASE delta_mirror OWNER delta_mirror;

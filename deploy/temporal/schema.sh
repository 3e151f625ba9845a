#!/bin/sh
# Temporal's schema in PostgreSQL, run by the `temporal-schema` service of
# docker-compose.yml in the temporalio/admin-tools image (whose tag matches the
# server's, so the schema files are the server's own).
#
# Safe to run on every `docker compose up`: a database that already has a
# schema is only brought up to date (setup-schema runs on a fresh one only).
set -eu

: "${POSTGRES_SEEDS:?names the PostgreSQL host}"
: "${POSTGRES_USER:?names the PostgreSQL user}"
: "${SQL_PASSWORD:?is the PostgreSQL password}"
PORT="${DB_PORT:-5432}"
SCHEMA=/etc/temporal/schema/postgresql/v12

# sql DATABASE COMMAND [ARGS...]; the password comes from SQL_PASSWORD.
sql() {
    db="$1"
    shift
    temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$PORT" \
        -u "$POSTGRES_USER" --db "$db" "$@"
}

for db in temporal temporal_visibility; do
    case "$db" in
        temporal) dir="$SCHEMA/temporal/versioned" ;;
        *) dir="$SCHEMA/visibility/versioned" ;;
    esac
    sql "$db" create-database
    if ! sql "$db" update-schema -d "$dir"; then
        echo "no schema in $db yet: setting it up"
        sql "$db" setup-schema -v 0.0
        sql "$db" update-schema -d "$dir"
    fi
    echo "$db: schema up to date"
done

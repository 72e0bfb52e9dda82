#!/usr/bin/env bash
# Start the services the tests need: a real PostgreSQL server for the run store's fleet backend,
# and headless Chromium, which opens every HTML report in tests/report/test_report_browser.py.
# Runs as root on a fresh Debian machine (called by .ci/run before `make test`). Idempotent.
# The tests connect to the fixed DSN below (override with TRAINPERF_TEST_PG):
#   postgresql://trainperf:trainperf@127.0.0.1:5432/trainperf
set -euo pipefail
if ! command -v pg_lsclusters >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
fi
if ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
fi
VER=$(ls /usr/lib/postgresql | sort -V | tail -1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$VER main$"; then
    pg_createcluster "$VER" main -p 5432
fi
if ! pg_lsclusters -h | grep -q "^$VER *main .*online"; then
    pg_ctlcluster "$VER" main start
fi
for _ in $(seq 1 30); do
    su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
    sleep 1
done
su postgres -c "psql -v ON_ERROR_STOP=1 -qAt" <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'trainperf') THEN
    CREATE ROLE trainperf LOGIN PASSWORD 'trainperf';
  END IF;
END $$;
SQL
if ! su postgres -c "psql -qAtc \"select 1 from pg_database where datname='trainperf'\"" | grep -q 1; then
    su postgres -c "createdb -O trainperf trainperf"
fi
echo "postgresql ready: postgresql://trainperf:trainperf@127.0.0.1:5432/trainperf"

#!/usr/bin/env bash
# Makes a PostgreSQL server answer on 127.0.0.1:$PORT for the ledger tests and prints the URL they
# connect with. A server already answering there is used as it is (never restarted or reconfigured).
# Otherwise: install the OS package `postgresql` (Debian/Ubuntu) if needed, create the cluster
# $CLUSTER if it does not exist, start it, and give the postgres role a password the tests use
# (Debian's pg_hba.conf asks TCP clients for one). Needs root, as apt-get does.
set -euo pipefail
PORT="${GATEWAY_TEST_PG_PORT:-5432}"
CLUSTER="${GATEWAY_TEST_PG_CLUSTER:-main}"
PASSWORD="${GATEWAY_TEST_PG_PASSWORD:-gateway-tests}"
PY="${PYTHON:-.venv/bin/python}"

answers() {  # $1: URL
  "$PY" -c 'import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()' "$1" 2>/dev/null
}

TRUST_URL="postgresql://postgres@127.0.0.1:${PORT}/postgres"
PASSWORD_URL="postgresql://postgres:${PASSWORD}@127.0.0.1:${PORT}/postgres"
for url in "$TRUST_URL" "$PASSWORD_URL"; do
  if answers "$url"; then echo "$url"; exit 0; fi
done

if ! command -v pg_createcluster >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "installing postgresql (apt-get)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
VERSION="$(ls /usr/lib/postgresql | sort -V | tail -1)"
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$VERSION $CLUSTER"; then
  echo "creating cluster $VERSION/$CLUSTER on port $PORT" >&2
  pg_createcluster "$VERSION" "$CLUSTER" --port "$PORT" >/dev/null
fi
pg_ctlcluster "$VERSION" "$CLUSTER" start 2>/dev/null || true  # already running is fine
for _ in $(seq 1 50); do
  runuser -u postgres -- psql -p "$PORT" -qAtc "SELECT 1" >/dev/null 2>&1 && break
  sleep 0.2
done
runuser -u postgres -- psql -p "$PORT" -qc "ALTER ROLE postgres PASSWORD '${PASSWORD}'" >/dev/null
if answers "$PASSWORD_URL"; then echo "$PASSWORD_URL"; exit 0; fi
echo "PostgreSQL cluster $VERSION/$CLUSTER does not answer on 127.0.0.1:$PORT" >&2
exit 1

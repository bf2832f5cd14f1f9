#!/bin/sh
# Stand-in for the official postgres image's entrypoint (tests on machines that cannot pull it):
# initialises the data folder on first start from POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB,
# then runs `postgres` with the given arguments as the postgres user.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  printf '%s' "${POSTGRES_PASSWORD:-postgres}" > /tmp/pwfile
  chown postgres /tmp/pwfile
  su postgres -s /bin/sh -c "$BIN/initdb -E UTF8 --locale=C -D '$PGDATA' -U '${POSTGRES_USER:-postgres}' --pwfile=/tmp/pwfile -A scram-sha-256 >/dev/null"
  rm -f /tmp/pwfile
  su postgres -s /bin/sh -c "$BIN/pg_ctl -D '$PGDATA' -o '-c listen_addresses= ' -w start >/dev/null"
  DB=${POSTGRES_DB:-${POSTGRES_USER:-postgres}}
  if [ "$DB" != "postgres" ]; then
    su postgres -s /bin/sh -c "PGPASSWORD='${POSTGRES_PASSWORD:-postgres}' $BIN/psql -h /var/run/postgresql -U '${POSTGRES_USER:-postgres}' -d postgres -c 'CREATE DATABASE \"$DB\"' >/dev/null"
  fi
  su postgres -s /bin/sh -c "$BIN/pg_ctl -D '$PGDATA' -w stop >/dev/null"
fi
[ "${1:-}" = "postgres" ] && shift
exec su postgres -s /bin/sh -c "exec $BIN/postgres -D '$PGDATA' $*"

"""Schema version 12: what a tenant's budget reservations hold, per replica, kept by
triggers on `reservations` in the transaction that writes them, so an admission reads a row
per replica instead of every reservation the tenant holds; and its purge finds what no
longer holds through two indexes (settled, by engine and last interval; by replica and
age), not by a scan. The statements the stores run on reservations (gateway/tenancy/store.py
has their life).

Statements use `{REAL}` and `{BIGINT}` (sql.schema fills them per dialect).
"""

from __future__ import annotations

MIGRATION: tuple[str, ...] = (
    """CREATE TABLE reservation_totals (
        tenant TEXT NOT NULL, replica TEXT NOT NULL, energy_j {REAL} NOT NULL,
        carbon_g {REAL} NOT NULL, cost_usd {REAL} NOT NULL, open_n {BIGINT} NOT NULL,
        rows_n {BIGINT} NOT NULL, settled_last {BIGINT}, PRIMARY KEY (tenant, replica))""",
    "DROP INDEX IF EXISTS reservations_tenant",
    "CREATE INDEX reservations_final ON reservations (tenant, open, engine, last_interval)",
    "CREATE INDEX reservations_replica ON reservations (tenant, replica, created_s)",
)

# reservation_totals, kept row by row: a reservation adds to its (tenant, replica) row, a
# settlement moves it, a delete takes it out (the row goes with its last reservation, so its
# sums start again from exact zeros). `settled_last` is the highest last interval settled
# there: it only grows (a reservation purged as final had the lower intervals).
_TOTALS_ADD = """INSERT INTO reservation_totals (tenant, replica, energy_j, carbon_g, cost_usd,
    open_n, rows_n, settled_last) VALUES (NEW.tenant, NEW.replica, NEW.energy_j, NEW.carbon_g,
    NEW.cost_usd, NEW.open, 1, CASE WHEN NEW.open = 0 THEN NEW.last_interval END)
    ON CONFLICT (tenant, replica) DO UPDATE SET
    energy_j = reservation_totals.energy_j + excluded.energy_j,
    carbon_g = reservation_totals.carbon_g + excluded.carbon_g,
    cost_usd = reservation_totals.cost_usd + excluded.cost_usd,
    open_n = reservation_totals.open_n + excluded.open_n,
    rows_n = reservation_totals.rows_n + 1,
    settled_last = CASE WHEN reservation_totals.settled_last IS NULL
        OR excluded.settled_last > reservation_totals.settled_last THEN excluded.settled_last
        ELSE reservation_totals.settled_last END"""
_TOTALS_MOVE = """UPDATE reservation_totals SET energy_j = energy_j - OLD.energy_j + NEW.energy_j,
    carbon_g = carbon_g - OLD.carbon_g + NEW.carbon_g,
    cost_usd = cost_usd - OLD.cost_usd + NEW.cost_usd, open_n = open_n - OLD.open + NEW.open,
    settled_last = CASE WHEN NEW.open = 0 AND (settled_last IS NULL
        OR NEW.last_interval > settled_last) THEN NEW.last_interval ELSE settled_last END
    WHERE tenant = OLD.tenant AND replica = OLD.replica"""
_TOTALS_TAKE = """UPDATE reservation_totals SET energy_j = energy_j - OLD.energy_j,
    carbon_g = carbon_g - OLD.carbon_g, cost_usd = cost_usd - OLD.cost_usd,
    open_n = open_n - OLD.open, rows_n = rows_n - 1
    WHERE tenant = OLD.tenant AND replica = OLD.replica"""
_TOTALS_GONE = """DELETE FROM reservation_totals
    WHERE tenant = OLD.tenant AND replica = OLD.replica AND rows_n = 0"""
_TOTALS_TRIGGERS = (("reservations_add", "INSERT", (_TOTALS_ADD,)),
                    ("reservations_move", "UPDATE", (_TOTALS_MOVE,)),
                    ("reservations_take", "DELETE", (_TOTALS_TAKE, _TOTALS_GONE)))
# A settlement moves a reservation's sums within its (tenant, replica) row: no statement may
# move it to another row.
_KEEPS_ITS_ROW = "a reservation keeps its tenant and replica"
# The totals of the reservations there were before the triggers (after them: every write
# that follows is counted once, by its trigger).
_TOTALS_BACKFILL = """INSERT INTO reservation_totals (tenant, replica, energy_j, carbon_g,
    cost_usd, open_n, rows_n, settled_last) SELECT tenant, replica, SUM(energy_j),
    SUM(carbon_g), SUM(cost_usd), SUM(open), COUNT(*),
    MAX(CASE WHEN open = 0 THEN last_interval END) FROM reservations GROUP BY tenant, replica"""


def _sqlite() -> tuple[str, ...]:
    return (
        *(f"CREATE TRIGGER {name} AFTER {event} ON reservations BEGIN "
          + "; ".join(body) + "; END" for name, event, body in _TOTALS_TRIGGERS),
        f"""CREATE TRIGGER reservations_keep BEFORE UPDATE OF tenant, replica ON reservations
            WHEN OLD.tenant IS NOT NEW.tenant OR OLD.replica IS NOT NEW.replica
            BEGIN SELECT RAISE(ABORT, '{_KEEPS_ITS_ROW}'); END""",
        _TOTALS_BACKFILL,
    )


def _postgres() -> tuple[str, ...]:
    # Writers of other replicas (a rolling upgrade) wait until the migration commits, so
    # the backfill and the triggers see every write once.
    out = ["LOCK TABLE reservations IN SHARE ROW EXCLUSIVE MODE"]
    for name, event, body in _TOTALS_TRIGGERS:
        out.append(f"""CREATE FUNCTION wattgate_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN {"; ".join(body)}; RETURN NULL; END $$""")
        out.append(f"""CREATE TRIGGER {name} AFTER {event} ON reservations FOR EACH ROW
            EXECUTE FUNCTION wattgate_{name}()""")
    out.append(f"""CREATE FUNCTION wattgate_reservations_keep() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN
        IF OLD.tenant IS DISTINCT FROM NEW.tenant OR OLD.replica IS DISTINCT FROM NEW.replica
        THEN RAISE EXCEPTION '{_KEEPS_ITS_ROW}'; END IF; RETURN NEW; END $$""")
    out.append("""CREATE TRIGGER reservations_keep BEFORE UPDATE OF tenant, replica
        ON reservations FOR EACH ROW EXECUTE FUNCTION wattgate_reservations_keep()""")
    out.append(_TOTALS_BACKFILL)
    return tuple(out)


DIALECT_MIGRATION: dict[str, tuple[str, ...]] = {"sqlite": _sqlite(), "postgres": _postgres()}

# Reservations that hold nothing any more, found through the indexes, as an admission purges
# them before it reads what its tenant holds: those of requests whose shares are final (the
# interval after their last one is apportioned), per engine; and expired ones (never
# settled: a replica died), per replica the tenant holds reservations on.
# (CROSS JOIN: SQLite walks the few engines or replicas first, then the index range of
# each; PostgreSQL plans it as any inner join.)
PURGE_FINAL = """DELETE FROM reservations WHERE request_id IN (SELECT r.request_id
    FROM engine_state e CROSS JOIN reservations r WHERE r.tenant = ? AND r.open = 0
    AND r.engine = e.engine AND r.last_interval <= e.next_interval - 2)"""
PURGE_EXPIRED = """DELETE FROM reservations WHERE request_id IN (SELECT r.request_id
    FROM reservation_totals t CROSS JOIN reservations r WHERE t.tenant = ?
    AND r.tenant = t.tenant AND r.replica = t.replica AND r.created_s < ?)"""
# What a tenant's reservations hold once purged (their totals); its requests in flight
# (open) on live replicas: a replica with requests open re-publishes its watermark every
# second; of one not heard from (just started, or gone), the young reservations count; and
# the last interval of its finished requests not yet final (they are, once the interval after
# it is apportioned; it may be one already final, never one lower than the last not final).
SELECT_HELD_TOTALS = """SELECT COALESCE(SUM(t.energy_j), 0), COALESCE(SUM(t.carbon_g), 0),
    COALESCE(SUM(t.cost_usd), 0), COALESCE(SUM(CASE WHEN t.open_n = 0 THEN 0
    WHEN t.replica IN (SELECT replica FROM replicas WHERE seen_s >= ?) THEN t.open_n
    ELSE (SELECT COALESCE(SUM(r.open), 0) FROM reservations r WHERE r.tenant = t.tenant
          AND r.replica = t.replica AND r.created_s >= ? AND r.open > 0) END), 0),
    MAX(t.settled_last) FROM reservation_totals t WHERE t.tenant = ?"""
# The same without a purge (a read-only look: /v1/usage, reports): every reservation read.
SELECT_HELD = """SELECT COALESCE(SUM(energy_j), 0), COALESCE(SUM(carbon_g), 0),
    COALESCE(SUM(cost_usd), 0), COALESCE(SUM(CASE WHEN open > 0 AND (created_s >= ?
    OR replica IN (SELECT replica FROM replicas WHERE seen_s >= ?)) THEN open ELSE 0 END), 0)
    FROM reservations WHERE tenant = ? AND created_s >= ? AND NOT COALESCE(
    last_interval + 2 <= (SELECT e.next_interval FROM engine_state e
                          WHERE e.engine = reservations.engine), FALSE)"""
INSERT_RESERVATION = """INSERT INTO reservations (request_id, tenant, replica, created_s,
    energy_j, carbon_g, cost_usd, open, engine, last_interval)
    VALUES (?, ?, ?, ?, ?, ?, ?, 1, NULL, NULL) ON CONFLICT (request_id) DO NOTHING"""
SETTLE_RESERVATION = """UPDATE reservations SET open = 0, energy_j = ?, carbon_g = ?,
    cost_usd = ?, engine = ?, last_interval = ? WHERE request_id = ?"""
DELETE_RESERVATION = "DELETE FROM reservations WHERE request_id = ?"
# An allowance (gateway/tenancy/allowance.py): a reservation row with no engine holding the
# room of requests its replica admits without a transaction each; `open` is the cap's slots
# it holds (0 for a tenant without a cap), so the counts of open requests above sum `open`.
UPSERT_ALLOWANCE = """INSERT INTO reservations (request_id, tenant, replica, created_s,
    energy_j, carbon_g, cost_usd, open, engine, last_interval)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL) ON CONFLICT (request_id) DO UPDATE SET
    created_s = excluded.created_s, energy_j = excluded.energy_j,
    carbon_g = excluded.carbon_g, cost_usd = excluded.cost_usd, open = excluded.open"""
# The row of a request admitted from an allowance that ended before its row was written, or
# one row for those of them that ended on one engine in one last interval (their settlements'
# sum): written settled (as SETTLE_RESERVATION leaves one).
INSERT_SETTLED = """INSERT INTO reservations (request_id, tenant, replica, created_s, energy_j,
    carbon_g, cost_usd, open, engine, last_interval) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)
    ON CONFLICT (request_id) DO NOTHING"""

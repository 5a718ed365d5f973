"""Schema migrations and statements shared by both stores (`?` placeholders; the PostgreSQL
store rewrites them to `$n`). Column types are filled in per dialect."""

from __future__ import annotations

import functools
import re

from accounting.ledger import reservation_schema, rollup_schema

# version -> statements; a store applies every version above the one it finds, in order.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE requests (
            request_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, model TEXT NOT NULL,
            engine TEXT NOT NULL, precision TEXT NOT NULL, slo_class TEXT NOT NULL,
            status TEXT NOT NULL, stream INTEGER NOT NULL, arrived_s {REAL} NOT NULL,
            finished_s {REAL} NOT NULL, finished_hour {BIGINT} NOT NULL,
            prompt_tokens {BIGINT} NOT NULL, completion_tokens {BIGINT} NOT NULL,
            slo_met INTEGER NOT NULL, last_interval {BIGINT}, replica TEXT NOT NULL)""",
        "CREATE INDEX requests_finished ON requests (finished_s)",
        """CREATE TABLE work (
            request_id TEXT NOT NULL, engine TEXT NOT NULL, interval_idx {BIGINT} NOT NULL,
            prefill {REAL} NOT NULL, decode {REAL} NOT NULL, residency_s {REAL} NOT NULL,
            start_s {REAL} NOT NULL, kv {REAL} NOT NULL, apportioned INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (engine, interval_idx, request_id))""",
        "CREATE INDEX work_pending ON work (engine, interval_idx) WHERE apportioned = 0",
        "CREATE INDEX work_request ON work (request_id)",
        """CREATE TABLE intervals (
            engine TEXT NOT NULL, interval_idx {BIGINT} NOT NULL, start_s {REAL} NOT NULL,
            hour_idx {BIGINT} NOT NULL, interval_s {REAL} NOT NULL, model TEXT NOT NULL,
            precision TEXT NOT NULL, gpus INTEGER NOT NULL, energy_j {REAL} NOT NULL,
            static_j {REAL} NOT NULL, dynamic_j {REAL} NOT NULL, idle_j {REAL} NOT NULL,
            idle_s {REAL} NOT NULL, idle_carbon_g {REAL} NOT NULL, idle_cost_usd {REAL} NOT NULL,
            estimated INTEGER NOT NULL, alpha {REAL} NOT NULL, beta {REAL} NOT NULL,
            gamma {REAL} NOT NULL, PRIMARY KEY (engine, interval_idx))""",
        "CREATE INDEX intervals_start ON intervals (start_s)",
        """CREATE TABLE shares (
            request_id TEXT NOT NULL, engine TEXT NOT NULL, interval_idx {BIGINT} NOT NULL,
            start_s {REAL} NOT NULL, hour_idx {BIGINT} NOT NULL, energy_j {REAL} NOT NULL,
            static_j {REAL} NOT NULL, dynamic_j {REAL} NOT NULL, gpu_s {REAL} NOT NULL,
            carbon_g {REAL} NOT NULL, cost_usd {REAL} NOT NULL, estimated INTEGER NOT NULL,
            PRIMARY KEY (engine, interval_idx, request_id))""",
        "CREATE INDEX shares_request ON shares (request_id)",
        "CREATE INDEX shares_start ON shares (start_s)",
        """CREATE TABLE engine_state (
            engine TEXT PRIMARY KEY, next_interval {BIGINT} NOT NULL, boundary_s {REAL} NOT NULL,
            boundary_j {REAL} NOT NULL, resets INTEGER NOT NULL)""",
    )),
    # Work rows are written for every request and interval: one index fewer to update per
    # row (a request's pending work is found through work_pending).
    (2, ("DROP INDEX IF EXISTS work_request",)),
    # A request's shares are found by key, interval by interval over the span of its work
    # (first_interval..last_interval), not through an index by request id: that index took a
    # write on a page of its own for every share of a long request (every interval it spans,
    # among the other requests of its time), and most of the apportioner's commit with it.
    (3, (
        "ALTER TABLE requests ADD COLUMN first_interval {BIGINT}",
        """UPDATE requests SET first_interval = w.lo,
            last_interval = CASE WHEN w.hi > last_interval THEN w.hi ELSE last_interval END
            FROM (SELECT request_id, engine, MIN(interval_idx) AS lo, MAX(interval_idx) AS hi
                  FROM work GROUP BY request_id, engine) AS w
            WHERE w.request_id = requests.request_id AND w.engine = requests.engine""",
        "DROP INDEX IF EXISTS shares_request",
    )),
    # Each replica's watermark: the wall-clock arrival of its oldest request still being
    # served (NULL: none), so the apportioner waits for requests in flight over an interval
    # instead of re-apportioning it each time one of them finishes.
    (4, (
        """CREATE TABLE replicas (
            replica TEXT PRIMARY KEY, open_since_s {REAL}, seen_s {REAL} NOT NULL)""",
    )),
    # Late work is found per interval, not per row: every append bumps the version of each
    # (engine, interval) it wrote work for and flags it dirty; the apportioner clears the flag
    # of an interval it apportioned if the version is still the one it read. No work row is
    # updated after its insert, and the partial index of unapportioned rows (an insert and a
    # delete in it for every row) goes. `work.apportioned` stays, unused (SQLite before 3.35
    # cannot drop a column).
    (5, (
        """CREATE TABLE work_versions (
            engine TEXT NOT NULL, interval_idx {BIGINT} NOT NULL, version {BIGINT} NOT NULL,
            dirty INTEGER NOT NULL, PRIMARY KEY (engine, interval_idx))""",
        "CREATE INDEX work_dirty ON work_versions (engine, interval_idx) WHERE dirty = 1",
        """INSERT INTO work_versions (engine, interval_idx, version, dirty)
            SELECT engine, interval_idx, 1, MAX(CASE WHEN apportioned = 0 THEN 1 ELSE 0 END)
            FROM work GROUP BY engine, interval_idx""",
        "DROP INDEX IF EXISTS work_pending",
    )),
    # An engine's counters survive a gateway restart: per GPU the raw counter last seen and
    # the offset added to it (JSON arrays), so the next gateway continues the same series and
    # charges the downtime; and the check's two sums (the counters' growth, the energy of the
    # intervals apportioned) since it began. NULL where a gateway before v6 wrote the row.
    (6, tuple(f"ALTER TABLE engine_state ADD COLUMN {column}" for column in (
        "counter_seen_s {REAL}", "counter_raw_j TEXT", "counter_offset_j TEXT",
        "counter_resets INTEGER", "metered_j {REAL}", "apportioned_j {REAL}"))),
    # How a request's prompt tokens were counted: "engine" (its usage), "gateway" (the
    # model's tokenizer, when the request ended before its usage came) or "estimate".
    (7, ("ALTER TABLE requests ADD COLUMN prompt_source TEXT NOT NULL DEFAULT 'engine'",)),
    # Tenant controls. Each tenant's charges per hour, kept by the apportioner's commit in the
    # transaction that writes the shares, so a budget check reads a few rows, not the shares;
    # and the budget reservations of requests admitted but not yet charged (see
    # gateway/tenancy/store.py for their life).
    (8, (
        """CREATE TABLE tenant_hours (
            tenant TEXT NOT NULL, hour_idx {BIGINT} NOT NULL, energy_j {REAL} NOT NULL,
            carbon_g {REAL} NOT NULL, cost_usd {REAL} NOT NULL, PRIMARY KEY (tenant, hour_idx))""",
        """INSERT INTO tenant_hours (tenant, hour_idx, energy_j, carbon_g, cost_usd)
            SELECT r.tenant, s.hour_idx, SUM(s.energy_j), SUM(s.carbon_g), SUM(s.cost_usd)
            FROM shares s JOIN requests r ON r.request_id = s.request_id
            GROUP BY r.tenant, s.hour_idx""",
        """CREATE TABLE reservations (
            request_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, replica TEXT NOT NULL,
            created_s {REAL} NOT NULL, energy_j {REAL} NOT NULL, carbon_g {REAL} NOT NULL,
            cost_usd {REAL} NOT NULL, open INTEGER NOT NULL, engine TEXT,
            last_interval {BIGINT})""",
        "CREATE INDEX reservations_tenant ON reservations (tenant)",
    )),
    # How a request ended: the HTTP status it was answered, its outcome class
    # (core/outcomes.py) and, for the failed account (accounting/failed.py), the
    # wall-clock time of its last read that carried a token event to the client. Rows from
    # before v9 get their class from their status: an engine's 4xx but 429 is refused, a
    # request no engine ran refused (the gateway said no), any other failed.
    # Each engine's failed account beside its idle account, per interval, and each share's
    # part that went there.
    (9, (
        "ALTER TABLE requests ADD COLUMN http_status INTEGER",
        "ALTER TABLE requests ADD COLUMN outcome TEXT NOT NULL DEFAULT 'served'",
        "ALTER TABLE requests ADD COLUMN delivered_s {REAL}",
        """UPDATE requests SET outcome = CASE
            WHEN status = 'ok' THEN 'served'
            WHEN status = 'client_disconnected' THEN 'cancelled'
            WHEN status = 'upstream_http_429' THEN 'failed'
            WHEN status LIKE 'upstream_http_4%' THEN 'refused'
            WHEN last_interval IS NULL THEN 'refused'
            ELSE 'failed' END""",
        "ALTER TABLE intervals ADD COLUMN failed_j {REAL} NOT NULL DEFAULT 0",
        "ALTER TABLE intervals ADD COLUMN failed_carbon_g {REAL} NOT NULL DEFAULT 0",
        "ALTER TABLE intervals ADD COLUMN failed_cost_usd {REAL} NOT NULL DEFAULT 0",
        "ALTER TABLE shares ADD COLUMN failed_j {REAL} NOT NULL DEFAULT 0",
    )),
    # Hourly rollups kept for ever (rollup_schema.py), so per-request rows can be pruned.
    (10, rollup_schema.MIGRATION),
    # Work in packs, one row per (engine, interval) and append (packs.py): a B-tree insert
    # per interval an append writes to, not per request and interval. The per-row table
    # stays for the rows written before, read with the packs until retention prunes them.
    (11, (
        """CREATE TABLE work_packs (
            engine TEXT NOT NULL, interval_idx {BIGINT} NOT NULL, version {BIGINT} NOT NULL,
            n_rows INTEGER NOT NULL, packed {BLOB} NOT NULL,
            PRIMARY KEY (engine, interval_idx, version))""",
    )),
    # Reservation totals (reservation_schema.py).
    (12, reservation_schema.MIGRATION),
    # Version 13 is empty: a development build used it for a column nothing reads (a ledger
    # it wrote keeps it, with its default; the packs it wrote read their prefill as a head).
    (13, ()),
    # Each work row's head (WorkRow.head_s, head_decode; accounting/heads.py): its seconds
    # from the residency's start (its prefill, or its decode up to where the pace changed)
    # and the decode tokens in it; the apportioner weighs the head's steps over the head and
    # the rest over the rest. Rows written before have 0 (the packs' arrays lack them, which
    # read as 0): their steps are weighed over the whole residency, as they were.
    (14, ("ALTER TABLE work ADD COLUMN head_s {REAL} NOT NULL DEFAULT 0",
          "ALTER TABLE work ADD COLUMN head_decode {REAL} NOT NULL DEFAULT 0")),
)
# Statements one store runs after a version's shared ones.
DIALECT_MIGRATIONS: dict[str, dict[int, tuple[str, ...]]] = {
    "sqlite": {
        # Work clustered by its key: the rows the apportioner reads and marks for one interval
        # lie together, so a commit writes a few pages, not one page per request.
        2: (
            """CREATE TABLE work_clustered (
                request_id TEXT NOT NULL, engine TEXT NOT NULL, interval_idx {BIGINT} NOT NULL,
                prefill {REAL} NOT NULL, decode {REAL} NOT NULL, residency_s {REAL} NOT NULL,
                start_s {REAL} NOT NULL, kv {REAL} NOT NULL,
                apportioned INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (engine, interval_idx, request_id)) WITHOUT ROWID""",
            """INSERT INTO work_clustered SELECT request_id, engine, interval_idx, prefill,
                decode, residency_s, start_s, kv, apportioned FROM work""",
            "DROP TABLE work",
            "ALTER TABLE work_clustered RENAME TO work",
            # `apportioned` in the key too: with equality on it the planner takes this small
            # index for pending work, not a range scan of the whole table by its primary key.
            """CREATE INDEX work_pending ON work (engine, apportioned, interval_idx)
                WHERE apportioned = 0""",
        ),
        10: rollup_schema.DIALECT_MIGRATION["sqlite"],
        # request_hours kept by the append's statement (rollup_schema.ADD_NEW_REQUEST_HOURS)
        11: ("DROP TRIGGER IF EXISTS requests_hours",),
        12: reservation_schema.DIALECT_MIGRATION["sqlite"],
    },
    "postgres": {10: rollup_schema.DIALECT_MIGRATION["postgres"],
                 12: reservation_schema.DIALECT_MIGRATION["postgres"]},
}
SCHEMA_VERSION = MIGRATIONS[-1][0]

CREATE_VERSION = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
GET_VERSION = "SELECT MAX(version) FROM schema_version"
SET_VERSION = "INSERT INTO schema_version (version) VALUES (?)"

INSERT_REQUEST = """INSERT INTO requests (request_id, tenant, model, engine, precision, slo_class,
    status, stream, arrived_s, finished_s, finished_hour, prompt_tokens, completion_tokens,
    slo_met, first_interval, last_interval, replica, prompt_source, http_status, outcome,
    delivered_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (request_id) DO NOTHING"""
INSERT_WORK = """INSERT INTO work (request_id, interval_idx, prefill, decode, residency_s, start_s,
    kv, head_s, head_decode, engine, apportioned) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
    ON CONFLICT DO NOTHING"""
UPSERT_REPLICA = """INSERT INTO replicas (replica, open_since_s, seen_s) VALUES (?, ?, ?)
    ON CONFLICT (replica) DO UPDATE SET open_since_s = excluded.open_since_s,
    seen_s = excluded.seen_s"""
# The earliest watermark of the replicas heard from since a time (the others are gone).
SELECT_OPEN_SINCE = """SELECT MIN(open_since_s) FROM replicas
    WHERE seen_s >= ? AND open_since_s IS NOT NULL"""
STATE_COLUMNS = ("engine, next_interval, boundary_s, boundary_j, resets, counter_seen_s, "
                 "counter_raw_j, counter_offset_j, counter_resets, metered_j, apportioned_j")
SELECT_STATES = f"SELECT {STATE_COLUMNS} FROM engine_state"
# A WorkRow's columns. Tenants are read apart, once per request (SELECT_TENANTS), not joined
# onto each of its rows.
SELECT_WORK = """SELECT request_id, interval_idx, prefill, decode, residency_s, start_s, kv,
    head_s, head_decode FROM work WHERE engine = ? AND interval_idx >= ? AND interval_idx <= ?"""
# Each append, per (engine, interval) it wrote work for (in key order: two replicas' appends
# take the rows' locks in the same order).
UPSERT_VERSION = """INSERT INTO work_versions (engine, interval_idx, version, dirty)
    VALUES (?, ?, 1, 1) ON CONFLICT (engine, interval_idx)
    DO UPDATE SET version = work_versions.version + 1, dirty = 1"""
SELECT_VERSIONS = """SELECT interval_idx, version FROM work_versions
    WHERE engine = ? AND interval_idx >= ? AND interval_idx <= ?"""
# An interval apportioned from what the apportioner read: clean unless written to since.
CLEAR_DIRTY = """UPDATE work_versions SET dirty = 0
    WHERE engine = ? AND interval_idx = ? AND version = ?"""
SELECT_TENANTS = """SELECT request_id, tenant, outcome, delivered_s FROM requests
    WHERE request_id IN ({MARKS})"""
SELECT_TENANT_SHARES = """SELECT s.interval_idx, COALESCE(r.tenant, ''), SUM(s.energy_j),
    SUM(s.carbon_g), SUM(s.cost_usd) FROM shares s
    LEFT JOIN requests r ON r.request_id = s.request_id
    WHERE s.engine = ? AND s.interval_idx >= ? AND s.interval_idx <= ?
    GROUP BY s.interval_idx, COALESCE(r.tenant, '')"""
SELECT_DIRTY = """SELECT interval_idx FROM work_versions
    WHERE engine = ? AND dirty = 1 AND interval_idx < ? ORDER BY interval_idx"""
INTERVAL_COLUMNS = ("engine, interval_idx, start_s, interval_s, model, precision, gpus, energy_j, "
                    "static_j, dynamic_j, idle_j, idle_s, idle_carbon_g, idle_cost_usd, "
                    "estimated, alpha, beta, gamma, failed_j, failed_carbon_g, failed_cost_usd")
SELECT_INTERVALS = f"""SELECT {INTERVAL_COLUMNS} FROM intervals
    WHERE engine = ? AND interval_idx >= ? AND interval_idx <= ?"""
UPSERT_INTERVAL = f"""INSERT INTO intervals ({INTERVAL_COLUMNS}, hour_idx)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (engine, interval_idx) DO UPDATE SET energy_j = excluded.energy_j,
    failed_j = excluded.failed_j, failed_carbon_g = excluded.failed_carbon_g,
    failed_cost_usd = excluded.failed_cost_usd,
    static_j = excluded.static_j, dynamic_j = excluded.dynamic_j, idle_j = excluded.idle_j,
    idle_s = excluded.idle_s, idle_carbon_g = excluded.idle_carbon_g,
    idle_cost_usd = excluded.idle_cost_usd, estimated = excluded.estimated,
    alpha = excluded.alpha, beta = excluded.beta, gamma = excluded.gamma"""
DELETE_SHARES = "DELETE FROM shares WHERE engine = ? AND interval_idx = ?"
SELECT_TENANT_HOURS = """SELECT hour_idx, energy_j, carbon_g, cost_usd FROM tenant_hours
    WHERE tenant = ? AND hour_idx >= ?"""
SELECT_LIVE_REPLICAS = "SELECT COUNT(*) FROM replicas WHERE seen_s >= ?"
# A tenant's latest final requests (the interval after their last one apportioned) since a
# time, each with its charges: what its budget reservations learn from (tenancy/rates.py).
SELECT_TENANT_BILLS = """SELECT r.precision, r.prompt_tokens, r.completion_tokens,
    SUM(s.energy_j), SUM(s.carbon_g), SUM(s.cost_usd)
    FROM shares s JOIN requests r ON r.request_id = s.request_id
    WHERE s.start_s >= ? AND r.tenant = ? AND r.arrived_s >= ? AND r.last_interval IS NOT NULL
    AND r.last_interval + 2 <= (SELECT e.next_interval FROM engine_state e
                                WHERE e.engine = r.engine)
    GROUP BY r.request_id, r.precision, r.prompt_tokens, r.completion_tokens
    ORDER BY MAX(r.finished_s) DESC LIMIT ?"""
INSERT_SHARE = """INSERT INTO shares (request_id, engine, interval_idx, start_s, hour_idx, energy_j,
    static_j, dynamic_j, gpu_s, carbon_g, cost_usd, estimated, failed_j)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
UPSERT_STATE = f"""INSERT INTO engine_state ({STATE_COLUMNS})
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (engine) DO UPDATE SET
    next_interval = excluded.next_interval, boundary_s = excluded.boundary_s,
    boundary_j = excluded.boundary_j, resets = excluded.resets,
    counter_seen_s = excluded.counter_seen_s, counter_raw_j = excluded.counter_raw_j,
    counter_offset_j = excluded.counter_offset_j, counter_resets = excluded.counter_resets,
    metered_j = excluded.metered_j, apportioned_j = excluded.apportioned_j"""
# A clean stop's last counters, without touching where apportioning stands (the stopping
# process may not have seen its own last commit complete).
UPDATE_COUNTER = """UPDATE engine_state SET counter_seen_s = ?, counter_raw_j = ?,
    counter_offset_j = ?, counter_resets = ?, metered_j = ? WHERE engine = ?"""

SELECT_REQUEST = """SELECT request_id, tenant, model, engine, precision, slo_class, status, stream,
    arrived_s, finished_s, prompt_tokens, completion_tokens, slo_met, first_interval,
    last_interval, replica, prompt_source, http_status, outcome FROM requests
    WHERE request_id = ?"""
REQUEST_COLUMNS = ("request_id", "tenant", "model", "engine", "precision", "slo_class", "status",
                   "stream", "arrived_s", "finished_s", "prompt_tokens", "completion_tokens",
                   "slo_met", "first_interval", "last_interval", "replica", "prompt_source",
                   "http_status", "outcome")
# One key look-up per interval of the request's work span (first, last, engine, request).
SELECT_REQUEST_TOTALS = """WITH RECURSIVE span(k) AS (
        SELECT CAST(? AS BIGINT) UNION ALL SELECT k + 1 FROM span WHERE k < CAST(? AS BIGINT))
    SELECT COUNT(*), COALESCE(SUM(s.energy_j), 0), COALESCE(SUM(s.static_j), 0),
    COALESCE(SUM(s.dynamic_j), 0), COALESCE(SUM(s.gpu_s), 0), COALESCE(SUM(s.carbon_g), 0),
    COALESCE(SUM(s.cost_usd), 0), COALESCE(MAX(s.estimated), 0), COALESCE(SUM(s.failed_j), 0)
    FROM span JOIN shares s ON s.engine = ? AND s.interval_idx = span.k AND s.request_id = ?"""
# Intervals of a request's span with work not yet apportioned (through the small index of
# dirty intervals): its share may still change.
SELECT_REQUEST_PENDING = """SELECT COUNT(*) FROM work_versions
    WHERE engine = ? AND dirty = 1 AND interval_idx >= ? AND interval_idx <= ?"""
SELECT_NEXT_INTERVAL = "SELECT next_interval FROM engine_state WHERE engine = ?"

USAGE_ENERGY = """SELECT r.tenant, r.model, r.precision, s.engine, s.hour_idx, SUM(s.energy_j),
    SUM(s.static_j), SUM(s.carbon_g), SUM(s.cost_usd), MAX(s.estimated), SUM(s.failed_j)
    FROM shares s JOIN requests r ON r.request_id = s.request_id
    WHERE s.start_s >= ? AND s.start_s < ? {TENANT}
    GROUP BY r.tenant, r.model, r.precision, s.engine, s.hour_idx"""
USAGE_REQUESTS = """SELECT tenant, model, precision, engine, finished_hour, COUNT(*),
    CAST(SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END) AS BIGINT),
    CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT),
    CAST(SUM(slo_met) AS BIGINT), MIN(arrived_s), MAX(finished_s),
    CAST(SUM(CASE WHEN outcome = 'served' THEN 1 ELSE 0 END) AS BIGINT),
    CAST(SUM(CASE WHEN outcome = 'refused' THEN 1 ELSE 0 END) AS BIGINT),
    CAST(SUM(CASE WHEN outcome = 'failed' THEN 1 ELSE 0 END) AS BIGINT),
    CAST(SUM(CASE WHEN outcome = 'cancelled' THEN 1 ELSE 0 END) AS BIGINT)
    FROM requests WHERE finished_s >= ? AND finished_s < ? {TENANT}
    GROUP BY tenant, model, precision, engine, finished_hour"""
USAGE_IDLE = """SELECT engine, model, precision, hour_idx, SUM(idle_j), SUM(idle_carbon_g),
    SUM(idle_cost_usd), MAX(estimated), MIN(start_s), MAX(start_s + interval_s),
    SUM(failed_j), SUM(failed_carbon_g), SUM(failed_cost_usd) FROM intervals
    WHERE start_s >= ? AND start_s < ? GROUP BY engine, model, precision, hour_idx"""


def schema(dialect: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    types = ({"REAL": "REAL", "BIGINT": "INTEGER", "BLOB": "BLOB"} if dialect == "sqlite"
             else {"REAL": "DOUBLE PRECISION", "BIGINT": "BIGINT", "BLOB": "BYTEA"})
    extra = DIALECT_MIGRATIONS.get(dialect, {})
    return tuple((v, tuple(s.format(**types) for s in (*stmts, *extra.get(v, ()))))
                 for v, stmts in MIGRATIONS)


def usage_sql(template: str, tenant: bool, column: str) -> str:
    return template.format(TENANT=f"AND {column} = ?" if tenant else "")


@functools.lru_cache(maxsize=256)
def multi_row(statement: str, n: int) -> str:
    """An `INSERT ... VALUES (...) [ON CONFLICT ...]` that inserts `n` rows in one statement
    (its parameters: the rows' values one after another)."""
    head, values, rest = statement.partition("VALUES (")
    group, close, tail = rest.partition(")")
    if not values or not close or n < 1:
        raise ValueError(f"not a one-row INSERT ... VALUES (...): {statement[:60]!r}")
    return f"{head}VALUES {', '.join([f'({group})'] * n)}{tail}"


def with_marks(template: str, n: int) -> str:
    """A statement with an `IN ({MARKS})` list of `n` placeholders."""
    return template.format(MARKS=", ".join("?" * n))


_PLACEHOLDER = re.compile(r"\?")


def numbered(sql: str) -> str:
    """`?` placeholders -> PostgreSQL's `$1, $2, ...`."""
    counter = iter(range(1, 10_000))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)

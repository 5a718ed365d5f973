"""Schema version 10: hourly rollups kept for ever, beside per-request rows kept for a
retention (accounting/ledger/retention.py).

- `request_hours`: requests by the hour they finished, per tenant, engine, model, precision
  and SLO class: counts by outcome class, tokens, SLO attainment, first arrival and last
  finish. Kept by a trigger on `requests`, which fires for the rows an append inserts and
  for none it skips (a request id written twice counts once), in the append's transaction.
- `share_hours`: the shares' energy, carbon and cost by the hour their interval starts, per
  tenant, engine, model, precision and SLO class; `engine_hours`: each engine's metered
  energy and its idle and failed accounts by the hour. The apportioner's commit takes an
  interval's old shares (and the interval's old row) out of them and puts the new ones in,
  in the transaction that writes the shares, so a rollup is the sum of the rows it covers.
  `shares`, `intervals` and `estimated_n` count what is in a row, so a revision can take
  it back out.
- `tenant_hours` (what budgets read) becomes a view of `share_hours`.

Statements use `{REAL}` and `{BIGINT}` (sql.schema fills them per dialect) and CASE, not
LEAST/GREATEST or two-argument MIN/MAX, so both stores run them.
"""

from __future__ import annotations

REQUEST_DIMS = "tenant, hour_idx, engine, model, precision, slo_class"
REQUEST_SUMS = ("requests, ok, prompt_tokens, completion_tokens, slo_met, served, refused, "
                "failed, cancelled")
SHARE_DIMS = REQUEST_DIMS
SHARE_SUMS = "shares, energy_j, static_j, carbon_g, cost_usd, failed_j, estimated_n"
ENGINE_DIMS = "engine, hour_idx, model, precision"
ENGINE_SUMS = ("intervals, energy_j, idle_j, idle_carbon_g, idle_cost_usd, failed_j, "
               "failed_carbon_g, failed_cost_usd, estimated_n")


def _add(table: str, sums: str) -> str:
    return ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in sums.split(", "))


def _lower(table: str, column: str) -> str:
    return (f"{column} = CASE WHEN excluded.{column} < {table}.{column} THEN excluded.{column} "
            f"ELSE {table}.{column} END")


def _higher(table: str, column: str) -> str:
    return (f"{column} = CASE WHEN excluded.{column} > {table}.{column} THEN excluded.{column} "
            f"ELSE {table}.{column} END")


UPSERT_REQUEST_HOURS = (
    f"ON CONFLICT ({REQUEST_DIMS}) DO UPDATE SET {_add('request_hours', REQUEST_SUMS)}, "
    f"{_lower('request_hours', 'first_arrived_s')}, "
    f"{_higher('request_hours', 'last_finished_s')}")
UPSERT_SHARE_HOURS = f"ON CONFLICT ({SHARE_DIMS}) DO UPDATE SET {_add('share_hours', SHARE_SUMS)}"
UPSERT_ENGINE_HOURS = (
    f"ON CONFLICT ({ENGINE_DIMS}) DO UPDATE SET {_add('engine_hours', ENGINE_SUMS)}, "
    f"{_lower('engine_hours', 'first_start_s')}, {_higher('engine_hours', 'last_end_s')}")


def _outcome(prefix: str, outcome: str) -> str:
    return f"CASE WHEN {prefix}outcome = '{outcome}' THEN 1 ELSE 0 END"


def request_values(prefix: str) -> str:
    """The rollup columns of one request row (`prefix`: "NEW." in a trigger)."""
    p = prefix
    return (f"{p}tenant, {p}finished_hour, {p}engine, {p}model, {p}precision, {p}slo_class, 1, "
            f"CASE WHEN {p}status = 'ok' THEN 1 ELSE 0 END, {p}prompt_tokens, "
            f"{p}completion_tokens, {p}slo_met, "
            + ", ".join(_outcome(p, o) for o in ("served", "refused", "failed", "cancelled"))
            + f", {p}arrived_s, {p}finished_s")


INSERT_REQUEST_HOURS = (f"INSERT INTO request_hours ({REQUEST_DIMS}, {REQUEST_SUMS}, "
                        "first_arrived_s, last_finished_s)")


def request_hours_of(where: str) -> str:
    """`request_hours` rows summed from the requests `where` selects."""
    return f"""{INSERT_REQUEST_HOURS}
        SELECT tenant, finished_hour, engine, model, precision, slo_class, COUNT(*),
        SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END), SUM(prompt_tokens),
        SUM(completion_tokens), SUM(slo_met), {", ".join(
            f"SUM({_outcome('', o)})" for o in ("served", "refused", "failed", "cancelled"))},
        MIN(arrived_s), MAX(finished_s) FROM requests {where}
        GROUP BY tenant, finished_hour, engine, model, precision, slo_class"""


# SQLite from schema version 11: the requests an append inserted (rowids above the largest
# before it; a request id already there inserts nothing) added to `request_hours` in one
# statement after them, not by a trigger per row (3 us of the child's CPU per record)
ADD_NEW_REQUEST_HOURS = f"{request_hours_of('WHERE rowid > ?')} {UPSERT_REQUEST_HOURS}"

MIGRATION: tuple[str, ...] = (
    f"""CREATE TABLE request_hours (
        tenant TEXT NOT NULL, hour_idx {{BIGINT}} NOT NULL, engine TEXT NOT NULL,
        model TEXT NOT NULL, precision TEXT NOT NULL, slo_class TEXT NOT NULL,
        requests {{BIGINT}} NOT NULL, ok {{BIGINT}} NOT NULL, prompt_tokens {{BIGINT}} NOT NULL,
        completion_tokens {{BIGINT}} NOT NULL, slo_met {{BIGINT}} NOT NULL,
        served {{BIGINT}} NOT NULL, refused {{BIGINT}} NOT NULL, failed {{BIGINT}} NOT NULL,
        cancelled {{BIGINT}} NOT NULL, first_arrived_s {{REAL}} NOT NULL,
        last_finished_s {{REAL}} NOT NULL, PRIMARY KEY ({REQUEST_DIMS}))""",
    "CREATE INDEX request_hours_hour ON request_hours (hour_idx)",
    request_hours_of(""),
    f"""CREATE TABLE share_hours (
        tenant TEXT NOT NULL, hour_idx {{BIGINT}} NOT NULL, engine TEXT NOT NULL,
        model TEXT NOT NULL, precision TEXT NOT NULL, slo_class TEXT NOT NULL,
        shares {{BIGINT}} NOT NULL, energy_j {{REAL}} NOT NULL, static_j {{REAL}} NOT NULL,
        carbon_g {{REAL}} NOT NULL, cost_usd {{REAL}} NOT NULL, failed_j {{REAL}} NOT NULL,
        estimated_n {{BIGINT}} NOT NULL, PRIMARY KEY ({SHARE_DIMS}))""",
    "CREATE INDEX share_hours_hour ON share_hours (hour_idx)",
    f"""INSERT INTO share_hours ({SHARE_DIMS}, {SHARE_SUMS})
        SELECT r.tenant, s.hour_idx, s.engine, r.model, r.precision, r.slo_class, COUNT(*),
        SUM(s.energy_j), SUM(s.static_j), SUM(s.carbon_g), SUM(s.cost_usd), SUM(s.failed_j),
        SUM(s.estimated) FROM shares s JOIN requests r ON r.request_id = s.request_id
        GROUP BY r.tenant, s.hour_idx, s.engine, r.model, r.precision, r.slo_class""",
    f"""CREATE TABLE engine_hours (
        engine TEXT NOT NULL, hour_idx {{BIGINT}} NOT NULL, model TEXT NOT NULL,
        precision TEXT NOT NULL, intervals {{BIGINT}} NOT NULL, energy_j {{REAL}} NOT NULL,
        idle_j {{REAL}} NOT NULL, idle_carbon_g {{REAL}} NOT NULL,
        idle_cost_usd {{REAL}} NOT NULL, failed_j {{REAL}} NOT NULL,
        failed_carbon_g {{REAL}} NOT NULL, failed_cost_usd {{REAL}} NOT NULL,
        estimated_n {{BIGINT}} NOT NULL, first_start_s {{REAL}} NOT NULL,
        last_end_s {{REAL}} NOT NULL, PRIMARY KEY ({ENGINE_DIMS}))""",
    "CREATE INDEX engine_hours_hour ON engine_hours (hour_idx)",
    f"""INSERT INTO engine_hours ({ENGINE_DIMS}, {ENGINE_SUMS}, first_start_s, last_end_s)
        SELECT engine, hour_idx, model, precision, COUNT(*), SUM(energy_j), SUM(idle_j),
        SUM(idle_carbon_g), SUM(idle_cost_usd), SUM(failed_j), SUM(failed_carbon_g),
        SUM(failed_cost_usd), SUM(estimated), MIN(start_s), MAX(start_s + interval_s)
        FROM intervals GROUP BY engine, hour_idx, model, precision""",
    "DROP TABLE tenant_hours",
    """CREATE VIEW tenant_hours AS SELECT tenant, hour_idx, SUM(energy_j) AS energy_j,
        SUM(carbon_g) AS carbon_g, SUM(cost_usd) AS cost_usd FROM share_hours
        GROUP BY tenant, hour_idx""",
)

# The trigger that keeps `request_hours`, per dialect.
DIALECT_MIGRATION: dict[str, tuple[str, ...]] = {
    "sqlite": (
        f"""CREATE TRIGGER requests_hours AFTER INSERT ON requests BEGIN
            {INSERT_REQUEST_HOURS} VALUES ({request_values("NEW.")})
            {UPSERT_REQUEST_HOURS}; END""",
    ),
    "postgres": (
        f"""CREATE FUNCTION wattgate_request_hours() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
            {INSERT_REQUEST_HOURS} VALUES ({request_values("NEW.")})
            {UPSERT_REQUEST_HOURS};
            RETURN NULL;
            END $$""",
        """CREATE TRIGGER requests_hours AFTER INSERT ON requests FOR EACH ROW
            EXECUTE FUNCTION wattgate_request_hours()""",
    ),
}

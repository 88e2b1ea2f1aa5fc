"""The store's generation: one counter that every change predictions read bumps, so that their
records, priors and whole answers are cached per generation and a request costs one primary-key read.

What predictions read changes only when a result, fit or profile row is written or deleted (or its
table truncated), or a job enters or leaves `succeeded` (a simulation's rows count only once its job
has succeeded). Triggers bump the counter in the same transaction as the change, so a reader never
sees a new generation without the change (nor the change under an old generation for longer than its
own read). The aggregates this replaces (counts and maxima over four tables) cost 0.3 ms more per
request than a trivial read at 1,000 results, and grew with the tables.

On PostgreSQL the row triggers are deferred constraint triggers: the counter row is locked only at
commit, the last lock a transaction takes, so two writers can wait for each other's commit but never
deadlock over it. A TRUNCATE (maintenance and test fixtures, never the service) fires no row trigger,
so a statement trigger bumps the counter at once. SQLite runs one writer at a time, so plain
triggers do.

The DDL lives here once: `core.tables` installs it on `create_all`, and the migration that added the
counter (0010) runs the same statements; changing them needs a new migration.
"""

from __future__ import annotations

TABLE = "store_generation"
WATCHED = ("results", "fits", "profiles")
"""Tables whose every insert, update and delete bumps the generation."""
JOBS = "jobs"
SUCCEEDED = "'succeeded'"
"""How `jobs.status` stores JobStatus.succeeded (a non-native enum: its name, as text)."""

_BUMP = f"UPDATE {TABLE} SET generation = generation + 1 WHERE id = 1"
_PG_FUNCTION = "prunecast_bump_store_generation"

# (trigger name suffix, event, condition) for jobs: entering or leaving `succeeded`.
_JOB_EVENTS = (
    ("update", "UPDATE OF status", f"(OLD.status = {SUCCEEDED}) <> (NEW.status = {SUCCEEDED})"),
    ("insert", "INSERT", f"NEW.status = {SUCCEEDED}"),
    ("delete", "DELETE", f"OLD.status = {SUCCEEDED}"),
)


def install_statements(dialect: str) -> list[str]:
    """The statements that create the triggers and the counter's one row (the table exists)."""
    statements = [f"INSERT INTO {TABLE} (id, generation) VALUES (1, 0)"]
    if dialect == "postgresql":
        statements.append(
            f"CREATE FUNCTION {_PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {_BUMP}; RETURN NULL; END $$"
        )
        deferred = "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
        for table in WATCHED:
            statements.append(
                f"CREATE CONSTRAINT TRIGGER {table}_generation AFTER INSERT OR UPDATE OR DELETE ON {table} "
                f"{deferred} EXECUTE FUNCTION {_PG_FUNCTION}()"
            )
        for name, event, condition in _JOB_EVENTS:
            statements.append(
                f"CREATE CONSTRAINT TRIGGER {JOBS}_generation_{name} AFTER {event} ON {JOBS} {deferred} "
                f"WHEN ({condition}) EXECUTE FUNCTION {_PG_FUNCTION}()"
            )
        for table in (*WATCHED, JOBS):  # TRUNCATE fires no row trigger (SQLite has no TRUNCATE)
            statements.append(
                f"CREATE TRIGGER {table}_generation_truncate AFTER TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {_PG_FUNCTION}()"
            )
        return statements
    if dialect == "sqlite":
        for table in WATCHED:
            for event in ("INSERT", "UPDATE", "DELETE"):
                statements.append(
                    f"CREATE TRIGGER {table}_generation_{event.lower()} AFTER {event} ON {table} "
                    f"BEGIN {_BUMP}; END"
                )
        for name, event, condition in _JOB_EVENTS:
            statements.append(
                f"CREATE TRIGGER {JOBS}_generation_{name} AFTER {event} ON {JOBS} WHEN {condition} "
                f"BEGIN {_BUMP}; END"
            )
        return statements
    raise ValueError(f"no store generation triggers for the {dialect!r} dialect")


def drop_statements(dialect: str) -> list[str]:
    """The statements that remove what `install_statements` created, the table's row included."""
    if dialect == "postgresql":
        triggers = [(f"{table}_generation", table) for table in WATCHED]
        triggers += [(f"{JOBS}_generation_{name}", JOBS) for name, _, _ in _JOB_EVENTS]
        triggers += [(f"{table}_generation_truncate", table) for table in (*WATCHED, JOBS)]
        drops = [f"DROP TRIGGER IF EXISTS {name} ON {table}" for name, table in triggers]
        return [*drops, f"DROP FUNCTION IF EXISTS {_PG_FUNCTION}()", f"DELETE FROM {TABLE}"]
    if dialect == "sqlite":
        events = ("insert", "update", "delete")
        names = [f"{table}_generation_{event}" for table in WATCHED for event in events]
        names += [f"{JOBS}_generation_{name}" for name, _, _ in _JOB_EVENTS]
        return [*(f"DROP TRIGGER IF EXISTS {name}" for name in names), f"DELETE FROM {TABLE}"]
    raise ValueError(f"no store generation triggers for the {dialect!r} dialect")

"""The PostgreSQL schema of ``PgCheckpointer``: an ordered list of migrations and the code that applies them.

The position of a migration in ``MIGRATIONS`` is the schema version it
produces (1-based); ``agentrun_migrations`` holds one row per applied
version. Append only: never edit or reorder a released step, since
databases in the field already ran it.

Safety when several pods start at once: ``apply_migrations`` first reads
the version without any lock (the fast path every pod takes once the schema
is current), and only when something is missing applies each missing step
in a transaction of its own that takes a transaction-level advisory lock,
re-reads the version under it, and applies the next step together with its
version row. A second migrator waits on the lock, then finds the step done.
PostgreSQL DDL is transactional, so a step that fails leaves nothing behind
and the version where it was. The lock is released by the step's COMMIT or
ROLLBACK (or the end of the session): no session state, so the same code
runs behind PgBouncer in transaction mode, where a session-level lock would
stay on a server connection some other client gets next.

HAZARDS
- A step holds the advisory lock while it runs; a migrator that hangs
  (not one that dies: the lock goes with its transaction) holds up every other
  pod's ``setup()``, which waits at most the connection's ``lock_timeout``
  (``PgCheckpointer(lock_timeout=...)``) and then fails with
  ``StorageError``; the pod restarts and tries again. Migrations here are
  small DDL on small tables; if one ever rewrites a large table, ship it as
  its own release.
- The thread id column type is chosen when migration 1 runs; changing
  ``thread_id_type`` later does not alter existing columns (a warning says
  so). Migrate by hand with ``ALTER TABLE ... ALTER COLUMN ... TYPE``.
- A database whose version is newer than this code knows (an older runner
  during a rolling upgrade) is used as is, with a warning: released
  migrations only add tables, columns and indexes that older code ignores.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

from ..errors import MigrationError, StorageError

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    # A plain connection or one borrowed from a pool: both run the same SQL.
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]

log = logging.getLogger("agentrun.checkpoint.postgres")

# The longest thread id the store accepts: a Kubernetes object name (DNS subdomain) is at most 253
# characters, and the runner's namespace-qualified ids must fit the same bound as the CRD's threadId.
MAX_THREAD_ID_LENGTH = 253

_TYPE_RE = re.compile(r"^(text|varchar\((\d{1,3})\))$")
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Migration:
    """One schema step. ``sql`` may hold ``{thread_id_type}`` and ``{max_len}`` placeholders."""

    description: str
    sql: str

    def render(self, thread_id_type: str) -> str:
        """The migration's SQL for a schema whose thread ids are ``thread_id_type``."""
        return self.sql.format(thread_id_type=thread_id_type, max_len=MAX_THREAD_ID_LENGTH)


# Plain CREATE TABLE (no IF NOT EXISTS): the version row makes a step run once, so a name that
# already exists is someone else's table, and failing loudly beats writing into it.
MIGRATIONS: list[Migration] = [
    Migration(
        "threads, versioned states, messages",
        """
        CREATE TABLE threads (
            thread_id {thread_id_type} PRIMARY KEY CHECK (char_length(thread_id) BETWEEN 1 AND {max_len}),
            -- A new id each time a thread row is created, so a cache entry of a deleted thread
            -- can never pass for the state of a new thread with the same id.
            incarnation UUID NOT NULL DEFAULT gen_random_uuid(),
            created_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        CREATE TABLE states (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            version BIGINT NOT NULL CHECK (version > 0),
            current_node TEXT,
            step INTEGER NOT NULL,
            status TEXT NOT NULL,
            -- JSON (verbatim text), not JSONB: a checkpoint must read back exactly as written
            -- (JSONB reorders object keys, and cannot hold U+0000). JSON still supports -> and ->>.
            state_values JSON NOT NULL,
            meta JSON NOT NULL,
            message_count INTEGER NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            -- The backstop of optimistic concurrency: two writers can never both own a version.
            CONSTRAINT states_thread_version_key UNIQUE (thread_id, version)
        );
        CREATE TABLE messages (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            idx INTEGER NOT NULL CHECK (idx >= 0),
            message_id TEXT,
            body JSON NOT NULL,
            -- The state version that last wrote this message.
            version BIGINT NOT NULL,
            PRIMARY KEY (thread_id, idx)
        );
        """,
    ),
    Migration(
        "the tool ledger",
        """
        CREATE TABLE tool_executions (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            -- The ledger key: <origin message id>:<tool call id>.
            tool_call_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            -- For queries. JSONB reorders object keys and cannot hold U+0000 (then it is NULL), so
            -- a replay reads result_text: the recorded result exactly, as the model first saw it.
            result JSONB,
            result_text TEXT,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, tool_call_id),
            CHECK (result IS NOT NULL OR result_text IS NOT NULL)
        );
        """,
    ),
    Migration(
        "tool intents",
        """
        CREATE TABLE tool_intents (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            tool_call_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            idempotency_key TEXT,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, tool_call_id)
        );
        """,
    ),
    Migration(
        "stop requests, fencing, and the attempt that wrote each row",
        """
        CREATE TABLE stop_requests (
            thread_id {thread_id_type} PRIMARY KEY REFERENCES threads (thread_id) ON DELETE CASCADE,
            reason TEXT NOT NULL,
            requested_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        CREATE TABLE attempts (
            thread_id {thread_id_type} PRIMARY KEY REFERENCES threads (thread_id) ON DELETE CASCADE,
            attempt INTEGER NOT NULL,
            registered_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        -- NULL on rows written before fencing existed, or by callers that pass no attempt.
        ALTER TABLE states ADD COLUMN attempt INTEGER;
        ALTER TABLE tool_executions ADD COLUMN attempt INTEGER;
        ALTER TABLE tool_intents ADD COLUMN attempt INTEGER;
        """,
    ),
    Migration(
        "fencing across AgentRuns: the owner's run uid, every run seen on a thread, the run that wrote each row",
        """
        -- NULL for owners registered before run uids (or without one): fenced by attempt alone.
        ALTER TABLE attempts ADD COLUMN run_uid TEXT;
        -- A thread outlives its AgentRuns: a run uid seen here before that no longer owns the
        -- thread was superseded and must not take it back.
        CREATE TABLE thread_runs (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            run_uid TEXT NOT NULL,
            registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, run_uid)
        );
        ALTER TABLE states ADD COLUMN run_uid TEXT;
        ALTER TABLE tool_executions ADD COLUMN run_uid TEXT;
        ALTER TABLE tool_intents ADD COLUMN run_uid TEXT;
        """,
    ),
    Migration(
        "run inputs: an attempt's input and resume value, written by the operator (too large for env vars)",
        """
        CREATE TABLE run_inputs (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            run_uid TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            -- JSON (verbatim text) as in states; SQL NULL when the run has no input or resume value.
            input JSON,
            resume JSON,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, run_uid, attempt)
        );
        """,
    ),
    Migration(
        "turns: one per request key on a thread, written with the turn's first, interrupted and final checkpoints",
        """
        CREATE TABLE turns (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            -- spec.requestId, or derived from the AgentRun and its input: the identity of a request.
            request_key TEXT NOT NULL,
            run_uid TEXT,
            status TEXT NOT NULL,
            -- The state version of the last checkpoint that recorded the turn.
            version BIGINT NOT NULL,
            -- JSON (verbatim text) as in states.
            error JSON,
            result JSON,
            tool_calls JSON NOT NULL,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, request_key)
        );
        """,
    ),
    Migration(
        "one round trip per checkpoint: the versioned, fenced write as a server-side function",
        # The same steps as the transaction it replaces (postgres.py: _put_txn), run by the server in
        # one statement: lock the thread row FOR UPDATE (creating it on the thread's first write), check
        # the fence and the version, recognize a retry's own committed row by its write id, insert the
        # state row, upsert the step's messages and the turn. Conflicts are reported in o_outcome, not
        # raised, so the caller raises the typed error with the owner it returns. No EXCEPTION block:
        # it would open a subtransaction per call; the unique key violation it would catch is
        # unreachable under the row lock and surfaces as UniqueViolationError, as before.
        """
        CREATE FUNCTION agentrun_put_checkpoint(
            p_thread_id {thread_id_type}, p_expected BIGINT, p_attempt INTEGER, p_run_uid TEXT, p_write_id TEXT,
            p_current_node TEXT, p_step INTEGER, p_status TEXT, p_values JSON, p_meta JSON, p_message_count INTEGER,
            p_idx INTEGER[], p_message_ids TEXT[], p_bodies TEXT[],
            p_turn_key TEXT, p_turn_run_uid TEXT, p_turn_status TEXT, p_turn_error JSON, p_turn_result JSON,
            p_turn_tool_calls JSON,
            OUT o_outcome TEXT, OUT o_version BIGINT, OUT o_incarnation TEXT, OUT o_created_at FLOAT8,
            OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
            v_current BIGINT;
        BEGIN
            LOOP
                SELECT t.incarnation::text INTO o_incarnation FROM threads t WHERE t.thread_id = p_thread_id
                FOR UPDATE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            -- base.check_fence: another run's uid, or an attempt older than the owner's.
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            SELECT COALESCE(MAX(s.version), 0) INTO v_current FROM states s WHERE s.thread_id = p_thread_id;
            IF v_current <> p_expected THEN
                SELECT extract(epoch FROM s.created_at)::float8 INTO o_created_at FROM states s
                WHERE s.thread_id = p_thread_id AND s.version = p_expected + 1 AND s.meta ->> 'write_id' = p_write_id;
                IF FOUND THEN
                    o_outcome := 'committed';
                    o_version := p_expected + 1;
                ELSE
                    o_outcome := 'stale';
                    o_version := v_current;
                END IF;
                RETURN;
            END IF;
            o_version := v_current + 1;
            INSERT INTO states (thread_id, version, current_node, step, status, state_values, meta, message_count,
                                attempt, run_uid)
            VALUES (p_thread_id, o_version, p_current_node, p_step, p_status, p_values, p_meta, p_message_count,
                    p_attempt, p_run_uid)
            RETURNING extract(epoch FROM created_at)::float8 INTO o_created_at;
            IF cardinality(p_idx) > 0 THEN
                -- An index below the stored count replaces a message (add_messages with a known id).
                INSERT INTO messages (thread_id, idx, message_id, body, version)
                SELECT p_thread_id, m.idx, m.message_id, m.body::json, o_version
                FROM unnest(p_idx, p_message_ids, p_bodies) AS m (idx, message_id, body)
                ON CONFLICT (thread_id, idx) DO UPDATE SET message_id = EXCLUDED.message_id, body = EXCLUDED.body,
                    version = EXCLUDED.version;
            END IF;
            IF p_turn_key IS NOT NULL THEN
                INSERT INTO turns (thread_id, request_key, run_uid, status, version, error, result, tool_calls)
                VALUES (p_thread_id, p_turn_key, p_turn_run_uid, p_turn_status, o_version, p_turn_error,
                        p_turn_result, p_turn_tool_calls)
                ON CONFLICT (thread_id, request_key) DO UPDATE SET run_uid = EXCLUDED.run_uid,
                    status = EXCLUDED.status, version = EXCLUDED.version, error = EXCLUDED.error,
                    result = EXCLUDED.result, tool_calls = EXCLUDED.tool_calls, updated_at = now();
            END IF;
            o_outcome := 'ok';
        END
        $$;
        """,
    ),
    Migration(
        "one round trip per ledger record and intent: the fenced insert as a server-side function",
        """
        -- A tool's ledger record (or its intent) in one statement: the thread row FOR SHARE (parallel
        -- siblings do not wait for each other, but do wait for a checkpoint or a registration in
        -- flight), the fence read after the lock is granted (a volatile function's statements each
        -- take a new snapshot, so the owner a registration just committed is seen), then the insert,
        -- ON CONFLICT DO NOTHING: the first record stays authoritative.
        CREATE FUNCTION agentrun_put_tool_row(
            p_table TEXT, p_thread_id {thread_id_type}, p_key TEXT, p_tool_name TEXT, p_result TEXT,
            p_result_text TEXT, p_idempotency_key TEXT, p_attempt INTEGER, p_run_uid TEXT,
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            IF p_table = 'tool_executions' THEN
                INSERT INTO tool_executions (thread_id, tool_call_id, tool_name, result, result_text, attempt, run_uid)
                VALUES (p_thread_id, p_key, p_tool_name, p_result::jsonb, p_result_text, p_attempt, p_run_uid)
                ON CONFLICT (thread_id, tool_call_id) DO NOTHING;
            ELSE
                INSERT INTO tool_intents (thread_id, tool_call_id, tool_name, idempotency_key, attempt, run_uid)
                VALUES (p_thread_id, p_key, p_tool_name, p_idempotency_key, p_attempt, p_run_uid)
                ON CONFLICT (thread_id, tool_call_id) DO NOTHING;
            END IF;
            o_outcome := CASE WHEN FOUND THEN 'inserted' ELSE 'exists' END;
        END
        $$;
        """,
    ),
    Migration(
        "progress notifications: NOTIFY agentrun_progress with the thread id when a checkpoint commits",
        # The operator LISTENs on one connection per store (agentrun_operator/io/notify.py) instead of
        # polling every run's progress. A trigger rather than a line in agentrun_put_checkpoint, so every
        # path that inserts a state row notifies (the function, the transaction kept for the fault tests).
        # NOTIFY is delivered at commit, never for a rolled-back write, and once per distinct payload per
        # transaction. Channels (shared by every schema of the database; a listener in another schema
        # only gets a spurious wake-up): agentrun_progress (this one, payload: the thread id) and
        # agentrun_stop (the runner's stop check, migration 11, payload: the thread id).
        """
        CREATE FUNCTION agentrun_notify_progress() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('agentrun_progress', NEW.thread_id::text);
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER agentrun_progress_notify AFTER INSERT ON states
            FOR EACH ROW EXECUTE FUNCTION agentrun_notify_progress();
        """,
    ),
    Migration(
        "stop requests notify channel agentrun_stop; state rows that carry only the channels a step changed",
        # Stop: a trigger, so every writer of a stop request (the runner's request_stop, the operator,
        # the CLI, an older agentrun) notifies in the transaction that records it; PostgreSQL delivers
        # the notification when it commits, to every session listening (pg_listen.StopListener).
        # The payload is the thread id; a listener treats it as "ask the store", never as the request.
        #
        # State deltas: a row with base_version set holds in state_delta only the channels changed
        # since the previous version; the state at its version is the row at base_version (a full
        # snapshot, base_version NULL) with every delta after it up to this one applied in version
        # order. Such a row's state_values is JSON null, so an agentrun older than this migration that
        # reads it fails loudly instead of resuming from a partial state. The checkpoint function gains
        # an overload taking the delta's base and the writer's incarnation of the thread; the old one
        # stays for older runners during a rolling upgrade (they write full rows, which newer readers
        # read as before). A delta lands only on the chain it continues: the latest row must belong to
        # the same snapshot and the thread must be the incarnation the writer saw, else the outcome is
        # 'rebase' and the writer sends a full snapshot instead.
        """
        CREATE FUNCTION agentrun_notify_stop() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('agentrun_stop', NEW.thread_id::text);
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER agentrun_stop_notify AFTER INSERT ON stop_requests
            FOR EACH ROW EXECUTE FUNCTION agentrun_notify_stop();

        ALTER TABLE states ADD COLUMN base_version BIGINT, ADD COLUMN state_delta JSON;

        CREATE FUNCTION agentrun_put_checkpoint(
            p_thread_id {thread_id_type}, p_expected BIGINT, p_attempt INTEGER, p_run_uid TEXT, p_write_id TEXT,
            p_current_node TEXT, p_step INTEGER, p_status TEXT, p_values JSON, p_meta JSON, p_message_count INTEGER,
            p_idx INTEGER[], p_message_ids TEXT[], p_bodies TEXT[],
            p_turn_key TEXT, p_turn_run_uid TEXT, p_turn_status TEXT, p_turn_error JSON, p_turn_result JSON,
            p_turn_tool_calls JSON, p_base_version BIGINT, p_incarnation TEXT,
            OUT o_outcome TEXT, OUT o_version BIGINT, OUT o_incarnation TEXT, OUT o_created_at FLOAT8,
            OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
            v_current BIGINT;
            v_chain BIGINT;
        BEGIN
            LOOP
                SELECT t.incarnation::text INTO o_incarnation FROM threads t WHERE t.thread_id = p_thread_id
                FOR UPDATE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            -- base.check_fence: another run's uid, or an attempt older than the owner's.
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            -- The latest row: the version to compare, and the snapshot its state is built on.
            SELECT s.version, COALESCE(s.base_version, s.version) INTO v_current, v_chain FROM states s
            WHERE s.thread_id = p_thread_id ORDER BY s.version DESC LIMIT 1;
            v_current := COALESCE(v_current, 0);
            IF v_current <> p_expected THEN
                SELECT extract(epoch FROM s.created_at)::float8 INTO o_created_at FROM states s
                WHERE s.thread_id = p_thread_id AND s.version = p_expected + 1 AND s.meta ->> 'write_id' = p_write_id;
                IF FOUND THEN
                    o_outcome := 'committed';
                    o_version := p_expected + 1;
                ELSE
                    o_outcome := 'stale';
                    o_version := v_current;
                END IF;
                RETURN;
            END IF;
            IF p_base_version IS NOT NULL
               AND (v_chain IS DISTINCT FROM p_base_version OR o_incarnation IS DISTINCT FROM p_incarnation) THEN
                o_outcome := 'rebase';
                RETURN;
            END IF;
            o_version := v_current + 1;
            INSERT INTO states (thread_id, version, current_node, step, status, state_values, state_delta, base_version,
                                meta, message_count, attempt, run_uid)
            VALUES (p_thread_id, o_version, p_current_node, p_step, p_status,
                    CASE WHEN p_base_version IS NULL THEN p_values ELSE 'null'::json END,
                    CASE WHEN p_base_version IS NULL THEN NULL ELSE p_values END,
                    p_base_version, p_meta, p_message_count, p_attempt, p_run_uid)
            RETURNING extract(epoch FROM created_at)::float8 INTO o_created_at;
            IF cardinality(p_idx) > 0 THEN
                -- An index below the stored count replaces a message (add_messages with a known id).
                INSERT INTO messages (thread_id, idx, message_id, body, version)
                SELECT p_thread_id, m.idx, m.message_id, m.body::json, o_version
                FROM unnest(p_idx, p_message_ids, p_bodies) AS m (idx, message_id, body)
                ON CONFLICT (thread_id, idx) DO UPDATE SET message_id = EXCLUDED.message_id, body = EXCLUDED.body,
                    version = EXCLUDED.version;
            END IF;
            IF p_turn_key IS NOT NULL THEN
                INSERT INTO turns (thread_id, request_key, run_uid, status, version, error, result, tool_calls)
                VALUES (p_thread_id, p_turn_key, p_turn_run_uid, p_turn_status, o_version, p_turn_error,
                        p_turn_result, p_turn_tool_calls)
                ON CONFLICT (thread_id, request_key) DO UPDATE SET run_uid = EXCLUDED.run_uid,
                    status = EXCLUDED.status, version = EXCLUDED.version, error = EXCLUDED.error,
                    result = EXCLUDED.result, tool_calls = EXCLUDED.tool_calls, updated_at = now();
            END IF;
            o_outcome := 'ok';
        END
        $$;
        """,
    ),
    Migration(
        "progress notifications leave the commit: drop migration 10's trigger (the runner notifies, throttled)",
        # A NOTIFY inside the checkpoint's transaction holds PostgreSQL's database-wide notify lock through
        # the commit's WAL flush, serializing every runner's commits; the store now sends the notification
        # itself after the commit, in a transaction of its own with asynchronous commit, at most once per
        # second per thread plus a trailing one (checkpoint/pg_progress.py). An older agentrun writing to
        # this schema no longer wakes the operator: it sees that run's progress at its resync (30 s).
        """
        DROP TRIGGER IF EXISTS agentrun_progress_notify ON states;
        DROP FUNCTION IF EXISTS agentrun_notify_progress();
        """,
    ),
    Migration(
        "LangGraph checkpoints, channel blobs and pending writes (agentrun.integrations.langgraph), by our threads",
        # The tables of ``AgentrunSaver``, the LangGraph BaseCheckpointSaver on this store. Rows hang off our
        # thread rows (ON DELETE CASCADE), so deleting a thread deletes its LangGraph history with its ledger,
        # and the fencing of ``attempts`` covers them. Values are LangGraph's serializer output, verbatim
        # (``serde.dumps_typed``: a type tag and bytes); a channel's value is stored once per version it
        # took (lg_blobs), not once per checkpoint. Text keys are compared with COLLATE "C" by the saver
        # (checkpoint ids are uuid6 strings: byte order is time order).
        """
        CREATE TABLE lg_checkpoints (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            checkpoint_ns TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            parent_checkpoint_id TEXT,
            -- The checkpoint without its channel values (those are in lg_blobs).
            checkpoint_type TEXT NOT NULL,
            checkpoint BYTEA NOT NULL,
            metadata_type TEXT NOT NULL,
            metadata BYTEA NOT NULL,
            -- channel -> version as text: which blobs the checkpoint uses (prune keeps exactly those).
            channel_versions JSON NOT NULL,
            -- metadata["run_id"], for delete_for_runs.
            run_id TEXT,
            attempt INTEGER,
            run_uid TEXT,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
        );
        CREATE INDEX lg_checkpoints_run_id ON lg_checkpoints (run_id) WHERE run_id IS NOT NULL;
        CREATE TABLE lg_blobs (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            checkpoint_ns TEXT NOT NULL,
            channel TEXT NOT NULL,
            version TEXT NOT NULL,
            blob_type TEXT NOT NULL,
            blob BYTEA,
            PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
        );
        CREATE TABLE lg_writes (
            thread_id {thread_id_type} NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
            checkpoint_ns TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            -- The write's position in its task; negative for LangGraph's special channels (WRITES_IDX_MAP).
            idx INTEGER NOT NULL,
            channel TEXT NOT NULL,
            value_type TEXT NOT NULL,
            value BYTEA,
            task_path TEXT NOT NULL DEFAULT '',
            attempt INTEGER,
            run_uid TEXT,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        );
        """,
    ),
    Migration(
        "one round trip per LangGraph checkpoint and per task's writes: the fenced inserts as server-side functions",
        # Migration 9's pattern for the tables of migration 13: the thread row FOR SHARE (a registration in
        # flight is waited for, parallel tasks' writes are not), the fence read after the lock, then the
        # inserts (conflict rules as pg_rows documents them). Outcome 'ok', 'fenced' (with the owner) or
        # 'vanished', like agentrun_put_tool_row, so the caller raises the typed error.
        """
        CREATE FUNCTION agentrun_lg_put(
            p_thread_id {thread_id_type}, p_ns TEXT, p_id TEXT, p_parent TEXT, p_type TEXT, p_checkpoint BYTEA,
            p_metadata_type TEXT, p_metadata BYTEA, p_versions JSON, p_run_id TEXT, p_attempt INTEGER,
            p_run_uid TEXT, p_channels TEXT[], p_blob_versions TEXT[], p_blob_types TEXT[], p_blobs BYTEA[],
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            IF cardinality(p_channels) > 0 THEN
                INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, blob_type, blob)
                SELECT p_thread_id, p_ns, b.channel, b.version, b.blob_type, b.blob
                FROM unnest(p_channels, p_blob_versions, p_blob_types, p_blobs) AS b (channel, version, blob_type, blob)
                ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;
            END IF;
            INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
                                        checkpoint, metadata_type, metadata, channel_versions, run_id, attempt, run_uid)
            VALUES (p_thread_id, p_ns, p_id, p_parent, p_type, p_checkpoint, p_metadata_type, p_metadata, p_versions,
                    p_run_id, p_attempt, p_run_uid)
            ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
                parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, checkpoint_type = EXCLUDED.checkpoint_type,
                checkpoint = EXCLUDED.checkpoint, metadata_type = EXCLUDED.metadata_type, metadata = EXCLUDED.metadata,
                channel_versions = EXCLUDED.channel_versions, run_id = EXCLUDED.run_id, attempt = EXCLUDED.attempt,
                run_uid = EXCLUDED.run_uid;
            o_outcome := 'ok';
        END
        $$;
        CREATE FUNCTION agentrun_lg_put_writes(
            p_thread_id {thread_id_type}, p_ns TEXT, p_id TEXT, p_attempt INTEGER, p_run_uid TEXT,
            p_task_ids TEXT[], p_idx INTEGER[], p_channels TEXT[], p_types TEXT[], p_values BYTEA[], p_paths TEXT[],
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type, value,
                                   task_path, attempt, run_uid)
            SELECT p_thread_id, p_ns, p_id, w.task_id, w.idx, w.channel, w.value_type, w.value, w.task_path, p_attempt,
                   p_run_uid
            FROM unnest(p_task_ids, p_idx, p_channels, p_types, p_values, p_paths)
                AS w (task_id, idx, channel, value_type, value, task_path)
            ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
                channel = EXCLUDED.channel, value_type = EXCLUDED.value_type, value = EXCLUDED.value,
                task_path = EXCLUDED.task_path, attempt = EXCLUDED.attempt, run_uid = EXCLUDED.run_uid
            WHERE lg_writes.idx < 0;
            o_outcome := 'ok';
        END
        $$;
        """,
    ),
    Migration(
        "group commit of parallel tool results, and an intent's lookup and record in one round trip",
        # Migration 9's fence for two new writes (checkpoint.group, PgCheckpointer.ledger_put_many and
        # intent_claim): the thread row FOR SHARE (siblings do not wait for each other, a checkpoint or
        # a registration in flight is waited for), the fence read after the lock, then the inserts.
        """
        -- The results of parallel tool calls that finished together: one statement, one commit. Each
        -- row is inserted if absent (the first recorded result stays authoritative), one by one so
        -- each gets its own outcome: 'inserted'; 'own' when the row already there is exactly this
        -- writer's (same text, attempt and run: a retried commit whose first try landed unacknowledged);
        -- 'exists' for anyone else's row. A fenced writer inserts nothing.
        CREATE FUNCTION agentrun_put_tool_results(
            p_thread_id {thread_id_type}, p_keys TEXT[], p_tool_names TEXT[], p_results TEXT[],
            p_result_texts TEXT[], p_attempt INTEGER, p_run_uid TEXT,
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER, OUT o_rows TEXT[]
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
            v_i INTEGER;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            o_rows := ARRAY[]::TEXT[];
            FOR v_i IN 1 .. coalesce(cardinality(p_keys), 0) LOOP
                INSERT INTO tool_executions (thread_id, tool_call_id, tool_name, result, result_text, attempt, run_uid)
                VALUES (p_thread_id, p_keys[v_i], p_tool_names[v_i], p_results[v_i]::jsonb, p_result_texts[v_i],
                        p_attempt, p_run_uid)
                ON CONFLICT (thread_id, tool_call_id) DO NOTHING;
                IF FOUND THEN
                    o_rows := o_rows || 'inserted'::TEXT;
                ELSIF EXISTS (
                    SELECT 1 FROM tool_executions e
                    WHERE e.thread_id = p_thread_id AND e.tool_call_id = p_keys[v_i] AND e.tool_name = p_tool_names[v_i]
                      AND e.result_text = p_result_texts[v_i] AND e.attempt IS NOT DISTINCT FROM p_attempt
                      AND e.run_uid IS NOT DISTINCT FROM p_run_uid
                ) THEN
                    o_rows := o_rows || 'own'::TEXT;
                ELSE
                    o_rows := o_rows || 'exists'::TEXT;
                END IF;
            END LOOP;
            o_outcome := 'ok';
        END
        $$;
        -- A side-effect call's start: the intent already recorded for the key (outcome 'exists', with
        -- its tool, idempotency key and start time: the call is in doubt; 'own' when it is exactly this
        -- writer's, which a retried claim whose first try landed unacknowledged takes as its own), or
        -- this one, recorded now ('inserted'). One round trip instead of a lookup and then an insert.
        -- A fenced writer learns nothing and records nothing: it must not start side effects.
        CREATE FUNCTION agentrun_claim_intent(
            p_thread_id {thread_id_type}, p_key TEXT, p_tool_name TEXT, p_idempotency_key TEXT,
            p_attempt INTEGER, p_run_uid TEXT,
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER,
            OUT o_tool_name TEXT, OUT o_idempotency_key TEXT, OUT o_started_at FLOAT8
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            INSERT INTO tool_intents (thread_id, tool_call_id, tool_name, idempotency_key, attempt, run_uid)
            VALUES (p_thread_id, p_key, p_tool_name, p_idempotency_key, p_attempt, p_run_uid)
            ON CONFLICT (thread_id, tool_call_id) DO NOTHING;
            IF FOUND THEN
                o_outcome := 'inserted';
                RETURN;
            END IF;
            SELECT i.tool_name, i.idempotency_key, extract(epoch FROM i.started_at)::float8,
                   CASE WHEN i.tool_name = p_tool_name AND i.idempotency_key IS NOT DISTINCT FROM p_idempotency_key
                             AND i.attempt IS NOT DISTINCT FROM p_attempt AND i.run_uid IS NOT DISTINCT FROM p_run_uid
                        THEN 'own' ELSE 'exists' END
            INTO o_tool_name, o_idempotency_key, o_started_at, o_outcome
            FROM tool_intents i WHERE i.thread_id = p_thread_id AND i.tool_call_id = p_key;
        END
        $$;
        """,
    ),
    Migration(
        "the intents of parallel calls claimed in one statement",
        # agentrun_claim_intent for the side-effect calls of one assistant message that start together
        # (PgCheckpointer.intent_claim coalesces the claims of one loop turn, as ledger_get does lookups).
        """
        -- Per key, in order: o_rows 'inserted' (this start recorded now), 'own' or 'exists' (an earlier
        -- start, with its tool, idempotency key and start time in the arrays beside; NULL for inserted).
        CREATE FUNCTION agentrun_claim_intents(
            p_thread_id {thread_id_type}, p_keys TEXT[], p_tool_names TEXT[], p_idempotency_keys TEXT[],
            p_attempt INTEGER, p_run_uid TEXT,
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER, OUT o_rows TEXT[],
            OUT o_tool_names TEXT[], OUT o_idempotency_keys TEXT[], OUT o_started_at FLOAT8[]
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
            v_i INTEGER;
            v_row TEXT;
            v_tool TEXT;
            v_key TEXT;
            v_started FLOAT8;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            o_rows := ARRAY[]::TEXT[];
            o_tool_names := ARRAY[]::TEXT[];
            o_idempotency_keys := ARRAY[]::TEXT[];
            o_started_at := ARRAY[]::FLOAT8[];
            FOR v_i IN 1 .. coalesce(cardinality(p_keys), 0) LOOP
                INSERT INTO tool_intents (thread_id, tool_call_id, tool_name, idempotency_key, attempt, run_uid)
                VALUES (p_thread_id, p_keys[v_i], p_tool_names[v_i], p_idempotency_keys[v_i], p_attempt, p_run_uid)
                ON CONFLICT (thread_id, tool_call_id) DO NOTHING;
                IF FOUND THEN
                    v_row := 'inserted';
                    v_tool := NULL;
                    v_key := NULL;
                    v_started := NULL;
                ELSE
                    SELECT i.tool_name, i.idempotency_key, extract(epoch FROM i.started_at)::float8,
                           CASE WHEN i.tool_name = p_tool_names[v_i]
                                     AND i.idempotency_key IS NOT DISTINCT FROM p_idempotency_keys[v_i]
                                     AND i.attempt IS NOT DISTINCT FROM p_attempt
                                     AND i.run_uid IS NOT DISTINCT FROM p_run_uid
                                THEN 'own' ELSE 'exists' END
                    INTO v_tool, v_key, v_started, v_row
                    FROM tool_intents i WHERE i.thread_id = p_thread_id AND i.tool_call_id = p_keys[v_i];
                END IF;
                o_rows := o_rows || v_row;
                o_tool_names := o_tool_names || v_tool;
                o_idempotency_keys := o_idempotency_keys || v_key;
                o_started_at := o_started_at || v_started;
            END LOOP;
            o_outcome := 'ok';
        END
        $$;
        """,
    ),
    Migration(
        "the arguments digest of an intent, recorded and returned by its claim",
        # A start of a key with other arguments is another call's (the call was edited since, e.g. in a fork
        # of a LangGraph thread): the ledger tells them apart by this digest (agentrun.ledger.args_digest).
        # agentrun_claim_intents of migration 16 with the digest beside each key: a new signature, so runners
        # of the previous release keep calling the old one during a rolling upgrade.
        """
        ALTER TABLE tool_intents ADD COLUMN args_digest TEXT;
        CREATE FUNCTION agentrun_claim_intents(
            p_thread_id {thread_id_type}, p_keys TEXT[], p_tool_names TEXT[], p_idempotency_keys TEXT[],
            p_args_digests TEXT[], p_attempt INTEGER, p_run_uid TEXT,
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER, OUT o_rows TEXT[],
            OUT o_tool_names TEXT[], OUT o_idempotency_keys TEXT[], OUT o_started_at FLOAT8[],
            OUT o_args_digests TEXT[]
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
            v_i INTEGER;
            v_row TEXT;
            v_tool TEXT;
            v_key TEXT;
            v_started FLOAT8;
            v_digest TEXT;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            o_rows := ARRAY[]::TEXT[];
            o_tool_names := ARRAY[]::TEXT[];
            o_idempotency_keys := ARRAY[]::TEXT[];
            o_started_at := ARRAY[]::FLOAT8[];
            o_args_digests := ARRAY[]::TEXT[];
            FOR v_i IN 1 .. coalesce(cardinality(p_keys), 0) LOOP
                INSERT INTO tool_intents (thread_id, tool_call_id, tool_name, idempotency_key, args_digest,
                                          attempt, run_uid)
                VALUES (p_thread_id, p_keys[v_i], p_tool_names[v_i], p_idempotency_keys[v_i], p_args_digests[v_i],
                        p_attempt, p_run_uid)
                ON CONFLICT (thread_id, tool_call_id) DO NOTHING;
                IF FOUND THEN
                    v_row := 'inserted';
                    v_tool := NULL;
                    v_key := NULL;
                    v_started := NULL;
                    v_digest := NULL;
                ELSE
                    SELECT i.tool_name, i.idempotency_key, extract(epoch FROM i.started_at)::float8, i.args_digest,
                           CASE WHEN i.tool_name = p_tool_names[v_i]
                                     AND i.idempotency_key IS NOT DISTINCT FROM p_idempotency_keys[v_i]
                                     AND i.args_digest IS NOT DISTINCT FROM p_args_digests[v_i]
                                     AND i.attempt IS NOT DISTINCT FROM p_attempt
                                     AND i.run_uid IS NOT DISTINCT FROM p_run_uid
                                THEN 'own' ELSE 'exists' END
                    INTO v_tool, v_key, v_started, v_digest, v_row
                    FROM tool_intents i WHERE i.thread_id = p_thread_id AND i.tool_call_id = p_keys[v_i];
                END IF;
                o_rows := o_rows || v_row;
                o_tool_names := o_tool_names || v_tool;
                o_idempotency_keys := o_idempotency_keys || v_key;
                o_started_at := o_started_at || v_started;
                o_args_digests := o_args_digests || v_digest;
            END LOOP;
            o_outcome := 'ok';
        END
        $$;
        """,
    ),
    Migration(
        "a LangGraph super-step in one statement: the finished tasks' writes, the new checkpoint and its blobs",
        # AgentrunSaver holds a task's pending writes (for a few milliseconds at most) until the checkpoint that
        # follows them, and sends both here: one round trip and one commit per super-step instead of two
        # (integrations/langgraph/saver.py says what the hold may lose on a crash). Migration 14's fence and
        # conflict rules, unchanged: the thread row FOR SHARE, the owner read after the lock, then the writes
        # (of the parent checkpoint p_writes_id: the checkpoint the tasks ran from), the blobs, the checkpoint.
        # A new name: agentrun_lg_put and agentrun_lg_put_writes stay for runners of the previous release
        # during a rolling upgrade (and for writes that go alone).
        """
        CREATE FUNCTION agentrun_lg_put_step(
            p_thread_id {thread_id_type}, p_ns TEXT, p_id TEXT, p_parent TEXT, p_type TEXT, p_checkpoint BYTEA,
            p_metadata_type TEXT, p_metadata BYTEA, p_versions JSON, p_run_id TEXT, p_attempt INTEGER,
            p_run_uid TEXT, p_channels TEXT[], p_blob_versions TEXT[], p_blob_types TEXT[], p_blobs BYTEA[],
            p_writes_id TEXT, p_task_ids TEXT[], p_idx INTEGER[], p_write_channels TEXT[], p_write_types TEXT[],
            p_values BYTEA[], p_paths TEXT[],
            OUT o_outcome TEXT, OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_tries INTEGER := 0;
        BEGIN
            LOOP
                PERFORM 1 FROM threads t WHERE t.thread_id = p_thread_id FOR SHARE;
                EXIT WHEN FOUND;
                v_tries := v_tries + 1;
                IF v_tries > 3 THEN
                    o_outcome := 'vanished';
                    RETURN;
                END IF;
                INSERT INTO threads (thread_id) VALUES (p_thread_id) ON CONFLICT (thread_id) DO NOTHING;
            END LOOP;
            SELECT a.run_uid, a.attempt INTO o_owner_run_uid, o_owner_attempt FROM attempts a
            WHERE a.thread_id = p_thread_id;
            IF o_owner_attempt IS NOT NULL AND (
                (p_run_uid IS NOT NULL AND o_owner_run_uid IS NOT NULL AND p_run_uid <> o_owner_run_uid)
                OR (p_attempt IS NOT NULL AND p_attempt < o_owner_attempt)
            ) THEN
                o_outcome := 'fenced';
                RETURN;
            END IF;
            IF cardinality(p_task_ids) > 0 THEN
                INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, value_type,
                                       value, task_path, attempt, run_uid)
                SELECT p_thread_id, p_ns, p_writes_id, w.task_id, w.idx, w.channel, w.value_type, w.value,
                       w.task_path, p_attempt, p_run_uid
                FROM unnest(p_task_ids, p_idx, p_write_channels, p_write_types, p_values, p_paths)
                    AS w (task_id, idx, channel, value_type, value, task_path)
                ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
                    channel = EXCLUDED.channel, value_type = EXCLUDED.value_type, value = EXCLUDED.value,
                    task_path = EXCLUDED.task_path, attempt = EXCLUDED.attempt, run_uid = EXCLUDED.run_uid
                WHERE lg_writes.idx < 0;
            END IF;
            IF cardinality(p_channels) > 0 THEN
                INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, blob_type, blob)
                SELECT p_thread_id, p_ns, b.channel, b.version, b.blob_type, b.blob
                FROM unnest(p_channels, p_blob_versions, p_blob_types, p_blobs) AS b (channel, version, blob_type, blob)
                ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING;
            END IF;
            INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
                                        checkpoint, metadata_type, metadata, channel_versions, run_id, attempt, run_uid)
            VALUES (p_thread_id, p_ns, p_id, p_parent, p_type, p_checkpoint, p_metadata_type, p_metadata, p_versions,
                    p_run_id, p_attempt, p_run_uid)
            ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
                parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, checkpoint_type = EXCLUDED.checkpoint_type,
                checkpoint = EXCLUDED.checkpoint, metadata_type = EXCLUDED.metadata_type, metadata = EXCLUDED.metadata,
                channel_versions = EXCLUDED.channel_versions, run_id = EXCLUDED.run_id, attempt = EXCLUDED.attempt,
                run_uid = EXCLUDED.run_uid;
            o_outcome := 'ok';
        END
        $$;
        """,
    ),
    Migration(
        "a LangGraph run's progress row and its super-step in one statement",
        # A LangGraph graph run as an AgentRun mirrors its progress into our state rows after each super-step
        # (integrations/langgraph/run.py); the mirror's row rides in the next super-step's statement when that
        # comes within the mirror's window (50 ms): one round trip and one commit per super-step instead of two. Our
        # row first (its lock FOR UPDATE, fence and version check, migration 11), then, only when it landed
        # (or had landed: a retry), the super-step (migration 18; it takes the same row FOR SHARE, which this
        # transaction already holds more strongly). An outcome other than ok or committed writes nothing of
        # either: the caller sends the super-step alone.
        """
        CREATE FUNCTION agentrun_put_checkpoint_and_lg_step(
            p_thread_id {thread_id_type}, p_expected BIGINT, p_attempt INTEGER, p_run_uid TEXT, p_write_id TEXT,
            p_current_node TEXT, p_step INTEGER, p_status TEXT, p_values JSON, p_meta JSON, p_message_count INTEGER,
            p_idx INTEGER[], p_message_ids TEXT[], p_bodies TEXT[],
            p_turn_key TEXT, p_turn_run_uid TEXT, p_turn_status TEXT, p_turn_error JSON, p_turn_result JSON,
            p_turn_tool_calls JSON, p_base_version BIGINT, p_incarnation TEXT,
            p_lg_ns TEXT, p_lg_id TEXT, p_lg_parent TEXT, p_lg_type TEXT, p_lg_checkpoint BYTEA,
            p_lg_metadata_type TEXT, p_lg_metadata BYTEA, p_lg_versions JSON, p_lg_run_id TEXT, p_lg_attempt INTEGER,
            p_lg_run_uid TEXT, p_lg_channels TEXT[], p_lg_blob_versions TEXT[], p_lg_blob_types TEXT[],
            p_lg_blobs BYTEA[], p_lg_writes_id TEXT, p_lg_task_ids TEXT[], p_lg_idx INTEGER[],
            p_lg_write_channels TEXT[], p_lg_write_types TEXT[], p_lg_values BYTEA[], p_lg_paths TEXT[],
            OUT o_outcome TEXT, OUT o_version BIGINT, OUT o_incarnation TEXT, OUT o_created_at FLOAT8,
            OUT o_owner_run_uid TEXT, OUT o_owner_attempt INTEGER, OUT o_lg_outcome TEXT
        ) LANGUAGE plpgsql AS $$
        BEGIN
            SELECT c.o_outcome, c.o_version, c.o_incarnation, c.o_created_at, c.o_owner_run_uid, c.o_owner_attempt
            INTO o_outcome, o_version, o_incarnation, o_created_at, o_owner_run_uid, o_owner_attempt
            FROM agentrun_put_checkpoint(p_thread_id, p_expected, p_attempt, p_run_uid, p_write_id, p_current_node,
                                         p_step, p_status, p_values, p_meta, p_message_count, p_idx, p_message_ids,
                                         p_bodies, p_turn_key, p_turn_run_uid, p_turn_status, p_turn_error,
                                         p_turn_result, p_turn_tool_calls, p_base_version, p_incarnation) c;
            IF o_outcome IN ('ok', 'committed') THEN
                SELECT s.o_outcome INTO o_lg_outcome
                FROM agentrun_lg_put_step(p_thread_id, p_lg_ns, p_lg_id, p_lg_parent, p_lg_type, p_lg_checkpoint,
                                          p_lg_metadata_type, p_lg_metadata, p_lg_versions, p_lg_run_id, p_lg_attempt,
                                          p_lg_run_uid, p_lg_channels, p_lg_blob_versions, p_lg_blob_types, p_lg_blobs,
                                          p_lg_writes_id, p_lg_task_ids, p_lg_idx, p_lg_write_channels,
                                          p_lg_write_types, p_lg_values, p_lg_paths) s;
                IF o_lg_outcome IS DISTINCT FROM 'ok' THEN
                    -- Unreachable while this transaction holds the thread row and passed its fence; never half.
                    RAISE EXCEPTION 'agentrun: the LangGraph step beside the progress row came out %', o_lg_outcome;
                END IF;
            END IF;
        END
        $$;
        """,
    ),
]

_CREATE_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS agentrun_migrations (
        version INTEGER PRIMARY KEY,
        description TEXT NOT NULL,
        thread_id_type TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""
# to_regclass follows the connection's search_path, i.e. the checkpointer's schema.
_VERSION_TABLE_EXISTS = "SELECT to_regclass('agentrun_migrations') IS NOT NULL"
_CURRENT_VERSION = "SELECT COALESCE(MAX(version), 0) FROM agentrun_migrations"
_FIRST_TYPE = "SELECT thread_id_type FROM agentrun_migrations WHERE version = 1"
_RECORD_VERSION = "INSERT INTO agentrun_migrations (version, description, thread_id_type) VALUES ($1, $2, $3)"
_SCHEMA_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)"
# Transaction-level lock, one per step: released at the step's COMMIT or ROLLBACK, or when a killed
# migrator's session ends; it shares its key space with session-level locks (pg_advisory_lock).
_LOCK = "SELECT pg_advisory_xact_lock($1)"


def normalize_thread_id_type(value: str) -> str:
    """``"text"`` or ``"varchar(N)"`` with 1 <= N <= 253; raises ``ValueError`` otherwise."""
    normalized = value.strip().lower().replace(" ", "")
    match = _TYPE_RE.match(normalized)
    if match is None or (match.group(2) is not None and not 1 <= int(match.group(2)) <= MAX_THREAD_ID_LENGTH):
        raise ValueError(
            f"thread_id_type must be 'text' or 'varchar(N)' with N <= {MAX_THREAD_ID_LENGTH}, not {value!r}"
        )
    return normalized


def validate_schema_name(schema: str) -> str:
    """``schema`` if it is a lower-case SQL identifier; raises ``ValueError`` otherwise (it is spliced into SQL)."""
    if not _SCHEMA_RE.match(schema):
        raise ValueError(f"schema must be a lower-case SQL identifier, not {schema!r}")
    return schema


def lock_key(schema: str) -> int:
    """The advisory lock id for migrating ``schema`` (advisory locks are per database already)."""
    digest = hashlib.sha256(f"agentrun.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def schema_version(conn: Connection) -> int:
    """The applied schema version of the connection's schema; 0 for an empty database."""
    if not await conn.fetchval(_VERSION_TABLE_EXISTS):
        return 0
    return int(await conn.fetchval(_CURRENT_VERSION))


@contextlib.asynccontextmanager
async def transaction(conn: Connection, begin: str = "BEGIN") -> AsyncIterator[None]:
    """``begin`` (one simple query: ``BEGIN`` and any ``SET LOCAL``), the block, then ``COMMIT``.

    Rolled back when the block raises (if the connection still can); raises what asyncpg raises.
    A block must not open ``conn.transaction()`` inside (asyncpg refuses it in a manual transaction).
    """
    await conn.execute(begin)
    try:
        yield
    except BaseException:
        if not conn.is_closed() and conn.is_in_transaction():
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


async def apply_migrations(
    conn: Connection,
    migrations: list[Migration],
    *,
    schema: str,
    thread_id_type: str = "text",
    begin: str = "BEGIN",
) -> list[int]:
    """Bring ``schema`` up to ``len(migrations)``; returns the versions this call applied.

    ``begin`` opens each transaction: ``"BEGIN"`` when ``conn`` has ``search_path``
    set to ``schema``; behind a transaction pooler also the ``SET LOCAL`` of
    ``search_path`` and the other settings (``PgCheckpointer``). Raises
    ``MigrationError`` when a step fails (that step is rolled back, earlier
    ones stay) and ``StorageError`` when the database cannot be reached.
    """
    target = len(migrations)
    key = lock_key(schema)
    applied: list[int] = []
    try:
        while True:
            async with transaction(conn, begin):
                current = await schema_version(conn)
                if current < target:
                    await conn.execute(_LOCK, key)
                    current = await _locked_version(conn, schema)
                if current >= target:
                    _warn_if_newer(current, target)
                    if current > 0 and not applied:
                        await _warn_if_type_differs(conn, thread_id_type)
                    return applied
                version, migration = current + 1, migrations[current]
                try:
                    await conn.execute(migration.render(thread_id_type))
                    await conn.execute(_RECORD_VERSION, version, migration.description, thread_id_type)
                except (asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                    raise MigrationError(
                        f"schema migration {version} ({migration.description}) failed: {e}; "
                        f"the schema stays at version {version - 1}"
                    ) from e
            log.info("applied agentrun schema migration %d: %s", version, migration.description)
            applied.append(version)
    except MigrationError:
        raise
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:
        raise StorageError(f"could not migrate the agentrun schema {schema!r}: {e}") from e


async def _locked_version(conn: Connection, schema: str) -> int:
    """Under the lock: the schema and its version table made to exist, then the version read again."""
    if not await conn.fetchval(_SCHEMA_EXISTS, schema):
        # Only when missing: CREATE SCHEMA needs CREATE on the database even with IF NOT EXISTS,
        # and a DBA may have created the schema for a role that lacks it.
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await conn.execute(_CREATE_VERSION_TABLE)
    # Another process may have migrated while this one waited.
    return await schema_version(conn)


def _warn_if_newer(current: int, target: int) -> None:
    if current > target:
        log.warning(
            "the agentrun schema is at version %d but this agentrun knows only %d; "
            "continuing (newer migrations only add what older code ignores)",
            current,
            target,
        )


async def _warn_if_type_differs(conn: Connection, thread_id_type: str) -> None:
    existing = await conn.fetchval(_FIRST_TYPE)
    if existing is not None and existing != thread_id_type:
        log.warning(
            "thread_id_type=%r is configured but the schema was created with %r; the existing columns are "
            "kept (alter them by hand to change the type)",
            thread_id_type,
            existing,
        )

//! Schema migrations, applied in order through SQLite's `user_version` (rusqlite_migration).
//! The SQL stays within what PostgreSQL also accepts (no SQLite-only types), so the store can move.
//!
//! Times are integers: milliseconds since the Unix epoch (UTC). JSON columns hold camelCase JSON.

/// Migration 1: the node model (spec "Nodes"), sites, pools, join tokens, node events.
pub const M001_NODE_MODEL: &str = r#"
CREATE TABLE sites (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    kind            TEXT NOT NULL DEFAULT 'platform',   -- platform | custom
    owner_tenant_id TEXT,
    created_at      BIGINT NOT NULL
);

CREATE TABLE pools (
    id               TEXT PRIMARY KEY,
    site_id          TEXT REFERENCES sites(id),
    name             TEXT NOT NULL,
    kind             TEXT NOT NULL,                     -- metal-host | vps-host | provider | metal-dedicated
    agent            TEXT NOT NULL DEFAULT 'bcd',       -- bcd | none
    owner_tenant_id  TEXT,
    hardware_profile TEXT NOT NULL DEFAULT '{}',        -- JSON: expected GPUs, drivers per concern
    created_at       BIGINT NOT NULL
);

CREATE TABLE nodes (
    id                   TEXT PRIMARY KEY,              -- node_...
    site_id              TEXT,
    pool_id              TEXT,
    owner_tenant_id      TEXT,
    role                 TEXT NOT NULL DEFAULT 'unassigned',
    trust                TEXT NOT NULL DEFAULT 'platform',
    adapter              TEXT NOT NULL DEFAULT 'bcd/v1',
    drivers              TEXT NOT NULL DEFAULT '{}',    -- JSON object: concern -> driver
    provision_state      TEXT NOT NULL,
    failed_from          TEXT,
    maintenance          INTEGER NOT NULL DEFAULT 0,
    maintenance_reason   TEXT,
    cordoned             INTEGER NOT NULL DEFAULT 0,
    power                TEXT NOT NULL DEFAULT 'unknown',
    connectivity         TEXT NOT NULL DEFAULT 'disconnected',
    conditions           TEXT NOT NULL DEFAULT '[]',    -- JSON array of Condition
    no_schedule_reasons  TEXT NOT NULL DEFAULT '[]',    -- JSON array of strings, sorted
    hardware_key         TEXT,
    hardware_key_trusted INTEGER NOT NULL DEFAULT 0,
    identifier_digests   TEXT NOT NULL DEFAULT '[]',    -- JSON array of hex digests
    generation           BIGINT NOT NULL DEFAULT 1,
    observed_generation  BIGINT NOT NULL DEFAULT 0,
    identity_generation  BIGINT NOT NULL DEFAULT 1,
    version              BIGINT NOT NULL DEFAULT 1,
    labels               TEXT NOT NULL DEFAULT '{}',    -- JSON object
    spec                 TEXT NOT NULL DEFAULT '{}',    -- JSON NodeSpec at `generation`
    hostname             TEXT,
    agent_version        TEXT,
    boot_id              TEXT,
    session_epoch        BIGINT NOT NULL DEFAULT 0,
    gateway_id           TEXT,
    connected_at         BIGINT,
    disconnected_at      BIGINT,
    last_seen            BIGINT,
    inventory            TEXT,                          -- JSON inventory document
    inventory_at         BIGINT,
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL
);
CREATE INDEX nodes_pool ON nodes(pool_id);
CREATE INDEX nodes_hardware_key ON nodes(hardware_key);

CREATE TABLE join_tokens (
    id          TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,                          -- hex SHA-256 of the secret part
    pool_id     TEXT,
    site_id     TEXT,
    expires_at  BIGINT NOT NULL,
    max_uses    BIGINT,                                 -- NULL: unlimited
    uses        BIGINT NOT NULL DEFAULT 0,
    revoked     INTEGER NOT NULL DEFAULT 0,
    description TEXT,
    created_at  BIGINT NOT NULL
);

CREATE TABLE node_events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id    TEXT NOT NULL,
    at         BIGINT NOT NULL,
    kind       TEXT NOT NULL,                           -- e.g. provisionState, connectivity, joined
    from_value TEXT,
    to_value   TEXT,
    actor      TEXT NOT NULL,                           -- JoinService, NodeLifecycle, gateway, operator
    message    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX node_events_node ON node_events(node_id, seq);

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"#;

/// Migration 3: the command lifecycle (queued → sent → running → succeeded | failed | cancelled |
/// expired), persisted per node.
pub const M003_COMMANDS: &str = r#"
CREATE TABLE commands (
    id            TEXT PRIMARY KEY,                    -- cmd_...
    node_id       TEXT NOT NULL,
    name          TEXT NOT NULL,                       -- inventory.refresh, diag.nvml, ...
    args          TEXT NOT NULL DEFAULT '{}',          -- JSON object
    state         TEXT NOT NULL,
    progress      INTEGER NOT NULL DEFAULT 0,          -- 0..=100
    result        TEXT,                                -- JSON
    error_code    TEXT,
    error_message TEXT,
    actor         TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    sent_at       BIGINT,
    started_at    BIGINT,
    finished_at   BIGINT,
    deadline_at   BIGINT NOT NULL
);
CREATE INDEX commands_node ON commands(node_id, created_at);
CREATE INDEX commands_open ON commands(state, deadline_at);
"#;

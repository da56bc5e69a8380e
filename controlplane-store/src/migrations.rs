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

/// Migration 2: optimistic `version` on sites and pools, operator taints, dedicated-root leases
/// (trust `tenant-controlled`), and allocations with their booked atoms (one row per GPU, so the
/// primary key alone forbids booking a GPU twice).
pub const M002_PLACEMENT: &str = r#"
ALTER TABLE sites ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE pools ADD COLUMN version BIGINT NOT NULL DEFAULT 1;

CREATE TABLE node_taints (
    node_id    TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL DEFAULT '',
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (node_id, key)
);

CREATE TABLE dedicated_root_leases (
    id           TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    tenant_id    TEXT NOT NULL,
    trust_before TEXT NOT NULL,                         -- trust restored when the lease ends
    started_at   BIGINT NOT NULL,
    started_by   TEXT NOT NULL,
    ended_at     BIGINT,
    ended_by     TEXT
);
CREATE UNIQUE INDEX dedicated_root_leases_active ON dedicated_root_leases(node_id)
    WHERE ended_at IS NULL;

CREATE TABLE allocations (
    id          TEXT PRIMARY KEY,                       -- alloc_...
    pool_id     TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    gpus        BIGINT NOT NULL,
    tenant_id   TEXT,
    created_by  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    released_at BIGINT,
    released_by TEXT
);
CREATE INDEX allocations_node ON allocations(node_id);
CREATE INDEX allocations_pool ON allocations(pool_id);

CREATE TABLE allocation_atoms (
    node_id       TEXT NOT NULL,
    atom          TEXT NOT NULL,                        -- GPU uuid, or gpu<index>
    allocation_id TEXT NOT NULL REFERENCES allocations(id) ON DELETE CASCADE,
    PRIMARY KEY (node_id, atom)
);
CREATE INDEX allocation_atoms_allocation ON allocation_atoms(allocation_id);
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

/// Migration 4: what a 10,000-node fleet needs to reconnect quickly (docs/benchmarks.md).
/// `inventory_sha256` lets the gateway skip storing a report identical to the last one (every
/// session open repeats it); `node_identifier_digests` turns JoinService's "same machine by two
/// shared identifiers" lookup into an index probe instead of a scan of every node. The backfill
/// uses SQLite's `json_each` (rows whose column is not a JSON array of strings, which only a hand
/// edit makes, are skipped rather than failing the start); PostgreSQL would use
/// `jsonb_array_elements_text`.
pub const M004_SCALE: &str = r#"
ALTER TABLE nodes ADD COLUMN inventory_sha256 TEXT;
CREATE TABLE node_identifier_digests (
    digest  TEXT NOT NULL,                               -- hex SHA-256 of one identifier
    node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    PRIMARY KEY (digest, node_id)
);
CREATE INDEX node_identifier_digests_node ON node_identifier_digests(node_id);
INSERT OR IGNORE INTO node_identifier_digests (digest, node_id)
    SELECT j.value, n.id FROM nodes n, json_each(n.identifier_digests) j
    WHERE json_valid(n.identifier_digests) AND json_type(n.identifier_digests) = 'array'
      AND j.type = 'text';
"#;

/// Migration 5: the uniqueness of a trusted hardware key, enforced by the store (issue 18.13),
/// and operators' approvals of re-joins (issue 19.1).
///
/// A store written before it may hold two nodes with the same trusted key (only code kept them
/// apart). The oldest holder (by `created_at`, then id: the node JoinService's lookup finds) keeps
/// the key trusted; every other one is demoted as the Inventory controller demotes a duplicate at
/// run time: `hardware_key_trusted = 0`, its `HardwareKeyTrusted` condition `false` with reason
/// `DuplicateKey` naming the holder, a `hardwareKey -> duplicate` event, and `version + 1` (its
/// trust changed). Then the partial unique index can be built, so opening such a store never
/// fails. `json_each`/`json_group_array`/`strftime` are SQLite's; PostgreSQL would use
/// `jsonb_array_elements` and `now()`.
///
/// `rejoin_requests` holds at most one request per node: a re-join in place of a platform node
/// that matched by identifiers only waits there for `nodes.approveRejoin`.
pub const M005_ACCESS: &str = r#"
CREATE TEMP TABLE m005_demoted AS
    SELECT r.id AS node_id,
           (SELECT k.id FROM nodes k WHERE k.hardware_key = r.hardware_key
                AND k.hardware_key_trusted = 1 ORDER BY k.created_at, k.id LIMIT 1) AS keeper
    FROM (SELECT id, hardware_key,
                 ROW_NUMBER() OVER (PARTITION BY hardware_key ORDER BY created_at, id) AS rn
          FROM nodes WHERE hardware_key_trusted = 1 AND hardware_key IS NOT NULL) r
    WHERE r.rn > 1;

UPDATE nodes SET
    hardware_key_trusted = 0,
    version = version + 1,
    conditions = CASE WHEN json_valid(conditions) AND json_type(conditions) = 'array' THEN (
        SELECT json_group_array(CASE WHEN json_extract(c.value, '$.type') = 'HardwareKeyTrusted'
            THEN json_set(c.value,
                '$.status', 'false',
                '$.reason', 'DuplicateKey',
                '$.message', 'node ' || d.keeper || ' already holds this trusted hardware key; uniqueness refused',
                '$.lastTransitionTime', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
            ELSE json(c.value) END)
        FROM json_each(nodes.conditions) c, m005_demoted d WHERE d.node_id = nodes.id)
        ELSE conditions END
WHERE id IN (SELECT node_id FROM m005_demoted);

INSERT INTO node_events (node_id, at, kind, from_value, to_value, actor, message)
    SELECT node_id, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'hardwareKey',
           NULL, 'duplicate', 'migration',
           'node ' || keeper || ' already holds this trusted hardware key; uniqueness refused'
    FROM m005_demoted;

DROP TABLE m005_demoted;

CREATE UNIQUE INDEX nodes_trusted_hardware_key ON nodes(hardware_key)
    WHERE hardware_key_trusted = 1;

CREATE TABLE rejoin_requests (
    id                   TEXT PRIMARY KEY,             -- rejoin_...
    node_id              TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    token_id             TEXT NOT NULL,                -- the join token the machine presented
    hardware_key         TEXT,
    hardware_key_trusted INTEGER NOT NULL DEFAULT 0,   -- as the control plane recomputed it
    identifier_digests   TEXT NOT NULL DEFAULT '[]',   -- JSON array of hex digests, sorted
    hostname             TEXT,
    peer                 TEXT,                         -- source address of the join
    requested_at         BIGINT NOT NULL,
    approved_at          BIGINT,
    approved_by          TEXT
);
CREATE UNIQUE INDEX rejoin_requests_node ON rejoin_requests(node_id);
"#;

/// Migration 6: a session whose stream broke without a Goodbye (`session_broken`: the node is
/// `disconnected` at once, and Liveness still turns its silence into `unreachable`, which a clean
/// Goodbye never does), and each pool's acceptance rules (`acceptance`, JSON
/// `{requireTrustedKey?, deadlineSeconds?}`; absent keys take the kind's defaults), with an index
/// on `provision_state` for the acceptance deadline sweep (it reads the `adopting` nodes every
/// second).
pub const M006_SESSIONS_AND_ACCEPTANCE: &str = r#"
ALTER TABLE nodes ADD COLUMN session_broken INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN acceptance TEXT NOT NULL DEFAULT '{}';
CREATE INDEX nodes_provision_state ON nodes(provision_state);
"#;

/// Migration 7: bare metal (issue 14). `node_bmcs`: the BMC a node was enrolled through (address,
/// TLS mode, the credentials sealed by the core's AEAD — never plaintext — and what the BMC
/// reported at verification, its identifiers as digests); `site_leases`: which site agent holds
/// each site's lease, at which epoch, until when; `commands.subject_node_id`: the bare-metal node
/// a `bmc.*` command acts on (the command itself goes to the site agent holding the lease).
pub const M007_BARE_METAL: &str = r#"
CREATE TABLE node_bmcs (
    node_id           TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    address           TEXT NOT NULL,
    tls               TEXT NOT NULL,                    -- pin | verify | insecure
    credentials       TEXT NOT NULL,                    -- sealed: AEAD envelope, never plaintext
    candidate         TEXT,                             -- sealed credentials under rotation
    cert_sha256       TEXT,
    facts             TEXT,                             -- JSON: what the BMC reported
    identifiers       TEXT NOT NULL DEFAULT '[]',       -- JSON [{kind, digest}]
    macs              TEXT NOT NULL DEFAULT '[]',       -- JSON: MACs the operator gave
    verified_at       BIGINT,
    verify_command_id TEXT,
    verify_started_at BIGINT,
    last_error        TEXT,
    power_expected    TEXT,
    power_expected_at BIGINT,
    reachable         INTEGER,
    created_at        BIGINT NOT NULL
);

CREATE TABLE site_leases (
    site_id        TEXT PRIMARY KEY REFERENCES sites(id) ON DELETE CASCADE,
    holder_node_id TEXT,
    epoch          BIGINT NOT NULL DEFAULT 0,
    granted_at     BIGINT,
    expires_at     BIGINT
);

ALTER TABLE commands ADD COLUMN subject_node_id TEXT;
CREATE INDEX commands_subject ON commands(subject_node_id, created_at);
"#;

/// Issue 15: the machine's current network boot into the ramdisk, one row per node. The boot
/// token's secret is kept twice: hashed (the join checks it) and sealed by the control plane's
/// credential key (the site agent's boot service serves it on the kernel command line).
pub const M008_BOOTS: &str = r#"
CREATE TABLE node_boots (
    node_id          TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    token_id         TEXT NOT NULL UNIQUE,
    secret_sha256    TEXT NOT NULL,
    sealed           TEXT NOT NULL,
    purpose          TEXT NOT NULL,      -- the provision state the boot is for
    created_at       BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    used_at          BIGINT,
    phase_started_at BIGINT NOT NULL,    -- when the node entered its current ramdisk state
    command_id       TEXT,               -- the bmc.power command that boots it, once issued
    ended_at         BIGINT,             -- when the node left the ramdisk (the row is kept)
    diag_command_id  TEXT,               -- commissioning's diag.nvml, once sent
    steps_at         BIGINT              -- when commissioning's inventory steps ran on this boot
);

-- Whether a verified enrollment goes on to `inspecting` by itself (nodes.enroll's `inspect`).
ALTER TABLE node_bmcs ADD COLUMN inspect INTEGER NOT NULL DEFAULT 0;
"#;

/// Issue 16: deploy, release, retire and adopting a running machine. The workflow's command in
/// flight on the boot and the last step it finished; the deploy asked for; whether an
/// enrollment is of a machine that already runs its OS (`nodes.enroll`'s `deployed`, Metal3's
/// `externallyProvisioned`).
pub const M009_WORKFLOWS: &str = r#"
ALTER TABLE node_boots ADD COLUMN work_command_id TEXT; -- disk.clean, image.write, bmc.* in flight
ALTER TABLE node_boots ADD COLUMN work_step TEXT;       -- the workflow's last finished step
ALTER TABLE node_bmcs ADD COLUMN deployed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE node_bmcs ADD COLUMN deployment TEXT;       -- nodes.deploy's image and config, JSON
ALTER TABLE node_bmcs ADD COLUMN rescue TEXT;           -- nodes.rescue's keys, JSON
"#;

/// Issue 17: the controllers' lease. Liveness, NodeLifecycle, the deadlines and the bare-metal
/// controllers run on one replica at a time: the one holding the row `controllers`, until
/// `expires_at` unless renewed; `epoch` counts holders.
pub const M010_CONTROLLER_LEASE: &str = r#"
CREATE TABLE controller_leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,            -- the replica (its gateway id)
    epoch      BIGINT NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
"#;

/// Issue 33: health remediation. A pool's policy (`remediation`, JSON `RemediationPolicy`), its
/// own conditions (`RemediationPaused` while its circuit breaker is open), when an operator last
/// resumed the breaker and how often it tripped; one row per remediation of a node (at most one
/// open per node: the partial unique index) and one per step it took; operators' suspensions of
/// remediation per node; what an allocation belongs to (`workload_id`: one workload over several
/// nodes books one allocation per node with the same id), why it was released, and the
/// workload's fault recorded on it; and the application-class XIDs seen on booked GPUs, which
/// tell a workload's fault from a node's. Remediations keep no foreign key to `nodes`: like the
/// event log, they outlive a deleted node.
pub const M011_REMEDIATION: &str = r#"
ALTER TABLE pools ADD COLUMN remediation TEXT NOT NULL DEFAULT '{}';
ALTER TABLE pools ADD COLUMN conditions TEXT NOT NULL DEFAULT '[]';
ALTER TABLE pools ADD COLUMN remediation_resumed_at BIGINT;
ALTER TABLE pools ADD COLUMN remediation_trips BIGINT NOT NULL DEFAULT 0;

CREATE TABLE remediations (
    id                TEXT PRIMARY KEY,                -- rem_...
    node_id           TEXT NOT NULL,
    pool_id           TEXT,
    mode              TEXT NOT NULL,                   -- observe | auto
    fault             TEXT NOT NULL,                   -- JSON Fault
    ladder            TEXT NOT NULL,                   -- JSON array of steps
    step_index        BIGINT NOT NULL DEFAULT 0,
    phase             TEXT NOT NULL,                   -- draining | acting | verifying | ended
    command_id        TEXT,
    verify_command_id TEXT,
    acted_at          BIGINT,
    cordoned          INTEGER NOT NULL DEFAULT 0,
    draining          INTEGER NOT NULL DEFAULT 0,
    waiting           TEXT,
    state             TEXT NOT NULL,                   -- active | succeeded | gaveUp | cleared | cancelled
    disruptive        INTEGER NOT NULL DEFAULT 0,
    started_at        BIGINT NOT NULL,
    phase_started_at  BIGINT NOT NULL,
    ended_at          BIGINT,
    outcome           TEXT
);
CREATE UNIQUE INDEX remediations_open ON remediations(node_id) WHERE ended_at IS NULL;
CREATE INDEX remediations_pool ON remediations(pool_id, started_at);
CREATE INDEX remediations_node ON remediations(node_id, started_at);

CREATE TABLE remediation_steps (
    remediation_id TEXT NOT NULL REFERENCES remediations(id) ON DELETE CASCADE,
    seq            BIGINT NOT NULL,
    step           TEXT NOT NULL,                      -- resetGpu | rebootNode | bmcPowerCycle | reinspect
    outcome        TEXT NOT NULL,                      -- succeeded | failed | skipped
    command_id     TEXT,
    at             BIGINT NOT NULL,
    message        TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (remediation_id, seq)
);

CREATE TABLE remediation_suspensions (
    node_id  TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    reason   TEXT NOT NULL,
    by_actor TEXT NOT NULL,
    at       BIGINT NOT NULL
);

ALTER TABLE allocations ADD COLUMN workload_id TEXT;
ALTER TABLE allocations ADD COLUMN release_reason TEXT;
ALTER TABLE allocations ADD COLUMN workload_fault TEXT;    -- JSON WorkloadFault
CREATE INDEX allocations_workload ON allocations(workload_id);

CREATE TABLE xid_observations (
    id             TEXT PRIMARY KEY,                   -- xid_...
    node_id        TEXT NOT NULL,
    xid            BIGINT NOT NULL,
    gpu            TEXT,
    workload_id    TEXT,
    allocation_id  TEXT,
    workload_fault INTEGER NOT NULL DEFAULT 0,
    at             BIGINT NOT NULL
);
CREATE INDEX xid_observations_workload ON xid_observations(workload_id, at);
CREATE INDEX xid_observations_node ON xid_observations(node_id, at);
CREATE INDEX xid_observations_at ON xid_observations(at);
"#;

/// Issue 31: the boot override is cleared (`bmc.setBootDevice none`) once the ramdisk joined;
/// the command that clears it, so it is sent once and the workflow's next step waits for it.
pub const M012_BOOT_OVERRIDE: &str = r#"
ALTER TABLE node_boots ADD COLUMN override_command_id TEXT; -- bmc.setBootDevice none after the join
"#;

/// Issue 30: a ramdisk join whose identifiers differ from the BMC's is counted on its boot
/// (evidence, not a verdict: the node fails only after several, or at the deadline); and the
/// identity a deploy issues to the system it wrote (`deploy_<id>.<secret>`, hashed here; the
/// deployed system's agent joins with it, and no pool join token re-joins a node that has one).
pub const M013_BOOT_EVIDENCE_AND_DEPLOY_IDENTITY: &str = r#"
ALTER TABLE node_boots ADD COLUMN mismatches BIGINT NOT NULL DEFAULT 0; -- ramdisk joins that differed
CREATE TABLE deploy_identities (
    node_id       TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    token_id      TEXT NOT NULL UNIQUE,
    secret_sha256 TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT,             -- the deployed system's last join with it
    uses          BIGINT NOT NULL DEFAULT 0
);
"#;

//! The typed requests and answers of the operator verbs (camelCase JSON). Requests refuse unknown
//! fields; a node, pool, site, token or allocation reference also accepts `id` for its id. Lists
//! are wrapped (`{"nodes": [...]}`) so they can grow fields later. The OpenAPI document is
//! generated from these same types, and clients (`bcctl`) build and serialize them too
//! ([`super::Request`]), so a field renamed here is renamed for the server and its clients at
//! once. An absent optional field serializes as `null`, which every request reads as absent.

use cpl_store::{
    Allocation, CommandRecord, DedicatedRootLease, HardwareProfile, JoinToken, NodeEvent, Pool,
    Site,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::conditions::rfc3339_ms;
use crate::detail::NodeDetail;
use crate::text::{Id, Key, Name, ShortText, Text};

/// A request without fields (`pools.list`, `sites.list`, `tokens.list`,
/// `controlPlane.status`): `{}` (or no body); an object with any key, or anything but an
/// object, is `INVALID_ARGUMENT` (a filter the verb does not have must not read as "everything").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// An answer without fields: `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Empty {}

/// A request naming one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRef {
    #[serde(alias = "id")]
    pub node_id: Id,
}

/// A node mutation: the node and the `version` the caller read (stale: `CONFLICT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeMutation {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
}

/// `nodes.taint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaintRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    /// 1 to 63 characters of `[A-Za-z0-9._/-]`, starting with a letter or digit.
    pub key: Key,
    #[serde(default)]
    pub value: ShortText,
}

/// `nodes.untaint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UntaintRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    pub key: Key,
}

/// `nodes.setLabels`: labels to add or replace (others stay).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetLabelsRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    /// Key (1 to 63 characters of `[A-Za-z0-9._/-]`) to value (0 to 256 printable characters);
    /// a node carries at most 64 labels.
    pub labels: std::collections::BTreeMap<Key, ShortText>,
}

/// `nodes.removeLabels`: keys to remove (a key the node does not carry is skipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveLabelsRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    pub keys: Vec<Key>,
}

/// `nodes.setMaintenance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaintenanceRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    pub maintenance: bool,
    #[serde(default)]
    pub reason: Option<Text>,
}

/// `nodes.updateSpec`: the new desired spec (a `NodeSpec` object, docs/node-model.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
}

/// `nodes.startDedicatedRoot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    pub tenant_id: Id,
}

/// `nodes.approveRejoin`: the request shown by `nodes.get` (`rejoinRequest.id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproveRejoinRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    /// `rejoin_…`: the node's pending request.
    pub request_id: Id,
}

/// `nodes.move`: the pool the node moves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MoveRequest {
    #[serde(alias = "id")]
    pub node_id: Id,
    pub version: u64,
    /// The pool the node moves to.
    pub pool_id: Id,
}

/// `nodes.list` answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeDetail>,
}

/// `nodes.events` answer, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventList {
    pub events: Vec<NodeEvent>,
}

/// `nodes.startDedicatedRoot` answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaseStarted {
    pub node: NodeDetail,
    pub lease: DedicatedRootLease,
}

/// A request naming one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRef {
    #[serde(alias = "id")]
    pub pool_id: Id,
}

/// `pools.update`: name and hardware profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolUpdate {
    #[serde(alias = "id")]
    pub pool_id: Id,
    pub version: u64,
    pub name: Name,
    #[serde(default, deserialize_with = "crate::text::profile")]
    pub hardware_profile: HardwareProfile,
    /// New acceptance rules; absent: unchanged.
    #[serde(default)]
    pub acceptance: Option<cpl_store::Acceptance>,
}

/// `pools.delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolDelete {
    #[serde(alias = "id")]
    pub pool_id: Id,
    pub version: u64,
}

/// `pools.list` answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<Pool>,
}

/// A request naming one site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteRef {
    #[serde(alias = "id")]
    pub site_id: Id,
}

/// `sites.update`: a new name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteUpdate {
    #[serde(alias = "id")]
    pub site_id: Id,
    pub version: u64,
    pub name: Name,
}

/// `sites.delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteDelete {
    #[serde(alias = "id")]
    pub site_id: Id,
    pub version: u64,
}

/// `sites.list` answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SiteList {
    pub sites: Vec<Site>,
}

/// `tokens.create` request. Without `ttlSeconds` the token lives an hour; without `maxUses` a
/// pool token is unlimited and a site token (a site, no pool: a site agent's) is good for one
/// join.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokensCreateRequest {
    #[serde(default)]
    pub pool_id: Option<Id>,
    #[serde(default)]
    pub site_id: Option<Id>,
    /// Seconds, 1 to 2,592,000 (30 days); default 3600.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub ttl_seconds: Option<u64>,
    /// 1 to 2^63-1 (what the store holds); default: unlimited, or 1 for a site token.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 9_223_372_036_854_775_807_u64)]
    pub max_uses: Option<u64>,
    #[serde(default)]
    pub description: Option<Text>,
}

/// `tokens.create` answer: the secret is shown here once and never again, with the CA pin and
/// the gateway URL an agent needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokensCreateResponse {
    /// `<id>.<secret>`.
    pub token: String,
    pub id: String,
    /// `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    pub ca_pin: String,
    /// The gateway URL agents join.
    pub control_plane: String,
    /// RFC 3339.
    pub expires_at: String,
    pub max_uses: Option<u64>,
    pub pool_id: Option<String>,
    pub site_id: Option<String>,
}

/// A request naming one token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRef {
    #[serde(alias = "id")]
    pub token_id: Id,
}

/// `tokens.list` answer, newest first, never with secrets.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<JoinToken>,
}

/// A request naming one allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocationRef {
    #[serde(alias = "id")]
    pub allocation_id: Id,
}

/// `allocations.list` filters; absent matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllocationListRequest {
    #[serde(default)]
    pub pool_id: Option<Id>,
    #[serde(default)]
    pub node_id: Option<Id>,
    /// Only allocations not released yet.
    #[serde(default)]
    pub active_only: bool,
}

/// `allocations.list` answer, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AllocationList {
    pub allocations: Vec<Allocation>,
}

/// `commands.create` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandsCreateRequest {
    pub node_id: Id,
    /// `inventory.refresh`, `diag.nvml`, `logs.collect`, `gpu.reset` or `node.reboot`.
    pub name: Id,
    /// A JSON object; `force: true` lets a disruptive command reach a node that still takes work.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub args: Option<serde_json::Value>,
    /// 1 to 86,400; default 300.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86_400)]
    pub timeout_seconds: Option<u64>,
}

/// A request naming one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandRef {
    pub command_id: Id,
}

/// `commands.list` request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandsListRequest {
    #[serde(default)]
    pub node_id: Option<Id>,
    /// Default 100, at most 1000.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// A command as the API shows it. Times are RFC 3339. `args.configDrive.userData` is shown
/// withheld (`crate::bare_metal::user_data`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandView {
    pub id: String,
    pub node_id: String,
    pub name: String,
    #[schema(value_type = Object)]
    pub args: serde_json::Value,
    /// queued | sent | running | succeeded | failed | cancelled | expired
    pub state: String,
    pub progress: u32,
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
    pub error: Option<CommandErrorView>,
    pub actor: String,
    pub created_at: String,
    pub sent_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub deadline: String,
}

/// A command's error: `{code, message}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CommandErrorView {
    pub code: String,
    pub message: String,
}

impl From<&CommandRecord> for CommandView {
    fn from(c: &CommandRecord) -> Self {
        Self {
            id: c.id.clone(),
            node_id: c.node_id.clone(),
            name: c.name.as_str().to_owned(),
            // Cloud-init user data is never shown (issue 30.4).
            args: crate::bare_metal::user_data::withhold(&c.args).unwrap_or_else(|| c.args.clone()),
            state: c.state.as_str().to_owned(),
            progress: c.progress,
            result: c.result.clone(),
            error: c.error_code.as_ref().map(|code| CommandErrorView {
                code: code.clone(),
                message: c.error_message.clone().unwrap_or_default(),
            }),
            actor: c.actor.clone(),
            created_at: rfc3339_ms(c.created_at),
            sent_at: c.sent_at.map(rfc3339_ms),
            started_at: c.started_at.map(rfc3339_ms),
            finished_at: c.finished_at.map(rfc3339_ms),
            deadline: rfc3339_ms(c.deadline_at),
        }
    }
}

/// `commands.list` answer, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CommandList {
    pub commands: Vec<CommandView>,
}

//! [`Core::dispatch`]: the one dispatcher of the operator verbs. Reads run in one read
//! transaction, mutations in one write transaction; what a committed verb means for a live
//! session (close a revoked or deleted node's session, push a new spec) happens after the commit,
//! through the [`AgentSessions`] port.

use std::sync::Arc;

use bc_protocol::pb::GoodbyeReason;
use cpl_store::{NewToken, NodeRecord, Reader, Store, Tx};
use tracing::Instrument;

use super::types::*;
use super::{Request, Response};
use crate::commands::Commands;
use crate::conditions::rfc3339_ms;
use crate::detail::NodeDetail;
use crate::error::OpError;
use crate::ops::nodes as node_ops;
use crate::port::AgentSessions;
use crate::{ops, placer, sessions};

/// Default lifetime of a join token, seconds (one hour).
pub const DEFAULT_TOKEN_TTL_SECONDS: u64 = 3600;
/// Uses of a site token (bound to a site and no pool) created without `maxUses`: one site
/// agent. A second appliance (a standby) asks for `maxUses: 2`, or gets its own token.
pub const DEFAULT_SITE_TOKEN_USES: u64 = 1;
/// Longest token lifetime accepted, seconds (30 days).
pub const MAX_TOKEN_TTL_SECONDS: u64 = 30 * 24 * 3600;
/// Longest command timeout accepted, seconds (one day).
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;

/// What `tokens.create` tells an operator besides the token: how an agent reaches and trusts
/// this control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIssuer {
    /// `sha256:<hex>` pin of the CA.
    pub ca_pin: String,
    /// The gateway URL agents use.
    pub control_plane: String,
}

/// Everything the verbs act on. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Core {
    pub store: Store,
    pub commands: Commands,
    /// Enrollment, power and BMC credentials (the site lease's holder does the BMC work).
    pub bare_metal: crate::bare_metal::BareMetal,
    pub sessions: Arc<dyn AgentSessions>,
    pub issuer: TokenIssuer,
    /// The replica this core answers for (`controlPlane.status`).
    pub replica: crate::status::ReplicaIdentity,
}

/// A node mutation `{nodeId, version}`.
type NodeVerb = fn(&Tx<'_>, &str, u64, &str) -> Result<NodeRecord, OpError>;

/// NodeDetail of a record just saved in `tx` (its pool's owner read in the same transaction).
pub(super) fn detail(tx: &Reader<'_>, node: &NodeRecord) -> Result<NodeDetail, OpError> {
    let owner = match &node.pool_id {
        Some(p) => tx.pool(p)?.and_then(|p| p.owner_tenant_id),
        None => None,
    };
    Ok(NodeDetail::new(node, owner.as_deref()))
}

impl Core {
    /// Runs `req` on behalf of `actor` (`operator`). Errors carry their API code
    /// ([`OpError::code`]).
    pub async fn dispatch(&self, req: Request, actor: &str) -> Result<Response, OpError> {
        let span = tracing::info_span!("verb", method = %req.method());
        self.dispatch_inner(req, actor).instrument(span).await
    }

    async fn dispatch_inner(&self, req: Request, actor: &str) -> Result<Response, OpError> {
        use Request as R;
        use Response as A;
        let a = actor;
        match req {
            R::NodesList(f) => self.nodes_list(f).await.map(A::NodesList),
            R::NodesGet(b) => self.nodes_get(b).await.map(A::NodesGet),
            R::NodesEvents(b) => self.nodes_events(b).await.map(A::NodesEvents),
            R::NodesCordon(b) => self
                .node_verb(b, a, node_ops::cordon)
                .await
                .map(A::NodesCordon),
            R::NodesUncordon(b) => self
                .node_verb(b, a, node_ops::uncordon)
                .await
                .map(A::NodesUncordon),
            R::NodesDrain(b) => self
                .node_verb(b, a, node_ops::drain)
                .await
                .map(A::NodesDrain),
            R::NodesTaint(b) => self.nodes_taint(b, a).await.map(A::NodesTaint),
            R::NodesUntaint(b) => self.nodes_untaint(b, a).await.map(A::NodesUntaint),
            R::NodesSetLabels(b) => self.nodes_set_labels(b, a).await.map(A::NodesSetLabels),
            R::NodesRemoveLabels(b) => self
                .nodes_remove_labels(b, a)
                .await
                .map(A::NodesRemoveLabels),
            R::NodesAdopt(b) => self
                .node_verb(b, a, node_ops::adopt)
                .await
                .map(A::NodesAdopt),
            R::NodesRecover(b) => self.nodes_recover(b, a).await.map(A::NodesRecover),
            R::NodesRetire(b) => {
                let d = self.node_verb(b, a, ops::retire::retire).await?;
                self.end_revoked_session(&d.id).await;
                Ok(A::NodesRetire(d))
            }
            R::NodesRelease(b) => {
                let d = self
                    .node_verb(b, a, crate::bare_metal::release::release)
                    .await?;
                self.end_revoked_session(&d.id).await;
                Ok(A::NodesRelease(d))
            }
            R::NodesSetMaintenance(b) => self
                .nodes_set_maintenance(b, a)
                .await
                .map(A::NodesSetMaintenance),
            R::NodesRevokeIdentity(b) => self
                .nodes_revoke_identity(b, a)
                .await
                .map(A::NodesRevokeIdentity),
            R::NodesDelete(b) => self.nodes_delete(b, a).await.map(A::NodesDelete),
            R::NodesUpdateSpec(b) => self.update_spec(b, a).await.map(A::NodesUpdateSpec),
            R::NodesStartDedicatedRoot(b) => self
                .start_dedicated_root(b, a)
                .await
                .map(A::NodesStartDedicatedRoot),
            R::NodesEndDedicatedRoot(b) => self
                .node_verb(b, a, node_ops::end_dedicated_root)
                .await
                .map(A::NodesEndDedicatedRoot),
            R::NodesApproveRejoin(b) => self
                .nodes_approve_rejoin(b, a)
                .await
                .map(A::NodesApproveRejoin),
            R::NodesMove(b) => self.nodes_move(b, a).await.map(A::NodesMove),
            R::NodesEnroll(b) => self.nodes_enroll(b, a).await.map(A::NodesEnroll),
            R::NodesPower(b) => self
                .bare_metal
                .power(b, a)
                .await
                .map(|c| A::NodesPower(CommandView::from(&c))),
            R::NodesSetBootDevice(b) => self
                .bare_metal
                .set_boot_device(b, a)
                .await
                .map(|c| A::NodesSetBootDevice(CommandView::from(&c))),
            R::NodesAbort(b) => self.nodes_abort(b, a).await.map(A::NodesAbort),
            R::NodesDeploy(b) => {
                let id = b.node_id.to_string();
                self.bare_metal.deploy(b, a).await?;
                self.read(move |r| crate::query::get_node(r, &id))
                    .await
                    .map(A::NodesDeploy)
            }
            R::NodesRescue(b) => {
                let id = b.node_id.to_string();
                self.bare_metal.rescue(b, a).await?;
                self.read(move |r| crate::query::get_node(r, &id))
                    .await
                    .map(A::NodesRescue)
            }
            R::NodesUnrescue(b) => {
                let id = b.node_id.to_string();
                self.bare_metal.unrescue(b, a).await?;
                self.end_revoked_session(&id).await;
                self.read(move |r| crate::query::get_node(r, &id))
                    .await
                    .map(A::NodesUnrescue)
            }
            R::NodesInspect(b) => {
                let id = b.node_id.to_string();
                self.bare_metal.inspect(b, a).await?;
                self.read(move |r| crate::query::get_node(r, &id))
                    .await
                    .map(A::NodesInspect)
            }
            R::NodesUpdateBmcCredentials(b) => self
                .nodes_update_bmc_credentials(b, a)
                .await
                .map(A::NodesUpdateBmcCredentials),
            R::NodesSetRemediation(b) => {
                let actor = a.to_owned();
                self.write(move |tx| {
                    let n = crate::remediation::view::set_suspension(tx, &b, &actor)?;
                    detail(tx, &n)
                })
                .await
                .map(A::NodesSetRemediation)
            }
            R::PoolsSetRemediation(b) => self
                .write(move |tx| crate::remediation::view::set_policy(tx, &b))
                .await
                .map(A::PoolsSetRemediation),
            R::PoolsResumeRemediation(b) => {
                let actor = a.to_owned();
                self.write(move |tx| {
                    crate::remediation::breaker::resume(tx, &b.pool_id, b.version, &actor)
                })
                .await
                .map(A::PoolsResumeRemediation)
            }
            R::RemediationsList(b) => self
                .read(move |r| crate::remediation::view::list(r, &b))
                .await
                .map(A::RemediationsList),
            R::RemediationsGet(b) => self
                .read(move |r| crate::remediation::view::get(r, &b))
                .await
                .map(A::RemediationsGet),
            R::PoolsCreate(b) => self
                .write(move |tx| ops::pools::create(tx, &b))
                .await
                .map(A::PoolsCreate),
            R::PoolsGet(b) => self
                .read(move |r| ops::pools::get(r, &b.pool_id))
                .await
                .map(A::PoolsGet),
            R::PoolsList(_) => self.pools_list().await.map(A::PoolsList),
            R::PoolsUpdate(b) => self.pools_update(b).await.map(A::PoolsUpdate),
            R::PoolsDelete(b) => self
                .write(move |tx| ops::pools::delete(tx, &b.pool_id, b.version))
                .await
                .map(A::PoolsDelete),
            R::PoolsCapacity(b) => self
                .read(move |r| placer::capacity(r, &b.pool_id))
                .await
                .map(A::PoolsCapacity),
            R::SitesCreate(b) => self
                .write(move |tx| ops::sites::create(tx, &b))
                .await
                .map(A::SitesCreate),
            R::SitesGet(b) => self
                .read(move |r| crate::bare_metal::site_detail::get(r, &b.site_id))
                .await
                .map(A::SitesGet),
            R::SitesList(_) => self.sites_list().await.map(A::SitesList),
            R::SitesUpdate(b) => self
                .write(move |tx| ops::sites::rename(tx, &b.site_id, b.version, &b.name))
                .await
                .map(A::SitesUpdate),
            R::SitesDelete(b) => self
                .write(move |tx| ops::sites::delete(tx, &b.site_id, b.version))
                .await
                .map(A::SitesDelete),
            R::TokensCreate(b) => self.create_token(b).await.map(A::TokensCreate),
            R::TokensList(_) => self.tokens_list().await.map(A::TokensList),
            R::TokensRevoke(b) => self.tokens_revoke(b).await.map(A::TokensRevoke),
            R::AllocationsCreate(b) => self
                .allocations_create(b, a)
                .await
                .map(A::AllocationsCreate),
            R::AllocationsGet(b) => self
                .read(move |r| placer::get(r, &b.allocation_id))
                .await
                .map(A::AllocationsGet),
            R::AllocationsList(b) => self.allocations_list(b).await.map(A::AllocationsList),
            R::AllocationsRelease(b) => self
                .allocations_release(b, a)
                .await
                .map(A::AllocationsRelease),
            R::CommandsCreate(b) => self.create_command(b, a).await.map(A::CommandsCreate),
            R::CommandsGet(b) => self.commands_get(b).await.map(A::CommandsGet),
            R::CommandsList(b) => self.commands_list(b).await.map(A::CommandsList),
            R::CommandsCancel(b) => self.commands_cancel(b).await.map(A::CommandsCancel),
            R::ControlPlaneStatus(_) => {
                let (replica, backend) = (self.replica.clone(), self.store.backend_name());
                self.read(move |r| crate::status::read(r, &replica, backend, cpl_store::now_ms()))
                    .await
                    .map(A::ControlPlaneStatus)
            }
        }
    }

    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Reader<'_>) -> Result<T, OpError> + Send + 'static,
    ) -> Result<T, OpError> {
        self.store.read(f).await
    }

    pub(super) async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, OpError> + Send + 'static,
    ) -> Result<T, OpError> {
        self.store.write(f).await
    }

    /// A node mutation `{nodeId, version}` run through `f` and answered with NodeDetail.
    pub(super) async fn node_verb(
        &self,
        b: NodeMutation,
        actor: &str,
        f: NodeVerb,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = f(tx, &b.node_id, b.version, &actor)?;
            detail(tx, &n)
        })
        .await
    }

    /// After `nodes.revokeIdentity`: the node's session ends at once, recorded as a clean end
    /// (the control plane ended it on purpose: `disconnected`, not `unreachable`).
    pub(super) async fn end_revoked_session(&self, node_id: &str) {
        let Some(epoch) =
            self.sessions
                .close(node_id, GoodbyeReason::Revoked, "node identity revoked")
        else {
            return;
        };
        let id = node_id.to_owned();
        if let Err(e) = self
            .write(move |tx| sessions::close_clean(tx, &id, epoch, "revoked"))
            .await
        {
            let span = tracing::info_span!("node", node_id = %node_id, epoch);
            span.in_scope(
                || tracing::error!(error = %e, "recording the revoked session's end failed"),
            );
        }
    }

    /// `nodes.updateSpec`: the spec must parse, name GPUs the node has, carry no past expiry, and
    /// give no break-glass keys to a tenant-controlled node; then it is stored and pushed.
    pub(super) async fn update_spec(
        &self,
        b: SpecRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let spec: bc_protocol::spec::NodeSpec = serde_json::from_value(b.spec.clone())
            .map_err(|e| OpError::InvalidArgument(format!("spec: {e}")))?;
        let actor = actor.to_owned();
        let d = self
            .write(move |tx| {
                if let Some(node) = tx.node(&b.node_id)? {
                    validate_spec(&node, &spec)?;
                }
                let n = node_ops::update_spec(tx, &b.node_id, b.version, &actor, b.spec)?;
                detail(tx, &n)
            })
            .await?;
        crate::push::push_spec(&self.store, self.sessions.as_ref(), &d.id).await;
        Ok(d)
    }

    /// `tokens.create`: 1 h by default, at most 30 days; `maxUses` at least 1, by default
    /// unlimited for a pool token and [`DEFAULT_SITE_TOKEN_USES`] for a site token.
    pub(super) async fn create_token(
        &self,
        b: TokensCreateRequest,
    ) -> Result<TokensCreateResponse, OpError> {
        let ttl = b.ttl_seconds.unwrap_or(DEFAULT_TOKEN_TTL_SECONDS);
        if ttl == 0 || ttl > MAX_TOKEN_TTL_SECONDS {
            return Err(OpError::InvalidArgument(format!(
                "ttlSeconds must be between 1 and {MAX_TOKEN_TTL_SECONDS}, got {ttl}"
            )));
        }
        if b.max_uses == Some(0) {
            return Err(OpError::InvalidArgument(
                "maxUses must be at least 1".to_owned(),
            ));
        }
        // A site token (a site, no pool) places a site agent, which receives every BMC
        // password of its site: one use unless the operator asks for more (issue 30.10).
        let site_only = b.site_id.is_some() && b.pool_id.is_none();
        let max_uses = b.max_uses.or(site_only.then_some(DEFAULT_SITE_TOKEN_USES));
        let new = NewToken {
            pool_id: b.pool_id.map(crate::text::Id::into_string),
            site_id: b.site_id.map(crate::text::Id::into_string),
            ttl_ms: i64::try_from(ttl.saturating_mul(1000)).unwrap_or(i64::MAX),
            max_uses,
            description: b.description.map(crate::text::Text::into_string),
        };
        let (tok, secret) = self.write(move |tx| ops::tokens::create(tx, &new)).await?;
        Ok(TokensCreateResponse {
            token: secret,
            id: tok.id,
            ca_pin: self.issuer.ca_pin.clone(),
            control_plane: self.issuer.control_plane.clone(),
            expires_at: rfc3339_ms(tok.expires_at),
            max_uses: tok.max_uses,
            pool_id: tok.pool_id,
            site_id: tok.site_id,
        })
    }
}

/// The spec checks of `nodes.updateSpec` against the node as stored (`spec::validate`).
fn validate_spec(node: &NodeRecord, spec: &bc_protocol::spec::NodeSpec) -> Result<(), OpError> {
    let known: Option<Vec<bc_protocol::spec::KnownGpu>> = crate::inventory::of(node).map(|inv| {
        inv.gpus
            .into_iter()
            .map(|g| bc_protocol::spec::KnownGpu {
                uuid: g.uuid,
                pci_address: Some(g.pci_bus_id),
            })
            .collect()
    });
    let ctx = bc_protocol::spec::ValidationContext {
        now_ms: cpl_store::now_ms(),
        trust: node.trust,
        known_gpus: known.as_deref(),
    };
    bc_protocol::spec::validate(spec, &ctx).map_err(|e| OpError::InvalidArgument(e.to_string()))
}

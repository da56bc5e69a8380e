//! The verbs that are more than one call: each is a small method of [`Core`], called from the
//! one dispatcher's match ([`super::dispatch`]).

use cpl_store::AllocationFilter;

use super::dispatch::{Core, detail};
use super::types::*;
use crate::commands::DEFAULT_COMMAND_TIMEOUT;
use crate::detail::NodeDetail;
use crate::error::OpError;
use crate::ops::nodes as node_ops;
use crate::{ops, placer, query};

impl Core {
    pub(super) async fn nodes_list(
        &self,
        f: crate::query::NodeFilter,
    ) -> Result<NodeList, OpError> {
        self.read(move |r| {
            Ok(NodeList {
                nodes: query::list_nodes(r, &f)?,
            })
        })
        .await
    }

    pub(super) async fn nodes_get(&self, b: NodeRef) -> Result<NodeDetail, OpError> {
        self.read(move |r| query::get_node(r, &b.node_id)).await
    }

    pub(super) async fn nodes_events(&self, b: NodeRef) -> Result<EventList, OpError> {
        self.read(move |r| {
            Ok(EventList {
                events: query::node_events(r, &b.node_id)?,
            })
        })
        .await
    }

    pub(super) async fn nodes_taint(
        &self,
        b: TaintRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = node_ops::taint(tx, &b.node_id, b.version, &actor, &b.key, &b.value)?;
            detail(tx, &n)
        })
        .await
    }

    pub(super) async fn nodes_untaint(
        &self,
        b: UntaintRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = node_ops::untaint(tx, &b.node_id, b.version, &actor, &b.key)?;
            detail(tx, &n)
        })
        .await
    }

    pub(super) async fn nodes_set_labels(
        &self,
        b: SetLabelsRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = ops::labels::set_labels(tx, &b.node_id, b.version, &actor, &b.labels)?;
            detail(tx, &n)
        })
        .await
    }

    pub(super) async fn nodes_remove_labels(
        &self,
        b: RemoveLabelsRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = ops::labels::remove_labels(tx, &b.node_id, b.version, &actor, &b.keys)?;
            detail(tx, &n)
        })
        .await
    }

    pub(super) async fn nodes_set_maintenance(
        &self,
        b: MaintenanceRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = node_ops::set_maintenance(
                tx,
                &b.node_id,
                b.version,
                &actor,
                b.maintenance,
                b.reason.as_deref(),
            )?;
            detail(tx, &n)
        })
        .await
    }

    /// `nodes.revokeIdentity`, then the node's live session ends at once.
    pub(super) async fn nodes_revoke_identity(
        &self,
        b: NodeMutation,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let d = self.node_verb(b, actor, node_ops::revoke_identity).await?;
        self.end_revoked_session(&d.id).await;
        Ok(d)
    }

    /// `nodes.delete`, then the node's live session ends with `Goodbye{deleted}`.
    pub(super) async fn nodes_delete(
        &self,
        b: NodeMutation,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let d = self.node_verb(b, actor, node_ops::delete).await?;
        self.sessions.close(
            &d.id,
            bc_protocol::pb::GoodbyeReason::Deleted,
            "node deleted",
        );
        Ok(d)
    }

    /// `nodes.startDedicatedRoot`, then the new spec (without break-glass keys) is pushed.
    pub(super) async fn start_dedicated_root(
        &self,
        b: LeaseRequest,
        actor: &str,
    ) -> Result<LeaseStarted, OpError> {
        let actor = actor.to_owned();
        let out = self
            .write(move |tx| {
                let (n, lease) = node_ops::start_dedicated_root(
                    tx,
                    &b.node_id,
                    b.version,
                    &actor,
                    &b.tenant_id,
                )?;
                Ok(LeaseStarted {
                    node: detail(tx, &n)?,
                    lease,
                })
            })
            .await?;
        crate::push::push_spec(&self.store, self.sessions.as_ref(), &out.node.id).await;
        Ok(out)
    }

    /// `nodes.approveRejoin`: answered with the node as `nodes.get` shows it (the request
    /// approved).
    pub(super) async fn nodes_approve_rejoin(
        &self,
        b: ApproveRejoinRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            ops::membership::approve_rejoin(tx, &b.node_id, b.version, &actor, &b.request_id)?;
            query::get_node(tx, &b.node_id)
        })
        .await
    }

    /// `nodes.move` (the spec and identity stay: nothing to push).
    pub(super) async fn nodes_move(
        &self,
        b: MoveRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| {
            let n = ops::membership::move_node(tx, &b.node_id, b.version, &actor, &b.pool_id)?;
            detail(tx, &n)
        })
        .await
    }

    /// `nodes.enroll`, then the site's lease holder gets the new BMC and its verification.
    pub(super) async fn nodes_enroll(
        &self,
        b: crate::bare_metal::enroll::EnrollRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        let key = std::sync::Arc::clone(&self.bare_metal.key);
        let site = b.site_id.clone();
        let d = self
            .write(move |tx| {
                let n = crate::bare_metal::enroll::enroll(tx, &key, &b, &actor)?;
                query::get_node(tx, &n.id)
            })
            .await?;
        self.bare_metal.issue_verifications(&site).await;
        Ok(d)
    }

    /// `nodes.recover`; a failed enrollment is verified again at once when its site has a
    /// lease holder.
    pub(super) async fn nodes_recover(
        &self,
        b: NodeMutation,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        let d = self
            .write(move |tx| {
                let n = crate::bare_metal::abort::recover(tx, &b.node_id, b.version, &actor)?;
                query::get_node(tx, &n.id)
            })
            .await?;
        if d.bmc.is_some()
            && let Some(site) = &d.site_id
        {
            self.bare_metal.issue_verifications(site).await;
        }
        Ok(d)
    }

    /// `nodes.abort`, then the workflow's commands in flight are cancelled (a command over by
    /// then is left as it ended).
    pub(super) async fn nodes_abort(
        &self,
        b: NodeMutation,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let actor = actor.to_owned();
        let (id, cancel) = self
            .write(move |tx| {
                let (n, cancel) =
                    crate::bare_metal::abort::abort(tx, &b.node_id, b.version, &actor)?;
                Ok::<_, OpError>((n.id, cancel))
            })
            .await?;
        for c in cancel {
            if let Err(e) = self.bare_metal.commands.cancel(&c).await {
                tracing::info!(command_id = %c, error = %e, "nodes.abort: command not cancelled");
            }
        }
        self.read(move |r| query::get_node(r, &id)).await
    }

    /// `nodes.updateBmcCredentials`: answered once the BMC accepted (or refused) the new pair.
    pub(super) async fn nodes_update_bmc_credentials(
        &self,
        b: crate::bare_metal::power::UpdateBmcCredentialsRequest,
        actor: &str,
    ) -> Result<NodeDetail, OpError> {
        let id = b.node_id.clone();
        self.bare_metal.update_credentials(b, actor).await?;
        self.read(move |r| query::get_node(r, &id)).await
    }

    pub(super) async fn pools_list(&self) -> Result<PoolList, OpError> {
        self.read(|r| {
            Ok(PoolList {
                pools: ops::pools::list(r)?,
            })
        })
        .await
    }

    pub(super) async fn pools_update(&self, b: PoolUpdate) -> Result<cpl_store::Pool, OpError> {
        self.write(move |tx| {
            ops::pools::update(
                tx,
                &b.pool_id,
                b.version,
                &b.name,
                &b.hardware_profile,
                b.acceptance.as_ref(),
            )
        })
        .await
    }

    pub(super) async fn sites_list(&self) -> Result<SiteList, OpError> {
        self.read(|r| {
            Ok(SiteList {
                sites: ops::sites::list(r)?,
            })
        })
        .await
    }

    pub(super) async fn tokens_list(&self) -> Result<TokenList, OpError> {
        self.read(|r| {
            Ok(TokenList {
                tokens: ops::tokens::list(r)?,
            })
        })
        .await
    }

    pub(super) async fn tokens_revoke(&self, b: TokenRef) -> Result<Empty, OpError> {
        self.write(move |tx| ops::tokens::revoke(tx, &b.token_id).map(|()| Empty {}))
            .await
    }

    pub(super) async fn allocations_create(
        &self,
        b: crate::placer::AllocationRequest,
        actor: &str,
    ) -> Result<cpl_store::Allocation, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| placer::create(tx, &b, &actor)).await
    }

    pub(super) async fn allocations_list(
        &self,
        b: AllocationListRequest,
    ) -> Result<AllocationList, OpError> {
        let f = AllocationFilter {
            pool_id: b.pool_id.map(crate::text::Id::into_string),
            node_id: b.node_id.map(crate::text::Id::into_string),
            active_only: b.active_only,
        };
        self.read(move |r| {
            Ok(AllocationList {
                allocations: placer::list(r, &f)?,
            })
        })
        .await
    }

    pub(super) async fn allocations_release(
        &self,
        b: AllocationRef,
        actor: &str,
    ) -> Result<cpl_store::Allocation, OpError> {
        let actor = actor.to_owned();
        self.write(move |tx| placer::release(tx, &b.allocation_id, &actor))
            .await
    }

    /// `commands.create`: timeout 1 s to one day (default 5 min); args default to `{}`.
    pub(super) async fn create_command(
        &self,
        b: CommandsCreateRequest,
        actor: &str,
    ) -> Result<CommandView, OpError> {
        let timeout = b
            .timeout_seconds
            .map(std::time::Duration::from_secs)
            .unwrap_or(DEFAULT_COMMAND_TIMEOUT);
        if timeout.is_zero() || timeout.as_secs() > super::dispatch::MAX_TIMEOUT_SECONDS {
            return Err(OpError::InvalidArgument(format!(
                "timeoutSeconds must be between 1 and {}",
                super::dispatch::MAX_TIMEOUT_SECONDS
            )));
        }
        let args = b
            .args
            .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
        let rec = self
            .commands
            .create(&b.node_id, &b.name, args, timeout, actor)
            .await?;
        Ok(CommandView::from(&rec))
    }

    pub(super) async fn commands_get(&self, b: CommandRef) -> Result<CommandView, OpError> {
        let rec = self.commands.get(&b.command_id).await?;
        let rec = rec.ok_or(OpError::NotFound {
            kind: "command",
            id: b.command_id.into_string(),
        })?;
        Ok(CommandView::from(&rec))
    }

    /// `commands.list`: newest first, 100 by default, at most 1000.
    pub(super) async fn commands_list(
        &self,
        b: CommandsListRequest,
    ) -> Result<CommandList, OpError> {
        let limit = b.limit.unwrap_or(100).clamp(1, 1000);
        let recs = self
            .store
            .read(move |r| r.commands(b.node_id.as_deref(), limit))
            .await?;
        Ok(CommandList {
            commands: recs.iter().map(CommandView::from).collect(),
        })
    }

    pub(super) async fn commands_cancel(&self, b: CommandRef) -> Result<CommandView, OpError> {
        let rec = self.commands.cancel(&b.command_id).await?;
        Ok(CommandView::from(&rec))
    }
}

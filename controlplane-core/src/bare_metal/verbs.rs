//! The workflow verbs on [`BareMetal`]: `nodes.inspect`, `nodes.deploy`, `nodes.rescue` and
//! `nodes.unrescue`, each its workflow module's transaction ([`super::inspect::inspect`],
//! [`super::deploy::deploy`], [`super::rescue::rescue`], [`super::rescue::unrescue`]) and what
//! follows the commit. The controller's pass does the rest.

use cpl_store::{NodeRecord, duration_ms};

use super::BareMetal;
use super::deploy::{self, DeployRequest};
use super::inspect::{self, InspectRequest};
use super::rescue::{self, RescueRequest, UnrescueRequest};
use crate::error::OpError;

impl BareMetal {
    /// `nodes.inspect` ([`inspect::inspect`]).
    pub async fn inspect(&self, req: InspectRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let actor = actor.to_owned();
        self.store
            .write(move |tx| inspect::inspect(tx, &req, &actor))
            .await
    }

    /// `nodes.deploy` ([`deploy::deploy`]); `INVALID_ARGUMENT` for an image, hints or config
    /// drive that `image.write` would refuse, before anything is read.
    pub async fn deploy(&self, req: DeployRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let args = deploy::write_args(&req)?;
        let actor = actor.to_owned();
        self.store
            .write(move |tx| deploy::deploy(tx, &req, &args, &actor))
            .await
    }

    /// `nodes.rescue` ([`rescue::rescue`]).
    pub async fn rescue(&self, req: RescueRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let actor = actor.to_owned();
        self.store
            .write(move |tx| rescue::rescue(tx, &req, &actor))
            .await
    }

    /// `nodes.unrescue` ([`rescue::unrescue`]), then the lease holder's reboot is dispatched.
    pub async fn unrescue(&self, req: UnrescueRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let (actor, sessions) = (actor.to_owned(), std::sync::Arc::clone(&self.sessions));
        let timeout = duration_ms(self.cfg.command_timeout);
        let (node, holder) = self
            .store
            .write(move |tx| rescue::unrescue(tx, &req, &actor, sessions.as_ref(), timeout))
            .await?;
        self.commands.dispatch(&holder, false).await;
        Ok(node)
    }
}

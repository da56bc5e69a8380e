//! The operator API's verbs as a type. [`Method`] names every method once, in one table below,
//! with its typed request ([`Request`]) and answer ([`Response`]); [`Core::dispatch`] is the one
//! dispatcher; [`openapi::document`] derives the OpenAPI 3.1 document from the same table. The
//! HTTP adapter only authenticates, decodes the body ([`Method::decode`]), calls the dispatcher,
//! and maps an error's code to a status.
//!
//! Answers: node verbs return NodeDetail (never the internal record); lists are wrapped
//! (`{"nodes": [...]}`) so they can grow fields later.

pub mod bmc_input;
mod dispatch;
mod handlers;
pub mod openapi;
pub mod types;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use dispatch::{
    Core, DEFAULT_SITE_TOKEN_USES, DEFAULT_TOKEN_TTL_SECONDS, MAX_TIMEOUT_SECONDS,
    MAX_TOKEN_TTL_SECONDS, TokenIssuer,
};
pub use types::*;

// Every request type of the table, and the types its fields need, at one path for clients
// (`bcctl` builds them), wherever the module that handles it lives.
pub use crate::bare_metal::deploy::DeployRequest;
pub use crate::bare_metal::enroll::{BmcInput, EnrollRequest, Secret, TlsMode};
pub use crate::bare_metal::inspect::InspectRequest;
pub use crate::bare_metal::power::{BootDeviceRequest, PowerRequest, UpdateBmcCredentialsRequest};
pub use crate::bare_metal::rescue::{RescueRequest, UnrescueRequest};
pub use crate::ops::pools::NewPool;
pub use crate::ops::sites::NewSite;
pub use crate::placer::AllocationRequest;
pub use crate::query::NodeFilter;
pub use crate::remediation::view::{
    PoolRemediationRequest, RemediationList, RemediationListRequest, RemediationRef,
    RemediationView, ResumeRemediationRequest, SetRemediationRequest, StepView,
};

use crate::bare_metal::site_detail::SiteDetail;
use crate::detail::NodeDetail;
use crate::error::OpError;
use crate::placer::PoolCapacity;
use crate::status::ControlPlaneStatus;
use cpl_store::{Allocation, Pool, Site};

fn parse<T: DeserializeOwned>(method: &str, body: Value) -> Result<T, OpError> {
    // Every request is an object. The HTTP adapter turns an absent body into `{}`; a JSON `null`
    // is what a client sends by mistake (an unset variable) and is not read as "no arguments".
    if !body.is_object() {
        let got = match &body {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        return Err(OpError::InvalidArgument(format!(
            "{method}: invalid request body: must be a JSON object (`{{}}` when the method takes no arguments), got {got}"
        )));
    }
    // The error names the field (`name: a name is 70000 characters long, ...`): the bounded
    // string types (`crate::text`) refuse while decoding, and their message alone does not say
    // which field it was.
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            OpError::InvalidArgument(format!("{method}: invalid request body: {inner}"))
        } else {
            OpError::InvalidArgument(format!("{method}: invalid request body: {path}: {inner}"))
        }
    })
}

/// The rules a request's types cannot say on their own, checked right after it decoded: the
/// operator's `bmc.address` ([`bmc_input`]). Errors name the method and the field, as a decoding
/// error does.
fn check(req: &Request) -> Result<(), OpError> {
    match req {
        Request::NodesEnroll(e) => bmc_input::check(&e.bmc.address).map_err(|e| {
            OpError::InvalidArgument(format!(
                "nodes.enroll: invalid request body: bmc.address: {e}"
            ))
        }),
        _ => Ok(()),
    }
}

/// Declares the method table: `Variant => "wire.name", RequestType, ResponseType, "summary";`.
macro_rules! verbs {
    ($($variant:ident => $name:literal, $req:ty, $resp:ty, $summary:literal;)+) => {
        /// Every method of the operator API (`POST /v1/<name>`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Method {
            $(#[doc = $summary] $variant),+
        }

        impl Method {
            /// Every method, in the order of the API reference.
            pub const ALL: &'static [Method] = &[$(Method::$variant),+];

            /// The wire name, e.g. `nodes.cordon`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Method::$variant => $name),+
                }
            }

            /// One line saying what the method does.
            pub const fn summary(self) -> &'static str {
                match self {
                    $(Method::$variant => $summary),+
                }
            }

            /// The method called `name`, if there is one.
            pub fn from_name(name: &str) -> Option<Method> {
                Method::ALL.iter().copied().find(|m| m.name() == name)
            }

            /// Decodes a JSON body (an object; an absent body is the adapter's `{}`) into this
            /// method's request. Errors: `INVALID_ARGUMENT` naming the method and what is wrong
            /// with the body (not an object, an unknown or missing field, a value out of range).
            pub fn decode(self, body: Value) -> Result<Request, OpError> {
                let req = match self {
                    $(Method::$variant => Request::$variant(parse(self.name(), body)?)),+
                };
                check(&req)?;
                Ok(req)
            }

            /// The request and answer schemas of this method, for the OpenAPI document.
            pub(crate) fn schemas(self) -> openapi::MethodSchemas {
                match self {
                    $(Method::$variant => openapi::MethodSchemas::of::<$req, $resp>()),+
                }
            }
        }

        /// A request of one method: what the server decoded ([`Method::decode`]), or what a
        /// client (`bcctl`) built to send. Serializes as the request itself, the body of
        /// `POST /v1/<method>`; [`Request::method`] says where it goes.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum Request {
            $(#[doc = $summary] $variant($req)),+
        }

        impl Request {
            /// The method this is a request of.
            pub fn method(&self) -> Method {
                match self {
                    $(Request::$variant(_) => Method::$variant),+
                }
            }
        }

        /// The answer of one method; serializes as the answer itself.
        #[derive(Debug, Clone, Serialize)]
        #[serde(untagged)]
        pub enum Response {
            $(#[doc = $summary] $variant($resp)),+
        }
    };
}

verbs! {
    NodesList => "nodes.list", NodeFilter, NodeList, "List nodes, filtered by pool, provisionState, connectivity, schedulable or labels.";
    NodesGet => "nodes.get", NodeRef, NodeDetail, "One node (NodeDetail).";
    NodesEvents => "nodes.events", NodeRef, EventList, "A node's event log, oldest first.";
    NodesCordon => "nodes.cordon", NodeMutation, NodeDetail, "Cordon: no new work lands on the node.";
    NodesUncordon => "nodes.uncordon", NodeMutation, NodeDetail, "Uncordon (also ends a drain).";
    NodesDrain => "nodes.drain", NodeMutation, NodeDetail, "Cordon, plus `draining` until the node's allocations are released.";
    NodesTaint => "nodes.taint", TaintRequest, NodeDetail, "Add or replace an operator taint (`taint:<key>` in noScheduleReasons).";
    NodesUntaint => "nodes.untaint", UntaintRequest, NodeDetail, "Remove an operator taint.";
    NodesSetLabels => "nodes.setLabels", SetLabelsRequest, NodeDetail, "Add or replace labels on a node (others stay).";
    NodesRemoveLabels => "nodes.removeLabels", RemoveLabelsRequest, NodeDetail, "Remove labels from a node.";
    NodesAdopt => "nodes.adopt", NodeMutation, NodeDetail, "Accept an adopting node by hand (`adopting -> adopted`).";
    NodesRecover => "nodes.recover", NodeMutation, NodeDetail, "Move a failed node back to failedFrom.";
    NodesRetire => "nodes.retire", NodeMutation, NodeDetail, "Retire a node for good; its identity ends. A node without a BMC goes on to `retired` at once; a machine enrolled through its BMC (`ready`, `deployed` or `failed`) boots the ramdisk, which cleans every disk (`retiring -> retired`, powered off).";
    NodesSetMaintenance => "nodes.setMaintenance", MaintenanceRequest, NodeDetail, "Turn maintenance on (with a reason) or off.";
    NodesRevokeIdentity => "nodes.revokeIdentity", NodeMutation, NodeDetail, "identityGeneration + 1: the node's certificates stop working and its session closes.";
    NodesDelete => "nodes.delete", NodeMutation, NodeDetail, "Delete the node (refused while it holds allocations).";
    NodesUpdateSpec => "nodes.updateSpec", SpecRequest, NodeDetail, "Replace the desired spec (generation + 1) and push it to the node.";
    NodesStartDedicatedRoot => "nodes.startDedicatedRoot", LeaseRequest, LeaseStarted, "Start a dedicated-root lease (trust becomes tenant-controlled).";
    NodesEndDedicatedRoot => "nodes.endDedicatedRoot", NodeMutation, NodeDetail, "End the dedicated-root lease and restore the trust before it.";
    NodesApproveRejoin => "nodes.approveRejoin", ApproveRejoinRequest, NodeDetail, "Approve a machine's pending re-join in place of a platform node (matched by its identifiers, not a trusted hardware key).";
    NodesMove => "nodes.move", MoveRequest, NodeDetail, "Move the node to another pool; role, trust, owner, adapter and drivers follow the target pool.";
    NodesEnroll => "nodes.enroll", EnrollRequest, NodeDetail, "Enroll a bare-metal machine through its BMC: the node starts in `enrolling`, the site's lease holder verifies the BMC (the password is write-only), and, unless `inspect: false`, the machine boots the ramdisk for inspection and commissioning (`inspecting -> commissioning -> ready`).";
    NodesPower => "nodes.power", PowerRequest, CommandView, "Power a bare-metal node on, off, softOff or reboot through its BMC (a `bmc.power` command on the site's lease holder).";
    NodesSetBootDevice => "nodes.setBootDevice", BootDeviceRequest, CommandView, "Set the device a bare-metal node boots from next (pxe or disk; persistent or once) through its BMC.";
    NodesRelease => "nodes.release", NodeMutation, NodeDetail, "Release a deployed bare-metal machine (`deployed -> releasing -> ready`): its identity ends at once, it boots the ramdisk, which cleans every disk as the pool's `acceptance.cleaning` says (metadata by default), and commissioning's checks run again.";
    NodesAbort => "nodes.abort", NodeMutation, NodeDetail, "Abort a bare-metal workflow in flight (enrolling, inspecting, commissioning, deploying, releasing, retiring): the node is `failed` (failedFrom that state, maintenance on), its command in flight cancelled, the machine powered off; `nodes.recover` starts the state over.";
    NodesDeploy => "nodes.deploy", DeployRequest, NodeDetail, "Deploy an image onto a ready bare-metal machine (`ready -> deploying -> deployed`): it boots the ramdisk, which streams the image onto the disk the root-device hints pick (else the smallest that fits) while hashing it, verifies its SHA-256 and writes a cloud-init NoCloud config drive; the BMC then boots it from disk, persistently.";
    NodesRescue => "nodes.rescue", RescueRequest, NodeDetail, "Rescue a deployed bare-metal machine (`deployed -> rescue`): it boots the ramdisk, which starts an SSH server that accepts only the given keys (the `Rescued` condition says where and its host keys).";
    NodesUnrescue => "nodes.unrescue", UnrescueRequest, NodeDetail, "End a rescue (`rescue -> deployed`): the rescue ramdisk's identity ends and the BMC reboots the machine from its disk.";
    NodesInspect => "nodes.inspect", InspectRequest, NodeDetail, "Inspect a bare-metal machine again (`ready`, or a verified `enrolling` node enrolled with `inspect: false`): it boots the ramdisk with a one-time boot token, is checked against its BMC's identifiers and commissioned back to `ready`.";
    NodesUpdateBmcCredentials => "nodes.updateBmcCredentials", UpdateBmcCredentialsRequest, NodeDetail, "Rotate a node's BMC credentials: the new pair replaces the old one only once the BMC accepted it (the password is write-only).";
    NodesSetRemediation => "nodes.setRemediation", SetRemediationRequest, NodeDetail, "Suspend health remediation on a node (its open remediation is cancelled, the cordon it set lifted; nothing new starts) or lift the suspension.";
    PoolsCreate => "pools.create", NewPool, Pool, "Create a pool.";
    PoolsGet => "pools.get", PoolRef, Pool, "One pool.";
    PoolsList => "pools.list", NoArgs, PoolList, "Every pool.";
    PoolsUpdate => "pools.update", PoolUpdate, Pool, "Rename a pool or change its hardware profile.";
    PoolsDelete => "pools.delete", PoolDelete, Pool, "Delete an empty pool.";
    PoolsCapacity => "pools.capacity", PoolRef, PoolCapacity, "GPU counts of a pool per capacity bucket.";
    PoolsSetRemediation => "pools.setRemediation", PoolRemediationRequest, Pool, "Set a pool's health remediation policy: mode (off, observe, auto), ladders per fault kind, the circuit breaker's limits, the drain grace and policy, attempts per node.";
    PoolsResumeRemediation => "pools.resumeRemediation", ResumeRemediationRequest, Pool, "Close a pool's remediation circuit breaker (RemediationPaused): new remediations may start again; the hourly limit counts from now.";
    SitesCreate => "sites.create", NewSite, Site, "Create a site.";
    SitesGet => "sites.get", SiteRef, SiteDetail, "One site, with its appliances (site agents) and who holds its lease.";
    SitesList => "sites.list", NoArgs, SiteList, "Every site.";
    SitesUpdate => "sites.update", SiteUpdate, Site, "Rename a site.";
    SitesDelete => "sites.delete", SiteDelete, Site, "Delete a site no pool or node references.";
    TokensCreate => "tokens.create", TokensCreateRequest, TokensCreateResponse, "Create a join token; the secret is shown once, with the CA pin.";
    TokensList => "tokens.list", NoArgs, TokenList, "Every join token, without secrets.";
    TokensRevoke => "tokens.revoke", TokenRef, Empty, "Revoke a join token.";
    AllocationsCreate => "allocations.create", AllocationRequest, Allocation, "Book GPUs on one schedulable node of a pool.";
    AllocationsGet => "allocations.get", AllocationRef, Allocation, "One allocation.";
    AllocationsList => "allocations.list", AllocationListRequest, AllocationList, "Allocations, filtered by pool, node or active.";
    AllocationsRelease => "allocations.release", AllocationRef, Allocation, "Release an allocation's GPUs.";
    CommandsCreate => "commands.create", CommandsCreateRequest, CommandView, "Queue a command for a node and send it if the node is connected.";
    CommandsGet => "commands.get", CommandRef, CommandView, "One command.";
    CommandsList => "commands.list", CommandsListRequest, CommandList, "Commands, newest first.";
    CommandsCancel => "commands.cancel", CommandRef, CommandView, "Cancel a command that is not over.";
    RemediationsList => "remediations.list", RemediationListRequest, RemediationList, "Health remediations, newest first, filtered by pool, node or open: node, fault, step, since, attempts, next step, why waiting.";
    RemediationsGet => "remediations.get", RemediationRef, RemediationView, "One remediation (by remediationId), or a node's newest (by nodeId), with every step it took.";
    ControlPlaneStatus => "controlPlane.status", NoArgs, ControlPlaneStatus, "Which replica answered, which one runs the controllers (the controller lease: holder, epoch, expiry), the store's backend, and connected nodes per replica.";
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod verbs_tests;

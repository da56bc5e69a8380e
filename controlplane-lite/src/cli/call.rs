//! How a `bcctl` verb talks to the operator API: it builds the typed request of its method
//! ([`Request`], the very type the server decodes), sends it, and prints the answer as a table
//! or, with `-o json`, as the API's JSON.
//!
//! A node mutation carries the node's `version`: the one given with `--version`, else the one
//! `nodes.get` reads just before (and reads again when an agent's report moved it in between).
//!
//! Strings go into requests unchecked (`Id::unchecked`, ...): the server checks them while it
//! decodes the body and answers a bad one with `INVALID_ARGUMENT` naming the field, the answer
//! every client gets. Closed sets (pool kinds, TLS modes, image formats) are parsed by clap with
//! [`spelled`], which lists the API's spellings in help and completions.

use anyhow::Context;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use cpl_core::text::Id;
use cpl_core::verbs::{NodeMutation, NodeRef, Request};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{ClientArgs, Output};
use controlplane_lite::client::{Client, ClientError};

/// How often a mutation without `--version` reads the version again after a `CONFLICT`.
const CONFLICT_RETRIES: u32 = 5;

/// What a verb sends.
#[derive(Debug)]
pub(crate) enum Call {
    /// One request, as built.
    Once(Box<Request>),
    /// A node mutation, built for the node's version when it is sent.
    Mutation(Mutation),
}

/// A node mutation: the node, the `--version` given (none: the node's current one) and the
/// request for a version.
pub(crate) struct Mutation {
    node_id: String,
    version: Option<u64>,
    build: Box<dyn Fn(Id, u64) -> Request + Send + Sync>,
}

impl std::fmt::Debug for Mutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutation")
            .field("node_id", &self.node_id)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Call {
    /// One request, sent as built.
    pub(crate) fn once(req: Request) -> Self {
        Call::Once(Box::new(req))
    }

    /// A mutation of `node_id` whose request `build` makes from the node and a version.
    pub(crate) fn mutation(
        node_id: String,
        version: Option<u64>,
        build: impl Fn(Id, u64) -> Request + Send + Sync + 'static,
    ) -> Self {
        Call::Mutation(Mutation {
            node_id,
            version,
            build: Box::new(build),
        })
    }

    /// A `{nodeId, version}` mutation: `variant` is the method's [`Request`] variant, e.g.
    /// `Request::NodesCordon`.
    pub(crate) fn node_verb(
        node_id: String,
        version: Option<u64>,
        variant: fn(NodeMutation) -> Request,
    ) -> Self {
        Self::mutation(node_id, version, move |node_id, version| {
            variant(NodeMutation { node_id, version })
        })
    }

    /// The `--version` a mutation was given.
    #[cfg(test)]
    pub(crate) fn given_version(&self) -> Option<u64> {
        match self {
            Call::Once(_) => None,
            Call::Mutation(m) => m.version,
        }
    }

    /// The request as sent at node version `version` (a mutation), or as built (any other).
    pub(crate) fn at(&self, version: u64) -> Request {
        match self {
            Call::Once(r) => r.as_ref().clone(),
            Call::Mutation(m) => (m.build)(Id::unchecked(m.node_id.as_str()), version),
        }
    }

    /// Sends the request and returns the API's answer. A mutation without `--version` reads the
    /// node's version first, and again (up to [`CONFLICT_RETRIES`] times) when a `CONFLICT`
    /// says an agent report (Inventory, SpecStatus) moved it between that read and the write;
    /// with `--version` a `CONFLICT` is the answer the operator asked for.
    /// Errors: the API's, or the API unreachable.
    pub(crate) async fn send(&self, client: &Client) -> anyhow::Result<Value> {
        let m = match self {
            Call::Once(r) => return Ok(client.request(r).await?),
            Call::Mutation(m) => m,
        };
        let mut attempt = 0;
        loop {
            let current = version_of(client, &m.node_id, m.version).await?;
            let req = self.at(current);
            match client.request::<Value>(&req).await {
                Err(ClientError::Api(e))
                    if m.version.is_none()
                        && e.code == bc_protocol::ErrorCode::Conflict
                        && attempt < CONFLICT_RETRIES =>
                {
                    attempt += 1;
                    tracing::debug!(
                        node_id = %m.node_id,
                        attempt,
                        "version moved under {}; reading it again",
                        req.method()
                    );
                }
                answer => return Ok(answer?),
            }
        }
    }
}

/// `given`, else the node's current version as `nodes.get` reads it.
pub(crate) async fn version_of(
    client: &Client,
    node_id: &str,
    given: Option<u64>,
) -> anyhow::Result<u64> {
    if let Some(v) = given {
        return Ok(v);
    }
    let get = Request::NodesGet(NodeRef {
        node_id: Id::unchecked(node_id),
    });
    let n: Value = client.request(&get).await?;
    n.get("version")
        .and_then(Value::as_u64)
        .context("nodes.get returned no version")
}

/// Prints an answer: its JSON with `-o json`, else `table` of it.
pub(crate) fn print(
    args: &ClientArgs,
    v: &Value,
    table: impl FnOnce(&Value) -> String,
) -> anyhow::Result<()> {
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        print!("{}", table(v));
    }
    Ok(())
}

/// The array under `key` of an answer (`{"nodes": [...]}`), empty when there is none.
pub(crate) fn items(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// A clap value parser for one of the API's closed sets (`metal-host`, `qcow2`, `pin`, ...):
/// help and completions list `spellings`, and a value is decoded as the server decodes it (serde
/// from the JSON string), so the flag and the API cannot spell a value differently.
pub(crate) fn spelled<T>(
    spellings: impl IntoIterator<Item = &'static str>,
) -> impl TypedValueParser<Value = T>
where
    T: DeserializeOwned + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(spellings.into_iter().collect::<Vec<_>>())
        .try_map(|s| serde_json::from_value::<T>(Value::String(s)))
}

/// The spellings of a `bc_protocol` string enum, for [`spelled`].
pub(crate) fn all_of<T: Copy>(
    all: &'static [T],
    as_str: fn(T) -> &'static str,
) -> impl Iterator<Item = &'static str> {
    all.iter().map(move |v| as_str(*v))
}

//! `bcctl nodes logs <node> [--command ID] -f FILE`: downloads a logs.collect bundle (by default
//! the node's newest succeeded one) with a progress bar, checking its SHA-256 against the
//! command's result before the file takes its name.

use std::path::Path;

use anyhow::{Context, bail};
use cpl_core::text::Id;
use cpl_core::verbs::{CommandRef, CommandsListRequest, Request};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::ClientArgs;

/// The node's newest succeeded logs.collect command id.
async fn newest(c: &controlplane_lite::client::Client, node_id: &str) -> anyhow::Result<String> {
    let list: Value = c
        .request(&Request::CommandsList(CommandsListRequest {
            node_id: Some(Id::unchecked(node_id)),
            limit: None,
        }))
        .await?;
    let mut found: Vec<&Value> = list
        .get("commands")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|c| c["name"] == "logs.collect" && c["state"] == "succeeded")
                .collect()
        })
        .unwrap_or_default();
    // RFC 3339 times in one format sort as strings.
    found.sort_by_key(|c| c["finishedAt"].as_str().unwrap_or_default().to_owned());
    found
        .last()
        .and_then(|c| c["id"].as_str())
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "node {node_id} has no succeeded logs.collect; run `bcctl nodes run {node_id} logs.collect --wait` first"
            )
        })
}

/// Runs the download.
pub async fn download(
    args: &ClientArgs,
    node_id: &str,
    command: Option<String>,
    file: &Path,
) -> anyhow::Result<()> {
    let c = args.client()?;
    let id = match command {
        Some(id) => id,
        None => newest(&c, node_id).await?,
    };
    let cmd: Value = c
        .request(&Request::CommandsGet(CommandRef {
            command_id: Id::unchecked(id.as_str()),
        }))
        .await?;
    if cmd["nodeId"] != node_id {
        bail!(
            "command {id} belongs to node {}, not {node_id}",
            cmd["nodeId"]
        );
    }
    let claimed = cmd["result"]["sha256"].as_str().map(str::to_owned);
    let mut resp = c.get_stream(&format!("/v1/bundles/{id}")).await?;
    // The digest the gateway computed when the bundle arrived; the node's own claim only where
    // an older server sends none.
    let served = resp
        .headers()
        .get("x-bundle-sha256")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let (Some(s), Some(c)) = (&served, &claimed)
        && s != c
    {
        eprintln!(
            "warning: node reported SHA-256 {c} for bundle {id}; the control plane received {s}"
        );
    }
    let want_sha = served.or(claimed);
    let total = resp.content_length().unwrap_or(0);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bytes}/{total_bytes} [{bar:30}] {bytes_per_sec} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let part = file.with_extension("part");
    let mut out = tokio::fs::File::create(&part)
        .await
        .with_context(|| format!("creating {}", part.display()))?;
    let mut hash = Sha256::new();
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await.context("downloading the bundle")? {
        hash.update(&chunk);
        out.write_all(&chunk)
            .await
            .with_context(|| format!("writing {}", part.display()))?;
        got += chunk.len() as u64;
        bar.set_position(got);
    }
    out.sync_all().await.context("syncing the bundle")?;
    drop(out);
    bar.finish_and_clear();
    let sha = hex::encode(hash.finalize());
    if let Some(w) = want_sha
        && w != sha
    {
        let _ = tokio::fs::remove_file(&part).await;
        bail!("bundle {id}: SHA-256 {sha} does not match the {w} the control plane stored");
    }
    tokio::fs::rename(&part, file)
        .await
        .with_context(|| format!("renaming to {}", file.display()))?;
    eprintln!("{id}: {got} bytes to {} (sha256 {sha})", file.display());
    Ok(())
}

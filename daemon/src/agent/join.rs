//! Joining: a key made here (ECDSA P-256, rcgen), a CSR, the Join RPC over TLS verified through the
//! CA pin, and the identity stored in the state dir.

use bc_protocol::pb::JoinRequest;
use bc_protocol::pb::join_client::JoinClient;
use rcgen::{CertificateParams, DnType, KeyPair};

use super::AgentError;
use crate::state::{Identity, NodeFile, StateDir};
use crate::tls;
use bcd_probes::hostroot::HostRoot;

/// What the agent needs to join.
#[derive(Debug, Clone)]
pub struct JoinParams<'a> {
    pub control_plane: &'a str,
    pub token: &'a str,
    pub ca_pin: &'a str,
    pub root: &'a HostRoot,
}

/// Joins and stores the identity. The token is sent only after the control plane's chain matched
/// the pin.
pub async fn join(state: &StateDir, p: &JoinParams<'_>) -> Result<Identity, AgentError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(AgentError::Key)?;
    let mut params = CertificateParams::default();
    let hostname = p
        .root
        .read_trimmed("/proc/sys/kernel/hostname")
        .unwrap_or_default();
    params.distinguished_name.push(
        DnType::CommonName,
        if hostname.is_empty() {
            "bcd"
        } else {
            hostname.as_str()
        },
    );
    let csr = params.serialize_request(&key).map_err(AgentError::Key)?;
    let csr_pem = csr.pem().map_err(AgentError::Key)?;
    let root = p.root.clone();
    let hardware = tokio::task::spawn_blocking(move || bcd_probes::hwkey::compute(&root))
        .await
        .map_err(|e| AgentError::Task(e.to_string()))?;

    let (cfg, mismatch) = tls::join_config(p.ca_pin)?;
    let channel = match tls::channel(p.control_plane, cfg).await {
        Ok(c) => c,
        Err(_) if mismatch.load(std::sync::atomic::Ordering::SeqCst) => {
            return Err(AgentError::PinMismatch {
                control_plane: p.control_plane.to_owned(),
                pin: p.ca_pin.to_owned(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let mut client = JoinClient::new(channel);
    let resp = client
        .join(JoinRequest {
            token: p.token.to_owned(),
            csr_pem,
            hardware: Some(hardware),
            agent_version: bc_protocol::VERSION.to_owned(),
            mode: bc_protocol::pb::AgentMode::Node.into(),
            hostname,
        })
        .await
        .map_err(AgentError::JoinRefused)?
        .into_inner();
    let identity = Identity {
        node: NodeFile {
            node_id: resp.node_id,
            identity_generation: resp.identity_generation,
            control_plane: p.control_plane.to_owned(),
            trust_domain: resp.trust_domain,
            joined_at: chrono::Utc::now().to_rfc3339(),
        },
        key_pem: key.serialize_pem(),
        cert_pem: resp.certificate_pem,
        ca_pem: resp.ca_pem,
    };
    state.save_identity(&identity)?;
    tracing::info!(node_id = %identity.node.node_id, identity_generation = identity.node.identity_generation, "joined");
    Ok(identity)
}

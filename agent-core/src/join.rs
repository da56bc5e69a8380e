//! Joining: a key made here (ECDSA P-256, rcgen; it never leaves the machine), a CSR, and the
//! Join RPC over TLS verified through the CA pin. The token is sent only after the control
//! plane's chain matched the pin.

use bc_protocol::pb::JoinRequest;
use bc_protocol::pb::join_client::JoinClient;
use rcgen::{CertificateParams, DnType, KeyPair};

use crate::mode::Machine;
use crate::state::{Identity, NodeFile};
use crate::tls::{self, ChannelError, TlsError};

/// Why a join attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The pin is malformed or the URL unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The control plane could not be reached.
    #[error("control plane: {0}")]
    Connect(#[from] ChannelError),
    /// The control plane's certificate chain does not hold the pinned CA: the token was not sent.
    #[error(
        "the control plane at {control_plane} does not present the CA pinned by --ca-pin {pin}; the join token was NOT sent. Check the pin (`bcctl tokens create` prints it) or that the URL points at your control plane"
    )]
    PinMismatch {
        /// The URL dialled.
        control_plane: String,
        /// The pin it did not match.
        pin: String,
    },
    /// The control plane refused the join (bad, expired or used-up token, ...).
    #[error("join refused: {}", .0.message())]
    Refused(tonic::Status),
    /// Making the key or CSR failed.
    #[error("key generation: {0}")]
    Key(rcgen::Error),
    /// The machine could not say who it is (the hardware key).
    #[error("hardware identity: {0}")]
    Hardware(String),
}

impl JoinError {
    /// Whether retrying cannot help: a refused token, a pin mismatch, bad local material. A
    /// control plane that is down or overloaded (`UNAVAILABLE`) is worth retrying.
    pub fn is_fatal(&self) -> bool {
        match self {
            JoinError::Refused(status) => !matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::ResourceExhausted
            ),
            JoinError::PinMismatch { .. } | JoinError::Tls(_) | JoinError::Key(_) => true,
            JoinError::Connect(_) | JoinError::Hardware(_) => false,
        }
    }

    /// Whether another replica may answer where this one did not: the TCP connection or the
    /// TLS handshake failed (a pin mismatch too: the token was not sent). An answer never is,
    /// a refusal included: replicas share one database, so one replica's refusal is the control
    /// plane's, and trying the others would only spend the token.
    pub fn tries_next(&self) -> bool {
        matches!(
            self,
            JoinError::Connect(ChannelError::Connect(_)) | JoinError::PinMismatch { .. }
        )
    }
}

/// Where to join and with what.
#[derive(Debug, Clone, Copy)]
pub struct JoinParams<'a> {
    /// The gateway URL, `https://host:port`.
    pub control_plane: &'a str,
    /// The join token `<id>.<secret>`.
    pub token: &'a str,
    /// `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    pub ca_pin: &'a str,
}

/// The `JoinRequest` for `machine`: the one place its fields are filled, for every mode.
pub fn join_request(
    machine: &impl Machine,
    token: &str,
    csr_pem: String,
    hostname: String,
    hardware: bc_protocol::pb::HardwareIdentity,
) -> JoinRequest {
    JoinRequest {
        token: token.to_owned(),
        csr_pem,
        hardware: Some(hardware),
        agent_version: bc_protocol::VERSION.to_owned(),
        mode: bc_protocol::pb::AgentMode::from(machine.mode()).into(),
        hostname,
    }
}

/// Joins `machine` and returns the new identity (not stored: the caller's
/// [`crate::identity::IdentityStore`] does that).
pub async fn join(machine: &impl Machine, p: &JoinParams<'_>) -> Result<Identity, JoinError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(JoinError::Key)?;
    let mut params = CertificateParams::default();
    let hostname = machine.hostname();
    params.distinguished_name.push(
        DnType::CommonName,
        if hostname.is_empty() {
            "bcd"
        } else {
            hostname.as_str()
        },
    );
    let csr = params.serialize_request(&key).map_err(JoinError::Key)?;
    let csr_pem = csr.pem().map_err(JoinError::Key)?;
    let hardware = machine.hardware().await.map_err(JoinError::Hardware)?;

    let (cfg, mismatch) = tls::join_config(p.ca_pin)?;
    let channel = match tls::channel(p.control_plane, cfg).await {
        Ok(c) => c,
        Err(_) if mismatch.load(std::sync::atomic::Ordering::SeqCst) => {
            return Err(JoinError::PinMismatch {
                control_plane: p.control_plane.to_owned(),
                pin: p.ca_pin.to_owned(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let request = join_request(machine, p.token, csr_pem, hostname, hardware);
    let resp = JoinClient::new(channel)
        .join(request)
        .await
        .map_err(JoinError::Refused)?
        .into_inner();
    Ok(Identity {
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
    })
}

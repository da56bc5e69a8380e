//! A scripted agent for the tests that need what `bcd agent` never sends: chosen hardware facts
//! (another machine's identifier digests, a claim of `trusted`), a flood of reports, concurrent
//! uploads. It speaks the real protocol (`bc_protocol::pb`) over real TLS to a real `bcctl serve`:
//! server-authenticated for Join (trusting the state dir's `ca.crt`), mutual TLS with the issued
//! certificate for the Gateway.

use bc_protocol::pb::gateway_client::GatewayClient;
use bc_protocol::pb::join_client::JoinClient;
use bc_protocol::pb::{
    AgentMessage, AgentMode, GatewayMessage, HardwareIdentity, Hello, JoinRequest, UploadChunk,
    UploadResult,
};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::ControlPlane;

/// What a join gave the fake agent.
#[derive(Debug, Clone)]
pub struct Joined {
    pub node_id: String,
    pub identity_generation: u64,
    pub cert_pem: String,
    pub key_pem: String,
}

/// The fake agent: a runtime, the gateway's URL and the CA it trusts.
#[derive(Debug)]
pub struct FakeAgent {
    pub rt: tokio::runtime::Runtime,
    url: String,
    ca_pem: String,
}

/// One open session: send with `tx`, and the gateway's messages arrive on `rx`.
#[derive(Debug)]
pub struct Session {
    pub tx: mpsc::Sender<AgentMessage>,
    pub rx: mpsc::Receiver<GatewayMessage>,
}

impl FakeAgent {
    /// A fake agent for `cp`.
    pub fn new(cp: &ControlPlane) -> Self {
        let ca_pem = std::fs::read_to_string(cp.dir.join("ca.crt")).expect("ca.crt");
        Self::at(&cp.gateway_url, &ca_pem)
    }

    /// A fake agent for the gateway at `url` whose CA is `ca_pem` (from a thread that holds no
    /// `ControlPlane`).
    pub fn at(url: &str, ca_pem: &str) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        Self {
            rt,
            url: url.to_owned(),
            ca_pem: ca_pem.to_owned(),
        }
    }

    /// A TLS channel to the gateway, with `identity` for mutual TLS.
    pub async fn channel(&self, identity: Option<&Joined>) -> Channel {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name("localhost");
        if let Some(j) = identity {
            tls = tls.identity(Identity::from_pem(&j.cert_pem, &j.key_pem));
        }
        Channel::from_shared(self.url.clone())
            .expect("gateway URL")
            .tls_config(tls)
            .expect("TLS config")
            .connect()
            .await
            .expect("gateway reachable")
    }

    /// Joins with `token` and the given hardware facts.
    pub fn join(
        &self,
        token: &str,
        hardware_key: &str,
        trusted: bool,
        digests: &[&str],
    ) -> Result<Joined, tonic::Status> {
        self.join_as(
            AgentMode::Unspecified,
            token,
            hardware_key,
            trusted,
            digests,
        )
    }

    /// [`FakeAgent::join`] in `mode` (a ramdisk joins with its boot token in mode `RAMDISK`).
    pub fn join_as(
        &self,
        mode: AgentMode,
        token: &str,
        hardware_key: &str,
        trusted: bool,
        digests: &[&str],
    ) -> Result<Joined, tonic::Status> {
        self.rt.block_on(async {
            let key =
                rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
            let csr = rcgen::CertificateParams::new(Vec::<String>::new())
                .expect("CSR params")
                .serialize_request(&key)
                .expect("CSR")
                .pem()
                .expect("CSR PEM");
            let req = JoinRequest {
                token: token.to_owned(),
                csr_pem: csr,
                hardware: Some(HardwareIdentity {
                    hardware_key: hardware_key.to_owned(),
                    trusted,
                    identifier_digests: digests.iter().map(|d| (*d).to_owned()).collect(),
                }),
                agent_version: "fake".into(),
                hostname: "fake-agent".into(),
                mode: mode as i32,
            };
            let resp = JoinClient::new(self.channel(None).await)
                .join(req)
                .await?
                .into_inner();
            Ok(Joined {
                node_id: resp.node_id,
                identity_generation: resp.identity_generation,
                cert_pem: resp.certificate_pem,
                key_pem: key.serialize_pem(),
            })
        })
    }

    /// Opens a session as `j` and says Hello; the gateway's messages are drained into `rx`.
    pub fn session(&self, j: &Joined) -> Session {
        self.session_as(j, AgentMode::Unspecified)
    }

    /// [`FakeAgent::session`], saying Hello in `mode`.
    pub fn session_as(&self, j: &Joined, mode: AgentMode) -> Session {
        self.rt.block_on(async {
            let (tx, out) = mpsc::channel::<AgentMessage>(1024);
            let hello = AgentMessage {
                epoch: 0,
                msg: Some(bc_protocol::pb::agent_message::Msg::Hello(Hello {
                    node_id: j.node_id.clone(),
                    boot_id: "fake-boot".into(),
                    agent_version: "fake".into(),
                    mode: mode as i32,
                    ..Default::default()
                })),
            };
            tx.send(hello).await.expect("queue Hello");
            let mut inbound = GatewayClient::new(self.channel(Some(j)).await)
                .session(tokio_stream::wrappers::ReceiverStream::new(out))
                .await
                .expect("session opened")
                .into_inner();
            let (in_tx, rx) = mpsc::channel(1024);
            tokio::spawn(async move {
                // Never blocks the gateway: what the test does not read is dropped.
                while let Ok(Some(m)) = inbound.message().await {
                    let _ = in_tx.try_send(m);
                }
            });
            Session { tx, rx }
        })
    }
}

/// Uploads the chunks that arrive on `chunks` over `channel` (`Gateway.Upload`; a channel made
/// with the node's identity, [`FakeAgent::channel`]).
pub async fn upload(
    channel: Channel,
    chunks: mpsc::Receiver<UploadChunk>,
) -> Result<UploadResult, tonic::Status> {
    GatewayClient::new(channel)
        .upload(tokio_stream::wrappers::ReceiverStream::new(chunks))
        .await
        .map(tonic::Response::into_inner)
}

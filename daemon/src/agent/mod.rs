//! The node agent (`bcd agent`): join, session, inventory, commands, convergence.

use std::path::PathBuf;

/// Flags of `bcd agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Control plane gateway URL, e.g. `https://cp.example:7443`.
    #[arg(long, env = "BCD_CONTROL_PLANE")]
    pub control_plane: Option<String>,
    /// Join token `<id>.<secret>`; needed only until the node has an identity.
    #[arg(long, env = "BCD_JOIN_TOKEN")]
    pub join_token: Option<String>,
    /// Pin of the control plane's CA: `sha256:<hex of the CA's SubjectPublicKeyInfo>`.
    #[arg(long, env = "BCD_CA_PIN")]
    pub ca_pin: Option<String>,
    /// Where the identity, journal and last spec live.
    #[arg(long, env = "BCD_STATE_DIR", default_value = "/var/lib/bcd")]
    pub state_dir: PathBuf,
    /// Host root prefix for /sys, /proc, /dev, /etc.
    #[arg(long, env = "BCD_ROOT", default_value = "/")]
    pub root: PathBuf,
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(_args: AgentArgs) -> anyhow::Result<()> {
    anyhow::bail!("agent: not wired yet")
}

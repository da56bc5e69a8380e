//! Connection limits of the HTTP listeners (operator API, metrics).

use std::time::Duration;

/// An operator-API or metrics connection with no byte in or out for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Open operator-API connections at most; more wait in the accept queue (bc_net).
pub const API_MAX_CONNECTIONS: usize = 256;

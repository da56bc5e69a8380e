//! Connection limits of the HTTP listeners (operator API, metrics).

use std::time::Duration;

/// An operator-API or metrics connection with no byte in or out for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Open operator-API connections at most; more wait in the accept queue (bc_net).
pub const API_MAX_CONNECTIONS: usize = 256;

/// Largest operator-API request body, bytes (2 MiB): a larger one is refused with 413 and
/// `{code: PAYLOAD_TOO_LARGE, message}` on every route.
pub const API_MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

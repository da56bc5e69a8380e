//! Connection limits of the HTTP listeners (operator API, metrics).

use std::time::Duration;

/// An operator-API or metrics connection with no byte in or out for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Open operator-API connections at most; more wait in the accept queue (bc_net).
pub const API_MAX_CONNECTIONS: usize = 256;

/// Time for an operator-API request head to arrive whole, however its bytes trickle in (an idle
/// timer alone restarts on every byte); a keep-alive connection with no next request is closed
/// after it too.
pub const API_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Operator-API connections one source address may hold open; more are closed at accept.
pub const API_MAX_CONNECTIONS_PER_ADDRESS: usize = 128;

/// Largest operator-API request body, bytes (2 MiB): a larger one is refused with 413 and
/// `{code: PAYLOAD_TOO_LARGE, message}` on every route.
pub const API_MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

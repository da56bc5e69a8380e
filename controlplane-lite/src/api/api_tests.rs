//! The HTTP adapter's own rules: one status per error code, and the OpenAPI document served from
//! the core's types.

use super::*;

#[test]
fn every_error_code_has_its_status() {
    let want = [
        (ErrorCode::NotFound, 404),
        (ErrorCode::InvalidState, 409),
        (ErrorCode::Conflict, 409),
        (ErrorCode::InvalidArgument, 400),
        (ErrorCode::Unauthenticated, 401),
        (ErrorCode::PermissionDenied, 403),
        (ErrorCode::Internal, 500),
        (ErrorCode::Unavailable, 503),
    ];
    assert_eq!(want.len(), ErrorCode::ALL.len());
    for (code, http) in want {
        assert_eq!(status(code).as_u16(), http, "{code}");
    }
}

#[test]
fn the_bearer_check_is_constant_time_and_exact() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
}

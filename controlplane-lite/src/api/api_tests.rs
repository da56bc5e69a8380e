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
        (ErrorCode::PayloadTooLarge, 413),
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

/// The router over an in-memory store, token `t0k`.
fn app() -> Result<Router, StoreError> {
    let store = cpl_store::testing::store()?;
    let sessions: Arc<dyn cpl_core::port::AgentSessions> = Arc::new(cpl_core::port::NoSessions);
    let commands = cpl_core::commands::Commands {
        store: store.clone(),
        sessions: Arc::clone(&sessions),
    };
    let core = Core {
        store,
        bare_metal: cpl_core::bare_metal::BareMetal::new(
            commands.clone(),
            cpl_core::bare_metal::CredentialKey::generate(),
            Default::default(),
        ),
        commands,
        sessions,
        issuer: cpl_core::verbs::TokenIssuer {
            ca_pin: "sha256:00".into(),
            control_plane: "https://127.0.0.1:7443".into(),
        },
        replica: cpl_core::status::ReplicaIdentity {
            id: "gw-test".into(),
            gateway_url: "https://127.0.0.1:7443".into(),
        },
    };
    Ok(router(Arc::new(ApiState {
        core,
        api_token: "t0k".into(),
        bundles_dir: std::env::temp_dir().join("bc-api-tests-no-bundles"),
    })))
}

/// Sends `req` and returns the status and the body as JSON (`Null` when it is not JSON).
async fn send(app: &Router, req: axum::http::Request<axum::body::Body>) -> (u16, Value) {
    use tower::ServiceExt;
    let Ok(resp) = app.clone().oneshot(req).await;
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn post(
    path: &str,
    auth: Option<&str>,
    body: axum::body::Body,
) -> axum::http::Request<axum::body::Body> {
    let mut b = axum::http::Request::post(path);
    if let Some(a) = auth {
        b = b.header(header::AUTHORIZATION, a);
    }
    b.body(body).unwrap_or_default()
}

/// Issue 30.11: an absent body is `{}`; a JSON `null` or a body with fields a list verb does not
/// have is refused.
#[tokio::test]
async fn an_absent_body_is_empty_and_a_null_or_foreign_body_is_refused() -> Result<(), StoreError> {
    let app = app()?;
    let auth = Some("Bearer t0k");
    let (status, body) = send(&app, post("/v1/pools.list", auth, "".into())).await;
    assert_eq!((status, &body), (200, &serde_json::json!({"pools": []})));
    for bad in ["null", r#"{"poolId": "x"}"#, "[1]", "7"] {
        let (status, body) = send(&app, post("/v1/pools.list", auth, bad.into())).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{bad}: {body}"
        );
    }
    let (status, body) = send(&app, post("/v1/nodes.list", auth, "null".into())).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{body}"
    );
    Ok(())
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() -> Result<(), StoreError> {
    let app = app()?;
    for auth in ["Bearer t0k", "bearer t0k", "BEARER t0k", "bEaReR   t0k"] {
        let (status, body) = send(&app, post("/v1/pools.list", Some(auth), "{}".into())).await;
        assert_eq!(
            (status, &body),
            (200, &serde_json::json!({"pools": []})),
            "{auth}"
        );
    }
    for auth in [
        "Basic t0k",
        "Bearer",
        "Bearer  ",
        "Bearert0k",
        "Bearer t0k0",
        "t0k",
    ] {
        let (status, body) = send(&app, post("/v1/pools.list", Some(auth), "{}".into())).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("UNAUTHENTICATED")),
            "{auth}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_body_over_the_limit_is_one_json_413_on_every_route() -> Result<(), StoreError> {
    let app = app()?;
    let big = vec![b' '; API_MAX_BODY_BYTES + 1];
    let want = (413, Some("PAYLOAD_TOO_LARGE"));
    let check = |(status, body): (u16, Value)| {
        assert_eq!((status, body["code"].as_str()), want, "{body}");
        assert!(
            body["message"].as_str().is_some_and(|m| m.contains("over")),
            "{body}"
        );
    };
    // Announced with Content-Length, on a verb, an unknown verb, a GET route and no route at all,
    // with and without the token.
    for (method, path, auth) in [
        ("POST", "/v1/pools.list", Some("Bearer t0k")),
        ("POST", "/v1/pools.list", None),
        ("POST", "/v1/nodes.frobnicate", Some("Bearer t0k")),
        ("GET", "/v1/openapi.json", None),
        ("GET", "/v1/bundles/cmd_x", Some("Bearer t0k")),
        ("POST", "/nowhere", None),
    ] {
        let mut b = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_LENGTH, big.len());
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        let req = b
            .body(axum::body::Body::from(big.clone()))
            .unwrap_or_default();
        check(send(&app, req).await);
    }
    // Streamed without a length: cut where the verb reads it, same answer.
    let chunks = futures_chunks(big.clone());
    let req = post(
        "/v1/pools.list",
        Some("Bearer t0k"),
        axum::body::Body::from_stream(chunks),
    );
    check(send(&app, req).await);
    // At the limit it is read (and is JSON-checked like any body).
    let (status, body) = send(
        &app,
        post(
            "/v1/pools.list",
            Some("Bearer t0k"),
            vec![b' '; API_MAX_BODY_BYTES].into(),
        ),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{body}"
    );
    Ok(())
}

/// `data` as a stream of 64 KiB chunks (a body without Content-Length).
fn futures_chunks(
    data: Vec<u8>,
) -> impl tokio_stream::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        data.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    tokio_stream::iter(chunks)
}

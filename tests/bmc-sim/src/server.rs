//! The simulator's HTTP server: each request is recorded, authenticated, faulted as scripted,
//! answered by the model or forwarded to the emulator, in a task of its own (the BMC finishes
//! what it started even when the client gave up).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::docs;
use crate::state::{BootOverride, Booted, FaultKind, Recorded, State, Task, TaskPlan};
use crate::{SimConfig, SimError};

/// What every request handler shares.
pub(crate) struct Shared {
    upstream: String,
    upstream_auth: (String, String),
    /// `/redfish/v1/Systems/<uuid>`.
    pub system: String,
    client: reqwest::Client,
    pub st: Mutex<State>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("upstream", &self.upstream)
            .field("system", &self.system)
            .finish_non_exhaustive()
    }
}

/// An answer.
struct Resp {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(status: u16, v: &Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: serde_json::to_vec(v).unwrap_or_default(),
        }
    }

    fn empty(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    fn error(status: u16, message_id: &str, message: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: docs::error(message_id, message),
        }
    }

    fn header(mut self, k: &'static str, v: String) -> Self {
        self.headers.push((k, v));
        self
    }

    fn into_hyper(self) -> Response<Full<Bytes>> {
        let mut r = Response::new(Full::new(Bytes::from(self.body)));
        *r.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::OK);
        for (k, v) in self.headers {
            if let Ok(v) = http::HeaderValue::from_str(&v) {
                r.headers_mut().insert(k, v);
            }
        }
        r
    }
}

/// A request, read whole.
struct Req {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn bare_path(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }
}

enum Out {
    Resp(Resp),
    Drop,
}

/// The connection is closed without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the simulated BMC dropped the connection")
    }
}

impl std::error::Error for Dropped {}

/// Counts a request in flight until the simulated BMC is done with it.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.0.st.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
    }
}

pub(crate) async fn start(
    cfg: SimConfig,
) -> Result<(SocketAddr, Arc<Shared>, tokio::task::JoinHandle<()>), SimError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(SimError::Listen)?;
    let addr = listener.local_addr().map_err(SimError::Listen)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| SimError::Client(e.to_string()))?;
    let shared = Arc::new(Shared {
        upstream: format!("http://{}", cfg.upstream),
        upstream_auth: cfg.upstream_credentials,
        system: format!("/redfish/v1/Systems/{}", cfg.system_uuid),
        client,
        st: Mutex::new(State::new(
            cfg.behaviour,
            cfg.credentials.0,
            cfg.credentials.1,
        )),
    });
    let sh = Arc::clone(&shared);
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let sh = Arc::clone(&sh);
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(Arc::clone(&sh), req));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    Ok((addr, shared, task))
}

async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Dropped> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let r = Req {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    // Its own task: a client that gives up does not stop the BMC's work on the request.
    match tokio::spawn(process(sh, r)).await {
        Ok(Some(resp)) => Ok(resp.into_hyper()),
        _ => Err(Dropped),
    }
}

async fn process(sh: Arc<Shared>, r: Req) -> Option<Resp> {
    let now = Instant::now();
    let monitor = r.path.starts_with("/redfish/v1/TaskService/");
    let idx = {
        let mut st = sh.st.lock();
        let during = !monitor && st.task_running(now);
        if during {
            st.during_task += 1;
        }
        st.in_flight += 1;
        st.max_in_flight = st.max_in_flight.max(st.in_flight);
        st.requests.push(Recorded {
            at: now,
            method: r.method.clone(),
            path: r.path.clone(),
            body: String::from_utf8_lossy(&r.body).into_owned(),
            if_match: r.header("if-match").map(str::to_owned),
            auth: "none",
            status: 0,
            during_task: during,
        });
        st.requests.len() - 1
    };
    let _in_flight = InFlight(Arc::clone(&sh));
    let delay = sh.st.lock().b.delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (auth, out) = answer(&sh, &r).await;
    let mut st = sh.st.lock();
    if let Some(rec) = st.requests.get_mut(idx) {
        rec.auth = auth;
        rec.status = match &out {
            Out::Resp(x) => x.status,
            Out::Drop => 0,
        };
    }
    match out {
        Out::Resp(x) => Some(x),
        Out::Drop => None,
    }
}

fn internal_error() -> Resp {
    Resp::error(
        500,
        "Base.1.8.InternalError",
        "The request failed due to an internal service error.  The service is still operational.",
    )
}

async fn answer(sh: &Arc<Shared>, r: &Req) -> (&'static str, Out) {
    let path = r.bare_path().trim_end_matches('/').to_owned();
    // A busy BMC answers everything the same, before it looks at the credentials.
    let busy = sh.st.lock().busy_now();
    if let Some((status, retry_after)) = busy {
        return (
            "none",
            Out::Resp(
                Resp::error(
                    status,
                    "Base.1.8.ServiceTemporarilyUnavailable",
                    "The service is temporarily unavailable.  Retry in the number of seconds in the Retry-After header.",
                )
                .header("retry-after", retry_after.to_string()),
            ),
        );
    }
    let scripted = sh.st.lock().take_fault(&r.method, &path);
    let before = |k: Option<FaultKind>| match k {
        Some(FaultKind::StatusBefore(c)) => Some(Out::Resp(Resp::error(
            c,
            "Base.1.8.InternalError",
            "The request failed due to an internal service error.  The service is still operational.",
        ))),
        Some(FaultKind::DropBefore) => Some(Out::Drop),
        _ => None,
    };
    if let Some(o) = before(scripted) {
        return ("none", o);
    }
    if let Some(FaultKind::Delay(d)) = scripted {
        tokio::time::sleep(d).await;
    }
    let (auth, fault) = if r.method == "GET" && path == "/redfish/v1" {
        ("none", scripted)
    } else if r.method == "POST" && path == "/redfish/v1/SessionService/Sessions" {
        return ("login", Out::Resp(login(sh, r)));
    } else {
        match authenticate(sh, r) {
            Ok(a) => (a, scripted.or_else(|| sh.st.lock().take_nth())),
            Err(resp) => return ("bad", Out::Resp(resp)),
        }
    };
    if let Some(o) = before(fault) {
        return (auth, o);
    }
    let resp = route(sh, r, &path).await;
    match fault {
        Some(FaultKind::StatusAfter(c)) => (
            auth,
            Out::Resp(Resp::error(
                c,
                "Base.1.8.InternalError",
                "The request failed due to an internal service error.  The service is still operational.",
            )),
        ),
        Some(FaultKind::DropAfter) => (auth, Out::Drop),
        _ => (auth, Out::Resp(resp)),
    }
}

fn unauthorized(message_id: &str, message: &str) -> Resp {
    Resp::error(401, message_id, message)
        .header("www-authenticate", "Basic realm=\"bmc-sim\"".into())
}

fn authenticate(sh: &Shared, r: &Req) -> Result<&'static str, Resp> {
    let now = Instant::now();
    let mut st = sh.st.lock();
    if let Some(token) = r.header("x-auth-token") {
        if st.sessions.values().any(|t| t == token) {
            return Ok("token");
        }
        return Err(unauthorized(
            "Base.1.8.NoValidSession",
            "There is no valid session established with the implementation.",
        ));
    }
    let basic = r
        .header("authorization")
        .and_then(|h| h.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok());
    let Some(pair) = basic else {
        return Err(unauthorized(
            "Base.1.8.NoValidSession",
            "There is no valid session established with the implementation.",
        ));
    };
    let (user, password) = pair.split_once(':').unwrap_or((&pair, ""));
    if st.login(user, password, now) {
        Ok("basic")
    } else {
        Err(unauthorized(
            "Base.1.8.ResourceAtUriUnauthorized",
            "While accessing the resource at /redfish/v1, the service received an authorization error: the credentials are not valid or the account is locked.",
        ))
    }
}

fn login(sh: &Shared, r: &Req) -> Resp {
    let now = Instant::now();
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let user = v["UserName"].as_str().unwrap_or_default();
    let password = v["Password"].as_str().unwrap_or_default();
    let mut st = sh.st.lock();
    if !st.b.sessions {
        return Resp::error(
            405,
            "Base.1.8.OperationNotAllowed",
            "The HTTP method is not allowed on this resource.",
        );
    }
    if !st.login(user, password, now) {
        return unauthorized(
            "Base.1.8.ResourceAtUriUnauthorized",
            "While accessing the resource at /redfish/v1/SessionService/Sessions, the service received an authorization error: the credentials are not valid or the account is locked.",
        );
    }
    if st.sessions.len() >= st.b.session_slots {
        st.sessions_refused += 1;
        return Resp::error(
            503,
            "Base.1.8.SessionLimitExceeded",
            "The session establishment failed due to the number of simultaneous sessions exceeding the limit of the implementation.",
        )
        .header("retry-after", "1".into());
    }
    let id = st.next_session;
    st.next_session += 1;
    let nanos = now.elapsed().as_nanos();
    let token = format!("sim-token-{id}-{nanos}-{}", st.requests.len());
    st.sessions.insert(id, token.clone());
    st.sessions_created += 1;
    st.sessions_peak = st.sessions_peak.max(st.sessions.len());
    let doc = docs::session(id, user);
    Resp::json(201, &doc).header("x-auth-token", token).header(
        "location",
        format!("/redfish/v1/SessionService/Sessions/{id}"),
    )
}

async fn route(sh: &Arc<Shared>, r: &Req, path: &str) -> Resp {
    let sys = sh.system.as_str();
    let m = r.method.as_str();
    if m == "GET" && path == "/redfish/v1" {
        return root(sh).await;
    }
    if m == "GET" && path == "/redfish/v1/SessionService" {
        return Resp::json(200, &docs::session_service());
    }
    if m == "GET" && path == "/redfish/v1/SessionService/Sessions" {
        return Resp::json(200, &docs::sessions(&sh.st.lock()));
    }
    if let Some(id) = path.strip_prefix("/redfish/v1/SessionService/Sessions/") {
        let mut st = sh.st.lock();
        let id: u32 = id.parse().unwrap_or(0);
        return match m {
            "DELETE" if st.sessions.remove(&id).is_some() => {
                st.sessions_deleted += 1;
                Resp::empty(204)
            }
            "GET" if st.sessions.contains_key(&id) => Resp::json(200, &docs::session(id, &st.user)),
            _ => Resp::error(
                404,
                "Base.1.8.ResourceMissingAtURI",
                "The resource is missing.",
            ),
        };
    }
    if m == "GET" && path == "/redfish/v1/AccountService" {
        return Resp::json(200, &docs::account_service(&sh.st.lock()));
    }
    if let Some(id) = path.strip_prefix("/redfish/v1/TaskService/TaskMonitors/") {
        return monitor(sh, id.parse().unwrap_or(0), path);
    }
    if let Some(id) = path.strip_prefix("/redfish/v1/TaskService/Tasks/") {
        let st = sh.st.lock();
        let id: u32 = id.parse().unwrap_or(0);
        return match st.tasks.get(&id) {
            Some(t) => {
                let state = match (Instant::now() < t.done_at, t.fails) {
                    (true, _) => "Running",
                    (false, true) => "Exception",
                    (false, false) => "Completed",
                };
                Resp::json(200, &docs::task(id, state, t.fails))
            }
            None => Resp::error(
                404,
                "Base.1.8.ResourceMissingAtURI",
                "The resource is missing.",
            ),
        };
    }
    if m == "GET" && path == sys {
        return system(sh).await;
    }
    if m == "GET" && path == format!("{sys}/ResetActionInfo") {
        return Resp::json(200, &docs::reset_action_info(sys, &sh.st.lock()));
    }
    if m == "PATCH" && path == sys {
        return patch_boot(sh, r);
    }
    if m == "POST" && path == format!("{sys}/Actions/ComputerSystem.Reset") {
        return reset(sh, r).await;
    }
    if m == "GET" && path.starts_with(&format!("{sys}/EthernetInterfaces/")) {
        return match upstream_json(sh, "GET", path, None).await {
            Ok((200, mut doc)) => {
                docs::overlay_nic(&mut doc, sh.st.lock().b.mac_style);
                Resp::json(200, &doc)
            }
            Ok((status, doc)) => Resp::json(status, &doc),
            Err(_) => internal_error(),
        };
    }
    let body = (!r.body.is_empty()).then(|| r.body.clone());
    match upstream(sh, m, path, body).await {
        Ok((status, bytes)) => Resp {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: bytes.to_vec(),
        },
        Err(_) => internal_error(),
    }
}

async fn upstream(
    sh: &Shared,
    method: &str,
    path: &str,
    body: Option<Bytes>,
) -> Result<(u16, Bytes), reqwest::Error> {
    let method = http::Method::from_bytes(method.as_bytes()).unwrap_or(http::Method::GET);
    let mut req = sh
        .client
        .request(method, format!("{}{path}", sh.upstream))
        .basic_auth(&sh.upstream_auth.0, Some(&sh.upstream_auth.1));
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.bytes().await?))
}

async fn upstream_json(
    sh: &Shared,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), reqwest::Error> {
    let body = body.map(|v| Bytes::from(serde_json::to_vec(&v).unwrap_or_default()));
    let (status, bytes) = upstream(sh, method, path, body).await?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

async fn root(sh: &Shared) -> Resp {
    match upstream_json(sh, "GET", "/redfish/v1", None).await {
        Ok((200, mut doc)) => {
            docs::overlay_root(&mut doc, &sh.st.lock());
            Resp::json(200, &doc)
        }
        Ok((status, doc)) => Resp::json(status, &doc),
        Err(_) => internal_error(),
    }
}

async fn system(sh: &Shared) -> Resp {
    match upstream_json(sh, "GET", &sh.system, None).await {
        Ok((200, mut doc)) => {
            let st = sh.st.lock();
            docs::overlay_system(&mut doc, &sh.system, &st, Instant::now());
            let mut resp = Resp::json(200, &doc);
            if st.b.etags {
                resp = resp.header("etag", docs::etag(&st));
            }
            resp
        }
        Ok((status, doc)) => Resp::json(status, &doc),
        Err(_) => internal_error(),
    }
}

/// A boot-override change as a PATCH asked for it.
#[derive(Debug, Clone)]
struct BootChange {
    target: Option<String>,
    enabled: Option<String>,
    mode: Option<String>,
}

fn not_in_list(value: &str, property: &str) -> Resp {
    Resp::error(
        400,
        "Base.1.8.PropertyValueNotInList",
        &format!(
            "The value {value} for the property {property} is not in the list of acceptable values."
        ),
    )
}

fn patch_boot(sh: &Arc<Shared>, r: &Req) -> Resp {
    let v: Value = match serde_json::from_slice(&r.body) {
        Ok(v) => v,
        Err(_) => {
            return Resp::error(
                400,
                "Base.1.8.MalformedJSON",
                "The request body submitted was malformed JSON and could not be parsed by the receiving service.",
            );
        }
    };
    let Some(boot) = v.get("Boot") else {
        return Resp::error(
            400,
            "Base.1.8.PropertyUnknown",
            "The property in the request body is not known to this service: only Boot can be changed.",
        );
    };
    let text = |k: &str| boot.get(k).and_then(Value::as_str).map(str::to_owned);
    let change = BootChange {
        target: text("BootSourceOverrideTarget"),
        enabled: text("BootSourceOverrideEnabled"),
        mode: text("BootSourceOverrideMode"),
    };
    let mut st = sh.st.lock();
    if st.b.etag_required {
        match r.header("if-match") {
            None => {
                return Resp::error(
                    428,
                    "Base.1.8.PreconditionRequired",
                    "A precondition header or annotation is required to change the resource.",
                );
            }
            Some(t) if t != docs::etag(&st) => {
                return Resp::error(
                    412,
                    "Base.1.8.PreconditionFailed",
                    "The ETag supplied did not match the ETag required to change this resource.",
                );
            }
            Some(_) => {}
        }
    }
    let reports_mode = st.boot.mode.is_some() || st.b.mode.is_some();
    if st.b.mode_required && reports_mode && change.mode.is_none() {
        return Resp::error(
            400,
            "Base.1.8.PropertyMissing",
            "The property BootSourceOverrideMode is a required property and must be included in the request.",
        );
    }
    if st.b.mode_refused && change.mode.is_some() {
        return Resp::error(
            400,
            "Base.1.8.PropertyNotWritable",
            "The property BootSourceOverrideMode is a read only property and cannot be assigned a value.",
        );
    }
    if let Some(t) = &change.target
        && !st.b.targets.contains(t)
    {
        return not_in_list(t, "BootSourceOverrideTarget");
    }
    if let Some(e) = &change.enabled
        && let Some(list) = &st.b.enabled_values
        && !list.contains(e)
    {
        return not_in_list(e, "BootSourceOverrideEnabled");
    }
    if let Some(plan) = st.b.patch_task {
        let (id, resp) = new_task(&mut st, plan);
        drop(st);
        let sh = Arc::clone(sh);
        tokio::spawn(async move {
            tokio::time::sleep(plan.runs).await;
            if !plan.fails {
                apply_boot(&mut sh.st.lock(), &change);
            }
            tracing::debug!(task = id, "boot override task over");
        });
        return resp;
    }
    apply_boot(&mut st, &change);
    Resp::empty(204)
}

fn apply_boot(st: &mut State, c: &BootChange) {
    if st.b.override_lost {
        return;
    }
    if let Some(t) = &c.target {
        st.boot.target = t.clone();
    }
    if let Some(e) = &c.enabled {
        st.boot.enabled = if st.b.once_as_continuous && e == "Once" {
            "Continuous".to_owned()
        } else {
            e.clone()
        };
    }
    if let Some(m) = &c.mode {
        st.boot.mode = Some(m.clone());
    }
    st.etag += 1;
}

fn new_task(st: &mut State, plan: TaskPlan) -> (u32, Resp) {
    let id = st.next_task;
    st.next_task += 1;
    st.tasks.insert(
        id,
        Task {
            done_at: Instant::now() + plan.runs,
            fails: plan.fails,
            retry_after_s: plan.retry_after_s,
        },
    );
    let resp = Resp::json(202, &docs::task(id, "Running", false))
        .header(
            "location",
            format!("/redfish/v1/TaskService/TaskMonitors/{id}"),
        )
        .header("retry-after", plan.retry_after_s.to_string());
    (id, resp)
}

fn monitor(sh: &Shared, id: u32, path: &str) -> Resp {
    let st = sh.st.lock();
    let Some(t) = st.tasks.get(&id) else {
        return Resp::error(
            404,
            "Base.1.8.ResourceMissingAtURI",
            "The resource is missing.",
        );
    };
    if Instant::now() < t.done_at {
        return Resp::json(202, &docs::task(id, "Running", false))
            .header("location", path.to_owned())
            .header("retry-after", t.retry_after_s.to_string());
    }
    let state = if t.fails { "Exception" } else { "Completed" };
    Resp::json(200, &docs::task(id, state, t.fails))
}

async fn reset(sh: &Arc<Shared>, r: &Req) -> Resp {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let Some(kind) = v["ResetType"].as_str().map(str::to_owned) else {
        return Resp::error(
            400,
            "Base.1.8.ActionParameterMissing",
            "The action ComputerSystem.Reset requires the parameter ResetType to be present in the request body.",
        );
    };
    {
        let mut st = sh.st.lock();
        if !st.b.reset_types.contains(&kind) {
            return Resp::error(
                400,
                "Base.1.8.ActionParameterValueNotInList",
                &format!(
                    "The value {kind} for the parameter ResetType in the action ComputerSystem.Reset is not in the list of acceptable values."
                ),
            );
        }
        if let Some(plan) = st.b.reset_task {
            let (_, resp) = new_task(&mut st, plan);
            drop(st);
            let sh = Arc::clone(sh);
            tokio::spawn(async move {
                tokio::time::sleep(plan.runs).await;
                if !plan.fails {
                    let _ = do_reset(&sh, &kind).await;
                }
            });
            return resp;
        }
    }
    match do_reset(sh, &kind).await {
        Ok(()) => Resp::empty(204),
        Err(_) => internal_error(),
    }
}

/// What the firmware does on a reset: decide what boots (a one-time override is consumed),
/// tell the emulator, and network-boot like iPXE where the test gave a boot URL.
async fn do_reset(sh: &Arc<Shared>, kind: &str) -> Result<(), String> {
    let on_before = match upstream_json(sh, "GET", &sh.system, None).await {
        Ok((200, doc)) => doc["PowerState"].as_str() == Some("On"),
        _ => false,
    };
    let boots = match kind {
        "On" | "ForceOn" | "PushPowerButton" => !on_before,
        "ForceRestart" | "GracefulRestart" | "PowerCycle" => true,
        _ => false,
    };
    let offs =
        matches!(kind, "ForceOff" | "GracefulShutdown") || (kind == "PushPowerButton" && on_before);
    let now = Instant::now();
    let (device, net, idx) = {
        let mut st = sh.st.lock();
        if offs && st.b.power_off_clears_once && st.boot.enabled == "Once" {
            st.boot = BootOverride {
                mode: st.boot.mode.clone(),
                ..BootOverride::default()
            };
            st.etag += 1;
        }
        if !st.b.transition.is_zero() && (boots || offs) {
            let shown = if offs { "PoweringOff" } else { "PoweringOn" };
            st.transition = Some((now + st.b.transition, shown));
        }
        if boots {
            let then = st.boot.clone();
            let ignored = st.b.ignore_override_boots > 0;
            if ignored {
                st.b.ignore_override_boots -= 1;
            }
            let armed = !ignored
                && then.enabled != "Disabled"
                && matches!(then.target.as_str(), "Pxe" | "Hdd");
            let device = if armed {
                then.target.clone()
            } else {
                "Hdd".to_owned()
            };
            if then.enabled == "Once" {
                st.boot = BootOverride {
                    mode: then.mode.clone(),
                    ..BootOverride::default()
                };
                st.etag += 1;
            }
            st.boots.push(Booted {
                at: now,
                device: device.clone(),
                override_then: then,
                script_status: None,
            });
            let net = if device == "Pxe" {
                st.net_boot.clone()
            } else {
                None
            };
            (Some(device), net, st.boots.len() - 1)
        } else {
            (None, None, 0)
        }
    };
    if let Some(d) = &device {
        let _ = upstream_json(
            sh,
            "PATCH",
            &sh.system,
            Some(json!({"Boot": {"BootSourceOverrideTarget": d}})),
        )
        .await;
    }
    let upstream_kind = match kind {
        "PowerCycle" => "ForceRestart",
        "PushPowerButton" if on_before => "ForceOff",
        "PushPowerButton" => "On",
        k => k,
    };
    let path = format!("{}/Actions/ComputerSystem.Reset", sh.system);
    match upstream_json(sh, "POST", &path, Some(json!({"ResetType": upstream_kind}))).await {
        Ok((s, _)) if s < 300 => {}
        Ok((s, doc)) => return Err(format!("the emulator answered {s}: {doc}")),
        Err(e) => return Err(e.to_string()),
    }
    if let Some((url, mac)) = net {
        let sh = Arc::clone(sh);
        tokio::spawn(async move { network_boot(&sh, idx, &url, &mac).await });
    }
    Ok(())
}

/// iPXE's request for its script: `url?mac=<mac>`, after the firmware's POST.
async fn network_boot(sh: &Shared, idx: usize, url: &str, mac: &str) {
    let post = sh.st.lock().b.post_delay;
    tokio::time::sleep(post).await;
    let got = sh.client.get(url).query(&[("mac", mac)]).send().await;
    let (status, text) = match got {
        Ok(r) => {
            let s = r.status().as_u16();
            (s, r.text().await.unwrap_or_default())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the simulated firmware's boot script request failed");
            (0, String::new())
        }
    };
    let hook = {
        let mut st = sh.st.lock();
        if let Some(b) = st.boots.get_mut(idx) {
            b.script_status = Some(status);
        }
        st.on_script.clone()
    };
    if status == 200
        && let Some(f) = hook
    {
        f(text);
    }
}

//! The operator API client `bcctl` uses: finds the API (flag, environment or the state dir's
//! `endpoints.json`), sends `POST /v1/<method>` with the bearer token, decodes `{code, message}`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::server::{API_TOKEN_FILE, ENDPOINTS_FILE, Endpoints};
use cpl_core::error::ErrorBody;
use cpl_core::verbs::{Method, Request};

/// What went wrong talking to the operator API.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Neither a flag, the environment nor the state dir says where the API is.
    #[error(
        "cannot find the operator API: pass --api URL (or BCCTL_API), or --state-dir of a running `bcctl serve` ({path}: {reason})"
    )]
    NoEndpoint { path: PathBuf, reason: String },
    /// No bearer token found.
    #[error(
        "no API token: pass --token (or BCCTL_TOKEN), or --state-dir of the control plane ({path}: {reason})"
    )]
    NoToken { path: PathBuf, reason: String },
    /// The control plane could not be reached.
    #[error("cannot reach the operator API at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    /// The API answered with an error.
    #[error("{0}")]
    Api(ErrorBody),
    /// The API answered something that is not the expected JSON.
    #[error("unexpected answer from {url} (HTTP {status}): {body}")]
    Protocol {
        url: String,
        status: u16,
        body: String,
    },
}

/// A connected operator client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// A client for `base` (e.g. `http://127.0.0.1:7080`) with `token`.
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.into().trim_end_matches('/').to_owned(),
            token: token.into(),
        }
    }

    /// Resolves the API URL and token: explicit values first, then the state dir's files.
    pub fn discover(
        api: Option<String>,
        token: Option<String>,
        state_dir: &Path,
    ) -> Result<Self, ClientError> {
        let base = match api {
            Some(a) => a,
            None => {
                let path = state_dir.join(ENDPOINTS_FILE);
                let text = std::fs::read_to_string(&path).map_err(|e| ClientError::NoEndpoint {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                let ep: Endpoints =
                    serde_json::from_str(&text).map_err(|e| ClientError::NoEndpoint {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                ep.api_url
            }
        };
        let token = match token {
            Some(t) => t,
            None => {
                let path = state_dir.join(API_TOKEN_FILE);
                std::fs::read_to_string(&path)
                    .map(|t| t.trim().to_owned())
                    .map_err(|e| ClientError::NoToken {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?
            }
        };
        Ok(Self::new(base, token))
    }

    /// Sends `req` with the bearer token; a transport failure names `url`.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::Response, ClientError> {
        req.bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.to_owned(),
                source,
            })
    }

    /// Sends `req` to its method ([`Request::method`]) and decodes the answer. The typed way:
    /// the body is the request type the server decodes, so the two cannot disagree on a field.
    pub async fn request<Resp: DeserializeOwned>(
        &self,
        req: &Request,
    ) -> Result<Resp, ClientError> {
        self.call(req.method(), req).await
    }

    /// Calls `method` with any serializable body: for tests and tools that send bodies the
    /// request types cannot hold (a malformed one, an unknown field). `bcctl` uses [`Self::request`].
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: Method,
        req: &Req,
    ) -> Result<Resp, ClientError> {
        let url = format!("{}/v1/{}", self.base, method.name());
        let resp = self.send(self.http.post(&url).json(req), &url).await?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.clone(),
                source,
            })?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol {
                url,
                status: status.as_u16(),
                body: format!("{e}: {}", String::from_utf8_lossy(&bytes)),
            });
        }
        Err(error_answer(url, status.as_u16(), &bytes))
    }

    /// `GET <base><path>` with the bearer token; the response when it is a success, else the
    /// API's error (e.g. `GET /v1/bundles/{commandId}`, streamed by the caller).
    pub async fn get_stream(&self, path: &str) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base);
        let resp = self.send(self.http.get(&url), &url).await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let bytes = resp.bytes().await.unwrap_or_default();
        Err(error_answer(url, status.as_u16(), &bytes))
    }
}

/// The error an unsuccessful answer carries: the API's `{code, message}`, else the raw body.
fn error_answer(url: String, status: u16, bytes: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(err) => ClientError::Api(err),
        Err(_) => ClientError::Protocol {
            url,
            status,
            body: String::from_utf8_lossy(bytes).into_owned(),
        },
    }
}

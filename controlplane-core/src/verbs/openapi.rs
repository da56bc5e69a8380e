//! The operator API as an OpenAPI 3.1 document, generated from the method table
//! ([`super::Method`]) and the request and answer types' schemas (utoipa): no schema here is
//! written by hand, so a renamed field or a new verb shows up in the document by itself.
//! `bcctl serve` serves it at `GET /v1/openapi.json` (without the bearer token: it describes the
//! API and holds no data); every verb in it requires the bearer token (`bearerAuth`).

use std::collections::BTreeMap;

use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem, PathsBuilder,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, ObjectBuilder, OpenApi, OpenApiBuilder, Ref,
    RefOr, Required, ResponseBuilder, Schema, Type,
};
use utoipa::{PartialSchema, ToSchema};

use super::Method;
use crate::error::ErrorBody;

/// The name of the bearer-token security scheme in the document.
pub const BEARER_SCHEME: &str = "bearerAuth";

/// A method's request and answer schemas, with every schema they reference.
pub(crate) struct MethodSchemas {
    request: String,
    response: String,
    schemas: Vec<(String, RefOr<Schema>)>,
}

impl MethodSchemas {
    /// The schemas of a method whose request is `Req` and answer is `Resp`.
    pub(crate) fn of<Req: ToSchema, Resp: ToSchema>() -> Self {
        let mut schemas = vec![
            (Req::name().into_owned(), Req::schema()),
            (Resp::name().into_owned(), Resp::schema()),
        ];
        Req::schemas(&mut schemas);
        Resp::schemas(&mut schemas);
        MethodSchemas {
            request: Req::name().into_owned(),
            response: Resp::name().into_owned(),
            schemas,
        }
    }
}

impl std::fmt::Debug for MethodSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodSchemas")
            .field("request", &self.request)
            .field("response", &self.response)
            .field("schemas", &self.schemas.len())
            .finish()
    }
}

fn json_content(schema_name: &str) -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(Ref::from_schema_name(schema_name)))
        .build()
}

fn error_response() -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description("An error: `{code, message}` (NOT_FOUND 404, INVALID_STATE and CONFLICT 409, INVALID_ARGUMENT 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, INTERNAL 500, UNAVAILABLE 503, PAYLOAD_TOO_LARGE 413)")
        .content("application/json", json_content(&ErrorBody::name()))
        .build()
}

/// Statuses a method answers besides 200 and the default error, each with why.
fn documented_refusals(m: Method) -> &'static [(&'static str, &'static str)] {
    match m {
        Method::AllocationsCreate => &[(
            "503",
            "UNAVAILABLE: no schedulable node of the pool has that many free GPUs now; retry once allocations are released",
        )],
        _ => &[],
    }
}

fn verb_path(m: Method, s: &MethodSchemas) -> PathItem {
    let mut op = OperationBuilder::new()
        .operation_id(Some(m.name()))
        .summary(Some(m.summary()))
        .request_body(Some(
            RequestBodyBuilder::new()
                .content("application/json", json_content(&s.request))
                .required(Some(Required::True))
                .build(),
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The answer")
                .content("application/json", json_content(&s.response))
                .build(),
        )
        .response("default", error_response());
    for (status, why) in documented_refusals(m) {
        op = op.response(
            *status,
            ResponseBuilder::new()
                .description(*why)
                .content("application/json", json_content(&ErrorBody::name()))
                .build(),
        );
    }
    PathItem::new(HttpMethod::Post, op.build())
}

/// `GET /v1/bundles/{commandId}`: a logs.collect bundle.
fn bundle_path() -> PathItem {
    let op = OperationBuilder::new()
        .operation_id(Some("bundles.download"))
        .summary(Some(
            "Download the logs.collect bundle (gzip-compressed tar) of a command.",
        ))
        .parameter(
            ParameterBuilder::new()
                .name("commandId")
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
        )
        .response(
            "200",
            ResponseBuilder::new()
                .description("The bundle; `X-Bundle-Sha256` carries its SHA-256 (lowercase hex)")
                .content(
                    "application/gzip",
                    ContentBuilder::new()
                        .schema(Some(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .content_media_type("application/gzip"),
                        ))
                        .build(),
                )
                .build(),
        )
        .response("default", error_response())
        .build();
    PathItem::new(HttpMethod::Get, op)
}

/// `GET /v1/openapi.json`: this document, without the bearer token.
fn document_path() -> PathItem {
    let op = OperationBuilder::new()
        .operation_id(Some("openapi"))
        .summary(Some("This OpenAPI document."))
        .security(SecurityRequirement::default())
        .response(
            "200",
            ResponseBuilder::new()
                .description("The document")
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(ObjectBuilder::new().schema_type(Type::Object)))
                        .build(),
                )
                .build(),
        )
        .build();
    PathItem::new(HttpMethod::Get, op)
}

/// The OpenAPI 3.1 document of the operator API.
pub fn document() -> OpenApi {
    let mut schemas: BTreeMap<String, RefOr<Schema>> = BTreeMap::new();
    let mut paths = PathsBuilder::new();
    for &m in Method::ALL {
        let s = m.schemas();
        paths = paths.path(format!("/v1/{}", m.name()), verb_path(m, &s));
        schemas.extend(s.schemas);
    }
    paths = paths
        .path("/v1/bundles/{commandId}", bundle_path())
        .path("/v1/openapi.json", document_path());
    let mut errors = vec![(ErrorBody::name().into_owned(), ErrorBody::schema())];
    ErrorBody::schemas(&mut errors);
    schemas.extend(errors);
    let components = ComponentsBuilder::new()
        .schemas_from_iter(schemas)
        .security_scheme(
            BEARER_SCHEME,
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        )
        .build();
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("controlplane-lite operator API")
                .version(bc_protocol::VERSION)
                .description(Some(
                    "POST /v1/<method> with a JSON body and `Authorization: Bearer <token>` (the server's `api-token` file). Errors are `{code, message}`.",
                )),
        )
        .paths(paths.build())
        .components(Some(components))
        .security(Some(vec![SecurityRequirement::new(BEARER_SCHEME, Vec::<String>::new())]))
        .build()
}

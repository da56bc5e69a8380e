//! OpenAPI schemas (utoipa) of the string enums: each is a `string` whose `enum` lists exactly the
//! spellings `as_str` renders, read from the type's `ALL`, so a new variant shows up by itself.

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

macro_rules! string_enum_schema {
    ($($name:ident),+ $(,)?) => {$(
        impl utoipa::PartialSchema for crate::$name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(crate::$name::ALL.iter().map(|v| v.as_str())))
                    .into()
            }
        }

        impl utoipa::ToSchema for crate::$name {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($name))
            }
        }
    )+};
}

string_enum_schema!(
    ProvisionState,
    Connectivity,
    Power,
    NodeRole,
    Trust,
    Adapter,
    ConditionStatus,
    ErrorCode,
    Mode,
    CommandName,
    PoolKind,
    PoolAgent,
    SiteKind,
    CapacityBucket,
);

//! Operator-supplied strings: every one has a length limit and a character set, and this module is
//! the one place that says which and checks them.
//!
//! # Background
//! The operator API used to accept any string up to the body limit, NUL and ESC included: a pool
//! name of 65,536 characters made `bcctl pools list` panic, and an ESC sequence in a name went raw
//! to the operator's terminal.
//!
//! # Design
//! One newtype per kind of string ([`Name`], [`Id`], [`Key`], [`ShortText`], [`Text`]), each
//! with its [`Rule`]. The verbs' request types use them for their fields, so a request that breaks
//! a rule fails while it is decoded (`Method::decode`, `INVALID_ARGUMENT` naming the field), and
//! the OpenAPI document gets `minLength`, `maxLength` and `pattern` from the same rule. Lengths
//! count Unicode scalar values (characters), not bytes. Types the verbs share with the store
//! (`HardwareProfile`) are checked through [`check_profile`] from their request's decoder.
//!
//! # Limitations
//! What is already stored is never re-checked (a record written before these rules still loads);
//! the printers escape what they cannot show. `nodes.updateSpec`'s spec has its own validator
//! (`bc_protocol::spec::validate`) and the body limit.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::error::OpError;

/// Which characters a string may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chars {
    /// Any character but control characters (C0, DEL, C1: NUL, ESC, newline, ...) and the
    /// Unicode bidirectional and line-separator formatting characters that reorder or break what a
    /// terminal shows (U+200E, U+200F, U+2028, U+2029, U+202A–U+202E, U+2066–U+2069).
    Printable,
    /// `[A-Za-z0-9._:-]`: ids (`node_…`, `pool_…`, tenant ids).
    Token,
    /// `[A-Za-z0-9._/-]`, starting with a letter or digit: taint and label keys.
    Key,
}

impl Chars {
    /// Whether `c` at position `at` (0-based, in characters) is allowed.
    fn allows(self, at: usize, c: char) -> bool {
        match self {
            Chars::Printable => !c.is_control() && !is_bidi_or_separator(c),
            Chars::Token => c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'),
            Chars::Key if at == 0 => c.is_ascii_alphanumeric(),
            Chars::Key => c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'),
        }
    }

    /// What the set is, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Chars::Printable => {
                "printable characters (no control or bidirectional formatting characters)"
            }
            Chars::Token => "characters of [A-Za-z0-9._:-]",
            Chars::Key => "characters of [A-Za-z0-9._/-], starting with a letter or digit",
        }
    }

    /// The set as an ECMA-262 regular expression (OpenAPI `pattern`) of one non-empty string.
    fn pattern(self) -> &'static str {
        match self {
            Chars::Printable => {
                "^[^\\u0000-\\u001F\\u007F-\\u009F\\u200E\\u200F\\u2028\\u2029\\u202A-\\u202E\\u2066-\\u2069]*$"
            }
            Chars::Token => "^[A-Za-z0-9._:-]*$",
            Chars::Key => "^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        }
    }
}

/// The formatting characters [`Chars::Printable`] refuses besides control characters.
fn is_bidi_or_separator(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// A kind of string: what it is called in messages, its length bounds and its characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// What the string is, e.g. `a name`.
    pub what: &'static str,
    /// Fewest characters. With `min > 0` a string of only whitespace is refused too.
    pub min: usize,
    /// Most characters (Unicode scalar values).
    pub max: usize,
    /// Allowed characters.
    pub chars: Chars,
}

/// Why a string breaks its [`Rule`]. Never echoes the string itself (it may be megabytes, or
/// hold what a terminal would interpret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Empty, or only whitespace, where at least one character is needed.
    #[error("{what} must not be empty or blank")]
    Empty { what: &'static str },
    /// Over the length limit.
    #[error("{what} is {len} characters long, at most {max} are allowed")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// A character outside the set.
    #[error("{what} holds {found} at character {at}; only {allowed} are allowed")]
    BadChar {
        what: &'static str,
        /// The character, escaped (`'\u{1b}'`).
        found: String,
        at: usize,
        allowed: &'static str,
    },
}

impl From<TextError> for OpError {
    fn from(e: TextError) -> Self {
        OpError::InvalidArgument(e.to_string())
    }
}

impl Rule {
    /// Checks `s` against the rule.
    pub fn check(&self, s: &str) -> Result<(), TextError> {
        let mut len = 0usize;
        for (at, c) in s.chars().enumerate() {
            if !self.chars.allows(at, c) {
                return Err(TextError::BadChar {
                    what: self.what,
                    found: format!("{:?}", c),
                    at,
                    allowed: self.chars.describe(),
                });
            }
            len += 1;
        }
        if len > self.max {
            return Err(TextError::TooLong {
                what: self.what,
                len,
                max: self.max,
            });
        }
        if self.min > 0 && (len < self.min || s.trim().is_empty()) {
            return Err(TextError::Empty { what: self.what });
        }
        Ok(())
    }

    /// The OpenAPI schema of a string under this rule.
    pub fn schema(&self) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length((self.min > 0).then_some(self.min))
            .max_length(Some(self.max))
            .pattern(Some(self.chars.pattern()))
            .description(Some(format!(
                "{}: {} to {} {}",
                self.what,
                self.min,
                self.max,
                self.chars.describe()
            )))
            .into()
    }
}

/// Pool, site and GPU model names: 1 to 128 printable characters, not blank.
pub const NAME: Rule = Rule {
    what: "a name",
    min: 1,
    max: 128,
    chars: Chars::Printable,
};
/// Ids in requests (node, pool, site, token, allocation, command, lease) and tenant ids: 1 to
/// 128 characters of `[A-Za-z0-9._:-]`.
pub const ID: Rule = Rule {
    what: "an id",
    min: 1,
    max: 128,
    chars: Chars::Token,
};
/// Taint and label keys, driver concerns: 1 to 63 characters of `[A-Za-z0-9._/-]`, starting with
/// a letter or digit.
pub const KEY: Rule = Rule {
    what: "a key",
    min: 1,
    max: 63,
    chars: Chars::Key,
};
/// Taint and label values, driver names: 0 to 256 printable characters.
pub const SHORT_TEXT: Rule = Rule {
    what: "a value",
    min: 0,
    max: 256,
    chars: Chars::Printable,
};
/// BMC addresses (`nodes.enroll`'s `bmc.address`): 1 to 512 printable characters; the
/// address grammar on top of it is `crate::verbs::bmc_input`'s.
pub const BMC_ADDRESS: Rule = Rule {
    what: "a BMC address",
    min: 1,
    max: 512,
    chars: Chars::Printable,
};
/// Descriptions and reasons: 0 to 1,024 printable characters.
pub const TEXT: Rule = Rule {
    what: "a text",
    min: 0,
    max: 1024,
    chars: Chars::Printable,
};

macro_rules! bounded {
    ($(#[$doc:meta])* $name:ident, $rule:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The rule every value of this type keeps.
            pub const RULE: Rule = $rule;

            /// `s`, when it keeps [`Self::RULE`].
            pub fn new(s: impl Into<String>) -> Result<Self, TextError> {
                let s = s.into();
                Self::RULE.check(&s)?;
                Ok(Self(s))
            }

            /// `s` as given, NOT checked against [`Self::RULE`]: for a client building a
            /// request to send (`bcctl`), so that the server's decoder checks the string and
            /// answers as it answers any client (`INVALID_ARGUMENT` naming the field). The core
            /// never builds one this way (a test of this module keeps it so): its values come
            /// from [`Self::new`] or from a decoded request.
            pub fn unchecked(s: impl Into<String>) -> Self {
                Self(s.into())
            }

            /// The string.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The string, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        /// Unchecked, for the crate's tests only (fixtures spell their values by hand).
        #[cfg(test)]
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        /// Unchecked, for the crate's tests only.
        #[cfg(test)]
        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::RULE.check(&s).map_err(serde::de::Error::custom)?;
                Ok(Self(s))
            }
        }

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                Self::RULE.schema()
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

bounded!(
    /// A name ([`NAME`]): pools, sites, GPU models.
    Name,
    NAME
);
bounded!(
    /// An id in a request ([`ID`]).
    Id,
    ID
);
bounded!(
    /// A taint or label key ([`KEY`]).
    Key,
    KEY
);
bounded!(
    /// A taint or label value ([`SHORT_TEXT`]).
    ShortText,
    SHORT_TEXT
);
bounded!(
    /// A description or reason ([`TEXT`]).
    Text,
    TEXT
);

impl Default for ShortText {
    /// The empty value (a taint without a value).
    fn default() -> Self {
        Self(String::new())
    }
}

/// Most labels one node carries.
pub const MAX_LABELS: usize = 64;

/// Checks the strings of a hardware profile in a request: `expectedGpuModel` is a [`NAME`],
/// each driver concern a [`KEY`] and each driver a [`SHORT_TEXT`].
pub fn check_profile(p: &cpl_store::HardwareProfile) -> Result<(), TextError> {
    if let Some(m) = &p.expected_gpu_model {
        NAME.check(m)?;
    }
    for (concern, driver) in &p.drivers {
        KEY.check(concern)?;
        SHORT_TEXT.check(driver)?;
    }
    Ok(())
}

/// `deserialize_with` for a request's hardware profile: parsed, then [`check_profile`].
pub fn profile<'de, D: Deserializer<'de>>(d: D) -> Result<cpl_store::HardwareProfile, D::Error> {
    let p = cpl_store::HardwareProfile::deserialize(d)?;
    check_profile(&p).map_err(serde::de::Error::custom)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_printable() {
        assert!(Name::new("h100 pool").is_ok());
        assert!(
            Name::new("Zürich – rack 7").is_ok(),
            "Unicode letters are fine"
        );
        assert_eq!(
            Name::new("x".repeat(129)),
            Err(TextError::TooLong {
                what: "a name",
                len: 129,
                max: 128
            })
        );
        assert!(Name::new("x".repeat(128)).is_ok());
        for bad in [
            "a\0b",
            "a\u{1b}[2Jb",
            "tab\there",
            "line\nbreak",
            "\u{202E}evil",
            "\u{85}",
        ] {
            let e = Name::new(bad);
            assert!(
                matches!(e, Err(TextError::BadChar { .. })),
                "{bad:?}: {e:?}"
            );
        }
        assert_eq!(Name::new(""), Err(TextError::Empty { what: "a name" }));
        assert_eq!(Name::new("   "), Err(TextError::Empty { what: "a name" }));
        // The message names the character escaped, never the raw string.
        let msg = Name::new("a\u{1b}b")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("\\u{1b}") && !msg.contains('\u{1b}'), "{msg}");
    }

    #[test]
    fn ids_keys_and_values_have_their_sets() {
        assert!(Id::new("node_0123abcd").is_ok());
        assert!(Id::new("tenant-a.b:c").is_ok());
        assert!(Id::new("a b").is_err());
        assert!(Id::new("").is_err());
        assert!(Id::new("x".repeat(129)).is_err());
        assert!(Key::new("gpu.vendor/nvidia-ok_1").is_ok());
        assert!(Key::new("-leading").is_err());
        assert!(Key::new("x".repeat(64)).is_err());
        assert!(ShortText::new("").is_ok());
        assert!(ShortText::new("x".repeat(257)).is_err());
        assert!(Text::new("x".repeat(1024)).is_ok());
        assert!(Text::new("x".repeat(1025)).is_err());
    }

    #[test]
    fn a_rule_refuses_while_decoding_and_shows_in_the_schema() {
        let bad: Result<Name, _> = serde_json::from_value(serde_json::json!("a\u{0}"));
        assert!(bad.is_err());
        let ok: Result<Name, _> = serde_json::from_value(serde_json::json!("ok"));
        assert_eq!(ok.ok().as_ref().map(Name::as_str), Some("ok"));
        let schema = serde_json::to_value(Name::schema()).unwrap_or_default();
        assert_eq!(schema["maxLength"], 128);
        assert_eq!(schema["minLength"], 1);
        assert!(
            schema["pattern"]
                .as_str()
                .is_some_and(|p| p.contains("\\u0000"))
        );
        let key = serde_json::to_value(Key::schema()).unwrap_or_default();
        assert_eq!(key["maxLength"], 63);
    }

    /// `unchecked` is for clients: no module of the core builds a text value that way, so every
    /// value the core acts on kept its rule.
    #[test]
    fn the_core_never_builds_an_unchecked_text() {
        fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|x| x == "rs")
                    && !path.ends_with("src/text.rs")
                    && std::fs::read_to_string(&path)
                        .is_ok_and(|t| t.contains(concat!("::unchecked", "(")))
                {
                    found.push(path.display().to_string());
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        walk(&src, &mut found);
        assert!(src.join("verbs").is_dir(), "{} not found", src.display());
        assert!(found.is_empty(), "unchecked text values in {found:?}");
    }

    proptest::proptest! {
        #[test]
        fn a_checked_string_is_within_its_bounds(s in ".{0,200}") {
            for rule in [NAME, ID, KEY, SHORT_TEXT, TEXT] {
                if rule.check(&s).is_ok() {
                    let n = s.chars().count();
                    proptest::prop_assert!(n <= rule.max && n >= rule.min);
                    proptest::prop_assert!(!s.chars().any(char::is_control));
                }
            }
        }
    }
}

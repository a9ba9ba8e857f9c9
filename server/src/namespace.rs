//! Namespace names: the one rule a name must follow, in flags, in every
//! store and in API calls alike ([`NAMESPACE_RULE`]), and [`Namespace`], a
//! name that passed it. The name becomes part of etcd keys and of the
//! single-instance store's file names, so this rule is what keeps `.`, `..`
//! and `/` out of both. This module imports nothing of the crate.

use std::fmt;

/// The rule of namespace names, as messages state it (see [`is_valid_namespace`]).
pub const NAMESPACE_RULE: &str = "1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit (so never \".\" or \"..\", and no \"/\")";

/// True for a namespace name snowkeep accepts, in flags, in every store and
/// in API calls alike: 1-64 characters of `A-Z a-z 0-9 . _ -`, the first a
/// letter or a digit. The name becomes part of etcd keys and of the
/// single-instance store's file names, so `.`, `..` and `/` must never pass. Names are
/// case-sensitive: `Orders` and `orders` are two namespaces.
pub fn is_valid_namespace(namespace: &str) -> bool {
    let bytes = namespace.as_bytes();
    (1..=64).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// A namespace name that follows [`NAMESPACE_RULE`]: safe to put in an etcd
/// key or a file name. Case-sensitive, as the name itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(String);

/// A name that breaks [`NAMESPACE_RULE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid namespace {name:?}: a namespace is {NAMESPACE_RULE}")]
pub struct InvalidNamespace {
    /// The name given.
    pub name: String,
}

impl Namespace {
    /// The namespace `name`.
    ///
    /// # Errors
    /// [`InvalidNamespace`] when `name` breaks [`NAMESPACE_RULE`].
    pub fn parse(name: &str) -> Result<Self, InvalidNamespace> {
        if is_valid_namespace(name) {
            Ok(Namespace(name.to_owned()))
        } else {
            Err(InvalidNamespace {
                name: name.to_owned(),
            })
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Namespace {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parsed_namespace_is_the_name_given() {
        let ns = Namespace::parse("orders.v2").unwrap();
        assert_eq!(ns.as_str(), "orders.v2");
        assert_eq!(ns.to_string(), "orders.v2");
        assert_ne!(Namespace::parse("Orders"), Namespace::parse("orders"));
    }

    #[test]
    fn a_name_that_breaks_the_rule_is_refused_with_the_rule() {
        for bad in ["", ".", "..", "a/b", "-x"] {
            let err = Namespace::parse(bad).unwrap_err();
            assert_eq!(err.name, bad);
            assert!(!is_valid_namespace(bad));
        }
        assert_eq!(
            Namespace::parse("..").unwrap_err().to_string(),
            "invalid namespace \"..\": a namespace is 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or a digit (so never \".\" or \"..\", and no \"/\")"
        );
    }
}

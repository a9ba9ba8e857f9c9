//! Namespace names: the one rule a name must follow, in flags, in every
//! store and in API calls alike ([`NAMESPACE_RULE`], [`is_valid_namespace`],
//! whose cases `config`'s tests pin). The name becomes part of etcd keys and
//! of the single-instance store's file names, so this rule is what keeps
//! `.`, `..` and `/` out of both. This module imports nothing of the crate.

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

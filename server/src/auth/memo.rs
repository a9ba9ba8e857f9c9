//! The key a connection's calls last presented and that verified, kept on
//! the connection ([`Memo`]): a call that presents the very same
//! `authorization` bytes while no key changed since skips the parse, the
//! record lookup and the SHA-256 of the secret, and hands on the scope
//! verified then.
//!
//! What makes the shortcut as strict as the full check:
//!
//! * **Any change of any key** (a revocation, an expiry moved, a delete, a
//!   reload after a watch failure) bumps the key cache's generation, and a
//!   kept key counts only at the generation it verified at. The generation
//!   is read before the full check, so a key is never kept at a generation
//!   newer than the keys it was checked against.
//! * **Expiry** is checked at each call against the server's clock; a key
//!   past it takes the full check, which refuses it with its message.
//! * **Other bytes** (another key, a wrong secret) take the full check. The
//!   bytes are compared in constant time, so a wrong secret costs the same
//!   whatever it shares with the right one; one that verifies replaces the
//!   kept key.
//! * Permissions and namespaces are still judged per call by the layer,
//!   from the kept scope: they depend on the method called.
//!
//! A connection keeps one key, of at most [`MAX_KEPT`] bytes as presented
//! (a generated key takes 85), until another key verifies on it or it
//! closes; the secret stays in the server's memory that long.

use std::sync::{Arc, OnceLock};

use metrics::Counter;
use snowkeep_core::api_key::{KeyScope, PresentedKey};
use snowkeep_guard::conn_info::Memo;
use subtle::ConstantTimeEq;

/// A key that verified: what its calls hand on, and when it stops counting.
pub(super) struct Verified {
    /// The `authorization` value exactly as presented.
    authorization: Box<[u8]>,
    /// The key cache's generation read before it verified.
    generation: u64,
    /// When the key expires, unix ms; 0 for never.
    expires_unix_ms: u64,
    /// What the key may do.
    pub(super) scope: Arc<KeyScope>,
    /// Its id, for the call limits and the audit trail.
    pub(super) caller: Arc<str>,
    /// The key as presented, for the streams that end when it is refused.
    pub(super) presented: PresentedKey,
    /// `snowkeep_auth_requests_total{key_id, result="ok"}`, registered
    /// at the key's first accepted call (a key refused every call for its
    /// permissions gets no `ok` series).
    pub(super) accepted: OnceLock<Counter>,
}

/// The longest `authorization` value a connection keeps: `Bearer` and a key
/// with room to spare. A longer one (padding is allowed around the key) is
/// checked in full at every call, so no connection pins more than this.
pub(super) const MAX_KEPT: usize = 256;

impl std::fmt::Debug for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the presented bytes: they hold the secret.
        f.debug_struct("Verified")
            .field("key_id", &self.caller)
            .field("generation", &self.generation)
            .field("expires_unix_ms", &self.expires_unix_ms)
            .finish_non_exhaustive()
    }
}

/// What [`Verified::new`] takes: the presented bytes and key, and the
/// check's generation, scope and expiry.
pub(super) struct Checked {
    pub(super) authorization: Box<[u8]>,
    pub(super) generation: u64,
    pub(super) expires_unix_ms: u64,
    pub(super) scope: KeyScope,
    pub(super) presented: PresentedKey,
}

impl Verified {
    /// A key that passed the full check.
    pub(super) fn new(checked: Checked) -> Self {
        Self {
            caller: checked.scope.key_id.as_str().into(),
            authorization: checked.authorization,
            generation: checked.generation,
            expires_unix_ms: checked.expires_unix_ms,
            scope: Arc::new(checked.scope),
            presented: checked.presented,
            accepted: OnceLock::new(),
        }
    }

    /// Whether `authorization`, presented when the cache is at `generation`
    /// and the clock at `now_unix_ms`, is this key still.
    fn holds(&self, authorization: &[u8], generation: u64, now_unix_ms: u64) -> bool {
        self.generation == generation
            && (self.expires_unix_ms == 0 || now_unix_ms < self.expires_unix_ms)
            && same_bytes(&self.authorization, authorization)
    }
}

/// Whether `a` and `b` are the same bytes, in a time that depends on their
/// lengths only: eight bytes at a time, every word compared, no early exit
/// (`subtle`'s byte slices take a barrier per byte, ten times the cost).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or_default());
    let (words_a, words_b) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = words_a
        .remainder()
        .iter()
        .zip(words_b.remainder())
        .fold(0u64, |d, (x, y)| d | u64::from(x ^ y));
    let diff = words_a
        .zip(words_b)
        .fold(tail, |d, (x, y)| d | (word(x) ^ word(y)));
    bool::from(diff.ct_eq(&0))
}

/// The key `memo` keeps, when `authorization` is it still (see
/// [`Verified::holds`]).
pub(super) fn recall(
    memo: Option<&Memo>,
    authorization: Option<&[u8]>,
    generation: u64,
    now_unix_ms: u64,
) -> Option<Arc<Verified>> {
    let (memo, authorization) = (memo?, authorization?);
    let kept = memo.get()?.downcast::<Verified>().ok()?;
    kept.holds(authorization, generation, now_unix_ms)
        .then_some(kept)
}

/// Keeps `verified` on the connection of `memo`, if the call has one and
/// its value is at most [`MAX_KEPT`] bytes.
pub(super) fn keep(memo: Option<&Memo>, verified: &Arc<Verified>) {
    if let Some(memo) = memo.filter(|_| verified.authorization.len() <= MAX_KEPT) {
        memo.set(verified.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_compares_every_byte_of_every_length() {
        let text = b"Bearer k0123456789ab.0123456789abcdef0123456789abcdef";
        for len in 0..=text.len() {
            let a = &text[..len];
            assert!(same_bytes(a, a), "length {len}");
            for i in 0..len {
                let mut b = a.to_vec();
                b[i] ^= 0x20;
                assert!(!same_bytes(a, &b), "length {len}, byte {i}");
            }
        }
        assert!(!same_bytes(b"abc", b"abcd"));
    }

    fn verified(authorization: &str, generation: u64, expires_unix_ms: u64) -> Arc<Verified> {
        let key = PresentedKey::generate();
        Arc::new(Verified::new(Checked {
            authorization: authorization.as_bytes().into(),
            generation,
            expires_unix_ms,
            scope: KeyScope {
                key_id: key.id().to_owned(),
                namespaces: vec![],
                permissions: vec![],
                max_lease_machine_ids: 0,
            },
            presented: key,
        }))
    }

    #[test]
    fn a_kept_key_counts_only_for_the_same_bytes_generation_and_before_expiry() {
        let memo = Memo::default();
        let kept = verified("Bearer k1.s3cret", 7, 1_000);
        keep(Some(&memo), &kept);
        let same = recall(Some(&memo), Some(b"Bearer k1.s3cret"), 7, 999).unwrap();
        assert!(Arc::ptr_eq(&same, &kept));
        assert_eq!(&*same.caller, kept.scope.key_id.as_str());
        // Any change of the keys since.
        assert!(recall(Some(&memo), Some(b"Bearer k1.s3cret"), 8, 999).is_none());
        // At and past its expiry.
        assert!(recall(Some(&memo), Some(b"Bearer k1.s3cret"), 7, 1_000).is_none());
        // Other bytes: a wrong secret of the same length, a longer value, none.
        assert!(recall(Some(&memo), Some(b"Bearer k1.s3creT"), 7, 999).is_none());
        assert!(recall(Some(&memo), Some(b"Bearer k1.s3cret "), 7, 999).is_none());
        assert!(recall(Some(&memo), Some(b"bearer k1.s3cret"), 7, 999).is_none());
        assert!(recall(Some(&memo), None, 7, 999).is_none());
        // No connection, nothing kept.
        assert!(recall(None, Some(b"Bearer k1.s3cret"), 7, 999).is_none());
        assert!(recall(Some(&Memo::default()), Some(b"Bearer k1.s3cret"), 7, 999).is_none());
        // A key that never expires, and a newer key replacing the kept one.
        keep(Some(&memo), &verified("Bearer k2.other", 9, 0));
        assert!(recall(Some(&memo), Some(b"Bearer k1.s3cret"), 9, 999).is_none());
        assert!(recall(Some(&memo), Some(b"Bearer k2.other"), 9, u64::MAX).is_some());
        // A value longer than MAX_KEPT is never kept.
        let long = format!("Bearer {}k3.s", " ".repeat(MAX_KEPT));
        keep(Some(&memo), &verified(&long, 9, 0));
        assert!(recall(Some(&memo), Some(long.as_bytes()), 9, 0).is_none());
        assert!(recall(Some(&memo), Some(b"Bearer k2.other"), 9, 0).is_some());
        let longest = format!("Bearer {}k3.s", " ".repeat(MAX_KEPT - 11));
        keep(Some(&memo), &verified(&longest, 9, 0));
        assert!(recall(Some(&memo), Some(longest.as_bytes()), 9, 0).is_some());
    }
}

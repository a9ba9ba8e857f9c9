//! A receiver of the grant that remembers which grant was read last.

use tokio::sync::watch;

use super::Grant;

/// A receiver of the grant that remembers which grant it saw last, so
/// "the same grant" and "a new one" are told apart with one atomic load:
/// the generator's lock state keeps one.
#[derive(Debug)]
pub(super) struct GrantView {
    rx: watch::Receiver<Option<Grant>>,
    /// True once the grant was seen after its sender had gone: it can
    /// never change again.
    final_: bool,
}

impl GrantView {
    pub(super) fn new(rx: watch::Receiver<Option<Grant>>) -> Self {
        Self { rx, final_: false }
    }

    /// True when the grant is the one seen last: no send (not even of an
    /// equal grant) since, or none can come. One atomic load.
    #[inline]
    pub(super) fn same(&self) -> bool {
        match self.rx.has_changed() {
            Ok(changed) => !changed,
            Err(_closed) => self.final_,
        }
    }

    /// Reads the grant in force and remembers it as the one seen last.
    pub(super) fn read(&mut self) -> Option<Grant> {
        // Closed before the read: no send can come after it, so the value
        // read is the last one.
        self.final_ = self.rx.has_changed().is_err();
        *self.rx.borrow_and_update()
    }
}

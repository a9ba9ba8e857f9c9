//! An error with its sources, for logs and statuses: the same text as
//! `snowkeep_core::DisplayChain`, which this crate cannot reach (that crate
//! sits above the protos).

/// Displays an error followed by each of its sources, `: `-separated.
pub(crate) struct DisplayChain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

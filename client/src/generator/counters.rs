//! The metric handles a generator updates.

/// Metric handles the generator updates; callers choose names and labels, so the
/// server and embedded clients each keep their own metric catalog.
#[derive(Debug, Clone)]
pub struct GeneratorMetrics {
    /// Ids issued.
    pub ids_issued: metrics::Counter,
    /// Milliseconds whose whole sequence was taken (counted once per ms, when
    /// its last sequence is issued).
    pub sequence_exhausted: metrics::Counter,
    /// Backwards clock steps that were waited out.
    pub backward_waited: metrics::Counter,
    /// Backwards clock steps that halted issuance.
    pub backward_halted: metrics::Counter,
}

impl Default for GeneratorMetrics {
    /// Counters that record nothing.
    fn default() -> Self {
        Self {
            ids_issued: metrics::Counter::noop(),
            sequence_exhausted: metrics::Counter::noop(),
            backward_waited: metrics::Counter::noop(),
            backward_halted: metrics::Counter::noop(),
        }
    }
}

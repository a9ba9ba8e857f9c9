//! Bounded resources under hostile or broken clients: connection and message
//! limits, CPU fairness for the claim loop, and callers that cannot starve others.

mod fairness;
mod limits;
mod starve;

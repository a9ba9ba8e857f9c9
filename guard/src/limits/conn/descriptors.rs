//! How many file descriptors the process may open, for the connection
//! limit's check at start-up.

/// File descriptors the server needs besides client connections: etcd
/// connections, the state file, the runtime, logs; generous.
pub const OWN_DESCRIPTORS: u64 = 64;

/// The soft open-file limit (RLIMIT_NOFILE) of this process, from
/// `/proc/self/limits`; `None` when unknown or unlimited.
pub fn open_file_limit() -> Option<u64> {
    parse_open_file_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft open-file limit in the text of `/proc/self/limits`.
pub(super) fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

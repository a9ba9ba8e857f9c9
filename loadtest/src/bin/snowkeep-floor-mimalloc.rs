//! snowkeep-floor-mimalloc: the gRPC floor (`snowkeep-floor`, the same code
//! and flags) on mimalloc, the allocator `snowkeep-server` uses. Beside the
//! floor on the system allocator it tells how much of snowkeep's unary rate
//! is the allocator and how much its layers (`scripts/bench`,
//! `docs/benchmarks.md`).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "snowkeep-floor.rs"]
mod floor;

fn main() -> std::process::ExitCode {
    floor::main()
}

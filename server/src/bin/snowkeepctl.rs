//! `snowkeepctl`, the administration CLI; its code is the `snowkeep-ctl`
//! crate (`ctl/`).

fn main() -> std::process::ExitCode {
    snowkeep_ctl::main()
}

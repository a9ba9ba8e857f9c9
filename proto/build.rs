//! Generates the snowkeep.v1 messages, clients and servers with tonic-prost-build,
//! plus the encoded file descriptor set that server reflection serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("snowkeep_v1_descriptor.bin"))
        .compile_protos(
            &[
                "snowkeep/v1/id.proto",
                "snowkeep/v1/info.proto",
                "snowkeep/v1/lease.proto",
                "snowkeep/v1/admin.proto",
            ],
            &["."],
        )?;
    Ok(())
}

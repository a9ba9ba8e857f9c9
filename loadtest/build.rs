//! Generates the floor server's test service (client-streaming and bidi
//! methods) with tonic-prost-build; its messages are snowkeep.v1's.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_client(false)
        .extern_path(".snowkeep.v1", "::snowkeep_proto::v1")
        .file_descriptor_set_path(out.join("floor_descriptor.bin"))
        .compile_protos(&["snowkeep/floor/v1/floor.proto"], &["proto", "../proto"])?;
    println!("cargo:rerun-if-changed=proto/snowkeep/floor/v1/floor.proto");
    Ok(())
}

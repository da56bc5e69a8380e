//! Compiles `proto/bcd/v1/*.proto` with protox (pure Rust), so no system `protoc` is needed.
//!
//! The gRPC services (clients and servers) are generated only with the `grpc` feature (on by
//! default): without it the crate is messages and domain types alone, with no tonic underneath,
//! which is what the control plane's core crate builds against.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/bcd/v1/common.proto",
        "proto/bcd/v1/join.proto",
        "proto/bcd/v1/gateway.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_fds(fds)?;
    Ok(())
}

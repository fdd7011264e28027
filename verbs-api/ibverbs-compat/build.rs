//! Generates the C struct layouts from the installed rdma-core headers
//! (Debian's libibverbs-dev), so the ABI is never copied by hand.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*|verbs_.*|_compat_ibv_port_attr|_ibv_device_ops|rdma_.*")
        .allowlist_var("IBV_.*|IB_.*|RDMA_.*|RAI_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen on <infiniband/verbs.h> failed (install libibverbs-dev, librdmacm-dev and libclang-dev): {e}")
        });
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    bindings
        .write_to_file(out.join("verbs.rs"))
        .unwrap_or_else(|e| panic!("writing the bindings: {e}"));
}

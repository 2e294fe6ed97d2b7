//! Link flags for the `weir` binary that keep its resident code small (issue 12, RSS).
//!
//! - `-z pack-relative-relocs` (DT_RELR: binutils 2.38+ or lld, glibc 2.36+, as Debian 12):
//!   a position-independent executable carries one 24-byte `R_X86_64_RELATIVE` entry per
//!   pointer in its read-only data (every vtable of tokio, openraft, rustls, ...), ~20,000
//!   entries, ~470 KB of `.rela.dyn` that the dynamic loader reads at every start and that
//!   stay resident. Packed, they are a bitmap of a few KB; the loader applies the same
//!   relocations.
//! - `-z keep-text-section-prefix`: functions LLVM marks cold (`#[cold]`, panic paths) stay
//!   in their own `.text.unlikely` output section instead of between the hot ones.
//! - `cold-text.ld`: the code a single node never runs (the Raft controller, TLS, backtrace
//!   printing) in one output section after `.text` (see the script).
//!
//! None of them changes what the code does, only where it lies in the file.
//! `WEIR_PLAIN_LINK=1` leaves them all out (a toolchain without them).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cold-text.ld");
    println!("cargo:rerun-if-env-changed=WEIR_PLAIN_LINK");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let plain = std::env::var_os("WEIR_PLAIN_LINK").is_some_and(|v| v == "1");
    if os != "linux" || env != "gnu" || plain {
        return;
    }
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    println!("cargo:rustc-link-arg-bins=-Wl,-z,keep-text-section-prefix");
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/cold-text.ld");
}

//! Link step of release builds of `drover-executor` (docs/executor.md, "Memory").
//!
//! Every host runs one executor per task, and the kernel maps a program's code 64 KiB
//! around each page it faults, so the code an executor never runs still costs memory
//! when it sits next to code it does run. `layout/hot.ld` (made by
//! `layout/profile.py`) places the functions a typical executor runs together at
//! the start of `.text`; `-z pack-relative-relocs` shrinks the 42 KiB of relocations
//! that the dynamic loader reads at every start to 4 KiB (glibc 2.36 or later).
//! Debug builds (the tests) link as usual; `DROVER_EXECUTOR_LAYOUT=0` turns it off.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=layout/hot.ld");
    println!("cargo:rerun-if-env-changed=DROVER_EXECUTOR_LAYOUT");
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let linux_gnu = env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux")
        && env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|e| e == "gnu");
    let wanted = env::var("DROVER_EXECUTOR_LAYOUT").map_or(true, |v| v != "0");
    if !(release && linux_gnu && wanted) {
        return;
    }
    let Ok(dir) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let script = PathBuf::from(dir).join("layout").join("hot.ld");
    println!(
        "cargo:rustc-link-arg-bin=drover-executor=-Wl,-T,{}",
        script.display()
    );
    println!("cargo:rustc-link-arg-bin=drover-executor=-Wl,-z,pack-relative-relocs");
}

//! Links the C math library into `ward-domain` although nothing in it calls the library: loaded with the program,
//! it is there before the first extension that needs it (most native plugins do, C++ ones through their runtime).
//! An exec'd domain and one forked from the template (which has it already) then end with the same libraries
//! mapped, and a forked one does not pay for finding and relocating it at every start. Without `--no-as-needed` the
//! linker would drop a library nothing calls.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--push-state,--no-as-needed,-lm,--pop-state");
}

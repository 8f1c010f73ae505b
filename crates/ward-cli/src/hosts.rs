//! The hosts ward itself runs, as opposed to the subcommands a user types: the hidden subcommands ward starts as
//! throwaway child processes for the demo and the campaign (`__native-host`, `__campaign-host`) and what starting,
//! bounding and limiting them takes (`child`, `ordinary`), and the in-process hosts of `demo` and `bench` (the
//! built-in plugins through their class wrappers, the machine's bare round-trip floor). The hidden subcommands that
//! belong to one command stay with it (`__ward-host` in `demo`, `__corpus-run` in `corpus`, `__busy` in `load`).

pub mod campaign_host;
pub mod child;
pub mod demo_plugins;
pub mod demo_runtime;
#[allow(unsafe_code)]
pub mod floor;
#[allow(unsafe_code)]
pub mod native_host;
#[allow(unsafe_code)]
pub mod ordinary;

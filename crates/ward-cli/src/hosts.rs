//! The hosts ward itself runs, as opposed to the subcommands a user types: the hidden subcommands ward starts as
//! throwaway child processes (`__native-host`, `__campaign-host`) and what starting and bounding them takes
//! (`child`, `host`), and the in-process hosts of `demo` and `bench` (the built-in plugins through their class
//! wrappers, the machine's bare round-trip floor).

pub mod campaign_host;
pub mod child;
pub mod demo_plugins;
pub mod floor;
pub mod native_host;
pub mod ordinary;

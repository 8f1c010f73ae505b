//! How one list of keys becomes the three forms of a policy section: the effective policy the core reads (every key
//! with its value, its default, its documentation), the override one section of a file sets (every key optional)
//! with the overlay that applies it, and the file form that reads and checks it ([`FileSection`]).
//!
//! Each key of the list is written once, as
//!
//! ```text
//! /// What it is (the effective field's documentation).
//! field: Type = default;
//!     "file_key", Scope, mode OverrideType => how its value is read;
//! ```
//!
//! where `Scope` says which sections may set it ([`Scope`]), the value is read by a [`ValueSeed`] that checks it,
//! and `mode` says how an override reaches the effective field:
//!
//! - `set`: the override is `Option<Type>`, and replaces the field when set;
//! - `some`: the field is an `Option` the override (of the same type) sets to `Some` (a section cannot unset it);
//! - `nested`: the field is a table of its own (or a map of them) whose override applies key by key.
//!
//! Fields that no file sets (class wrappers set them, or they follow from a key) are listed apart, with their
//! defaults.
//!
//! [`FileSection`]: super::file::FileSection
//! [`Scope`]: super::file::Scope
//! [`ValueSeed`]: super::values::ValueSeed

use std::collections::BTreeMap;

/// An override that sets what it holds in an effective policy of type `T`.
pub(crate) trait Overlay<T> {
    fn overlay(&self, target: &mut T);
}

/// Sections by name (functions): each applies to its own entry, created with its defaults.
impl<T: Default, O: Overlay<T>> Overlay<BTreeMap<String, T>> for BTreeMap<String, O> {
    fn overlay(&self, target: &mut BTreeMap<String, T>) {
        for (name, section) in self {
            section.overlay(target.entry(name.clone()).or_default());
        }
    }
}

/// Generates a section's effective struct and its `Default`, its override struct and `apply`, and its file form,
/// from one list of keys (see the module documentation).
macro_rules! policy_section {
    (@apply set, $src:expr, $dst:expr) => {
        if let Some(value) = &$src {
            $dst = value.clone();
        }
    };
    (@apply some, $src:expr, $dst:expr) => {
        if let Some(value) = &$src {
            $dst = Some(value.clone());
        }
    };
    (@apply nested, $src:expr, $dst:expr) => {
        $crate::policy::section::Overlay::overlay(&$src, &mut $dst)
    };
    (@store nested, $dst:expr, $value:expr) => {
        $dst = $value
    };
    (@store $mode:ident, $dst:expr, $value:expr) => {
        $dst = Some($value)
    };
    (
        $(#[$effective_meta:meta])*
        pub struct $Effective:ident;
        $(#[$override_meta:meta])*
        pub struct $Override:ident, read as $expecting:literal $(, then $finish:path)?;
        keys {
            $(
                $(#[doc = $doc:literal])*
                $field:ident: $Type:ty = $default:expr;
                    $key:literal, $scope:ident, $mode:ident $Over:ty => $value:expr;
            )*
        }
        set_by_code {
            $(
                $(#[doc = $code_doc:literal])*
                $code_field:ident: $CodeType:ty = $code_default:expr;
            )*
        }
    ) => {
        $(#[$effective_meta])*
        pub struct $Effective {
            $( $(#[doc = $doc])* pub $field: $Type, )*
            $( $(#[doc = $code_doc])* pub $code_field: $CodeType, )*
        }

        impl Default for $Effective {
            fn default() -> Self {
                $Effective { $( $field: $default, )* $( $code_field: $code_default, )* }
            }
        }

        $(#[$override_meta])*
        pub struct $Override {
            $(
                #[doc = concat!("`", $key, "`: see [`", stringify!($Effective), "::", stringify!($field), "`].")]
                pub $field: $Over,
            )*
        }

        impl $Override {
            /// Sets in `policy` what this section sets.
            pub(crate) fn apply(&self, policy: &mut $Effective) {
                $( policy_section!(@apply $mode, self.$field, policy.$field); )*
            }
        }

        impl $crate::policy::section::Overlay<$Effective> for $Override {
            fn overlay(&self, target: &mut $Effective) {
                self.apply(target)
            }
        }

        impl $crate::policy::file::FileSection for $Override {
            const KEYS: &'static [$crate::policy::file::Key] =
                &[ $( $crate::policy::file::Key { name: $key, scope: $crate::policy::file::Scope::$scope }, )* ];
            const EXPECTING: &'static str = $expecting;

            fn read_value<'de, A: serde::de::MapAccess<'de>>(
                &mut self,
                key: &'static str,
                map: &mut A,
            ) -> Result<(), A::Error> {
                match key {
                    $(
                        $key => policy_section!(
                            @store $mode,
                            self.$field,
                            map.next_value_seed($crate::policy::values::Keyed { key: $key, seed: $value })?
                        ),
                    )*
                    // The key seed yields only names of KEYS.
                    _ => {}
                }
                Ok(())
            }

            $(
                fn finish(self) -> Result<Self, $crate::policy::file::KeyError> {
                    $finish(self)
                }
            )?
        }
    };
}

pub(crate) use policy_section;

//! The object tracker (Nooks §3.4): per domain, typed records of what the extension holds, each with the action
//! that releases it when the domain fails.
//!
//! Records are added as resources are lent (a pool buffer for a call, a callback passed as an argument, an instance
//! the extension created, the descriptors of an incarnation) and removed when their normal life ends. After a fault
//! [`Tracker::release_all`] runs every remaining release action, so nothing a dead incarnation held leaks.

use std::collections::BTreeMap;
use std::sync::Arc;

/// The kinds of resource a domain can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResourceKind {
    /// An object the extension created and the host refers to by handle.
    Instance,
    /// A buffer lent to the domain in one of its pools.
    PoolBuffer,
    /// A host callback the extension was given.
    Callback,
    /// A host descriptor that belongs to the domain (its pidfd, its control socket).
    Descriptor,
}

/// How many records of each kind a release freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    pub instances: usize,
    pub pool_buffers: usize,
    pub callbacks: usize,
    pub descriptors: usize,
}

impl Released {
    pub fn total(&self) -> usize {
        self.instances + self.pool_buffers + self.callbacks + self.descriptors
    }
}

/// Identifies one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId(u64);

/// Releases the resources of one owner, each named by a token: records of resources lent on every call (a pool
/// buffer) name their owner and a token instead of carrying a closure of their own, so lending allocates nothing.
pub(crate) trait Releaser: Send + Sync {
    fn release(&self, token: [u64; 2]);
}

enum Release {
    Once(Box<dyn FnOnce() + Send>),
    By(Arc<dyn Releaser>, [u64; 2]),
}

impl Release {
    fn run(self) {
        match self {
            Release::Once(f) => f(),
            Release::By(owner, token) => owner.release(token),
        }
    }
}

struct Record {
    kind: ResourceKind,
    release: Release,
}

#[derive(Default)]
pub struct Tracker {
    next: u64,
    records: BTreeMap<RecordId, Record>,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Record a resource with the action that releases it.
    pub fn track(&mut self, kind: ResourceKind, release: impl FnOnce() + Send + 'static) -> RecordId {
        self.next += 1;
        let id = RecordId(self.next);
        self.records.insert(id, Record { kind, release: Release::Once(Box::new(release)) });
        id
    }

    /// Record a resource that `owner` releases, named to it by `token`.
    pub(crate) fn track_by(&mut self, kind: ResourceKind, owner: &Arc<dyn Releaser>, token: [u64; 2]) -> RecordId {
        self.next += 1;
        let id = RecordId(self.next);
        self.records.insert(id, Record { kind, release: Release::By(owner.clone(), token) });
        id
    }

    /// The resource's life ended normally: release it now. False if it was already released (by a recovery that
    /// happened while its owner was suspended in a nested call).
    pub fn release(&mut self, id: RecordId) -> bool {
        match self.records.remove(&id) {
            Some(r) => {
                r.release.run();
                true
            }
            None => false,
        }
    }

    /// Forget a record without running its action (ownership moved elsewhere).
    pub fn forget(&mut self, id: RecordId) -> bool {
        self.records.remove(&id).is_some()
    }

    /// Release everything (the domain failed), in record order.
    pub fn release_all(&mut self) -> Released {
        let mut released = Released::default();
        for (_, r) in std::mem::take(&mut self.records) {
            match r.kind {
                ResourceKind::Instance => released.instances += 1,
                ResourceKind::PoolBuffer => released.pool_buffers += 1,
                ResourceKind::Callback => released.callbacks += 1,
                ResourceKind::Descriptor => released.descriptors += 1,
            }
            r.release.run();
        }
        released
    }

    pub fn count(&self, kind: ResourceKind) -> usize {
        self.records.values().filter(|r| r.kind == kind).count()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn release_all_runs_every_action_once_and_counts_by_kind() {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut t = Tracker::new();
        for kind in [ResourceKind::Instance, ResourceKind::PoolBuffer, ResourceKind::PoolBuffer, ResourceKind::Callback]
        {
            let ran = ran.clone();
            t.track(kind, move || {
                ran.fetch_add(1, Ordering::SeqCst);
            });
        }
        let r = t.release_all();
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        assert_eq!(r, Released { instances: 1, pool_buffers: 2, callbacks: 1, descriptors: 0 });
        assert!(t.is_empty());
        assert_eq!(t.release_all().total(), 0);
    }

    #[test]
    fn a_record_released_by_recovery_is_not_released_again() {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut t = Tracker::new();
        let r2 = ran.clone();
        let id = t.track(ResourceKind::PoolBuffer, move || {
            r2.fetch_add(1, Ordering::SeqCst);
        });
        t.release_all();
        assert!(!t.release(id));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn forget_skips_the_action() {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut t = Tracker::new();
        let r2 = ran.clone();
        let id = t.track(ResourceKind::Descriptor, move || {
            r2.fetch_add(1, Ordering::SeqCst);
        });
        assert!(t.forget(id));
        t.release_all();
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}

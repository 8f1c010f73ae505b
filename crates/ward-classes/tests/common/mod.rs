//! Helpers shared by the class tests.

use std::path::PathBuf;
use std::sync::mpsc::Receiver;

use ward::Event;

/// The files the extension's image was switched to (`restart_from`), in order.
pub fn switched_to(events: &Receiver<Event>) -> Vec<PathBuf> {
    events
        .try_iter()
        .filter_map(|e| match e {
            Event::ImageSwitched { path, .. } => Some(path),
            _ => None,
        })
        .collect()
}

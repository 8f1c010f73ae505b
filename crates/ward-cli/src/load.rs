//! `--load N` of the benchmarks: N processes of busy work, started and stopped by the benchmark itself, so that a
//! run measures ward (and the native baseline beside it) on a machine that is not idle.

use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

/// The busy processes of one benchmark run; they are killed and reaped when this is dropped.
pub struct Load {
    children: Vec<Child>,
}

impl Load {
    /// Start `n` busy processes (none for 0): this program again, as `ward __busy`.
    pub fn start(n: u32) -> Result<Load> {
        let exe = std::env::current_exe().context("cannot find the running ward program for --load")?;
        let mut load = Load { children: Vec::with_capacity(n as usize) };
        for _ in 0..n {
            let child = Command::new(&exe)
                .args(["__busy", "--parent", &std::process::id().to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("cannot start a busy process ({})", exe.display()))?;
            load.children.push(child);
        }
        Ok(load)
    }

    /// How many busy processes run.
    pub fn processes(&self) -> usize {
        self.children.len()
    }

    /// The header line that says so, if any run.
    pub fn describe(&self) -> Option<String> {
        match self.children.len() {
            0 => None,
            n => Some(format!("load: {n} busy process{} started by the benchmark, for every variant", plural(n))),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "es"
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.children {
            // Our own children: killed by their handle, never by name.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `ward __busy --parent PID`: spin on arithmetic until killed, or until the benchmark that started it is gone.
pub fn busy_main(parent: u32) -> ! {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and changes nothing else of this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // The parent may have exited before the line above; then this process was reparented and must not spin on.
    if std::os::unix::process::parent_id() != parent {
        std::process::exit(0);
    }
    let mut x: u64 = 1;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
    }
}

#[cfg(test)]
mod tests {
    use super::Load;

    #[test]
    fn no_load_starts_nothing_and_says_nothing() {
        let load = Load::start(0).expect("nothing to start");
        assert_eq!(load.processes(), 0);
        assert!(load.describe().is_none());
    }
}

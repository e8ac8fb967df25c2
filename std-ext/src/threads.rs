//! Intra-op threads: mote-core's parallel-for hook ([`mote_core::par`]) on
//! rayon (feature `rayon`, on by default).
//!
//! The hook is installed once per process, but it only hands tasks to rayon
//! when it is called from inside a pool that a [`Session`](crate::Session)
//! with more than one thread installed ([`Pool::install`]); everywhere else
//! (a 1-thread session, a caller's own rayon pool, a plain thread) the
//! kernels run in a plain loop. So a 1-thread session never touches rayon,
//! and sessions with different thread counts each use their own pool.
//! Results do not depend on the thread count: core's kernels split their
//! output so that every element is computed as in the single-thread run.

use crate::error::{Error, Result};

/// Checks a thread count: at least 1, and more than 1 only with the
/// `rayon` feature.
pub fn check(n: usize) -> Result<()> {
    match n {
        0 => Err(Error::Config(
            "the number of threads must be at least 1".into(),
        )),
        1 => Ok(()),
        n if cfg!(feature = "rayon") => {
            let _ = n;
            Ok(())
        }
        n => Err(Error::Config(format!(
            "{n} threads: this build of mote-std has no multithreaded provider (feature `rayon`)"
        ))),
    }
}

/// A session's threads: none of its own for 1, else a rayon pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pool {
    #[cfg(feature = "rayon")]
    pool: Option<std::sync::Arc<rayon::ThreadPool>>,
}

impl Pool {
    /// A pool of `n` threads (none for 1), after [`check`].
    pub(crate) fn new(n: usize) -> Result<Self> {
        check(n)?;
        #[cfg(feature = "rayon")]
        {
            if n == 1 {
                return Ok(Pool { pool: None });
            }
            imp::init();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("mote-{i}"))
                .build()
                .map_err(|e| Error::Config(format!("cannot start {n} threads: {e}")))?;
            Ok(Pool {
                pool: Some(std::sync::Arc::new(pool)),
            })
        }
        #[cfg(not(feature = "rayon"))]
        Ok(Pool {})
    }

    /// Runs `f` on the pool (the kernels it calls split their work among
    /// the pool's threads), or here for a 1-thread pool.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        #[cfg(feature = "rayon")]
        if let Some(pool) = &self.pool {
            return pool.install(|| imp::inside(f));
        }
        f()
    }
}

#[cfg(feature = "rayon")]
mod imp {
    use std::cell::Cell;
    use std::sync::Once;

    use mote_core::par::{self, Provider};
    use rayon::prelude::*;

    thread_local! {
        /// Set while this thread runs a session inside its pool.
        static IN_SESSION: Cell<bool> = const { Cell::new(false) };
    }

    static PROVIDER: Provider = Provider { for_each, workers };

    static INIT: Once = Once::new();

    /// Installs the rayon hook in mote-core, once per process.
    pub(super) fn init() {
        // SAFETY: `for_each` calls `f(i)` once for each i in 0..n (rayon's
        // `for_each` over a range, or a plain loop) and returns only after
        // every call returned.
        INIT.call_once(|| unsafe { par::set_provider(Some(&PROVIDER)) });
    }

    /// Runs `f` with the hook enabled on this (pool) thread.
    pub(super) fn inside<R>(f: impl FnOnce() -> R) -> R {
        struct Reset(bool);
        impl Drop for Reset {
            fn drop(&mut self) {
                IN_SESSION.with(|c| c.set(self.0));
            }
        }
        let _reset = Reset(IN_SESSION.with(|c| c.replace(true)));
        f()
    }

    fn active() -> bool {
        IN_SESSION.with(Cell::get) && rayon::current_thread_index().is_some()
    }

    fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
        if active() {
            (0..n).into_par_iter().for_each(f);
        } else {
            (0..n).for_each(f);
        }
    }

    fn workers() -> usize {
        if active() {
            rayon::current_num_threads()
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts() {
        assert!(check(0).is_err());
        assert!(check(1).is_ok());
        assert_eq!(check(2).is_ok(), cfg!(feature = "rayon"));
        assert!(Pool::new(0).is_err());
        assert_eq!(Pool::new(1).map(|p| p.install(|| 7)).ok(), Some(7));
    }

    #[cfg(feature = "rayon")]
    #[test]
    fn workers_only_inside_a_session_pool() {
        let pool = Pool::new(3).unwrap();
        assert_eq!(mote_core::par::workers(), 1);
        assert_eq!(pool.install(mote_core::par::workers), 3);
        // A rayon pool the session did not install: no splitting.
        let other = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        assert_eq!(other.install(mote_core::par::workers), 1);
        assert_eq!(Pool::new(1).unwrap().install(mote_core::par::workers), 1);
    }
}

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

/// A session's threads: none for 1; else the calling thread plus `n - 1`
/// rayon workers.
///
/// The thread that runs a multi-thread session takes part in the work, as
/// in onnxruntime's pool: each thread keeps one rayon pool of `n` threads
/// whose thread 0 is itself (`use_current_thread`), made on its first
/// multi-thread session and shared by all its sessions with that `n`, for
/// the life of the thread. A run then starts on the caller with no hand-off
/// to a pool thread, which cost two thread wake-ups per run (about 20 µs on
/// the 2-core machine of the README's benchmark; the MLP ran 0.046 ms with
/// 2 threads against 0.020 ms with 1 when no step split). A thread that
/// cannot have such a pool (it is already a worker of another rayon pool,
/// or has one with another `n`) runs the session on a pool of `n` workers
/// the session owns, handing each run to it.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    threads: usize,
    #[cfg(feature = "rayon")]
    own: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<rayon::ThreadPool>>>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            threads: 1,
            #[cfg(feature = "rayon")]
            own: std::sync::Arc::default(),
        }
    }
}

impl Pool {
    /// A pool of `n` threads (none for 1), after [`check`]; for `n > 1`
    /// the calling thread's pool is made now, so that a failure to start
    /// threads shows here.
    pub(crate) fn new(n: usize) -> Result<Self> {
        check(n)?;
        let pool = Pool {
            threads: n,
            ..Pool::default()
        };
        #[cfg(feature = "rayon")]
        if n > 1 {
            imp::init();
            if imp::caller_pool(n)?.is_none() {
                pool.owned()?;
            }
        }
        Ok(pool)
    }

    /// The session's own pool of `n` workers, started on first use.
    #[cfg(feature = "rayon")]
    fn owned(&self) -> Result<&rayon::ThreadPool> {
        if let Some(p) = self.own.get() {
            return Ok(p);
        }
        let p = imp::build(self.threads, false)?;
        Ok(self.own.get_or_init(|| std::sync::Arc::new(p)))
    }

    /// Runs `f` with the pool's threads (the kernels it calls split their
    /// work among them), or plainly for a 1-thread pool.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        #[cfg(feature = "rayon")]
        if self.threads > 1 {
            let run = || imp::inside(f);
            return match imp::caller_pool(self.threads)? {
                // Runs here: this thread is the pool's thread 0.
                Some(p) => Ok(p.install(run)),
                None => Ok(self.owned()?.install(run)),
            };
        }
        Ok(f())
    }
}

#[cfg(feature = "rayon")]
mod imp {
    use std::cell::{Cell, RefCell};
    use std::sync::{Arc, Once};

    use mote_core::par::{self, Provider};
    use rayon::prelude::*;

    use crate::error::{Error, Result};

    thread_local! {
        /// Set while this thread runs a session inside its pool.
        static IN_SESSION: Cell<bool> = const { Cell::new(false) };
        /// This thread's pool (its thread count, and the pool whose
        /// thread 0 this thread is), made by its first multi-thread
        /// session.
        static CALLER: RefCell<Option<(usize, Arc<rayon::ThreadPool>)>> =
            const { RefCell::new(None) };
    }

    /// A pool of `n` threads: the calling thread and `n - 1` workers when
    /// `with_caller`, else `n` workers.
    pub(super) fn build(n: usize, with_caller: bool) -> Result<rayon::ThreadPool> {
        let b = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("mote-{i}"));
        let b = if with_caller {
            b.use_current_thread()
        } else {
            b
        };
        b.build()
            .map_err(|e| Error::Config(format!("cannot start {n} threads: {e}")))
    }

    /// The calling thread's pool of `n` threads, made on first use; `None`
    /// when this thread cannot have one (it has one with another thread
    /// count, or is a worker of a rayon pool it did not make).
    pub(super) fn caller_pool(n: usize) -> Result<Option<Arc<rayon::ThreadPool>>> {
        CALLER.with(|c| {
            let mut c = c.borrow_mut();
            if let Some((m, p)) = c.as_ref() {
                return Ok((*m == n).then(|| Arc::clone(p)));
            }
            if rayon::current_thread_index().is_some() {
                return Ok(None);
            }
            let p = Arc::new(build(n, true)?);
            *c = Some((n, Arc::clone(&p)));
            Ok(Some(p))
        })
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
        assert_eq!(Pool::new(1).and_then(|p| p.install(|| 7)).ok(), Some(7));
    }

    #[cfg(feature = "rayon")]
    #[test]
    fn workers_only_inside_a_session_pool() {
        let pool = Pool::new(3).unwrap();
        assert_eq!(mote_core::par::workers(), 1);
        assert_eq!(pool.install(mote_core::par::workers).unwrap(), 3);
        assert_eq!(mote_core::par::workers(), 1);
        // A rayon pool the session did not install: no splitting.
        let other = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        assert_eq!(other.install(mote_core::par::workers), 1);
        assert_eq!(
            Pool::new(1)
                .unwrap()
                .install(mote_core::par::workers)
                .unwrap(),
            1
        );
    }

    /// The thread id a pool's run starts on, for the calling thread.
    #[cfg(feature = "rayon")]
    fn runs_on(p: &Pool) -> std::thread::ThreadId {
        p.install(|| std::thread::current().id()).unwrap()
    }

    #[cfg(feature = "rayon")]
    #[test]
    fn the_caller_takes_part_once_per_thread_count() {
        // A fresh thread: the test harness may run tests on one thread.
        std::thread::spawn(|| {
            let here = std::thread::current().id();
            let three = Pool::new(3).unwrap();
            assert_eq!(runs_on(&three), here);
            assert_eq!(runs_on(&Pool::new(3).unwrap()), here);
            // This thread has a 3-thread pool already: a 2-thread session
            // hands its runs to a pool of its own.
            let two = Pool::new(2).unwrap();
            assert_ne!(runs_on(&two), here);
            assert_eq!(two.install(mote_core::par::workers).unwrap(), 2);
            assert_eq!(runs_on(&three), here);
            // Inside a worker of a rayon pool the session did not make.
            let other = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let n = other.install(|| {
                let p = Pool::new(2).unwrap();
                assert_ne!(runs_on(&p), std::thread::current().id());
                p.install(mote_core::par::workers).unwrap()
            });
            assert_eq!(n, 2);
        })
        .join()
        .unwrap();
    }
}

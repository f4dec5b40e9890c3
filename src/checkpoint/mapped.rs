//! Checkpoint files mapped into memory, with the two ways a map can hand back bytes that
//! were never the checkpoint's made visible:
//! - a file cut short or replaced while mapped makes reads of its lost pages raise SIGBUS,
//!   which kills the process without a word: a handler turns it into one line naming the
//!   file and the byte;
//! - a sparse file's holes (regions never written: an interrupted download or copy that had
//!   sized the file first) read as zeros: `holes` finds them, so a run can say so.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::{Error, Result};

/// A read-only map of a whole file, its range known to the SIGBUS handler while it lives.
pub struct MappedFile {
    map: Mmap,
    guard: Option<guard::Registration>,
}

impl MappedFile {
    /// Maps the file at `path` (which `file` has open).
    pub fn new(path: &Path, file: &File) -> Result<Self> {
        // SAFETY: the map is read-only; a file changed while mapped is caught below (SIGBUS
        // for lost pages) or is the user's to avoid, as with every mmap-based loader.
        let map = unsafe { Mmap::map(file) }.map_err(|e| Error::io(path, e))?;
        let guard = guard::Registration::new(path, &map);
        Ok(Self { map, guard })
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Forget the range before it is unmapped (the field order would do it after).
        self.guard.take();
    }
}

/// The bytes of `file` in `from..len` that were never written (holes of a sparse file,
/// which read as zeros), and where the first begins. None on filesystems and systems that
/// report no holes.
pub fn holes(file: &File, from: u64, len: u64) -> (u64, Option<u64>) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        let (mut total, mut first, mut at) = (0u64, None, from);
        while at < len {
            // SAFETY: lseek on a descriptor `file` keeps open; it moves only the file offset,
            // which nothing here reads through.
            let hole = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_HOLE) };
            if hole < 0 || hole as u64 >= len {
                break;
            }
            let data = unsafe { libc::lseek(fd, hole, libc::SEEK_DATA) };
            let end = if data < 0 {
                len
            } else {
                (data as u64).min(len)
            };
            total += end - hole as u64;
            first.get_or_insert(hole as u64);
            at = end;
        }
        (total, first)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, from, len);
        (0, None)
    }
}

#[cfg(target_os = "linux")]
mod guard {
    //! The SIGBUS handler and the maps it knows: a fixed table of slots, so that the handler
    //! only reads atomics and calls `write` and `_exit` (async-signal-safe).
    use std::path::Path;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

    const SLOTS: usize = 1024;

    struct Slot {
        start: AtomicUsize,
        /// 0 while the slot is free or being filled.
        len: AtomicUsize,
        /// The line's beginning (`error: FILE: ... byte `), null while free.
        message: AtomicPtr<u8>,
        message_len: AtomicUsize,
    }

    impl Slot {
        const fn free() -> Self {
            Slot {
                start: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                message: AtomicPtr::new(std::ptr::null_mut()),
                message_len: AtomicUsize::new(0),
            }
        }
    }

    static MAPS: [Slot; SLOTS] = [const { Slot::free() }; SLOTS];
    /// What SIGBUS did before: restored for faults outside the maps (Rust's own handler).
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

    const ENDING: &[u8] = b" is gone): was it cut short or replaced while quantppl ran? \
        Run again once the file is whole\n";

    pub struct Registration {
        slot: usize,
        /// The slot's message points into it.
        _message: Box<[u8]>,
    }

    impl Registration {
        /// Makes `map`'s range known to the handler (installed on first use); None when
        /// every slot is taken (a fault there then ends as it would without the handler).
        pub fn new(path: &Path, map: &[u8]) -> Option<Self> {
            install();
            let mut message = format!(
                "error: {}: the file's bytes are no longer there while it is mapped (byte ",
                path.display()
            )
            .into_bytes()
            .into_boxed_slice();
            let ptr = message.as_mut_ptr();
            let slot = MAPS.iter().position(|s| {
                s.message
                    .compare_exchange(
                        std::ptr::null_mut(),
                        ptr,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            })?;
            let s = &MAPS[slot];
            s.message_len.store(message.len(), Ordering::Relaxed);
            s.start.store(map.as_ptr() as usize, Ordering::Relaxed);
            s.len.store(map.len(), Ordering::Release);
            Some(Self {
                slot,
                _message: message,
            })
        }
    }

    impl Drop for Registration {
        fn drop(&mut self) {
            let s = &MAPS[self.slot];
            s.len.store(0, Ordering::Release);
            s.message.store(std::ptr::null_mut(), Ordering::Release);
        }
    }

    fn install() {
        PREVIOUS.get_or_init(|| {
            // SAFETY: a zeroed sigaction is valid input; the handler only reads atomics,
            // writes to stderr and exits, or restores the previous action.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigbus as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let mut previous: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGBUS, &action, &mut previous);
                previous
            }
        });
    }

    extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: the kernel hands a valid siginfo_t for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        for s in &MAPS {
            let len = s.len.load(Ordering::Acquire);
            let start = s.start.load(Ordering::Relaxed);
            if len == 0 || addr < start || addr - start >= len {
                continue;
            }
            let message = s.message.load(Ordering::Acquire);
            let message_len = s.message_len.load(Ordering::Relaxed);
            let mut digits = [0u8; 20];
            let offset = decimal(addr - start, &mut digits);
            // SAFETY: the message lives as long as the registration, which lives while the
            // map it describes can be read; write and _exit are async-signal-safe.
            unsafe {
                libc::write(2, message.cast(), message_len);
                libc::write(2, offset.as_ptr().cast(), offset.len());
                libc::write(2, ENDING.as_ptr().cast(), ENDING.len());
                libc::_exit(1);
            }
        }
        // Not a map of ours: the previous action takes the fault when it recurs on return.
        if let Some(previous) = PREVIOUS.get() {
            // SAFETY: restoring the action sigaction handed back at installation.
            unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
        }
    }

    /// `n` in decimal, written into the end of `buf` without allocating.
    fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return &buf[i..];
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod guard {
    pub struct Registration;
    impl Registration {
        pub fn new(_: &std::path::Path, _: &[u8]) -> Option<Self> {
            None
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn holes_are_the_bytes_never_written() {
        let dir = std::env::temp_dir().join(format!("quantppl-holes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sparse");
        let mut file = File::create(&path).unwrap();
        file.write_all(&[1u8; 8192]).unwrap();
        file.set_len(1 << 20).unwrap();
        // A filesystem that allocates every block (some network and overlay ones) keeps no
        // holes: nothing to find there.
        use std::os::unix::fs::MetadataExt;
        if path.metadata().unwrap().blocks() * 512 >= 1 << 20 {
            eprintln!("skipped: {} keeps no holes", dir.display());
            return;
        }
        let file = File::open(&path).unwrap();
        assert_eq!(holes(&file, 0, 1 << 20), ((1 << 20) - 8192, Some(8192)));
        let whole = dir.join("whole");
        std::fs::write(&whole, vec![1u8; 1 << 16]).unwrap();
        assert_eq!(holes(&File::open(&whole).unwrap(), 0, 1 << 16), (0, None));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

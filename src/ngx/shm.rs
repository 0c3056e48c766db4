//! A shared memory zone the module owns: one block, zeroed for each new
//! configuration (a reload starts it afresh; old workers keep the old one
//! mapped until they exit, so they never write into the new one), or kept
//! across reloads while its name and size stay the same (`Keep::Yes`).

use super::sys;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A zone added to the configuration being parsed; its block exists once
/// nginx has created the cycle's shared memory.
#[derive(Clone, Copy)]
pub struct Zone(NonNull<sys::ngx_shm_zone_t>);

// SAFETY: the zone struct lives in the cycle's pool and is only read after
// configuration; the memory it points to is shared and accessed with atomics.
unsafe impl Send for Zone {}
// SAFETY: &Zone reads the zone struct, written only during configuration, and
// the shared block, accessed only through atomics.
unsafe impl Sync for Zone {}

/// Whether a reload keeps a zone's block.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// A new, zeroed block each configuration.
    No,
    /// The old configuration's block, as it is, if its name and size are
    /// the same (nginx maps the same memory into the new cycle).
    Yes,
}

/// Room the slab allocator's own bookkeeping needs in a zone, beyond the
/// block (its header, page descriptors; rounded up generously).
const SLAB_OVERHEAD: usize = 64 * 1024;

impl Zone {
    /// Adds a zone holding a zeroed block of `size` bytes.
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed.
    pub unsafe fn add(cf: *mut sys::ngx_conf_t, name: &'static [u8], size: usize) -> Option<Zone> {
        // SAFETY: the caller's contract; a static name outlives the cycle.
        unsafe { Zone::add_named(cf, name.as_ptr(), name.len(), size, Keep::No) }
    }

    /// Adds a zone named `name` (copied into the cycle's pool) holding a
    /// zeroed block of `size` bytes, kept across reloads as `keep` says.
    ///
    /// # Safety
    /// `cf` must be the configuration being parsed.
    pub unsafe fn add_kept(cf: *mut sys::ngx_conf_t, name: &str, size: usize) -> Option<Zone> {
        // SAFETY: cf->pool is the cycle's pool (the contract), where the
        // copy of the name lives as long as the zone.
        let copy = unsafe { sys::ngx_pnalloc((*cf).pool, name.len()) }.cast::<u8>();
        if copy.is_null() {
            return None;
        }
        // SAFETY: copy holds name.len() bytes; the caller's contract for the
        // rest.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), copy, name.len());
            Zone::add_named(cf, copy, name.len(), size, Keep::Yes)
        }
    }

    /// # Safety
    /// `cf` must be the configuration being parsed; `name` must point to
    /// `len` bytes that outlive the cycle.
    unsafe fn add_named(
        cf: *mut sys::ngx_conf_t,
        name: *const u8,
        len: usize,
        size: usize,
        keep: Keep,
    ) -> Option<Zone> {
        let mut name = sys::ngx_str_t {
            len,
            data: name as *mut u8,
        };
        // SAFETY: cf is being parsed; the tag is the module's record, which
        // outlives every cycle. nginx copies nothing and keeps name.data,
        // which outlives the cycle (the contract).
        unsafe {
            let zone = sys::ngx_shared_memory_add(
                cf,
                &mut name,
                size + SLAB_OVERHEAD,
                super::module::own() as *mut c_void,
            );
            let mut zone = NonNull::new(zone)?;
            let z = zone.as_mut();
            z.init = Some(init_zone);
            z.data = size as *mut c_void;
            // Keep::No: a new zone each configuration, never the old
            // workers' one
            z.noreuse = usize::from(keep == Keep::No) as _;
            Some(Zone(zone))
        }
    }

    /// The zeroed block, once nginx has created the zone (init_module on).
    pub fn block(&self) -> Option<NonNull<u8>> {
        // SAFETY: the zone lives as long as its cycle; data is set by
        // init_zone (or still holds the size before that, below any valid
        // address, hence the check against the zone's own memory).
        unsafe {
            let z = self.0.as_ref();
            let data = z.data as *mut u8;
            let start = z.shm.addr;
            (!start.is_null() && data > start && data < start.add(z.shm.size))
                .then(|| NonNull::new(data))
                .flatten()
        }
    }
}

impl Zone {
    /// `len` values of T from byte `offset` of the block, once nginx has
    /// created the zone.
    ///
    /// # Safety
    /// The zone must have been added with room for them, `offset` must be
    /// a multiple of T's alignment (at most 8), and an all-zero T must be a
    /// valid value that may be shared between processes and threads
    /// (atomics).
    pub unsafe fn as_slice<T: Sync>(&self, offset: usize, len: usize) -> Option<&'static [T]> {
        let block = self.block()?;
        // SAFETY: the zone was added with room for `len` T at `offset`, which
        // is T-aligned, and an all-zero T is a valid shared value (the
        // contract); the slab allocator aligns a block to at least 8 bytes,
        // and the zone stays mapped in this process until it exits.
        Some(unsafe { std::slice::from_raw_parts(block.as_ptr().add(offset).cast::<T>(), len) })
    }
}

/// The bytes of a word of shared memory.
pub const WORD: usize = size_of::<u64>();

/// Writes `bytes` into `data` from byte `at` (a multiple of 8), a word at
/// a time.
pub fn write_words(data: &[AtomicU64], at: usize, bytes: &[u8]) {
    for (word, chunk) in data[at / WORD..].iter().zip(bytes.chunks(WORD)) {
        let mut w = [0u8; WORD];
        w[..chunk.len()].copy_from_slice(chunk);
        word.store(u64::from_ne_bytes(w), Ordering::Relaxed);
    }
}

/// `len` bytes of `data` from byte `at` (a multiple of 8).
pub fn read_words(data: &[AtomicU64], at: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len.next_multiple_of(WORD));
    for word in &data[at / WORD..(at + len).div_ceil(WORD)] {
        out.extend_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
    out.truncate(len);
    out
}

unsafe extern "C" fn init_zone(zone: *mut sys::ngx_shm_zone_t, old: *mut c_void) -> sys::ngx_int_t {
    super::guard::no_unwind("init_zone", sys::NGX_ERROR as sys::ngx_int_t, || {
        // SAFETY: nginx passes the zone it is initialising, mapped.
        let (start, size) = unsafe { ((*zone).shm.addr as *mut c_void, (*zone).shm.size) };
        // A kept zone: nginx mapped the old cycle's memory again, and old,
        // its block, lies in it. Newer nginx (1.31, OpenResty's) also
        // passes the old block of a zone it does not keep (noreuse), which
        // lies in the old mapping only: that zone starts afresh.
        if !old.is_null() && old > start && old < start.wrapping_byte_add(size) {
            // SAFETY: as above.
            unsafe { (*zone).data = old };
            return sys::NGX_OK as sys::ngx_int_t;
        }
        // SAFETY: nginx calls this once the zone's memory exists, with the
        // slab pool at its start; data holds the size asked for in add.
        unsafe {
            let size = (*zone).data as usize;
            let pool = (*zone).shm.addr as *mut sys::ngx_slab_pool_t;
            let block = sys::ngx_slab_calloc(pool, size);
            if block.is_null() {
                return sys::NGX_ERROR as sys::ngx_int_t;
            }
            (*zone).data = block;
        }
        sys::NGX_OK as sys::ngx_int_t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_carry_bytes_of_any_length() {
        let data: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        for len in [0, 1, 7, 8, 9, 24] {
            let bytes: Vec<u8> = (1..=len as u8).collect();
            write_words(&data, 8, &bytes);
            assert_eq!(read_words(&data, 8, len), bytes);
        }
    }
}

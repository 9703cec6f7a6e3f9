//! Per-session state of one proxy, shared by both of its planes: a session's turns counted (for
//! a hinted request that carries no roles) and its *home*, the instance that answered it last
//! (`docs/serve.md`, "Session life"). The gateway's native path and the Python app hold the same
//! table (`smetric._core.SessionTable`), so a session's requests see one state whichever plane
//! served them.
//!
//! Algorithm: a hash map from a key's 16-byte digest (the first half of its SHA-256) to an entry
//! `(turns, last seen, home, stamp)`, and a queue of `(digest, stamp)` touches in the order they
//! happened. A touch gives the entry the next stamp and appends it; the least recently used
//! entry is the queue's first item whose stamp is still its entry's (older items are stale and
//! skipped). An entry unseen for `ttl` counts as absent; `home` looks without touching; `end`
//! drops an entry at once.
//!
//! Invariants: at most `capacity` entries (the least recently used is dropped first); the queue
//! holds every live entry's current stamp and is compacted (stale items dropped, order kept)
//! once it is more than twice the map plus a constant, so it stays within
//! O(capacity); a key is never kept, only its digest (clients' hints may be megabytes), so the
//! table is bounded in bytes — at most [`ENTRY_BYTES`] per entry, homes interned.
//!
//! Complexity: O(length of the key) to digest it, then O(1) amortised per call (the compaction
//! is O(queue), run after at least as many touches); one mutex held for the call alone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use sha2::{Digest as _, Sha256};

/// A session key's fixed-size form.
pub type SessionDigest = [u8; 16];

/// A session table's default bound on its entries.
pub const DEFAULT_CAPACITY: usize = 100_000;
/// A session's default idle time before it starts over, seconds.
pub const DEFAULT_TTL_S: f64 = 3600.0;

/// The queue's slack over the map before it is compacted.
const QUEUE_SLACK: usize = 64;

/// An upper bound of one entry's memory, bytes: its map slot (digest, entry, control byte) at
/// the map's lowest load (half full, just after it grew) plus its share of the queue at its
/// longest (two touches per entry, and their buffer at half use). Homes are interned: an
/// instance name is kept once, whatever number of entries name it.
pub const ENTRY_BYTES: usize =
    2 * (size_of::<SessionDigest>() + size_of::<Entry>() + 1) + 4 * size_of::<(SessionDigest, u64)>();

/// The fixed-size form a session key is kept in.
pub fn session_digest(key: &[u8]) -> SessionDigest {
    let full = Sha256::digest(key);
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&full[..16]);
    digest
}

/// Seconds on this process's monotonic clock: every caller that passes no time of its own (the
/// gateway, the app) reads the same one.
pub fn monotonic_s() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

#[derive(Clone, Debug)]
struct Entry {
    turns: u32,
    seen: f64,
    home: Option<Arc<str>>,
    stamp: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<SessionDigest, Entry>,
    order: VecDeque<(SessionDigest, u64)>,
    homes: HashSet<Arc<str>>,
    next_stamp: u64,
}

/// The table; every method takes `&self` (one mutex inside), so the planes share it by `Arc`.
pub struct SessionTable {
    capacity: usize,
    ttl_s: f64,
    inner: Mutex<Inner>,
}

/// A table setting out of range.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SessionTableError {
    #[error("capacity must be at least 1")]
    Capacity,
    #[error("ttl_s must be a positive number of seconds, got {0}")]
    Ttl(f64),
}

impl Default for SessionTable {
    /// [`DEFAULT_CAPACITY`] entries, [`DEFAULT_TTL_S`] seconds.
    fn default() -> Self {
        Self {
            capacity: DEFAULT_CAPACITY,
            ttl_s: DEFAULT_TTL_S,
            inner: Mutex::new(Inner::default()),
        }
    }
}

impl SessionTable {
    pub fn new(capacity: usize, ttl_s: f64) -> Result<Self, SessionTableError> {
        if capacity == 0 {
            return Err(SessionTableError::Capacity);
        }
        if ttl_s.is_nan() || ttl_s <= 0.0 {
            return Err(SessionTableError::Ttl(ttl_s));
        }
        Ok(Self {
            capacity,
            ttl_s,
            inner: Mutex::new(Inner::default()),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn ttl_s(&self) -> f64 {
        self.ttl_s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request of session `key` and returns its turn (1 for a new or idle key).
    pub fn next_turn(&self, key: &[u8], now: Option<f64>) -> u32 {
        let now = now.unwrap_or_else(monotonic_s);
        let digest = session_digest(key);
        let mut inner = self.lock();
        let live = inner.live(&digest, now, self.ttl_s);
        let turn = live.as_ref().map_or(1, |e| e.turns.saturating_add(1));
        let home = live.and_then(|e| e.home);
        inner.put(digest, turn, now, home, self.capacity);
        turn
    }

    /// Records that `instance` answered session `key` (its home from now on).
    pub fn place(&self, key: &[u8], instance: &str, now: Option<f64>) {
        let now = now.unwrap_or_else(monotonic_s);
        let digest = session_digest(key);
        let mut inner = self.lock();
        let turns = inner.live(&digest, now, self.ttl_s).map_or(0, |e| e.turns);
        let home = inner.intern(instance);
        inner.put(digest, turns, now, Some(home), self.capacity);
    }

    /// The instance that answered session `key` last, or None (unknown, idle, ended). A look,
    /// not a use: the entry's age and place in the LRU are unchanged.
    pub fn home(&self, key: &[u8], now: Option<f64>) -> Option<Arc<str>> {
        let now = now.unwrap_or_else(monotonic_s);
        let inner = self.lock();
        let entry = inner.entries.get(&session_digest(key))?;
        if now - entry.seen > self.ttl_s {
            return None;
        }
        entry.home.clone()
    }

    /// Drops session `key`'s entry at once; whether the table held one.
    pub fn end(&self, key: &[u8]) -> bool {
        self.lock().entries.remove(&session_digest(key)).is_some()
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The heap the table's structures hold now (their allocated capacity, not their use),
    /// bytes; the interned homes' text is not counted (one copy per instance name).
    pub fn heap_bytes(&self) -> usize {
        let inner = self.lock();
        inner.entries.capacity() * (size_of::<SessionDigest>() + size_of::<Entry>() + 1)
            + inner.order.capacity() * size_of::<(SessionDigest, u64)>()
            + inner.homes.capacity() * (size_of::<Arc<str>>() + 1)
    }
}

impl Inner {
    /// The entry of `digest`, taken out, when it is live (seen within `ttl_s`).
    fn live(&mut self, digest: &SessionDigest, now: f64, ttl_s: f64) -> Option<Entry> {
        let entry = self.entries.remove(digest)?;
        (now - entry.seen <= ttl_s).then_some(entry)
    }

    fn put(&mut self, digest: SessionDigest, turns: u32, now: f64, home: Option<Arc<str>>, capacity: usize) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.entries.insert(
            digest,
            Entry {
                turns,
                seen: now,
                home,
                stamp,
            },
        );
        self.order.push_back((digest, stamp));
        while self.entries.len() > capacity {
            let Some((oldest, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&oldest).is_some_and(|e| e.stamp == stamp) {
                self.entries.remove(&oldest);
            }
        }
        if self.order.len() > 2 * self.entries.len() + QUEUE_SLACK {
            let entries = &self.entries;
            self.order
                .retain(|(digest, stamp)| entries.get(digest).is_some_and(|e| e.stamp == *stamp));
        }
    }

    /// The one shared copy of an instance name. The set is pruned of names no entry holds
    /// once it has grown past a fleet's worth, so a changing membership cannot grow it.
    fn intern(&mut self, instance: &str) -> Arc<str> {
        if let Some(name) = self.homes.get(instance) {
            return Arc::clone(name);
        }
        if self.homes.len() >= 1024 {
            self.homes.retain(|name| Arc::strong_count(name) > 1);
        }
        let name: Arc<str> = Arc::from(instance);
        self.homes.insert(Arc::clone(&name));
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(capacity: usize) -> SessionTable {
        SessionTable::new(capacity, 10.0).unwrap()
    }

    #[test]
    fn turns_count_up_and_start_over_when_idle_or_ended() {
        let t = table(4);
        assert_eq!(
            [
                t.next_turn(b"a", Some(0.0)),
                t.next_turn(b"a", Some(1.0)),
                t.next_turn(b"b", Some(2.0))
            ],
            [1, 2, 1]
        );
        assert_eq!(t.next_turn(b"a", Some(20.0)), 1, "idle past the ttl");
        assert!(t.end(b"a") && !t.end(b"a"));
        assert_eq!(t.next_turn(b"a", Some(21.0)), 1, "ended: starts over");
    }

    #[test]
    fn a_home_is_kept_with_the_turns_and_a_look_does_not_renew_it() {
        let t = table(2);
        t.place(b"a", "http://i1", Some(0.0));
        assert_eq!(t.next_turn(b"a", Some(1.0)), 1, "a placed entry has no turn yet");
        assert_eq!(t.home(b"a", Some(1.0)).as_deref(), Some("http://i1"));
        t.place(b"b", "http://i2", Some(2.0));
        assert_eq!(t.home(b"a", Some(3.0)).as_deref(), Some("http://i1"));
        t.place(b"c", "http://i1", Some(4.0));
        assert_eq!(
            t.home(b"a", Some(4.0)),
            None,
            "a was the least recently used: a look is no use"
        );
        assert_eq!(t.home(b"b", Some(13.0)), None, "idle past the ttl");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn the_least_recently_used_entry_goes_first_whatever_the_touches_before() {
        let t = table(3);
        for (i, key) in [b"a", b"b", b"c", b"a", b"b", b"a"].iter().enumerate() {
            t.next_turn(*key, Some(i as f64 * 0.1));
        }
        t.next_turn(b"d", Some(1.0)); // c is the least recently used
        assert_eq!(t.len(), 3);
        assert_eq!(t.next_turn(b"c", Some(1.1)), 1, "c was dropped");
        assert_eq!(t.next_turn(b"a", Some(1.2)), 4, "c's return dropped b, used before a");
        assert_eq!(t.next_turn(b"b", Some(1.3)), 1);
        // Negative control: the one a stays in when only it is touched.
        let t = table(2);
        for i in 0..1000 {
            t.next_turn(b"a", Some(f64::from(i) * 1e-3));
        }
        t.next_turn(b"b", Some(2.0));
        assert_eq!(t.next_turn(b"a", Some(2.1)), 1001);
    }

    #[test]
    fn the_queue_stays_bounded_under_repeated_touches() {
        let t = table(8);
        for i in 0..100_000u32 {
            t.next_turn(&(i % 8).to_le_bytes(), Some(f64::from(i) * 1e-6));
        }
        let inner = t.lock();
        assert!(inner.order.len() <= 2 * inner.entries.len() + QUEUE_SLACK + 1);
    }

    #[test]
    fn keys_are_kept_as_digests_so_memory_does_not_follow_their_length() {
        let t = table(100);
        for i in 0..300u32 {
            let key = vec![u8::try_from(i % 251).unwrap(); 200_000];
            t.next_turn(&key, None);
        }
        assert_eq!(t.len(), 100);
        assert!(t.heap_bytes() <= 100 * ENTRY_BYTES + 1024, "{}", t.heap_bytes());
    }

    #[test]
    fn homes_are_interned_and_the_set_is_pruned() {
        let t = table(4);
        for i in 0..5000 {
            t.place(format!("s{}", i % 4).as_bytes(), &format!("http://i{i}"), Some(0.0));
        }
        assert!(t.lock().homes.len() <= 1024 + 1);
        t.place(b"x", "http://same", Some(0.0));
        t.place(b"y", "http://same", Some(0.0));
        let (x, y) = (t.home(b"x", Some(0.0)).unwrap(), t.home(b"y", Some(0.0)).unwrap());
        assert!(Arc::ptr_eq(&x, &y), "one copy of a name");
    }

    #[test]
    fn bad_settings_are_refused() {
        assert_eq!(SessionTable::new(0, 1.0).err(), Some(SessionTableError::Capacity));
        assert!(SessionTable::new(1, 0.0).is_err() && SessionTable::new(1, f64::NAN).is_err());
    }
}

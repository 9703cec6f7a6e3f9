//! Unit and model tests of the KV$ index.

use super::*;

fn chain(range: std::ops::Range<u64>) -> Vec<BlockHash> {
    range.map(BlockHash).collect()
}

impl KvIndex {
    /// Test only: checks the module's invariants (an entry exists iff some holder holds it and
    /// the hash table finds it; holder bits, inline seats, maps and counts agree; every held
    /// (entry, holder) pair is current in exactly one run; no holder is over capacity) and
    /// panics naming the first one broken.
    pub(crate) fn assert_consistent(&self) {
        let live = self.entries.iter().filter(|e| e.live()).count();
        assert_eq!(self.by_hash.len(), live, "the table holds every live entry");
        assert_eq!(
            live + self.free_entries.len(),
            self.entries.len(),
            "a slot is live or free"
        );
        for (e, entry) in self.entries.iter().enumerate() {
            let e = e as u32;
            if !entry.live() {
                continue;
            }
            assert_eq!(self.entry_of(entry.hash), Some(e), "entry {e} is found by its hash");
            assert!(
                entry.in_global() || !self.no_instance_holds(e),
                "entry {e} is held by someone"
            );
            for seat in [entry.inline_slot, entry.second_slot] {
                if seat != NO_SLOT {
                    let s = u32::from(seat);
                    assert!(
                        self.is_live(s) && self.bit(e, s),
                        "entry {e}'s inline seat {s} holds it"
                    );
                }
            }
            assert!(
                entry.second_slot == NO_SLOT || entry.second_slot != entry.inline_slot,
                "entry {e}'s two seats are two instances"
            );
        }
        let holders = (0..self.instances.len() as u32)
            .filter(|&s| self.is_live(s))
            .map(Holder::Instance)
            .chain(self.global_enabled().then_some(Holder::Global));
        for holder in holders {
            let members = (0..self.entries.len() as u32)
                .filter(|&e| self.entries[e as usize].live() && self.seq_locked(holder, e).is_some())
                .count();
            assert_eq!(self.held(holder), members, "{holder:?}'s count");
            assert!(
                self.held(holder) as u64 <= self.capacity(holder),
                "{holder:?} within capacity"
            );
            let mut current: Vec<u32> = self
                .lru_pairs(holder)
                .into_iter()
                .filter(|&(seq, e)| self.seq_locked(holder, e) == Some(seq))
                .map(|(_, e)| e)
                .collect();
            assert_eq!(current.len(), members, "{holder:?}: each held block current in one run");
            current.sort_unstable();
            current.dedup();
            assert_eq!(current.len(), members, "{holder:?}: no block current twice");
            if let Holder::Instance(s) = holder {
                for &e in self.instances[s as usize].order.lock().seqs.keys() {
                    assert!(self.bit(e, s), "{holder:?}'s map names only blocks it holds");
                    let entry = &self.entries[e as usize];
                    assert!(
                        u32::from(entry.inline_slot) != s && u32::from(entry.second_slot) != s,
                        "seated and mapped"
                    );
                }
            }
        }
        for s in (0..self.instances.len() as u32).filter(|&s| !self.is_live(s)) {
            assert!(
                (0..self.entries.len() as u32).all(|e| !self.bit(e, s)),
                "free slot {s} holds nothing"
            );
        }
    }

    /// Test only: every (seq, entry) pair `holder`'s LRU order queues, oldest run first (its
    /// mutex taken and released here, so that the caller may look the numbers up after).
    fn lru_pairs(&self, holder: Holder) -> Vec<(u32, u32)> {
        match holder {
            Holder::Instance(s) => self.instances[s as usize].order.lock().lru.all().collect(),
            Holder::Global => self.global_lru.lock().all().collect(),
        }
    }

    /// Whether entry `e`'s holder bitset has slot `s`.
    fn bit(&self, e: u32, s: u32) -> bool {
        let word = if s < 64 {
            self.entries[e as usize].held
        } else {
            self.more_bits[e as usize * (self.words - 1) + s as usize / 64 - 1]
        };
        word & (1 << (s % 64)) != 0
    }

    /// Test only: `holder`'s blocks by hash in eviction order, least recently used first (runs
    /// oldest first, each from its chain's tail): equal for two indexes iff they hold the same
    /// blocks and would evict them in the same order, however their runs are cut.
    pub(crate) fn lru_order(&self, holder: Holder) -> Vec<BlockHash> {
        let mut order: Vec<BlockHash> = Vec::new();
        let (mut run_seq, mut run_start) = (None, 0);
        for (seq, e) in self.lru_pairs(holder) {
            if run_seq != Some(seq) {
                order[run_start..].reverse();
                (run_seq, run_start) = (Some(seq), order.len());
            }
            if self.seq_locked(holder, e) == Some(seq) {
                order.push(self.entries[e as usize].hash);
            }
        }
        order[run_start..].reverse();
        order
    }
}

fn index(local: u64, global: u64) -> KvIndex {
    let mut ix = KvIndex::new(IndexLimits {
        local_capacity: local,
        global_capacity: global,
        local_ttl_ms: None,
    });
    for s in 0..3 {
        ix.add_slot(s);
    }
    ix
}

#[test]
fn longest_prefix_per_instance_and_global() {
    let mut ix = index(100, 100);
    ix.touch(Holder::Instance(0), &chain(0..10), None, 0);
    ix.touch(Holder::Instance(1), &chain(0..4), None, 0);
    ix.touch(Holder::Global, &chain(0..6), None, 0);
    let mut q = IndexQuery::default();
    ix.query(&chain(0..12), 0, &mut q);
    assert_eq!(q.local_blocks, vec![10, 4, 0]);
    assert_eq!(q.global_blocks, 6);
    assert_eq!(q.deepest_blocks, 10);
}

/// Two holders of a block sit in the entry's two seats, a third in its map; a seat freed by
/// an eviction is taken by the next new holder, and the order of the holders' touches and
/// evictions never loses a sequence number (`assert_consistent` after every step).
#[test]
fn two_holders_are_seated_a_third_is_mapped() {
    let mut ix = index(4, 0);
    let c = chain(0..4);
    for s in 0..3 {
        ix.touch(Holder::Instance(s), &c, None, u64::from(s));
        ix.assert_consistent();
    }
    let mapped = |ix: &KvIndex, s: usize| ix.instances[s].order.lock().seqs.len();
    assert_eq!((mapped(&ix, 0), mapped(&ix, 1), mapped(&ix, 2)), (0, 0, 4));
    // Instance 1 gives the chain up (a new chain of its capacity evicts it): its seat frees,
    // and instance 2's next touch still finds its own numbers in its map.
    ix.touch(Holder::Instance(1), &chain(10..14), None, 5);
    ix.assert_consistent();
    ix.touch(Holder::Instance(2), &c, None, 6);
    ix.assert_consistent();
    assert_eq!(mapped(&ix, 2), 4, "a mapped holder stays mapped");
    // A new holder takes the free second seat.
    ix.add_slot(3);
    ix.touch(Holder::Instance(3), &c, None, 7);
    ix.assert_consistent();
    assert_eq!(mapped(&ix, 3), 0, "the freed seat is reused");
    let mut q = IndexQuery::default();
    ix.query(&c, 7, &mut q);
    assert_eq!(q.local_blocks, vec![4, 0, 4, 4]);
}

#[test]
fn tail_is_evicted_first() {
    let mut ix = index(5, 0);
    ix.touch(Holder::Instance(0), &chain(0..5), None, 0);
    ix.touch(Holder::Instance(0), &chain(100..102), None, 1);
    // Two evictions took the tail (blocks 4 and 3) of the older chain.
    let mut q = IndexQuery::default();
    ix.query(&chain(0..5), 1, &mut q);
    assert_eq!(q.local_blocks[0], 3);
    assert_eq!(ix.stats().local_blocks[0], 5);
}

#[test]
fn children_count_branches() {
    let mut ix = index(100, 0);
    let sys = chain(0..4);
    let mut a = sys.clone();
    a.extend(chain(10..12));
    let mut b = sys.clone();
    b.extend(chain(20..22));
    ix.touch(Holder::Instance(0), &a, None, 0);
    ix.touch(Holder::Instance(1), &b, None, 0);
    let mut q = IndexQuery::default();
    let mut c = sys.clone();
    c.push(BlockHash(99));
    ix.query(&c, 0, &mut q);
    assert_eq!((q.deepest_blocks, q.branches), (4, 2));
    ix.query(&a, 0, &mut q);
    assert_eq!((q.deepest_blocks, q.branches), (6, 0));
}

#[test]
fn ttl_and_removal_free_entries() {
    let mut ix = KvIndex::new(IndexLimits {
        local_capacity: 100,
        global_capacity: 0,
        local_ttl_ms: Some(1000),
    });
    ix.add_slot(0);
    ix.touch(Holder::Instance(0), &chain(0..3), None, 0);
    let mut q = IndexQuery::default();
    ix.query(&chain(0..3), 999, &mut q);
    assert_eq!(q.local_blocks[0], 3);
    ix.query(&chain(0..3), 1000, &mut q);
    assert_eq!(q.local_blocks[0], 0);
    assert_eq!(ix.stats().entries, 0);
    ix.touch(Holder::Instance(0), &chain(0..3), None, 2000);
    ix.remove(Holder::Instance(0), &chain(1..2));
    ix.query(&chain(0..3), 2000, &mut q);
    assert_eq!(q.local_blocks[0], 1);
}

#[test]
fn many_slots_restride() {
    let mut ix = KvIndex::new(IndexLimits {
        local_capacity: 10,
        global_capacity: 0,
        local_ttl_ms: None,
    });
    ix.add_slot(0);
    ix.touch(Holder::Instance(0), &chain(0..3), None, 0);
    ix.add_slot(130);
    ix.touch(Holder::Instance(130), &chain(0..2), None, 0);
    let mut q = IndexQuery::default();
    ix.query(&chain(0..3), 0, &mut q);
    assert_eq!((q.local_blocks[0], q.local_blocks[130]), (3, 2));
    ix.remove_slot(0);
    ix.query(&chain(0..3), 0, &mut q);
    assert_eq!((q.local_blocks[0], q.local_blocks[130]), (0, 2));
}

#[test]
fn compaction_keeps_order() {
    let mut ix = index(8, 8);
    for round in 0..200u64 {
        ix.touch(Holder::Instance(0), &chain(0..4), None, round);
        ix.touch(Holder::Global, &chain(0..4), None, round);
        ix.touch(Holder::Instance(0), &chain(100 + round..101 + round), None, round);
    }
    assert!(ix.instances[0].order.get_mut().lru.queued() <= 2 * 8 + lru::COMPACT_SLACK + 4 * lru::CLEAN_FACTOR);
    let mut q = IndexQuery::default();
    ix.query(&chain(0..4), 0, &mut q);
    assert_eq!((q.local_blocks[0], q.global_blocks), (4, 4));
}

#[test]
fn follow_up_turns_leave_no_stale_ids() {
    // Each turn extends the previous one's chain: the previous run is superseded whole
    // and dropped at once, so nothing stale is ever queued.
    let mut ix = index(1_000, 1_000);
    let mut q = IndexQuery::default();
    for turn in 1..50u64 {
        let c = chain(0..turn * 3);
        ix.query(&c, 0, &mut q);
        ix.touch_queried(1, &c, 0);
        // Another session on the same instance in between.
        ix.touch_routed(1, &chain(10_000 + turn..10_001 + turn), 0);
    }
    let (order, global) = (ix.instances[1].order.lock(), ix.global_lru.lock());
    let local = &order.lru;
    assert_eq!(local.queued(), ix.instances[1].held);
    assert_eq!(global.queued(), ix.global_held);
    assert!(local.queued_runs() < 2 * 49 + 8);
}

/// A naive model of §2: per holder, an ordered list (LRU first) and a capacity.
#[derive(Default)]
struct Model {
    order: std::collections::HashMap<Option<u32>, Vec<u64>>,
}

impl Model {
    fn touch(&mut self, holder: Option<u32>, run: &[u64], cap: usize) {
        let order = self.order.entry(holder).or_default();
        for h in run.iter().rev() {
            order.retain(|x| x != h);
            order.push(*h);
        }
        while order.len() > cap {
            order.remove(0);
        }
    }
    fn remove(&mut self, holder: Option<u32>, run: &[u64]) {
        self.order.entry(holder).or_default().retain(|x| !run.contains(x));
    }
    fn hit(&self, holder: Option<u32>, chain: &[u64]) -> u32 {
        let held = self.order.get(&holder);
        chain.iter().take_while(|h| held.is_some_and(|o| o.contains(h))).count() as u32
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    #[test]
    fn matches_a_naive_lru_model(ops in proptest::collection::vec((0u8..6, 0u32..4, 0u64..6, 1usize..8), 1..300)) {
        let (local, global) = (6usize, 9usize);
        let mut ix = KvIndex::new(IndexLimits { local_capacity: local as u64, global_capacity: global as u64, local_ttl_ms: None });
        for s in 0..3 {
            ix.add_slot(s);
        }
        let mut model = Model::default();
        let mut q = IndexQuery::default();
        // A decision's walk taken and not yet committed: (slot, run, chain, walk).
        let mut walked: Option<(u32, Vec<u64>, Vec<BlockHash>, Walk)> = None;
        for (kind, who, start, len) in ops {
            let (holder, key, cap) = if who == 3 { (Holder::Global, None, global) } else { (Holder::Instance(who), Some(who), local) };
            let run: Vec<u64> = (start..start + len as u64).collect();
            let chain: Vec<BlockHash> = run.iter().map(|&h| BlockHash(h)).collect();
            match kind {
                0 | 1 => {
                    ix.touch(holder, &chain, None, 0);
                    model.touch(key, &run, cap);
                }
                2 => {
                    ix.remove(holder, &chain);
                    model.remove(key, &run);
                }
                // Insert on route, with and without the ids of a query of the same chain
                // (local chains longer than the capacity take two touches).
                4 | 5 => {
                    let slot = who % 3;
                    if kind == 4 {
                        ix.touch_routed(slot, &chain, 0);
                    } else {
                        ix.query(&chain, 0, &mut q);
                        ix.touch_queried(slot, &chain, 0);
                    }
                    model.touch(Some(slot), &run, local);
                    model.touch(None, &run, global);
                }
                // A decision's walk under the shared lock, and its commit some ops later (other
                // decisions' inserts and events in between): the insert on route at commit time.
                3 => match walked.take() {
                    None => {
                        let mut walk = Walk::default();
                        ix.query_shared(&chain, 0, &mut q, &mut walk);
                        walked = Some((who % 3, run, chain, walk));
                    }
                    Some((slot, run, chain, mut walk)) => {
                        ix.touch_walked(slot, &chain, 0, &mut walk);
                        model.touch(Some(slot), &run, local);
                        model.touch(None, &run, global);
                    }
                },
                _ => {}
            }
            ix.assert_consistent();
            let probe: Vec<u64> = (0..13).collect();
            let probe_chain: Vec<BlockHash> = probe.iter().map(|&h| BlockHash(h)).collect();
            ix.query(&probe_chain, 0, &mut q);
            for s in 0..3u32 {
                proptest::prop_assert_eq!(q.local_blocks[s as usize], model.hit(Some(s), &probe));
            }
            proptest::prop_assert_eq!(q.global_blocks, model.hit(None, &probe));
            for s in 0..3u32 {
                proptest::prop_assert_eq!(ix.stats().local_blocks[s as usize], model.order.get(&Some(s)).map_or(0, Vec::len));
            }
            // Every block's membership, not only the probe's prefix hits.
            for (key, holder) in [(Some(0), Holder::Instance(0)), (Some(1), Holder::Instance(1)), (Some(2), Holder::Instance(2)), (None, Holder::Global)] {
                let held = model.order.get(&key);
                for &h in &probe {
                    proptest::prop_assert_eq!(ix.holds(holder, BlockHash(h)), held.is_some_and(|o| o.contains(&h)));
                }
            }
        }
    }
}

/// Negative control of the walk stamps: a decision's walk whose entries are freed, and their
/// slab slots reused for other blocks, before its commit. The commit must find its chain again
/// (the `frees` stamp moved); the test-only variant that trusts the stale ids inserts the
/// other blocks instead, and the model comparison the tests rely on sees it.
#[test]
fn a_stale_walk_is_not_trusted_and_the_checks_catch_one_that_is() {
    let run = |broken: bool| {
        let mut ix = index(4, 4);
        ix.trust_stale_walks = broken;
        let (a, b, c) = (chain(1..5), chain(10..14), chain(20..24));
        ix.touch_routed(0, &a, 0);
        let (mut walk, mut q) = (Walk::default(), IndexQuery::default());
        ix.query_shared(&a, 0, &mut q, &mut walk);
        assert_eq!(q.local_blocks[0], 4);
        // Meanwhile: `a` leaves instance 0 (an event) and the global tier (evicted by `b`),
        // and `c`'s new entries take the freed slots.
        ix.remove(Holder::Instance(0), &a);
        ix.touch_routed(1, &b, 0);
        ix.touch(Holder::Instance(2), &c, None, 0);
        assert!(
            walk.ids.iter().all(|&e| ix.entries[e as usize].hash.0 >= 20),
            "slots reused by `c`"
        );
        ix.touch_walked(0, &a, 0, &mut walk);
        ix.assert_consistent();
        // The same writes with the insert on route at commit time, no walk kept.
        let mut replay = index(4, 4);
        replay.touch_routed(0, &a, 0);
        replay.remove(Holder::Instance(0), &a);
        replay.touch_routed(1, &b, 0);
        replay.touch(Holder::Instance(2), &c, None, 0);
        replay.touch_routed(0, &a, 0);
        let same = [
            Holder::Instance(0),
            Holder::Instance(1),
            Holder::Instance(2),
            Holder::Global,
        ]
        .into_iter()
        .all(|h| ix.lru_order(h) == replay.lru_order(h));
        ix.query(&a, 0, &mut q);
        let mut cq = IndexQuery::default();
        ix.query(&c, 0, &mut cq);
        (same, q.local_blocks[0], q.global_blocks, cq.local_blocks[0])
    };
    // The model: instance 0 and the global tier hold `a` whole, instance 0 nothing of `c`.
    assert_eq!(run(false), (true, 4, 4, 0));
    let broken = run(true);
    assert!(!broken.0, "the broken variant must be caught by the replay");
    assert_ne!(broken, (false, 4, 4, 0), "and by the model");
}

// ---- sent, not yet confirmed blocks (docs §2.7) -------------------------------------------------

fn exact_index(local: u64, ttl_ms: u64) -> KvIndex {
    let mut ix = index(local, 0);
    ix.enable_pending(ttl_ms, false);
    ix
}

/// Routes `c` to `slot` in exact mode at `now`: the query then the record of the decision.
fn send(ix: &mut KvIndex, slot: u32, c: &[BlockHash], now: u64) -> IndexQuery {
    let mut q = IndexQuery::default();
    ix.query(c, now, &mut q);
    ix.send_queried(slot, c, now);
    q
}

fn hits(ix: &mut KvIndex, c: &[BlockHash], now: u64) -> IndexQuery {
    let mut q = IndexQuery::default();
    ix.query(c, now, &mut q);
    q
}

#[test]
fn sent_blocks_count_until_events_confirm_them_without_double_count() {
    let mut ix = exact_index(100, 1_000);
    let first = chain(0..10);
    assert_eq!(send(&mut ix, 1, &first, 0).local_blocks, vec![0, 0, 0]);
    // The follow-up beats the predecessor's events: its home still shows the whole prefix.
    let follow_up = chain(0..14);
    let q = hits(&mut ix, &follow_up, 5);
    assert_eq!(q.local_blocks, vec![0, 10, 0]);
    assert_eq!(q.deepest_blocks, 10);
    assert_eq!(ix.stats().pending_blocks[1], 10);
    // Events confirm six of them: they move to the index proper, counted once.
    ix.touch(Holder::Instance(1), &first[..6], None, 6);
    assert_eq!(ix.stats().local_blocks[1], 6);
    assert_eq!(ix.stats().pending_blocks[1], 4);
    assert_eq!(hits(&mut ix, &follow_up, 7).local_blocks, vec![0, 10, 0]);
    // The rest confirmed: nothing pending, the same hit.
    ix.touch(Holder::Instance(1), &first[6..], Some(first[5]), 8);
    assert_eq!(ix.stats().pending_blocks[1], 0);
    assert_eq!(hits(&mut ix, &follow_up, 9).local_blocks, vec![0, 10, 0]);
}

#[test]
fn an_eviction_event_ends_a_sent_block() {
    let mut ix = exact_index(100, 1_000);
    let c = chain(0..10);
    send(&mut ix, 0, &c, 0);
    ix.remove(Holder::Instance(0), &[BlockHash(7)]);
    assert_eq!(hits(&mut ix, &c, 1).local_blocks[0], 7);
    assert_eq!(ix.stats().pending_blocks[0], 9);
    // An eviction addressed to another instance changes nothing here.
    ix.remove(Holder::Instance(2), &[BlockHash(3)]);
    assert_eq!(hits(&mut ix, &c, 1).local_blocks[0], 7);
    ix.clear_instance(0);
    assert_eq!(hits(&mut ix, &c, 1).local_blocks[0], 0);
    assert_eq!(ix.stats().pending_blocks[0], 0);
}

#[test]
fn sent_blocks_expire_after_the_ttl_and_renew_when_sent_again() {
    let mut ix = exact_index(100, 50);
    let c = chain(0..4);
    send(&mut ix, 0, &c, 0);
    assert_eq!(hits(&mut ix, &c, 49).local_blocks[0], 4);
    assert_eq!(
        hits(&mut ix, &c, 50).local_blocks[0],
        0,
        "counts while now < route + ttl"
    );
    send(&mut ix, 0, &c, 60);
    assert_eq!(hits(&mut ix, &c, 109).local_blocks[0], 4);
    // A longer chain re-sent later renews the shared prefix's deadline too.
    send(&mut ix, 0, &chain(0..6), 100);
    assert_eq!(hits(&mut ix, &c, 140).local_blocks[0], 4);
    assert_eq!(hits(&mut ix, &c, 150).local_blocks[0], 0);
}

#[test]
fn hit_is_the_prefix_of_confirmed_and_sent_blocks_together() {
    let mut ix = exact_index(100, 1_000);
    // Confirmed 0..3 and 6..8 (a hole at 3..6), then 0..10 sent: blocks 3..6 and 8..10
    // become pending, and the hit runs through both kinds.
    ix.touch(Holder::Instance(0), &chain(0..3), None, 0);
    ix.touch(Holder::Instance(0), &chain(6..8), None, 0);
    send(&mut ix, 0, &chain(0..10), 1);
    assert_eq!(ix.stats().pending_blocks[0], 5);
    assert_eq!(hits(&mut ix, &chain(0..12), 2).local_blocks[0], 10);
    // Only what the instance lacked was recorded: after the TTL the hole is back.
    assert_eq!(hits(&mut ix, &chain(0..12), 1_001).local_blocks[0], 3);
}

#[test]
fn sent_blocks_are_bounded_per_instance_oldest_first() {
    let mut ix = exact_index(8, 1_000_000);
    send(&mut ix, 0, &chain(0..5), 0);
    send(&mut ix, 0, &chain(100..105), 1);
    assert_eq!(ix.stats().pending_blocks[0], 8);
    // The least recently sent went first: the first chain lost its tail (sent before its head)...
    assert_eq!(hits(&mut ix, &chain(0..5), 2).local_blocks[0], 3);
    assert!(!ix.pending.counts(0, BlockHash(3), 2));
    assert!(ix.pending.counts(0, BlockHash(2), 2));
    // ...and the second chain is whole.
    assert_eq!(hits(&mut ix, &chain(100..105), 2).local_blocks[0], 5);
    // A client re-sending long prompts cannot grow the set or its queue without limit.
    for t in 0..2_000u64 {
        send(&mut ix, 0, &chain(t * 7..t * 7 + 20), 10 + t);
        assert!(ix.stats().pending_blocks[0] <= 8);
        assert!(ix.pending.queued(0) <= 2 * 8 + 64 + 20);
    }
}

#[test]
fn a_sent_chain_that_continued_past_the_match_is_a_branch() {
    let mut ix = exact_index(100, 1_000);
    // Session A (system prompt 0..4, then its own 4..8) is sent; no event yet.
    let a = chain(0..8);
    send(&mut ix, 2, &a, 0);
    // Session B shares the system prompt only: a match that ends where A went on is a branch
    // (a first turn), as the index proper would say once A's events arrive.
    let mut b = chain(0..4);
    b.extend(chain(50..54));
    let q = hits(&mut ix, &b, 1);
    assert_eq!((q.local_blocks[2], q.deepest_blocks, q.branches), (4, 4, 1));
    // A's follow-up extends A's whole prompt: no branch at its end (a follow-up).
    let q = hits(&mut ix, &chain(0..12), 1);
    assert_eq!((q.local_blocks[2], q.deepest_blocks, q.branches), (8, 8, 0));
}

#[test]
fn sent_blocks_are_off_unless_enabled() {
    let mut ix = index(100, 0);
    send(&mut ix, 0, &chain(0..4), 0);
    assert_eq!(hits(&mut ix, &chain(0..4), 1).local_blocks[0], 0);
    assert_eq!(ix.stats().pending_blocks[0], 0);
}

/// A naive model of §2.7 beside [`Model`]: per instance, the sent blocks least recently sent
/// first, with their deadline and child flag.
#[derive(Default)]
struct PendingModel {
    sent: std::collections::HashMap<u32, Vec<(u64, u64, bool)>>,
}

impl PendingModel {
    fn send(&mut self, slot: u32, run: &[u64], now: u64, ttl: u64, cap: usize, held: &Model) {
        let list = self.sent.entry(slot).or_default();
        while list.first().is_some_and(|&(_, d, _)| d <= now) {
            list.remove(0);
        }
        for (i, &h) in run.iter().enumerate().rev() {
            if held.hit(Some(slot), &[h]) == 1 {
                continue;
            }
            let old = list.iter().position(|x| x.0 == h).map(|p| list.remove(p));
            list.push((h, now + ttl, old.is_some_and(|x| x.2) || i + 1 < run.len()));
        }
        while list.len() > cap {
            list.remove(0);
        }
    }
    fn end(&mut self, slot: u32, run: &[u64]) {
        self.sent.entry(slot).or_default().retain(|x| !run.contains(&x.0));
    }
    fn hit(&self, slot: u32, chain: &[u64], now: u64, held: &Model) -> u32 {
        let sent = self.sent.get(&slot);
        chain
            .iter()
            .take_while(|&&h| {
                held.hit(Some(slot), &[h]) == 1 || sent.is_some_and(|l| l.iter().any(|x| x.0 == h && now < x.1))
            })
            .count() as u32
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// Events and routes interleaved at random against the naive models: every instance's hit
    /// is the prefix of its confirmed ∪ sent blocks; a store confirms (no double count), a
    /// removal ends, the TTL expires; the set and its queue stay within their bounds.
    #[test]
    fn sent_blocks_match_a_naive_model(ops in proptest::collection::vec((0u8..5, 0u32..3, 0u64..6, 1usize..8, 0u64..4), 1..300)) {
        let (local, ttl) = (6usize, 5u64);
        let mut ix = KvIndex::new(IndexLimits { local_capacity: local as u64, global_capacity: 0, local_ttl_ms: None });
        for s in 0..3 {
            ix.add_slot(s);
        }
        ix.enable_pending(ttl, false);
        let (mut model, mut sent) = (Model::default(), PendingModel::default());
        let mut now = 0u64;
        let mut q = IndexQuery::default();
        for (kind, slot, start, len, dt) in ops {
            now += dt;
            let run: Vec<u64> = (start..start + len as u64).collect();
            let c: Vec<BlockHash> = run.iter().map(|&h| BlockHash(h)).collect();
            match kind {
                // A store event: confirms what was sent.
                0 => {
                    ix.touch(Holder::Instance(slot), &c, None, now);
                    model.touch(Some(slot), &run, local);
                    sent.end(slot, &run);
                }
                1 => {
                    ix.remove(Holder::Instance(slot), &c);
                    model.remove(Some(slot), &run);
                    sent.end(slot, &run);
                }
                // A decision: the chain from the root, sent to `slot`.
                2 | 3 => {
                    let from_root: Vec<u64> = (0..start + len as u64).collect();
                    let rc: Vec<BlockHash> = from_root.iter().map(|&h| BlockHash(h)).collect();
                    ix.query(&rc, now, &mut q);
                    ix.send_queried(slot, &rc, now);
                    sent.send(slot, &from_root, now, ttl, local, &model);
                }
                _ => {
                    ix.clear_instance(slot);
                    model.order.remove(&Some(slot));
                    sent.sent.remove(&slot);
                }
            }
            let probe: Vec<u64> = (0..13).collect();
            let probe_chain: Vec<BlockHash> = probe.iter().map(|&h| BlockHash(h)).collect();
            ix.query(&probe_chain, now, &mut q);
            for s in 0..3u32 {
                proptest::prop_assert_eq!(q.local_blocks[s as usize], sent.hit(s, &probe, now, &model));
                proptest::prop_assert_eq!(ix.stats().local_blocks[s as usize], model.order.get(&Some(s)).map_or(0, Vec::len));
                proptest::prop_assert!(ix.stats().pending_blocks[s as usize] <= local);
                proptest::prop_assert!(ix.pending.queued(s) <= 2 * local + 64 + 13);
                for &h in &probe {
                    let model_counts = sent.sent.get(&s).is_some_and(|l| l.iter().any(|x| x.0 == h && now < x.1));
                    proptest::prop_assert_eq!(ix.pending.counts(s, BlockHash(h), now), model_counts);
                }
            }
        }
    }
}

// ---- answer credits (docs §2.7, "The answer") ---------------------------------------------------

fn answer_index(local: u64, ttl_ms: u64) -> KvIndex {
    let mut ix = index(local, 0);
    ix.enable_pending(ttl_ms, true);
    ix
}

#[test]
fn a_follow_up_is_credited_prompt_plus_answer_before_any_event() {
    let mut ix = answer_index(100, 1_000);
    // Turn 1: prompt blocks 0..10 sent to instance 1; it finished with 3 full answer blocks.
    send(&mut ix, 1, &chain(0..10), 0);
    ix.credit_answer(1, BlockHash(9), 10, 3, 5);
    // The follow-up repeats prompt + answer (10..13) and adds its message (13..16).
    let q = hits(&mut ix, &chain(0..16), 6);
    assert_eq!(q.local_blocks, vec![0, 13, 0]);
    assert_eq!((q.deepest_blocks, q.branches), (13, 0), "a follow-up, not a branch");
    // A chain that does not go through the anchor gets nothing from it.
    let mut other = chain(0..5);
    other.extend(chain(50..60));
    assert_eq!(hits(&mut ix, &other, 6).local_blocks[1], 5);
    // A follow-up shorter than the answer is credited up to its own length.
    assert_eq!(hits(&mut ix, &chain(0..11), 6).local_blocks[1], 11);
    // Credits live on the instance that answered only.
    assert_eq!(ix.stats().answer_credits, vec![0, 1, 0]);
    // Off: the same calls credit nothing.
    let mut off = exact_index(100, 1_000);
    send(&mut off, 1, &chain(0..10), 0);
    off.credit_answer(1, BlockHash(9), 10, 3, 5);
    assert_eq!(hits(&mut off, &chain(0..16), 6).local_blocks[1], 10);
}

#[test]
fn answer_events_confirm_a_credit_without_double_count() {
    let mut ix = answer_index(100, 1_000);
    send(&mut ix, 0, &chain(0..10), 0);
    ix.touch(Holder::Instance(0), &chain(0..10), None, 1);
    ix.credit_answer(0, BlockHash(9), 10, 4, 2);
    let follow_up = chain(0..20);
    assert_eq!(hits(&mut ix, &follow_up, 3).local_blocks[0], 14);
    // The first two answer blocks' event: counted once (14, not 16); the credit moves on.
    ix.touch(Holder::Instance(0), &chain(10..12), Some(BlockHash(9)), 4);
    assert_eq!(hits(&mut ix, &follow_up, 5).local_blocks[0], 14);
    assert_eq!(ix.stats().answer_credits[0], 1);
    // The rest: the credit ends, the events alone give the same hit.
    ix.touch(Holder::Instance(0), &chain(12..14), Some(BlockHash(11)), 6);
    assert_eq!(ix.stats().answer_credits[0], 0);
    assert_eq!(hits(&mut ix, &follow_up, 7).local_blocks[0], 14);
    // Now confirmed, an eviction of the answer's tail shows at once.
    ix.remove(Holder::Instance(0), &[BlockHash(13)]);
    assert_eq!(hits(&mut ix, &follow_up, 8).local_blocks[0], 13);
}

#[test]
fn events_that_beat_the_finish_leave_the_credit_whole() {
    let mut ix = answer_index(100, 1_000);
    ix.touch(Holder::Instance(0), &chain(0..10), None, 0);
    // The first answer block's event arrives while the request still decodes...
    ix.touch(Holder::Instance(0), &chain(10..11), Some(BlockHash(9)), 1);
    // ...then it finishes with 3 answer blocks: the credit spans all three, counted once.
    ix.credit_answer(0, BlockHash(9), 10, 3, 2);
    assert_eq!(hits(&mut ix, &chain(0..16), 3).local_blocks[0], 13);
}

#[test]
fn an_evicted_anchor_clear_or_ttl_ends_a_credit() {
    let mut ix = answer_index(100, 50);
    send(&mut ix, 0, &chain(0..4), 0);
    ix.credit_answer(0, BlockHash(3), 4, 2, 10);
    assert_eq!(hits(&mut ix, &chain(0..8), 49).local_blocks[0], 6);
    // TTL: counts while now < finish + ttl (the sent prompt blocks expired at 50 already).
    ix.touch(Holder::Instance(0), &chain(0..4), None, 50);
    assert_eq!(hits(&mut ix, &chain(0..8), 59).local_blocks[0], 6);
    assert_eq!(hits(&mut ix, &chain(0..8), 60).local_blocks[0], 4);
    // Eviction of the anchor (vLLM frees tail first: the answer went before it).
    ix.credit_answer(0, BlockHash(3), 4, 2, 100);
    ix.remove(Holder::Instance(0), &[BlockHash(3)]);
    assert_eq!(ix.stats().answer_credits[0], 0);
    ix.touch(Holder::Instance(0), &chain(3..4), Some(BlockHash(2)), 101);
    assert_eq!(hits(&mut ix, &chain(0..8), 102).local_blocks[0], 4);
    // Clear.
    ix.credit_answer(0, BlockHash(3), 4, 2, 110);
    ix.clear_instance(0);
    assert_eq!(ix.stats().answer_credits[0], 0);
    assert_eq!(hits(&mut ix, &chain(0..8), 111).local_blocks[0], 0);
}

#[test]
fn answer_credits_are_bounded_per_instance_oldest_first() {
    let mut ix = answer_index(8, 1_000_000);
    ix.touch(Holder::Instance(0), &chain(0..1), None, 0);
    ix.touch(Holder::Instance(0), &chain(100..101), None, 0);
    ix.credit_answer(0, BlockHash(0), 1, 5, 1);
    ix.credit_answer(0, BlockHash(100), 1, 5, 2);
    // 10 credited blocks > 8: the older credit went.
    assert_eq!(ix.stats().answer_credits[0], 1);
    assert_eq!(hits(&mut ix, &chain(0..10), 3).local_blocks[0], 1);
    assert_eq!(hits(&mut ix, &chain(100..110), 3).local_blocks[0], 6);
    for t in 0..2_000u64 {
        ix.credit_answer(0, BlockHash(t * 3), 1, 1 + (t % 4) as u32, 10 + t);
        assert!(ix.pending.credit_blocks(0) <= 8);
        assert!(ix.pending.credits_queued(0) <= 2 * 8 + 64);
    }
}

/// A naive model of the credits: per instance, live credits in FIFO order as
/// (anchor, blocks, deadline).
#[derive(Default)]
struct CreditModel {
    credits: std::collections::HashMap<u32, Vec<(u64, u32, u64)>>,
}

impl CreditModel {
    fn credit(&mut self, slot: u32, anchor: u64, blocks: u32, now: u64, ttl: u64, cap: usize) {
        let list = self.credits.entry(slot).or_default();
        while list.first().is_some_and(|c| c.2 <= now) {
            list.remove(0);
        }
        list.retain(|c| c.0 != anchor);
        list.push((anchor, blocks, now + ttl));
        while list.iter().map(|c| c.1 as usize).sum::<usize>() > cap {
            list.remove(0);
        }
    }
    fn confirm(&mut self, slot: u32, run: &[u64], parent: Option<u64>) {
        let list = self.credits.entry(slot).or_default();
        let last = run.len() - 1;
        let anchors: Vec<(u64, usize)> = parent
            .map(|h| (h, run.len()))
            .into_iter()
            .chain(run[..last].iter().enumerate().map(|(i, &h)| (h, last - i)))
            .collect();
        let mut moved: Option<(u32, u64)> = None;
        for (a, after) in anchors {
            if let Some(pos) = list.iter().position(|c| c.0 == a) {
                let c = list.remove(pos);
                if c.1 as usize > after {
                    let rest = (c.1 - after as u32, c.2);
                    moved = Some(moved.map_or(rest, |m| if m.0 >= rest.0 { m } else { rest }));
                }
            }
        }
        if let Some((blocks, deadline)) = moved {
            list.retain(|c| c.0 != run[last]);
            list.push((run[last], blocks, deadline));
        }
    }
    fn end(&mut self, slot: u32, hashes: &[u64]) {
        self.credits.entry(slot).or_default().retain(|c| !hashes.contains(&c.0));
    }
    fn hit(&self, slot: u32, chain: &[u64], k: u32, now: u64) -> u32 {
        let mut best = k as usize;
        for c in self.credits.get(&slot).into_iter().flatten() {
            if now < c.2
                && let Some(p) = chain[..k as usize].iter().position(|&h| h == c.0)
            {
                best = best.max((p + 1 + c.1 as usize).min(chain.len()));
            }
        }
        best as u32
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// Events, routes and finishes interleaved at random on two chains against the naive
    /// models: every hit is the larger of the confirmed ∪ sent prefix and the credits matched
    /// through their anchor (no double count); a store past an anchor confirms, an eviction
    /// of the anchor or a clear ends, the TTL expires; credits stay within the bound.
    #[test]
    fn answer_credits_match_a_naive_model(ops in proptest::collection::vec((0u8..6, 0u32..3, 0u64..10, 1usize..6, 0u64..4, 0u64..2), 1..300)) {
        let (local, ttl) = (12usize, 7u64);
        let mut ix = KvIndex::new(IndexLimits { local_capacity: local as u64, global_capacity: 0, local_ttl_ms: None });
        for s in 0..3 {
            ix.add_slot(s);
        }
        ix.enable_pending(ttl, true);
        let (mut model, mut sent, mut credits) = (Model::default(), PendingModel::default(), CreditModel::default());
        let mut now = 0u64;
        let mut q = IndexQuery::default();
        for (kind, slot, start, len, dt, line) in ops {
            now += dt;
            let base = line * 1_000;
            let run: Vec<u64> = (base + start..base + start + len as u64).collect();
            let parent = (start > 0).then(|| base + start - 1);
            let c: Vec<BlockHash> = run.iter().map(|&h| BlockHash(h)).collect();
            match kind {
                0 => {
                    ix.touch(Holder::Instance(slot), &c, parent.map(BlockHash), now);
                    model.touch(Some(slot), &run, local);
                    sent.end(slot, &run);
                    credits.confirm(slot, &run, parent);
                }
                1 => {
                    ix.remove(Holder::Instance(slot), &c);
                    model.remove(Some(slot), &run);
                    sent.end(slot, &run);
                    credits.end(slot, &run);
                }
                2 => {
                    let from_root: Vec<u64> = (base..base + start + len as u64).collect();
                    let rc: Vec<BlockHash> = from_root.iter().map(|&h| BlockHash(h)).collect();
                    ix.query(&rc, now, &mut q);
                    ix.send_queried(slot, &rc, now);
                    sent.send(slot, &from_root, now, ttl, local, &model);
                }
                // A finish: the answer hangs past block `start` of the line.
                3 | 4 => {
                    ix.credit_answer(slot, BlockHash(base + start), start as u32 + 1, len as u32, now);
                    credits.credit(slot, base + start, len as u32, now, ttl, local);
                }
                _ => {
                    ix.clear_instance(slot);
                    model.order.remove(&Some(slot));
                    sent.sent.remove(&slot);
                    credits.credits.remove(&slot);
                }
            }
            for l in 0..2u64 {
                let probe: Vec<u64> = (l * 1_000..l * 1_000 + 16).collect();
                let probe_chain: Vec<BlockHash> = probe.iter().map(|&h| BlockHash(h)).collect();
                ix.query(&probe_chain, now, &mut q);
                for s in 0..3u32 {
                    let k = sent.hit(s, &probe, now, &model);
                    proptest::prop_assert_eq!(q.local_blocks[s as usize], credits.hit(s, &probe, k, now));
                    proptest::prop_assert!(ix.pending.credit_blocks(s) <= local);
                    proptest::prop_assert_eq!(
                        ix.stats().answer_credits[s as usize],
                        credits.credits.get(&s).map_or(0, Vec::len)
                    );
                }
            }
        }
    }
}

#[test]
fn evicted_touch_time_is_the_newest_block_given_up_for_room_or_by_an_event() {
    let mut ix = KvIndex::new(IndexLimits {
        local_capacity: 4,
        global_capacity: 8,
        local_ttl_ms: Some(10_000),
    });
    ix.add_slot(0);
    ix.add_slot(1);
    // Room to spare: nothing given up.
    ix.touch(Holder::Instance(0), &chain(0..3), None, 100);
    assert_eq!(ix.evicted_touch_ms(0), None);
    // Three more blocks into four: two of the chain touched at 100 go.
    ix.touch(Holder::Instance(0), &chain(10..13), None, 500);
    assert_eq!(ix.evicted_touch_ms(0), Some(100));
    assert_eq!(ix.evicted_touch_ms(1), None, "per instance");
    // The global tier's evictions are not an instance's.
    ix.touch(Holder::Global, &chain(20..30), None, 600);
    assert_eq!(ix.evicted_touch_ms(1), None);
    // An engine's removal event: the block's touch time (500), the newest so far.
    ix.remove(Holder::Instance(0), &chain(11..12));
    assert_eq!(ix.evicted_touch_ms(0), Some(500));
    // An older block removed later does not move it back.
    ix.touch(Holder::Instance(1), &chain(40..42), None, 50);
    ix.touch(Holder::Instance(1), &chain(42..44), None, 900);
    ix.remove(Holder::Instance(1), &chain(42..43));
    ix.remove(Holder::Instance(1), &chain(40..41));
    assert_eq!(ix.evicted_touch_ms(1), Some(900));
    // Blocks aged out by the TTL are not given up for room.
    ix.add_slot(2);
    ix.touch(Holder::Instance(2), &chain(50..52), None, 0);
    ix.purge_all_expired(20_000);
    assert_eq!(ix.stats().local_blocks[2], 0, "expired");
    assert_eq!(ix.evicted_touch_ms(2), None);
    // An emptied or reused slot starts afresh.
    ix.clear_instance(0);
    assert_eq!(ix.evicted_touch_ms(0), None);
    ix.remove_slot(1);
    ix.add_slot(1);
    assert_eq!(ix.evicted_touch_ms(1), None);
    ix.assert_consistent();
}

// ---- the insert on route in place (`refront_walked`) ------------------------------------------

/// One route of `chain` to `slot` at `now` on two indexes, both purged first when a purge is
/// due (as the router does before its walk): `a` as the router does it (walk under a shared
/// borrow, the write in place when `refront_walked` may, else `touch_walked`), `b` always with
/// `touch_routed` under `&mut`. Returns whether `a`'s was in
/// place.
fn route_both(a: &mut KvIndex, b: &mut KvIndex, slot: u32, chain: &[BlockHash], now: u64) -> bool {
    for ix in [&mut *a, &mut *b] {
        if ix.purge_due(now) {
            ix.purge_all_expired(now);
        }
    }
    let (mut walk, mut q) = (Walk::default(), IndexQuery::default());
    a.query_shared(chain, now, &mut q, &mut walk);
    let mut applied = false;
    let in_place = a.refront_walked(slot, chain, now, &walk, &q, || applied = true);
    assert_eq!(
        in_place, applied,
        "`applied` runs exactly when the write was done in place"
    );
    if !in_place {
        a.touch_walked(slot, chain, now, &mut walk);
    }
    b.touch_routed(slot, chain, now);
    in_place
}

/// The holders whose LRU order differs between `a` and `b` (blocks, and their order).
fn order_differences(a: &KvIndex, b: &KvIndex) -> Vec<Holder> {
    (0..3)
        .map(Holder::Instance)
        .chain([Holder::Global])
        .filter(|&h| a.lru_order(h) != b.lru_order(h))
        .collect()
}

/// Session `k`'s chain at `turn`: a 3-block prefix every session shares, then `2 + turn` blocks
/// of its own.
fn session_chain(k: u64, turn: u64) -> Vec<BlockHash> {
    (1..4)
        .chain((0..2 + turn).map(|i| 100 * (k + 1) + i))
        .map(BlockHash)
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// The insert on route in place does exactly what the write under `&mut` does: after every
    /// route of random sessions' turns to random instances (with engine removals between, and
    /// a TTL in some cases), both indexes hold the same blocks in the same LRU order for every
    /// holder, and the in-place one is consistent. The shared prefix on three instances puts
    /// the third holder's numbers in its map, so the map's path is exercised too.
    #[test]
    fn a_refront_in_place_is_the_touch_it_replaces(
        ops in proptest::collection::vec((0u64..5, 0u32..3, 0u64..4, 0u8..8), 1..120),
        ttl in proptest::option::of(4u64..40),
    ) {
        let (mut a, mut b) = session_indexes(ttl);
        proptest::prop_assert!(!replay_sessions(&mut a, &mut b, &ops));
    }
}

/// Two empty indexes with three slots for [`replay_sessions`].
fn session_indexes(ttl: Option<u64>) -> (KvIndex, KvIndex) {
    let limits = IndexLimits {
        local_capacity: 14,
        global_capacity: 22,
        local_ttl_ms: ttl,
    };
    let (mut a, mut b) = (KvIndex::new(limits), KvIndex::new(limits));
    for s in 0..3 {
        a.add_slot(s);
        b.add_slot(s);
    }
    (a, b)
}

/// Replays `ops` — (session, slot, turn, kind): kind 0 an engine's eviction of the chain's last
/// block there, else a route of the session's chain at that turn (`route_both`) — on `a` and `b`,
/// checking `a`'s consistency after each; returns whether some holder's LRU order ever differed.
fn replay_sessions(a: &mut KvIndex, b: &mut KvIndex, ops: &[(u64, u32, u64, u8)]) -> bool {
    let mut differed = false;
    for (now, &(k, slot, turn, kind)) in ops.iter().enumerate() {
        let chain = session_chain(k, turn);
        if kind == 0 {
            let gone = &chain[chain.len() - 1..];
            a.remove(Holder::Instance(slot), gone);
            b.remove(Holder::Instance(slot), gone);
        } else {
            route_both(a, b, slot, &chain, now as u64);
        }
        a.assert_consistent();
        differed |= !order_differences(a, b).is_empty();
    }
    differed
}

/// A fixed run of the comparison above that must re-front (a session's chain, held whole, no
/// longer the newest where it goes), and its negative control: the broken variant that forgets
/// the global tier's order is caught by the same comparison.
#[test]
fn refronts_are_exercised_and_a_broken_one_is_caught() {
    let run = |broken: bool| {
        let (mut a, mut b) = (index(14, 22), index(14, 22));
        a.refront_skips_global = broken;
        let mut in_place = 0;
        let mut caught = false;
        for (now, (k, slot)) in [(0, 0), (1, 1), (0, 0), (2, 2), (1, 1), (0, 0), (2, 2), (1, 1)]
            .into_iter()
            .enumerate()
        {
            in_place += usize::from(route_both(&mut a, &mut b, slot, &session_chain(k, 1), now as u64));
            caught |= !order_differences(&a, &b).is_empty();
        }
        (in_place, a.refronts.load(Ordering::Relaxed), caught)
    };
    let (in_place, refronts, caught) = run(false);
    assert!(
        in_place >= 5 && refronts >= 5,
        "{in_place} in place, {refronts} re-fronts"
    );
    assert!(!caught);
    assert!(run(true).2, "the broken variant must be caught");
}

/// A re-front in place whose run takes the holders' sequence numbers past the threshold
/// renumbers them under the holders' mutexes, as the write under `&mut` does: same order
/// after, numbers back near zero.
#[test]
fn a_refront_in_place_renumbers_as_the_exclusive_write_does() {
    let (mut a, mut b) = (index(14, 22), index(14, 22));
    let routes = [(0, 0), (1, 0), (2, 1), (0, 0), (1, 0)];
    for (now, &(k, slot)) in routes.iter().enumerate().take(3) {
        route_both(&mut a, &mut b, slot, &session_chain(k, 1), now as u64);
    }
    for ix in [&mut a, &mut b] {
        ix.instances[0].order.get_mut().lru.skip_to_seq_limit();
        ix.global_lru.get_mut().skip_to_seq_limit();
    }
    for (now, &(k, slot)) in routes.iter().enumerate().skip(3) {
        assert!(
            route_both(&mut a, &mut b, slot, &session_chain(k, 1), now as u64),
            "in place"
        );
    }
    a.assert_consistent();
    assert_eq!(order_differences(&a, &b), Vec::<Holder>::new());
    for ix in [&mut a, &mut b] {
        assert!(ix.instances[0].order.get_mut().lru.next_seq() < 10, "renumbered");
        assert!(ix.global_lru.get_mut().next_seq() < 10, "renumbered");
    }
}

// ---- relinked runs (`lru::RunLru::relink`) -------------------------------------------------------

impl KvIndex {
    /// Test only: sets how every holder's LRU order relinks (slots added later keep the default).
    fn set_test_relink(&mut self, mode: lru::TestRelink) {
        for h in &mut self.instances {
            h.order.get_mut().lru.test_relink = mode;
        }
        self.global_lru.get_mut().test_relink = mode;
    }

    /// Test only: runs relinked so far, over every holder.
    fn relinked(&mut self) -> usize {
        let local: usize = self.instances.iter_mut().map(|h| h.order.get_mut().lru.relinked).sum();
        local + self.global_lru.get_mut().relinked
    }
}

/// `a` and `b` routed the same chains (`route_both`: `a` as the router does, `b` under `&mut`),
/// `b` never relinking: after every route or engine removal the two hold the same blocks in the
/// same LRU order for every holder, and `a` is consistent. Returns the relinks `a` made and
/// whether some holder's order ever differed.
fn relink_against_rewrite(mode: lru::TestRelink, ops: &[(u64, u32, u64, u8)], ttl: Option<u64>) -> (usize, bool) {
    let (mut a, mut b) = session_indexes(ttl);
    a.set_test_relink(mode);
    b.set_test_relink(lru::TestRelink::Off);
    let differed = replay_sessions(&mut a, &mut b, ops);
    assert_eq!(b.relinked(), 0);
    (a.relinked(), differed)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// Relinking a run is exactly the re-touch that writes every entry's number anew: the same
    /// blocks in the same LRU order for every holder after every route of random sessions'
    /// turns (a session touched again whole while another was touched since: a relink), engine
    /// removals between, a TTL in some cases.
    #[test]
    fn a_relinked_run_is_the_rewrite_it_replaces(
        ops in proptest::collection::vec((0u64..5, 0u32..3, 0u64..4, 0u8..8), 1..120),
        ttl in proptest::option::of(4u64..40),
    ) {
        let (_, differed) = relink_against_rewrite(lru::TestRelink::On, &ops, ttl);
        proptest::prop_assert!(!differed);
    }
}

/// A fixed run of the comparison above that must relink (sessions on one instance, each touched
/// again after the others: whole, or as its next turn), and its negative control: the broken
/// variant that queues a relinked run's ids in reverse is caught by the same comparison.
#[test]
fn relinks_are_exercised_and_a_broken_one_is_caught() {
    let ops: Vec<(u64, u32, u64, u8)> = [(0, 1), (1, 1), (0, 1), (2, 1), (1, 2), (0, 2), (2, 1), (1, 2), (0, 3)]
        .iter()
        .map(|&(k, turn)| (k, 0, turn, 1))
        .collect();
    let (relinked, differed) = relink_against_rewrite(lru::TestRelink::On, &ops, None);
    assert!(relinked >= 5, "{relinked} relinks");
    assert!(!differed);
    let (relinked, differed) = relink_against_rewrite(lru::TestRelink::Reversed, &ops, None);
    assert!(relinked >= 5 && differed, "the broken variant must be caught");
}

//! Unit and model tests of the KV$ index.

use super::*;

fn chain(range: std::ops::Range<u64>) -> Vec<BlockHash> {
    range.map(BlockHash).collect()
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
    assert!(ix.instances[0].lru.queued() <= 2 * 8 + lru::COMPACT_SLACK + 4 * lru::CLEAN_FACTOR);
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
    let (local, global) = (&ix.instances[1].lru, &ix.global_lru);
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
                _ => {}
            }
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

use std::sync::Arc;

use super::*;
use crate::error::SmetricError;
use crate::ids::BlockHash;
use crate::router::request::{IndexOp, Prompt, RouteRequest, Tier};
use crate::turn::TurnHint;

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("i{i}")).collect()
}

#[test]
fn follow_up_returns_home_and_lifecycle_balances() {
    // The paper's form: with the smetric+ defaults this follow-up, whose first turn still
    // queues at home while the tier holds its prefix, moves to an idle instance (a fetch).
    let r = Router::new(&names(4), PolicyKind::Smetric, 4, 1, RouterConfig::V1).unwrap();
    let turn1: Vec<u32> = (0..40).collect();
    let d1 = r
        .route(&RouteRequest {
            now: Some(0.0),
            ..RouteRequest::new(Prompt::Tokens(&turn1))
        })
        .unwrap();
    assert!(d1.first_turn);
    let mut turn2 = turn1.clone();
    turn2.extend(100..140);
    let d2 = r
        .route(&RouteRequest {
            now: Some(1.0),
            ..RouteRequest::new(Prompt::Tokens(&turn2))
        })
        .unwrap();
    assert!(!d2.first_turn);
    assert_eq!(d2.instance, d1.instance);
    assert_eq!(d2.local_hit_tokens, 40);
    for id in [d1.request_id, d2.request_id] {
        assert!(r.on_prefilled(id));
        assert!(r.on_finished(id, 10));
        assert!(!r.on_finished(id, 10), "a second finish changes nothing");
    }
    let l = r.load(&d1.instance_name).unwrap();
    assert_eq!((l.bs, l.waiting, l.queued, l.active), (0, 0, 0, 0));
    assert_eq!(r.stats().unknown_request_events, 2);
}

#[test]
fn removed_instance_is_never_chosen_and_slot_reuse_is_safe() {
    let r = Router::new(&names(2), PolicyKind::RoundRobin, 16, 0, RouterConfig::default()).unwrap();
    let d = r.route(&RouteRequest::new(Prompt::Tokens(&[1, 2, 3]))).unwrap();
    let gone = d.instance_name.clone();
    r.remove_instance(&gone).unwrap();
    r.add_instance("new").unwrap();
    assert!(
        !r.on_finished(d.request_id, 0),
        "the new occupant's counters are not touched"
    );
    let l = r.load("new").unwrap();
    assert_eq!(l.bs, 0);
    for _ in 0..4 {
        let d = r.route(&RouteRequest::new(Prompt::Tokens(&[1, 2, 3]))).unwrap();
        assert_ne!(d.instance_name, gone);
    }
    assert!(matches!(
        r.add_instance("new"),
        Err(SmetricError::DuplicateInstance { .. })
    ));
    assert!(matches!(
        r.remove_instance("zzz"),
        Err(SmetricError::UnknownInstance { .. })
    ));
}

#[test]
fn bad_construction() {
    assert!(matches!(
        Router::new(&[], PolicyKind::Smetric, 16, 0, RouterConfig::default()),
        Err(SmetricError::NoInstances)
    ));
    assert!(matches!(
        Router::new(&names(1), PolicyKind::Smetric, 0, 0, RouterConfig::default()),
        Err(SmetricError::InvalidBlockSize { .. })
    ));
    let r = Router::new(&names(1), PolicyKind::Smetric, 16, 0, RouterConfig::default()).unwrap();
    r.remove_instance("i0").unwrap();
    assert!(matches!(
        r.route(&RouteRequest::new(Prompt::Tokens(&[1]))),
        Err(SmetricError::NoInstances)
    ));
}

#[test]
fn apply_blocks_matches_one_call_per_op() {
    let (a, b) = (BlockHash(11), BlockHash(12));
    let ops = [
        IndexOp::Store {
            tier: Tier::Local,
            hashes: &[a, b],
            parent: None,
        },
        IndexOp::Store {
            tier: Tier::Global,
            hashes: &[a],
            parent: None,
        },
        IndexOp::Remove {
            tier: Tier::Local,
            hashes: &[b],
        },
    ];
    let hits = |r: &Router| {
        let h = r
            .query(
                Prompt::Hashes {
                    hashes: &[a, b],
                    num_tokens: Some(9),
                },
                None,
                Some(0.0),
            )
            .unwrap();
        (h.local, h.global_hit_tokens)
    };
    let batched = Router::new(&names(2), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
    batched.apply_blocks(Some("i1"), &ops, Some(0.0)).unwrap();
    let single = Router::new(&names(2), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
    single
        .store_blocks(Some("i1"), Tier::Local, &[a, b], None, Some(0.0))
        .unwrap();
    single.store_blocks(None, Tier::Global, &[a], None, Some(0.0)).unwrap();
    single.remove_blocks(Some("i1"), Tier::Local, &[b]).unwrap();
    assert_eq!(hits(&batched), hits(&single));
    assert_eq!(hits(&batched).1, 4);
    // Ops on an unknown instance fail; the others still apply.
    let r = Router::new(&names(1), PolicyKind::Smetric, 4, 0, RouterConfig::default()).unwrap();
    assert!(matches!(
        r.apply_blocks(Some("zzz"), &ops, Some(0.0)),
        Err(SmetricError::UnknownInstance { .. })
    ));
    assert_eq!(hits(&r), (vec![(Arc::from("i0"), 0)], 4));
}

/// Concurrency: decisions from many threads at once, each routing in lockstep with the others
/// (a barrier before every decision, so that they overlap as much as they can).
mod concurrent {
    use std::sync::Arc;
    use std::thread;

    use super::*;
    use crate::ids::RequestId;
    use crate::index::{Holder, IndexLimits, KvIndex};
    // Not `std::sync::Barrier`: a failed assertion in one thread must fail the test, not leave
    // the others waiting for it forever.
    use crate::lockstep::{Lockstep as Barrier, Member};

    const THREADS: usize = 4;
    // Not a multiple of INSTANCES: a pile-up of THREADS decisions per round does not even out.
    const ROUNDS: usize = 201;
    const INSTANCES: usize = 8;

    /// In-flight requests per instance, after every thread ran `decide` `ROUNDS` times in
    /// lockstep. Requests never finish, so a decision that sees every earlier one's load keeps
    /// the counts within one of each other under `least_load`.
    fn in_flight_after(decide: impl Fn(&Router, usize, usize) + Sync) -> Vec<u64> {
        in_flight_after_with(|_| {}, decide).0
    }

    /// [`in_flight_after`] on a router `configure` set up first; also returns its stats.
    fn in_flight_after_with(
        configure: impl FnOnce(&mut Router),
        decide: impl Fn(&Router, usize, usize) + Sync,
    ) -> (Vec<u64>, crate::router::RouterStats) {
        let mut r = Router::new(&names(INSTANCES), PolicyKind::LeastLoad, 4, 3, RouterConfig::default()).unwrap();
        configure(&mut r);
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for t in 0..THREADS {
                let (r, barrier, decide) = (&r, &barrier, &decide);
                s.spawn(move || {
                    let _member = Member(&[barrier]);
                    for round in 0..ROUNDS {
                        barrier.wait();
                        decide(r, t, round);
                    }
                });
            }
        });
        let counts = r.instances().iter().map(|name| r.load(name).unwrap().bs).collect();
        (counts, r.stats())
    }

    /// Every thread's decision reads the loads, then waits for the others (`after_select`),
    /// then commits: each round, all of them chose from the same loads.
    fn routes_that_read_the_same_loads(unchecked_commit: bool) -> (Vec<u64>, crate::router::RouterStats) {
        let read_then_commit = Arc::new(Barrier::new(THREADS));
        in_flight_after_with(
            |r| {
                r.after_select = Some(read_then_commit.clone());
                r.unchecked_commit = unchecked_commit;
            },
            |r, t, round| {
                let _member = Member(&[&*read_then_commit]);
                let prompt: Vec<u32> = (0..(16 * (t + 1) + round) as u32).collect();
                r.route(&RouteRequest::new(Prompt::Tokens(&prompt))).unwrap();
            },
        )
    }

    #[test]
    fn decisions_that_read_the_same_loads_commit_one_at_a_time_per_instance() {
        let (counts, stats) = routes_that_read_the_same_loads(false);
        assert_eq!(counts.iter().sum::<u64>(), (THREADS * ROUNDS) as u64);
        assert!(spread(&counts) <= 1, "least_load stays balanced: {counts:?}");
        // The check was exercised: decisions that picked the same instance as another decided
        // again (ties are drawn at random, so not every round collides).
        assert!(stats.decision_retries > 0, "{stats:?}");
        assert_eq!(stats.routed, (THREADS * ROUNDS) as u64);
    }

    /// Negative control: the same lockstep with the commit's check off piles decisions onto the
    /// instances they all read as least loaded; the balance check must see it.
    #[test]
    fn the_balance_check_catches_a_commit_without_its_check() {
        let (counts, stats) = routes_that_read_the_same_loads(true);
        assert_eq!(counts.iter().sum::<u64>(), (THREADS * ROUNDS) as u64);
        assert_eq!(stats.decision_retries, 0);
        assert!(spread(&counts) > 1, "the unchecked commit must unbalance: {counts:?}");
    }

    fn spread(counts: &[u64]) -> u64 {
        counts.iter().max().unwrap() - counts.iter().min().unwrap()
    }

    #[test]
    fn concurrent_decisions_see_each_others_load() {
        let counts = in_flight_after(|r, t, round| {
            // Prompts of different lengths per thread: each thread's chain buffer differs.
            let prompt: Vec<u32> = (0..(16 * (t + 1) + round) as u32).collect();
            r.route(&RouteRequest::new(Prompt::Tokens(&prompt))).unwrap();
        });
        assert_eq!(counts.iter().sum::<u64>(), (THREADS * ROUNDS) as u64);
        assert!(spread(&counts) <= 1, "least_load stays balanced: {counts:?}");
    }

    /// Negative control: the same decision with the load read and the load bump not in one
    /// critical section (the race the index mutex prevents). Threads in lockstep then read the
    /// same loads, pick the same instance, and pile onto it; the balance check must see it.
    #[test]
    fn the_balance_check_catches_a_decision_outside_the_lock() {
        let read_then_bump = Barrier::new(THREADS);
        let counts = in_flight_after(|r, _, _| {
            let _member = Member(&[&read_then_bump]);
            let fleet = r.fleet.load_full();
            let (slot, _) = fleet
                .members()
                .min_by_key(|(slot, m)| (m.load.snapshot().bs, *slot))
                .unwrap();
            read_then_bump.wait();
            fleet.member(slot).unwrap().load.on_routed(0, 1, 0);
        });
        assert_eq!(counts.iter().sum::<u64>(), (THREADS * ROUNDS) as u64);
        assert!(spread(&counts) > 1, "the racy decision must unbalance: {counts:?}");
    }

    /// Capacities of the replay test (local, global): small, so that inserts evict and free
    /// entries while other decisions hold walks that name them.
    const SMALL: (u64, u64) = (16, 24);
    /// Capacities where every holder keeps several chains whole, so that a route re-fronts in
    /// place a chain its instance and the global tier hold but not as their newest.
    const ROOMY: (u64, u64) = (32, 48);

    /// One decision as the replay needs it: request id, chosen slot, chain, time.
    type Routed = (RequestId, u32, Vec<BlockHash>, u64);

    /// Routes `prompt` at `round` ms and records the decision.
    fn route_at(r: &Router, prompt: &[u32], round: u32) -> Routed {
        let now = f64::from(round) / 1000.0;
        let d = r
            .route(&RouteRequest {
                now: Some(now),
                ..RouteRequest::new(Prompt::Tokens(prompt))
            })
            .unwrap();
        (d.request_id, d.instance.0, r.hash_tokens(prompt, None), to_ms(now))
    }

    /// Where `router`'s index and the single-threaded `replay` differ: counts, and each holder's
    /// blocks in eviction order.
    fn differences(router: &KvIndex, replay: &KvIndex) -> Vec<String> {
        let (a, b) = (router.stats(), replay.stats());
        let mut out = Vec::new();
        for (what, x, y) in [
            ("entries", a.entries, b.entries),
            ("global blocks", a.global_blocks, b.global_blocks),
            ("evictions", a.evictions as usize, b.evictions as usize),
        ] {
            if x != y {
                out.push(format!("{what}: {x} vs {y}"));
            }
        }
        let holders = (0..INSTANCES as u32).map(Holder::Instance).chain([Holder::Global]);
        for holder in holders {
            if router.lru_order(holder) != replay.lru_order(holder) {
                out.push(format!("{holder:?}'s blocks or their order"));
            }
        }
        out
    }

    /// The replay: each decision's insert on route, in the order the router applied them (its
    /// test-only log), on a fresh index.
    fn replay(decisions: &[Routed], (local, global): (u64, u64)) -> KvIndex {
        let mut ix = KvIndex::new(IndexLimits {
            local_capacity: local,
            global_capacity: global,
            local_ttl_ms: None,
        });
        for slot in 0..INSTANCES as u32 {
            ix.add_slot(slot);
        }
        for (_, slot, chain, now_ms) in decisions {
            ix.touch_routed(*slot, chain, *now_ms);
        }
        ix
    }

    /// Concurrent routes of one chain from several threads, each round's walks all before its
    /// decisions, each request kept in flight for a few rounds; then one last request alone.
    /// The chain: an 8-block prefix, then one of `tails` tails of 4–8 blocks. With one tail
    /// every thread routes the very same chain (most index writes are renewals in place);
    /// with 16, more blocks than the holders keep, so that walks find entries that
    /// concurrent inserts evict and free; with 6 and `ROOMY` capacities, instances hold
    /// several chains, and routes re-front in place the one they hold but not as their newest.
    /// `caps`: the local and global capacities; `broken_refront`: the index's broken variant
    /// of the write in place, for a negative control. Returns the router, its decisions in the order
    /// their index writes were applied, and how many of those were in place.
    fn route_one_chain_concurrently(
        tails: u32,
        (local, global): (u64, u64),
        broken_refront: bool,
    ) -> (Router, Vec<Routed>, usize) {
        let config = RouterConfig {
            local_capacity_blocks: local,
            global_capacity_blocks: global,
            ..RouterConfig::default()
        };
        let mut r = Router::new(&names(INSTANCES), PolicyKind::Smetric, 4, 3, config).unwrap();
        r.index.get_mut().refront_skips_global = broken_refront;
        // Every round's walks all precede its decisions.
        let after_walk = Arc::new(Barrier::new(THREADS));
        r.after_walk = Some(Arc::clone(&after_walk));
        let prefix: Vec<u32> = (0..32).collect();
        let barrier = Barrier::new(THREADS);
        let mut decisions: Vec<Routed> = thread::scope(|s| {
            let threads: Vec<_> = (0..THREADS as u32)
                .map(|t| {
                    let (r, prefix, barrier, after_walk) = (&r, &prefix, &barrier, &*after_walk);
                    s.spawn(move || {
                        let _member = Member(&[barrier, after_walk]);
                        let (mut routed, mut in_flight) = (Vec::new(), Vec::new());
                        for round in 0..ROUNDS as u32 {
                            let tail = (t * 7 + round * 3) % tails;
                            let mut prompt = prefix.clone();
                            prompt.extend((0..4 * (4 + tail % 5)).map(|i| 1_000 * (tail + 1) + i));
                            barrier.wait();
                            let d = route_at(r, &prompt, round);
                            r.on_prefilled(d.0);
                            in_flight.push(d.0);
                            if in_flight.len() > 3 {
                                r.on_finished(in_flight.remove(0), 4);
                            }
                            routed.push(d);
                        }
                        for id in in_flight {
                            r.on_finished(id, 4);
                        }
                        routed
                    })
                })
                .collect();
            threads.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        // One last request with a tail of its own, for the negative control.
        r.after_walk = None;
        let mut last = prefix;
        last.extend(90_000..90_008);
        let d = route_at(&r, &last, ROUNDS as u32);
        r.on_finished(d.0, 0);
        decisions.push(d);
        let log = r.write_order.lock().clone();
        let order: std::collections::HashMap<RequestId, usize> =
            log.iter().enumerate().map(|(i, &(id, _))| (id, i)).collect();
        assert_eq!(order.len(), decisions.len(), "every decision wrote the index once");
        decisions.sort_by_key(|d| order[&d.0]);
        let in_place = log.iter().filter(|(_, in_place)| *in_place).count();
        (r, decisions, in_place)
    }

    /// What must hold after concurrent routes of one chain, against a single-threaded replay
    /// of the same decisions: the index is consistent and equal to the replay's, block for
    /// block and in eviction order (no insert lost, none applied to entries freed since its
    /// walk); the load board and the in-flight table are back to zero.
    #[test]
    fn concurrent_routes_of_one_chain_match_a_serial_replay() {
        let (mut stale, mut in_place, mut exclusive, mut queued, mut refronts) = (0, 0, 0, 0, 0);
        for (tails, caps) in [(1, SMALL), (16, SMALL), (6, ROOMY)] {
            let (r, decisions, renewed) = route_one_chain_concurrently(tails, caps, false);
            queued += r.deferred_total.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(decisions.len(), THREADS * ROUNDS + 1);
            let index = r.write_index();
            index.assert_consistent();
            assert_eq!(
                differences(&index, &replay(&decisions, caps)),
                Vec::<String>::new(),
                "{tails} tails"
            );
            stale += index.stale_walks;
            refronts += index.refronts.load(std::sync::atomic::Ordering::Relaxed);
            (in_place, exclusive) = (in_place + renewed, exclusive + decisions.len() - renewed);
            drop(index);
            let stats = r.stats();
            assert_eq!((stats.routed, stats.in_flight), ((THREADS * ROUNDS + 1) as u64, 0));
            for name in r.instances() {
                let l = r.load(&name).unwrap();
                assert_eq!(
                    (l.bs, l.waiting, l.queued, l.queued_work, l.active),
                    (0, 0, 0, 0, 0),
                    "{name}"
                );
            }
        }
        // What the runs went through: writes in place (under the shared lock), writes under
        // the exclusive lock, and walks whose ids were freed (and mostly reused) before their
        // write, which must find the chain again (the broken variant that trusts them is
        // caught by the index's own `a_stale_walk_is_not_trusted_and_the_checks_catch_one_that_is`).
        assert!(
            in_place > 0 && exclusive > 0,
            "{in_place} in place, {exclusive} exclusive"
        );
        assert!(stale > 0, "some walks went stale before their write");
        // Some writes in place made the chain a new run under the shared lock (the holders
        // held it whole, not newest), beside other threads' walks and re-fronts.
        assert!(refronts > 0, "some writes in place re-fronted a chain");
        // Decisions that found the index held queued their writes (`index_lock.rs`), and the
        // replay still matches: queued writes are applied in the order recorded.
        assert!(queued > 0, "some writes were handed over");
    }

    /// Negative control: the same comparison against a replay that lost one insert (the last
    /// decision's, whose tail no other request has) must fail.
    #[test]
    fn the_replay_comparison_catches_a_lost_insert() {
        let (r, mut decisions, _) = route_one_chain_concurrently(16, SMALL, false);
        decisions.pop();
        let index = r.write_index();
        assert!(!differences(&index, &replay(&decisions, SMALL)).is_empty());
    }

    /// Negative control of the writes in place: with the broken re-front that forgets the
    /// global tier's order, the concurrent run's index must differ from the replay.
    #[test]
    fn the_replay_comparison_catches_a_broken_refront() {
        let (r, decisions, _) = route_one_chain_concurrently(6, ROOMY, true);
        let index = r.write_index();
        assert!(!differences(&index, &replay(&decisions, ROOMY)).is_empty());
    }

    /// Each thread runs its own agent session, turn after turn; the sessions' follow-ups must
    /// find their own earlier turns at home, whatever the other threads hash at the same time
    /// (every thread hashes into its own chain buffer, outside the index lock).
    #[test]
    fn concurrent_sessions_find_their_own_history() {
        // The v2 gate without the load comparison: the sessions are tiny against the drain
        // rate, so every follow-up meets its budget at home and must stay there. (The default's
        // `fetch` comparison rightly moves a follow-up whose home holds another thread's request
        // while an instance is idle, since the router's global tier holds its prefix.)
        let config = RouterConfig {
            smetric_migration: crate::config::MigrationRule::Threshold,
            ..RouterConfig::default()
        };
        let r = Router::new(&names(INSTANCES), PolicyKind::Smetric, 4, 3, config).unwrap();
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for t in 0..THREADS as u32 {
                let (r, barrier) = (&r, &barrier);
                s.spawn(move || {
                    let _member = Member(&[barrier]);
                    let mut prompt: Vec<u32> = (0..40).map(|i| 1_000_000 * (t + 1) + i).collect();
                    let mut home = None;
                    for turn in 1..=50u32 {
                        barrier.wait();
                        let d = r
                            .route(&RouteRequest {
                                turn: TurnHint::Turn(turn),
                                ..RouteRequest::new(Prompt::Tokens(&prompt))
                            })
                            .unwrap();
                        assert_eq!(d.num_tokens, prompt.len() as u64);
                        if let Some((instance, previous_len)) = home {
                            assert_eq!(d.instance, instance, "thread {t} turn {turn} goes home");
                            assert_eq!(d.local_hit_tokens, previous_len / 4 * 4, "thread {t} turn {turn}");
                        }
                        r.on_finished(d.request_id, 8);
                        home = Some((d.instance, prompt.len() as u64));
                        prompt.extend((0..8 + t).map(|i| 7 * turn + i + 1_000_000 * (t + 1)));
                    }
                });
            }
        });
        let stats = r.stats();
        assert_eq!(stats.routed, (THREADS * 50) as u64);
        assert_eq!(stats.in_flight, 0);
        assert_eq!(stats.output_tokens, (THREADS * 50 * 8) as u64);
    }
}

#[test]
fn exclude_skips_named_instances_and_fails_when_none_is_left() {
    let r = Router::new(&names(3), PolicyKind::Smetric, 4, 1, RouterConfig::default()).unwrap();
    let turn1: Vec<u32> = (0..40).collect();
    let home = r.route(&RouteRequest::new(Prompt::Tokens(&turn1))).unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(100..140);
    let excluded = [&*home.instance_name];
    let retry = r
        .route(&RouteRequest {
            exclude: &excluded,
            ..RouteRequest::new(Prompt::Tokens(&turn2))
        })
        .unwrap();
    assert_ne!(retry.instance, home.instance, "the failed home is not chosen again");
    assert_eq!(retry.local_hit_tokens, 0);
    let all = ["i0", "i1", "i2", "gone"];
    let err = r
        .route(&RouteRequest {
            exclude: &all,
            ..RouteRequest::new(Prompt::Tokens(&turn2))
        })
        .unwrap_err();
    assert_eq!(err, SmetricError::NoInstances);
    assert_eq!(r.stats().routed, 2, "a failed call is not counted");
}

/// Docs §2.7 through the router: in exact mode, back-to-back turns that all beat their
/// predecessors' KV events stay home with their predecessor's whole prompt as the hit, the
/// turn inferred from the index; without sent blocks the second turn is taken for evicted.
#[test]
fn exact_mode_follow_ups_that_beat_the_events_stay_home() {
    let exact = |ttl: f64| {
        let config = RouterConfig {
            index_mode: IndexMode::Exact,
            exact_pending_ttl_s: ttl,
            ..RouterConfig::default()
        };
        Router::new(&names(4), PolicyKind::Smetric, 4, 1, config).unwrap()
    };
    let route = |r: &Router, tokens: &[u32], now: f64| {
        r.route(&RouteRequest {
            now: Some(now),
            ..RouteRequest::new(Prompt::Tokens(tokens))
        })
        .unwrap()
    };
    let r = exact(2.0);
    let mut prompt: Vec<u32> = (0..40).collect();
    let first = route(&r, &prompt, 0.0);
    assert!(first.first_turn);
    for turn in 1..6u32 {
        let sent = prompt.len() as u64;
        prompt.extend((0..12).map(|t| 1_000 * turn + t));
        let d = route(&r, &prompt, 0.001 * f64::from(turn));
        assert!(!d.first_turn, "turn {turn}: inferred from the sent blocks");
        assert_eq!(d.instance, first.instance, "turn {turn}");
        assert_eq!(d.local_hit_tokens, sent, "turn {turn}");
        assert_eq!(d.reason, Reason::Sticky, "turn {turn}");
    }
    // The events arrive: confirmed blocks leave the sent set, the hit is the same.
    let chain = r.hash_tokens(&prompt, None);
    let home = first.instance_name.clone();
    let ops = [IndexOp::Store {
        tier: Tier::Local,
        hashes: &chain,
        parent: None,
    }];
    r.apply_blocks(Some(&home), &ops, Some(0.01)).unwrap();
    assert_eq!(r.stats().index.pending_blocks.iter().sum::<usize>(), 0);
    let hits = r.query(Prompt::Tokens(&prompt), None, Some(0.02)).unwrap();
    // The whole prompt is cached, in whole blocks: vLLM serves the blocks within its first
    // n − 1 tokens, one block less than the prompt.
    let whole_blocks_before_the_last_token = (prompt.len() as u64 - 1) / 4 * 4;
    assert_eq!(whole_blocks_before_the_last_token, prompt.len() as u64 - 4);
    assert!(
        hits.local
            .iter()
            .any(|(n, t)| *n == home && *t == whole_blocks_before_the_last_token)
    );

    // Sent blocks off: the same second turn finds nothing at home.
    let blind = exact(0.0);
    route(&blind, &prompt[..40], 0.0);
    let d = blind
        .route(&RouteRequest {
            now: Some(0.001),
            turn: TurnHint::Turn(2),
            ..RouteRequest::new(Prompt::Tokens(&prompt[..52]))
        })
        .unwrap();
    assert_eq!((d.local_hit_tokens, d.reason), (0, Reason::MigrateEvicted));
}

#[test]
fn exact_mode_credits_the_answer_a_back_to_back_follow_up_repeats() {
    // The July rule (v1): its evicted follow-up goes to the least-loaded score, which prefers
    // the home's hit on an idle fleet, so the local hit of the pick shows what the index credits
    // (v2's pick on an idle fleet is any instance: every score is 0).
    let exact = |answers: bool| {
        let config = RouterConfig {
            index_mode: IndexMode::Exact,
            exact_answer_credit: answers,
            ..RouterConfig::V1
        };
        Router::new(&names(4), PolicyKind::Smetric, 4, 1, config).unwrap()
    };
    let route = |r: &Router, tokens: &[u32], now: f64| {
        r.route(&RouteRequest {
            now: Some(now),
            turn: TurnHint::Turn(2),
            ..RouteRequest::new(Prompt::Tokens(tokens))
        })
        .unwrap()
    };
    // A short prompt (8 tokens, 2 blocks), a long answer (40 tokens): vLLM caches the KV of
    // 8 + 40 - 1 tokens, 11 full blocks (44 tokens); the follow-up repeats both and adds 8.
    let prompt: Vec<u32> = (0..8).collect();
    let mut follow_up = prompt.clone();
    follow_up.extend(100..140);
    follow_up.extend(200..208);
    for (answers, hit, reason) in [(true, 44, Reason::Sticky), (false, 8, Reason::MigrateEvicted)] {
        let r = exact(answers);
        let first = route(&r, &prompt, 0.0);
        assert!(r.on_finished_at(first.request_id, 40, Some(0.5)).unwrap());
        // Routed right after the answer, before any KV event.
        let d = route(&r, &follow_up, 0.501);
        assert_eq!((d.local_hit_tokens, d.reason), (hit, reason), "answer credit {answers}");
        if answers {
            assert_eq!(d.instance, first.instance);
        }
    }
    // No output, an unknown request, an aborted one: no credit; a bad clock: an error.
    let r = exact(true);
    let first = route(&r, &prompt, 0.0);
    assert!(r.on_finished_at(first.request_id, 40, Some(-1.0)).is_err());
    assert!(r.on_aborted(first.request_id));
    assert!(!r.on_finished_at(first.request_id, 40, Some(0.5)).unwrap());
    assert_eq!(route(&r, &follow_up, 0.6).local_hit_tokens, 8);
    assert_eq!(r.stats().index.answer_credits.iter().sum::<usize>(), 0);
    // Approximate mode credits nothing (it never learns the answer's blocks, docs §2.7).
    let approx = Router::new(&names(4), PolicyKind::Smetric, 4, 1, RouterConfig::V1).unwrap();
    let first = route(&approx, &prompt, 0.0);
    approx.on_finished_at(first.request_id, 40, Some(0.5)).unwrap();
    assert_eq!(route(&approx, &follow_up, 0.501).local_hit_tokens, 8);
}

/// `smetric` v2's queued work: charged at route, released once at the first token, and
/// released (without a rate sample) by an abort before it; an excluded instance is never
/// charged; a retry after an abort leaves exactly the retry's charge.
#[test]
fn queued_work_is_exact_under_retries_aborts_and_exclude() {
    let r = Router::new(&names(2), PolicyKind::Smetric, 16, 0, RouterConfig::PAPER).unwrap();
    let hashes: Vec<BlockHash> = (1..=100).map(BlockHash).collect();
    let route = |now: f64, exclude: &[&str]| {
        r.route(&RouteRequest {
            now: Some(now),
            exclude,
            ..RouteRequest::new(Prompt::Hashes {
                hashes: &hashes,
                num_tokens: None,
            })
        })
        .unwrap()
    };
    let first = route(0.0, &["i1"]);
    assert_eq!(&*first.instance_name, "i0");
    let work = crate::policy::prefill_work(1600, 1600, r.config().smetric_l_eq_tokens);
    assert_eq!(r.load("i0").unwrap().queued_work, work);
    assert_eq!(r.load("i1").unwrap().queued_work, 0, "excluded: never charged");
    // The attempt fails; the proxy aborts it and retries elsewhere.
    assert!(r.on_aborted(first.request_id));
    assert!(!r.on_aborted(first.request_id));
    let retry = route(0.5, &["i0"]);
    assert_eq!(&*retry.instance_name, "i1");
    assert_eq!(r.load("i0").unwrap().queued_work, 0);
    let retry_work = r.load("i1").unwrap().queued_work;
    assert!(retry_work > 0);
    assert!(r.on_prefilled_at(retry.request_id, Some(1.0)).unwrap());
    assert!(!r.on_prefilled_at(retry.request_id, Some(2.0)).unwrap(), "once");
    assert_eq!(r.load("i1").unwrap().queued_work, 0);
    assert!(r.on_finished(retry.request_id, 3));
    assert!(matches!(
        r.on_prefilled_at(retry.request_id, Some(f64::NAN)),
        Err(SmetricError::InvalidArgument { argument: "now", .. })
    ));
}

/// The drain rate is learned from the lifecycle's timing: pairs of requests queued behind
/// each other on one instance that drains a known 25,000 work/s give that rate (to the
/// millisecond clock), and the decisions read it (the fallback until
/// `smetric_drain_min_samples` samples came in).
#[test]
fn drain_rate_is_learned_from_first_token_timing() {
    const RATE: f64 = 25_000.0;
    let cfg = RouterConfig {
        smetric_drain_min_samples: 4,
        ..RouterConfig::PAPER
    };
    let l_eq = cfg.smetric_l_eq_tokens;
    let r = Router::new(&names(1), PolicyKind::Smetric, 16, 0, cfg).unwrap();
    let mut ids = 0u64;
    for k in 0..6 {
        let t = f64::from(k) * 0.5;
        // Two requests routed at `t`: the second queues behind the first (its work ahead).
        let mut routed = Vec::new();
        for _ in 0..2 {
            ids += 1;
            let hashes: Vec<BlockHash> = (0..200).map(|b| BlockHash(1000 * ids + b)).collect();
            let d = r
                .route(&RouteRequest {
                    now: Some(t),
                    ..RouteRequest::new(Prompt::Hashes {
                        hashes: &hashes,
                        num_tokens: None,
                    })
                })
                .unwrap();
            routed.push(d);
        }
        assert_eq!(r.load("i0").unwrap().drain_rate.is_some(), k >= 2);
        let mut drained_at = t;
        for d in routed {
            drained_at += crate::policy::prefill_work(d.prefill_tokens, d.num_tokens, l_eq) as f64 / RATE;
            assert!(r.on_prefilled_at(d.request_id, Some(drained_at)).unwrap());
        }
    }
    let learned = r.load("i0").unwrap().drain_rate.unwrap();
    assert!((learned / RATE - 1.0).abs() < 0.01, "learned {learned}");
    assert_eq!(r.load("i0").unwrap().queued_work, 0);
}

/// `preble`: each decision charges its instance's window (`recent_load.rs`), explore reads the
/// windows' costs, and an entry leaves `preble_window_s` after its routing.
#[test]
fn preble_windows_charge_the_chosen_instance_and_age_out() {
    let config = RouterConfig {
        preble_window_s: 10.0,
        ..RouterConfig::default()
    };
    let router = Router::new(&names(2), PolicyKind::Preble, 4, 0, config).unwrap();
    let route = |tokens: &[u32], now: f64| {
        router
            .route(&RouteRequest {
                now: Some(now),
                ..RouteRequest::new(Prompt::Tokens(tokens))
            })
            .unwrap()
    };
    // Two cold prompts explore: the second goes where the first did not (a charged window).
    let first = route(&(0..40).collect::<Vec<u32>>(), 0.0);
    let second = route(&(100..140).collect::<Vec<u32>>(), 1.0);
    assert_eq!(
        (first.reason, second.reason),
        (Reason::PrebleExplore, Reason::PrebleExplore)
    );
    assert_ne!(first.instance, second.instance);
    // A follow-up of the first (40 of 48 tokens held, > half) exploits its instance.
    let follow: Vec<u32> = (0..48).collect();
    let follow_up = route(&follow, 2.0);
    assert_eq!(
        (follow_up.instance, follow_up.reason),
        (first.instance, Reason::PrebleExploit)
    );
    // Just before 10.0 the first's window holds two entries (≈ 6.81 s + 6.75 s), the second's
    // one (≈ 6.81 s).
    let third = route(&(200..240).collect::<Vec<u32>>(), 9.999);
    assert_eq!(
        (third.instance, third.reason),
        (second.instance, Reason::PrebleExplore),
        "2 entries cost more than 1"
    );
    // At 11.0 the entries of 0.0 and 1.0 are out: the first's window holds the follow-up (8 new
    // tokens, ≈ 6.75 s), the second's the cold prompt of 9.999 (40 new tokens, ≈ 6.81 s).
    let fourth = route(&(300..340).collect::<Vec<u32>>(), 11.0);
    assert_eq!(
        (fourth.instance, fourth.reason),
        (first.instance, Reason::PrebleExplore)
    );
}

/// `previous_instance` names the candidate `llmd_session_affinity` favours; a name that is not a
/// candidate (unknown, or excluded) favours none.
#[test]
fn previous_instance_reaches_the_session_affinity_policy() {
    let r = Router::new(
        &names(3),
        PolicyKind::LlmdSessionAffinity,
        4,
        0,
        RouterConfig::default(),
    )
    .unwrap();
    let prompt: Vec<u32> = (0..8).collect();
    let route = |previous: Option<&str>, exclude: &[&str]| {
        r.route(&RouteRequest {
            now: Some(0.0),
            previous_instance: previous,
            exclude,
            ..RouteRequest::new(Prompt::Tokens(&prompt))
        })
        .unwrap()
    };
    // Idle fleet: the previous instance scores 2, every other 1.
    let d = route(Some("i2"), &[]);
    assert_eq!((&*d.instance_name, d.reason), ("i2", Reason::LlmdSessionAffinity));
    // i2 now has the only request: 1 + 0 for it, 0 + 1 for the idle ones: a tie of three.
    let draws = r.stats().draws;
    let _ = route(Some("i2"), &[]);
    assert_eq!(r.stats().draws, draws + 1, "a tie is drawn");
    // With i2 excluded, the named instance is no candidate: the least busy idle one wins.
    let e = route(Some("i2"), &["i2"]);
    assert_ne!(&*e.instance_name, "i2");
    // An unknown name is no candidate either: the call succeeds as without one.
    let u = route(Some("nope"), &[]);
    assert_eq!(u.reason, Reason::LlmdSessionAffinity);
}

/// `session_key` is what the hash policies hash: a session keeps its instance whatever its
/// prompt, load or fleet slot order; without one the prompt is the key, so the same prompt
/// lands on the same instance and a different one may not.
#[test]
fn session_key_reaches_the_hash_policies() {
    for kind in [PolicyKind::ConsistentHash, PolicyKind::RendezvousHash] {
        let r = Router::new(&names(4), kind, 4, 0, RouterConfig::default()).unwrap();
        let route = |prompt: &[u32], key: Option<u64>| {
            r.route(&RouteRequest {
                now: Some(0.0),
                session_key: key,
                ..RouteRequest::new(Prompt::Tokens(prompt))
            })
            .unwrap()
            .instance_name
        };
        for key in 0..20u64 {
            let at = route(&[1, 2, 3, 4], Some(key));
            let grown: Vec<u32> = (0..(8 + key as u32)).collect();
            assert_eq!(route(&grown, Some(key)), at, "{kind:?}: the session sticks");
        }
        let spread: std::collections::HashSet<_> = (0..40u64).map(|k| route(&[9], Some(k))).collect();
        assert_eq!(spread.len(), 4, "{kind:?}: sessions spread");
        let prompt: Vec<u32> = (0..10).collect();
        assert_eq!(
            route(&prompt, None),
            route(&prompt, None),
            "{kind:?}: the prompt is the key"
        );
        // A router whose fleet lists the same names in another order agrees: names, not slots.
        let mut reversed = names(4);
        reversed.reverse();
        let q = Router::new(&reversed, kind, 4, 0, RouterConfig::default()).unwrap();
        for key in 0..20u64 {
            let d = q
                .route(&RouteRequest {
                    now: Some(0.0),
                    session_key: Some(key),
                    ..RouteRequest::new(Prompt::Tokens(&[7]))
                })
                .unwrap();
            assert_eq!(d.instance_name, route(&[7], Some(key)));
        }
    }
}

/// Handing writes over (`index_lock.rs`): `prompt(k)` is 64 tokens (16 blocks) of its own.
fn handed_over_prompt(k: u32) -> Vec<u32> {
    (0..64).map(|t| k * 1_000 + t).collect()
}

/// The index as `stats()` sees it: entries, blocks per instance, global blocks.
fn index_shape(r: &Router) -> (usize, Vec<usize>, usize) {
    let s = r.stats().index;
    (s.entries, s.local_blocks, s.global_blocks)
}

/// A decision that finds the index held by a walker hands its write over; the write is applied
/// before the next read that finds the index free, and the index then equals the sequential
/// router's. Negative control: while the walker holds it, the write is not there.
#[test]
fn a_write_found_busy_is_queued_then_applied_before_the_next_free_read() {
    let r = Router::new(&names(4), PolicyKind::LeastLoad, 4, 0, RouterConfig::default()).unwrap();
    let sequential = Router::new(&names(4), PolicyKind::LeastLoad, 4, 0, RouterConfig::default()).unwrap();
    let prompt = handed_over_prompt(1);
    let walker = r.index.read();
    let d = r.route(&RouteRequest::new(Prompt::Tokens(&prompt))).unwrap();
    assert_eq!(r.deferred_count.load(std::sync::atomic::Ordering::Acquire), 1);
    assert_eq!(walker.stats().entries, 0, "the queued write is not applied yet");
    drop(walker);
    let s = sequential.route(&RouteRequest::new(Prompt::Tokens(&prompt))).unwrap();
    assert_eq!(d.instance, s.instance);
    assert_eq!(index_shape(&r), index_shape(&sequential));
    assert_eq!(r.deferred_count.load(std::sync::atomic::Ordering::Acquire), 0);
    assert!(index_shape(&r).0 > 0);
}

/// At most `MAX_DEFERRED` writes wait: the next decision waits for the lock (it cannot finish
/// while a walker holds the index), then applies every queued write and its own, in order.
/// (The queue fills from one thread here with the one-write-per-thread rule off; with it, only
/// as many threads fill it.)
#[test]
fn a_full_queue_makes_the_next_decision_wait_and_apply_them_all() {
    use super::index_lock::MAX_DEFERRED;
    let mut r = Router::new(&names(4), PolicyKind::LeastLoad, 4, 0, RouterConfig::default()).unwrap();
    r.one_queued_per_thread = false;
    let sequential = Router::new(&names(4), PolicyKind::LeastLoad, 4, 0, RouterConfig::default()).unwrap();
    let prompts: Vec<Vec<u32>> = (0..=MAX_DEFERRED as u32).map(handed_over_prompt).collect();
    let walker = r.index.read();
    for p in &prompts[..MAX_DEFERRED] {
        r.route(&RouteRequest::new(Prompt::Tokens(p))).unwrap();
    }
    assert_eq!(
        r.deferred_count.load(std::sync::atomic::Ordering::Acquire),
        MAX_DEFERRED
    );
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let last = s.spawn(|| {
            r.route(&RouteRequest::new(Prompt::Tokens(&prompts[MAX_DEFERRED])))
                .unwrap();
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !done.load(std::sync::atomic::Ordering::Acquire),
            "the full queue makes it wait"
        );
        drop(walker);
        last.join().unwrap();
    });
    assert_eq!(r.deferred_count.load(std::sync::atomic::Ordering::Acquire), 0);
    for p in &prompts {
        sequential.route(&RouteRequest::new(Prompt::Tokens(p))).unwrap();
    }
    assert_eq!(index_shape(&r), index_shape(&sequential));
    for slot in 0..4 {
        let holder = crate::index::Holder::Instance(slot);
        assert_eq!(
            r.write_index().lru_order(holder),
            sequential.write_index().lru_order(holder)
        );
    }
}

/// One write per thread waits at a time: with the index held by another thread, a route queues
/// its write and returns; the same thread's next route, its first write still waiting, waits for
/// the lock instead — it returns only once the holder let go, having applied both, and nothing
/// more was queued. Negative control: with the rule off, the second route queues too and returns
/// while the index is still held.
#[test]
fn a_thread_has_one_write_waiting_at_a_time() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let run = |rule: bool| -> (bool, bool, u64) {
        let mut r = Router::new(&names(4), PolicyKind::LeastLoad, 4, 0, RouterConfig::default()).unwrap();
        r.one_queued_per_thread = rule;
        let (held, released) = (std::sync::Barrier::new(2), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                let walker = r.index.read();
                held.wait();
                std::thread::sleep(std::time::Duration::from_millis(200));
                released.store(true, Ordering::Release);
                drop(walker);
            });
            held.wait();
            r.route(&RouteRequest::new(Prompt::Tokens(&handed_over_prompt(1))))
                .unwrap();
            let first_returned_while_held = !released.load(Ordering::Acquire);
            r.route(&RouteRequest::new(Prompt::Tokens(&handed_over_prompt(2))))
                .unwrap();
            (
                first_returned_while_held,
                released.load(Ordering::Acquire),
                r.deferred_total.load(Ordering::Relaxed),
            )
        })
    };
    assert_eq!(run(true), (true, true, 1), "the second route waited for the lock");
    assert_eq!(run(false), (true, false, 2), "without the rule it queues");
}

#[test]
fn to_ms_rounds_down_as_the_floor_does() {
    // The conversion truncates instead of calling `floor`: the same for every input a clock,
    // a caller's `now` or a configured duration can be.
    for s in [
        0.0,
        0.000_4,
        0.000_999_9,
        0.001,
        1.234_56,
        5.0,
        1e9,
        f64::MAX,
        f64::INFINITY,
        -0.000_1,
        -3.7,
        f64::NAN,
    ] {
        assert_eq!(to_ms(s), (s * 1000.0).floor() as u64, "{s}");
    }
}

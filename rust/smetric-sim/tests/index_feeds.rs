//! The three ways to feed the router's index (`IndexFeed`): the KV-event feed — vLLM-format
//! batches through the production encoder and ingestor — must end up holding exactly what the
//! oracle holds, and the feeds must differ only in what the router knew when it routed.

use smetric_sim::{
    CorePlacer, GlobalTierConfig, IndexFeed, PolicyKind, SimConfig, SimReport, SyntheticSessions, Workload,
    core_placer, simulate, synthetic_sessions,
};

const B: u32 = 16;

/// 24 closed-loop sessions of 6 turns sharing a 1K-token system prompt; each turn extends
/// the previous one by 1.5K tokens.
fn sessions() -> Workload {
    let shape = SyntheticSessions {
        sessions: 24,
        turns: 6,
        shared_tokens: 1024,
        turn_tokens: 1536,
        output_tokens: 40,
        think_s: 1.0,
    };
    synthetic_sessions(B, shape).unwrap()
}

/// Small pools and a small store, so both evict: every kind of event is exercised.
fn tight(feed: IndexFeed, delay_s: f64) -> SimConfig {
    let base = SimConfig::default();
    SimConfig {
        instances: 4,
        kv_capacity_tokens: Some(24_576),
        max_model_len: Some(16_384),
        session_rate_per_s: 4.0,
        keep_records: true,
        index_feed: feed,
        event_delay_s: delay_s,
        global_tier: GlobalTierConfig {
            capacity_bytes: (40_000.0 * base.profile.kv_bytes_per_token) as u64,
            ..GlobalTierConfig::default()
        },
        ..base
    }
}

fn run_with(config: &SimConfig, w: &Workload, policy: PolicyKind) -> (SimReport, CorePlacer) {
    let mut placer = core_placer(config, w, policy).unwrap();
    let report = simulate(config, w, &mut placer).unwrap();
    (report, placer)
}

fn counter(report: &SimReport, name: &str) -> u64 {
    report
        .feed_counters
        .iter()
        .find(|(n, _)| n == name)
        .map_or_else(|| panic!("no counter {name}: {:?}", report.feed_counters), |&(_, v)| v)
}

/// Per request chain: every instance's local hit and the global hit the router's index reports.
/// Per request: `(instance, local hit tokens)` for every instance, and the global hit tokens.
type IndexView = Vec<(Vec<(std::sync::Arc<str>, u64)>, u64)>;

fn index_view(placer: &mut CorePlacer, w: &Workload) -> IndexView {
    (0..w.len())
        .map(|r| {
            let hits = placer.index_hits(w.chain(r)).unwrap();
            (hits.local, hits.global_hit_tokens)
        })
        .collect()
}

#[test]
fn event_fed_index_ends_equal_to_the_oracle_index() {
    let w = sessions();
    // Round robin ignores the index, so both runs make the same cache changes.
    let (oracle, mut oracle_placer) = run_with(&tight(IndexFeed::Oracle, 0.0), &w, PolicyKind::RoundRobin);
    let (events, mut events_placer) = run_with(&tight(IndexFeed::Events, 0.25), &w, PolicyKind::RoundRobin);
    assert_eq!(oracle.completed, w.len() as u64);
    let placements = |r: &SimReport| r.records.iter().map(|x| x.instance).collect::<Vec<_>>();
    assert_eq!(placements(&oracle), placements(&events));
    assert!(oracle.gpu_evictions > 0 && oracle.tier_evictions > 0, "{oracle:?}");

    let want = index_view(&mut oracle_placer, &w);
    assert_eq!(index_view(&mut events_placer, &w), want);
    assert!(want.iter().any(|(local, _)| local.iter().any(|&(_, t)| t > 0)));
    let stats = |p: &CorePlacer| {
        let s = p.router().stats();
        (s.index.local_blocks, s.index.global_blocks)
    };
    assert_eq!(stats(&events_placer), stats(&oracle_placer));
    assert!(stats(&oracle_placer).1 > 0);

    assert_eq!(events.index_feed, "events");
    assert!(counter(&events, "published_batches") > 100);
    assert_eq!(
        counter(&events, "ingest_batches"),
        counter(&events, "published_batches")
    );
    assert_eq!(counter(&events, "ingest_events"), counter(&events, "published_events"));
    assert_eq!(counter(&events, "ingest_decode_errors"), 0);
    assert_eq!(counter(&events, "ingest_dropped_messages"), 0);
    assert!(counter(&events, "ingest_removed_blocks") > 0);
    assert!(oracle.feed_counters.is_empty());
}

#[test]
fn what_the_router_knew_at_routing_time_orders_the_feeds() {
    let w = sessions();
    let run_feed = |feed, delay| run_with(&tight(feed, delay), &w, PolicyKind::Smetric).0;
    let approximate = run_feed(IndexFeed::Approximate, 0.0);
    let events = run_feed(IndexFeed::Events, 0.01);
    // 30 s late and without the blocks it sent (docs/routing-semantics.md §2.7): the router
    // knows nothing a session did when its next turn comes.
    let mut blind = tight(IndexFeed::Events, 30.0);
    blind.router.exact_pending_ttl_s = 0.0;
    let late = run_with(&blind, &w, PolicyKind::Smetric).0;
    // The same lag with the sent blocks counted (the default).
    let late_sent = run_feed(IndexFeed::Events, 30.0);
    let oracle = run_feed(IndexFeed::Oracle, 0.0);
    for r in [&approximate, &events, &late, &late_sent, &oracle] {
        assert_eq!(r.completed, w.len() as u64, "{}", r.index_feed);
    }
    let over = |r: &SimReport| r.local_hit_overpredicted_share;
    let err = |r: &SimReport| r.local_hit_prediction_error;
    for r in [&approximate, &events, &late, &late_sent, &oracle] {
        eprintln!(
            "{} {}: over {:.3} err {:.3} hit {:.3} tps {:.0} reasons {:?}",
            r.index_feed,
            r.event_delay_s,
            over(r),
            err(r),
            r.local_hit_ratio,
            r.slo[0].tps_under_slo,
            r.reasons
        );
    }
    // The later the router hears of a change, the further its expected hits are from what
    // the engines then serve.
    assert!(err(&oracle) < err(&events), "{} vs {}", err(&oracle), err(&events));
    assert!(err(&events) < err(&late), "{} vs {}", err(&events), err(&late));
    // A router that hears of stores 30 s late sees no follow-up's cache at routing time: told
    // the turn (the default), it knows each follow-up for one and finds its home evicted.
    assert!(late.reasons.iter().all(|(reason, n)| *n == 0
        || reason.starts_with("first-turn")
        || reason == "follow-up: migrate (local KV$ evicted)"));
    assert!(
        late.reasons
            .iter()
            .any(|(reason, n)| *n > 0 && reason.contains("evicted"))
    );
    // Counting what it sent, the late router keeps follow-ups whose predecessor it routed
    // within the bound: fewer taken for evicted, expected hits as close as the oracle's.
    let evicted = |r: &SimReport| {
        r.reasons
            .iter()
            .filter(|(reason, _)| reason.contains("evicted"))
            .map(|&(_, n)| n)
            .sum::<u64>()
    };
    assert!(
        evicted(&late_sent) < evicted(&late),
        "{:?} vs {:?}",
        late_sent.reasons,
        late.reasons
    );
    assert!(err(&late_sent) < err(&late), "{} vs {}", err(&late_sent), err(&late));
    assert!(
        err(&late_sent) <= err(&oracle) + 0.01,
        "{} vs {}",
        err(&late_sent),
        err(&oracle)
    );
    assert_eq!(approximate.index_feed, "approximate");
    assert!(approximate.feed_counters.is_empty());
}

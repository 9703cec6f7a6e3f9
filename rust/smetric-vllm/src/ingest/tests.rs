//! Unit tests of the ingestor against a real `smetric_core::Router` (block size 4, exact mode).

use smetric_core::{IndexMode, PolicyKind, Prompt, Router, RouterConfig};

use super::*;

const B: u32 = 4;

use crate::test_msgpack::Mp;

/// What the tests publish.
enum Ev<'a> {
    Stored {
        hashes: &'a [u64],
        parent: Option<u64>,
        tokens: &'a [u32],
        block_size: u32,
        medium: &'a str,
        lora: Option<&'a str>,
        salt_first: bool,
        group: u64,
    },
    Removed(&'a [u64], &'a str),
    Cleared,
}

fn stored<'a>(hashes: &'a [u64], parent: Option<u64>, tokens: &'a [u32], medium: &'a str) -> Ev<'a> {
    Ev::Stored {
        hashes,
        parent,
        tokens,
        block_size: B,
        medium,
        lora: None,
        salt_first: false,
        group: 0,
    }
}

fn encode_event(e: &Ev<'_>) -> Mp {
    match e {
        Ev::Stored {
            hashes,
            parent,
            tokens,
            block_size,
            medium,
            lora,
            salt_first,
            group,
        } => {
            let mut m = Mp::default()
                .map(9)
                .s("type")
                .s("BlockStored")
                .s("block_hashes")
                .arr(hashes.len());
            for h in *hashes {
                m = m.u(*h);
            }
            m = m.s("parent_block_hash");
            m = match parent {
                Some(p) => m.u(*p),
                None => m.nil(),
            };
            m = m.s("token_ids").arr(tokens.len());
            for t in *tokens {
                m = m.u(u64::from(*t));
            }
            m = m
                .s("block_size")
                .u(u64::from(*block_size))
                .s("medium")
                .s(medium)
                .s("lora_name");
            m = match lora {
                Some(l) => m.s(l),
                None => m.nil(),
            };
            m = m.s("extra_keys").arr(hashes.len());
            for i in 0..hashes.len() {
                m = match (i, salt_first, lora) {
                    (0, true, _) => m.arr(1).s("salt"),
                    (_, _, Some(l)) => m.arr(1).s(l),
                    _ => m.nil(),
                };
            }
            m.s("group_idx").u(*group)
        }
        Ev::Removed(hashes, medium) => {
            let mut m = Mp::default()
                .map(3)
                .s("type")
                .s("BlockRemoved")
                .s("block_hashes")
                .arr(hashes.len());
            for h in *hashes {
                m = m.u(*h);
            }
            m.s("medium").s(medium)
        }
        Ev::Cleared => Mp::default().map(1).s("type").s("AllBlocksCleared"),
    }
}

fn payload(events: &[Ev<'_>], rank: u64) -> Vec<u8> {
    let mut m = Mp::default()
        .arr(3)
        .raw(&[0xcb])
        .raw(&1.5f64.to_be_bytes())
        .arr(events.len());
    for e in events {
        m = m.raw(&encode_event(e).0);
    }
    m.u(rank).0
}

fn msg(seq: u64, events: &[Ev<'_>]) -> Vec<Vec<u8>> {
    vec![b"topic".to_vec(), seq.to_be_bytes().to_vec(), payload(events, 0)]
}

fn router(names: &[&str]) -> Router {
    let config = RouterConfig {
        index_mode: IndexMode::Exact,
        host_capacity_blocks: 1024,
        ..RouterConfig::default()
    };
    let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    Router::new(&names, PolicyKind::Smetric, B, 0, config).unwrap()
}

/// Local prefix hit of `tokens` on `instance`, in blocks, and the global hit in blocks.
fn hits(r: &Router, instance: &str, tokens: &[u32], namespace: Option<&str>) -> (u64, u64) {
    let chain = r.hash_tokens(tokens, namespace);
    let n = Some(chain.len() as u64 * u64::from(B) + 1);
    let h = r
        .query(
            Prompt::Hashes {
                hashes: &chain,
                num_tokens: n,
            },
            None,
            Some(0.0),
        )
        .unwrap();
    let local = h.local.iter().find(|(name, _)| name.as_ref() == instance).unwrap().1;
    (local / u64::from(B), h.global_hit_tokens / u64::from(B))
}

fn local_blocks(r: &Router, instance: &str) -> usize {
    r.stats()
        .local_blocks
        .iter()
        .find(|(n, _)| n.as_ref() == instance)
        .unwrap()
        .1
}

fn toks(start: u32, n: u32) -> Vec<u32> {
    (start..start + n).collect()
}

fn feed(ing: &mut Ingestor, r: &Router, src: SourceId, seq: u64, events: &[Ev<'_>]) -> Step {
    ing.on_message(r, src, &msg(seq, events)).unwrap()
}

#[test]
fn stores_chains_through_parents_and_removes() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let t = toks(100, 12);
    feed(&mut ing, &r, src, 0, &[stored(&[1, 2], None, &t[..8], "GPU")]);
    feed(&mut ing, &r, src, 1, &[stored(&[3], Some(2), &t[8..], "GPU")]);
    assert_eq!(hits(&r, "a", &t, None), (3, 0));
    assert_eq!(local_blocks(&r, "a"), 3);
    feed(
        &mut ing,
        &r,
        src,
        2,
        &[Ev::Removed(&[3], "GPU"), Ev::Removed(&[99], "GPU")],
    );
    assert_eq!(hits(&r, "a", &t, None), (2, 0));
    let s = ing.stats();
    assert_eq!((s.batches, s.events, s.stored_blocks, s.removed_blocks), (3, 4, 3, 1));
    assert_eq!((s.unmapped_hashes, s.mapped_blocks, s.gaps), (1, 2, 0));
}

#[test]
fn media_map_to_tiers_and_placeholders_resolve_through_the_map() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let t = toks(7, 8);
    feed(&mut ing, &r, src, 0, &[stored(&[1, 2], None, &t, "GPU")]);
    let placeholder = Ev::Stored {
        hashes: &[1, 5],
        parent: None,
        tokens: &[],
        block_size: 0,
        medium: "cpu",
        lora: None,
        salt_first: false,
        group: 0,
    };
    feed(
        &mut ing,
        &r,
        src,
        1,
        &[placeholder, stored(&[2], Some(1), &t[4..], "Storage")],
    );
    assert_eq!(hits(&r, "a", &t, None), (2, 2));
    feed(
        &mut ing,
        &r,
        src,
        2,
        &[Ev::Removed(&[2], "STORAGE"), Ev::Removed(&[1], "disk")],
    );
    assert_eq!(hits(&r, "a", &t, None), (2, 1));
    feed(&mut ing, &r, src, 3, &[Ev::Cleared]);
    assert_eq!(hits(&r, "a", &t, None), (0, 1), "a clear drops the GPU tier only");
    let s = ing.stats();
    assert_eq!((s.unmapped_hashes, s.unknown_media, s.cleared), (1, 1, 1));
}

#[test]
fn shared_holders_are_reference_counted() {
    let r = router(&["a", "b"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let (a, b) = (ing.add_source("a", false), ing.add_source("b", false));
    let (a1, a2) = (ing.add_source("x", false), ing.add_source("x", false));
    ing.remove_source(&r, a1).unwrap();
    let rank1 = ing.add_source("a", false);
    let t = toks(0, 4);
    feed(&mut ing, &r, a, 0, &[stored(&[1], None, &t, "CPU")]);
    feed(&mut ing, &r, b, 0, &[stored(&[9], None, &t, "CPU")]);
    feed(&mut ing, &r, a, 1, &[Ev::Removed(&[1], "CPU")]);
    assert_eq!(hits(&r, "a", &t, None).1, 1, "b still holds it in the global tier");
    feed(&mut ing, &r, b, 1, &[Ev::Removed(&[9], "CPU")]);
    assert_eq!(hits(&r, "a", &t, None).1, 0);
    // Two ranks feeding one instance: the instance holds the union.
    feed(&mut ing, &r, a, 2, &[stored(&[1], None, &t, "GPU")]);
    feed(&mut ing, &r, rank1, 0, &[stored(&[1], None, &t, "GPU")]);
    feed(&mut ing, &r, a, 3, &[Ev::Removed(&[1], "GPU")]);
    assert_eq!(hits(&r, "a", &t, None).0, 1);
    ing.remove_source(&r, rank1).unwrap();
    assert_eq!(hits(&r, "a", &t, None).0, 0, "removing a source removes its blocks");
    assert!(ing.on_message(&r, rank1, &msg(0, &[])).is_err());
    assert_eq!(ing.source_stats(a2).unwrap().messages, 0);
    assert_eq!(ing.refs.len(), 0);
}

/// Each instance's host-pool hit, in blocks, by name.
fn host_hits(r: &Router, tokens: &[u32]) -> Vec<(String, u64)> {
    let chain = r.hash_tokens(tokens, None);
    let h = r
        .query(
            Prompt::Hashes {
                hashes: &chain,
                num_tokens: Some(chain.len() as u64 * u64::from(B) + 1),
            },
            None,
            Some(0.0),
        )
        .unwrap();
    h.host.iter().map(|(n, t)| (n.to_string(), t / u64::from(B))).collect()
}

/// A CPU-medium event from a source declared host-local credits only its instance (docs
/// §2.8); the same event from a shared-offload source credits the global tier (the negative
/// control). Removals and a source's removal reach the host pool, reference-counted over the
/// instance's ranks.
#[test]
fn a_host_local_source_credits_its_own_instance_only() {
    let t = toks(0, 8);
    let r = router(&["a", "b"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let a = ing.add_source_with("a", false, Offload::HostLocal);
    let rank1 = ing.add_source_with("a", false, Offload::HostLocal);
    feed(&mut ing, &r, a, 0, &[stored(&[1, 2], None, &t, "CPU")]);
    assert_eq!(hits(&r, "b", &t, None), (0, 0), "nothing reaches the global tier");
    assert_eq!(host_hits(&r, &t), [("a".to_owned(), 2), ("b".to_owned(), 0)]);
    // A second rank of the same instance holds the first block too: one removal keeps it.
    feed(&mut ing, &r, rank1, 0, &[stored(&[1], None, &t[..4], "CPU")]);
    feed(&mut ing, &r, a, 1, &[Ev::Removed(&[1], "CPU")]);
    assert_eq!(host_hits(&r, &t)[0].1, 2, "rank 1 still holds block 1");
    ing.remove_source(&r, rank1).unwrap();
    assert_eq!(host_hits(&r, &t)[0].1, 0, "removing the last holder removes it");
    assert_eq!(ing.refs.len(), 1, "block 2 is still counted for a's host pool");

    // Negative control: the same events from a shared-offload source credit everyone.
    let shared = router(&["a", "b"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let a = ing.add_source("a", false);
    feed(&mut ing, &shared, a, 0, &[stored(&[1, 2], None, &t, "CPU")]);
    assert_eq!(hits(&shared, "b", &t, None), (0, 2));
    assert_eq!(host_hits(&shared, &t), [("a".to_owned(), 0), ("b".to_owned(), 0)]);
}

/// A host-local source whose instance is not in the router writes nothing and counts it.
#[test]
fn a_host_local_source_of_an_unknown_instance_writes_nothing() {
    let t = toks(0, 4);
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let ghost = ing.add_source_with("ghost", false, Offload::HostLocal);
    feed(&mut ing, &r, ghost, 0, &[stored(&[1], None, &t, "CPU")]);
    assert_eq!(host_hits(&r, &t), [("a".to_owned(), 0)]);
    assert_eq!(ing.stats().unknown_instances, 1);
}

#[test]
fn gap_without_replay_resets_and_restart_resets() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let (t, u) = (toks(0, 4), toks(50, 4));
    feed(&mut ing, &r, src, 0, &[stored(&[1], None, &t, "GPU")]);
    let step = feed(&mut ing, &r, src, 5, &[stored(&[2], None, &u, "GPU")]);
    assert_eq!(step, Step::default());
    assert_eq!((hits(&r, "a", &t, None).0, hits(&r, "a", &u, None).0), (0, 1));
    feed(&mut ing, &r, src, 0, &[stored(&[1], None, &t, "GPU")]);
    assert_eq!((hits(&r, "a", &t, None).0, hits(&r, "a", &u, None).0), (1, 0));
    let s = ing.stats();
    assert_eq!((s.gaps, s.resets, s.restarts, s.replays), (1, 2, 1, 0));
}

#[test]
fn gap_with_replay_fills_in_order_in_both_reply_layouts() {
    for old_layout in [false, true] {
        let r = router(&["a"]);
        let mut ing = Ingestor::new(IngestConfig::default());
        let src = ing.add_source("a", true);
        let t = toks(0, 16);
        feed(&mut ing, &r, src, 0, &[stored(&[1], None, &t[..4], "GPU")]);
        let step = feed(&mut ing, &r, src, 3, &[stored(&[4], Some(3), &t[12..], "GPU")]);
        assert_eq!(step.replay_from, Some(1));
        let step = feed(&mut ing, &r, src, 4, &[Ev::Removed(&[4], "GPU")]);
        assert_eq!(step, Step::default(), "held back while replaying");
        assert_eq!(hits(&r, "a", &t, None).0, 1);
        let reply = |seq: u64, events: &[Ev<'_>]| {
            let mut f = vec![
                Vec::new(),
                b"topic".to_vec(),
                seq.to_be_bytes().to_vec(),
                payload(events, 0),
            ];
            if old_layout {
                f.remove(1);
            }
            f
        };
        for (seq, events) in [
            (1, vec![stored(&[2], Some(1), &t[4..8], "GPU")]),
            (2, vec![stored(&[3], Some(2), &t[8..12], "GPU")]),
            (3, vec![stored(&[4], Some(3), &t[12..], "GPU")]),
        ] {
            assert_eq!(
                ing.on_replay_reply(&r, src, &reply(seq, &events)).unwrap(),
                Step::default()
            );
        }
        assert_eq!(hits(&r, "a", &t, None).0, 4);
        let end = if old_layout {
            vec![Vec::new(), END_SEQ.to_be_bytes().to_vec(), Vec::new()]
        } else {
            vec![Vec::new(), Vec::new(), END_SEQ.to_be_bytes().to_vec(), Vec::new()]
        };
        assert!(ing.on_replay_reply(&r, src, &end).unwrap().replay_done);
        assert_eq!(hits(&r, "a", &t, None).0, 3, "the held-back removal applied last");
        let s = ing.stats();
        assert_eq!((s.gaps, s.replays, s.replay_failures, s.resets), (1, 1, 0, 0));
        assert_eq!(s.stale_messages, 1, "seq 3 came both replayed and live");
        // A late reply for the finished replay changes nothing.
        ing.on_replay_reply(&r, src, &reply(2, &[Ev::Cleared])).unwrap();
        assert_eq!(hits(&r, "a", &t, None).0, 3);
    }
}

#[test]
fn replay_that_cannot_fill_the_gap_resets() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", true);
    let (t, u) = (toks(0, 4), toks(40, 4));
    feed(&mut ing, &r, src, 0, &[stored(&[1], None, &t, "GPU")]);
    assert_eq!(
        feed(&mut ing, &r, src, 9, &[stored(&[2], None, &u, "GPU")]).replay_from,
        Some(1)
    );
    // The publisher's buffer starts at 7: batches 1..6 are lost.
    let reply = vec![Vec::new(), Vec::new(), 7u64.to_be_bytes().to_vec(), payload(&[], 0)];
    ing.on_replay_reply(&r, src, &reply).unwrap();
    assert_eq!(hits(&r, "a", &t, None).0, 0, "reset");
    assert!(ing.on_replay_failed(&r, src).unwrap().replay_done);
    assert_eq!(
        hits(&r, "a", &u, None).0,
        1,
        "seq 8 is still missing: reset again, then 9 applied"
    );
    let s = ing.stats();
    assert_eq!((s.replay_failures, s.resets), (2, 2));
    // Timeout with nothing replayed, then an overflow of the held-back buffer.
    let mut ing = Ingestor::new(IngestConfig {
        max_pending_batches: 2,
        ..IngestConfig::default()
    });
    let src = ing.add_source("a", true);
    assert_eq!(
        feed(&mut ing, &r, src, 3, &[]).replay_from,
        Some(0),
        "first message: replay history"
    );
    feed(&mut ing, &r, src, 4, &[]);
    assert!(feed(&mut ing, &r, src, 5, &[]).replay_done);
    assert_eq!(feed(&mut ing, &r, src, 6, &[]), Step::default(), "live again");
    let s = ing.stats();
    assert_eq!((s.replays, s.replay_failures, s.gaps), (1, 1, 0));
}

#[test]
fn late_join_restart_during_replay_and_rank_change() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let t = toks(0, 4);
    feed(&mut ing, &r, src, 41, &[stored(&[1], None, &t, "GPU")]);
    assert_eq!(hits(&r, "a", &t, None).0, 1);
    let other_rank = vec![b"".to_vec(), 42u64.to_be_bytes().to_vec(), payload(&[], 1)];
    ing.on_message(&r, src, &other_rank).unwrap();
    assert_eq!(hits(&r, "a", &t, None).0, 0, "a new rank is a new publisher");
    let s = ing.stats();
    assert_eq!((s.late_joins, s.restarts, s.resets), (1, 1, 1));

    let src = ing.add_source("a", true);
    feed(&mut ing, &r, src, 0, &[]);
    assert_eq!(feed(&mut ing, &r, src, 5, &[]).replay_from, Some(1));
    let step = feed(&mut ing, &r, src, 0, &[stored(&[1], None, &t, "GPU")]);
    assert!(
        step.replay_done,
        "seq went back while replaying: the publisher restarted"
    );
    assert_eq!(hits(&r, "a", &t, None).0, 1);
}

#[test]
fn engine_blocks_of_k_router_blocks_and_unusable_sizes() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let t = toks(0, 24);
    let big = |hashes, parent, tokens| Ev::Stored {
        hashes,
        parent,
        tokens,
        block_size: 2 * B,
        medium: "GPU",
        lora: None,
        salt_first: false,
        group: 0,
    };
    feed(&mut ing, &r, src, 0, &[big(&[1, 2], None, &t[..16])]);
    feed(&mut ing, &r, src, 1, &[big(&[3], Some(2), &t[16..])]);
    assert_eq!(hits(&r, "a", &t, None).0, 6);
    feed(&mut ing, &r, src, 2, &[Ev::Removed(&[2], "GPU")]);
    assert_eq!(
        hits(&r, "a", &t, None).0,
        2,
        "an engine block removes all its router blocks"
    );
    let odd = Ev::Stored {
        hashes: &[7],
        parent: None,
        tokens: &t[..6],
        block_size: 6,
        medium: "GPU",
        lora: None,
        salt_first: false,
        group: 0,
    };
    let short = Ev::Stored {
        hashes: &[8, 9],
        parent: None,
        tokens: &t[..4],
        block_size: B,
        medium: "GPU",
        lora: None,
        salt_first: false,
        group: 0,
    };
    let group1 = Ev::Stored {
        hashes: &[10],
        parent: None,
        tokens: &t[..4],
        block_size: B,
        medium: "GPU",
        lora: None,
        salt_first: false,
        group: 1,
    };
    feed(&mut ing, &r, src, 3, &[odd, short, group1]);
    let s = ing.stats();
    assert_eq!((s.block_size_mismatches, s.malformed_events, s.other_groups), (1, 1, 1));
    assert_eq!(
        local_blocks(&r, "a"),
        4,
        "engine blocks 1 and 3, two router blocks each"
    );
}

#[test]
fn lora_is_the_namespace_and_a_salt_cuts_the_chain() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let t = toks(0, 8);
    let lora = Ev::Stored {
        hashes: &[1, 2],
        parent: None,
        tokens: &t,
        block_size: B,
        medium: "GPU",
        lora: Some("sql"),
        salt_first: false,
        group: 0,
    };
    let salted = Ev::Stored {
        hashes: &[5, 6],
        parent: None,
        tokens: &t,
        block_size: B,
        medium: "CPU",
        lora: None,
        salt_first: true,
        group: 0,
    };
    feed(&mut ing, &r, src, 0, &[lora, salted]);
    assert_eq!(hits(&r, "a", &t, Some("sql")), (2, 0));
    assert_eq!(hits(&r, "a", &t, None), (0, 0), "salted blocks are not plain blocks");
    assert_eq!(ing.stats().unsupported_extra_keys, 1);
}

#[test]
fn bad_input_is_counted_and_never_corrupts() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let ghost = ing.add_source("gone", false);
    let t = toks(0, 4);
    feed(&mut ing, &r, src, 0, &[stored(&[1], None, &t, "GPU")]);
    let mut garbage = msg(1, &[Ev::Cleared]);
    garbage[2].truncate(5);
    let step = ing.on_message(&r, src, &garbage).unwrap();
    assert_eq!(step.error.as_ref().map(DecodeError::kind), Some("truncated"));
    let two_frames = [b"".to_vec(), vec![0; 8]];
    assert!(ing.on_message(&r, src, &two_frames).unwrap().error.is_some());
    let unknown = Mp::default().arr(3).raw(&[0xcb]).raw(&0f64.to_be_bytes()).arr(1);
    let unknown = unknown.map(2).s("type").s("BlockMoved").s("x").u(1).u(0).0;
    ing.on_message(&r, src, &[b"".to_vec(), 2u64.to_be_bytes().to_vec(), unknown])
        .unwrap();
    feed(
        &mut ing,
        &r,
        ghost,
        0,
        &[stored(&[1], None, &t, "GPU"), Ev::Removed(&[1], "GPU")],
    );
    feed(&mut ing, &r, src, 3, &[]);
    let s = ing.stats();
    assert_eq!((s.decode_errors, s.unknown_event_types, s.unknown_instances), (2, 1, 1));
    assert_eq!(s.decode_errors_by_kind["frame_count"], 1);
    assert_eq!((s.gaps, s.resets), (0, 0), "a bad payload consumes its sequence number");
    assert_eq!(hits(&r, "a", &t, None).0, 1);
    r.remove_instance("a").unwrap();
    feed(&mut ing, &r, src, 4, &[Ev::Removed(&[1], "GPU")]);
    assert_eq!(ing.stats().unknown_instances, 2);
}

#[test]
fn map_capacity_bounds_what_is_tracked() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig {
        max_mapped_blocks: 8,
        ..IngestConfig::default()
    });
    let src = ing.add_source("a", false);
    for i in 0..20u32 {
        let t = toks(i * 10, 4);
        feed(
            &mut ing,
            &r,
            src,
            u64::from(i),
            &[stored(&[u64::from(i) + 1], None, &t, "GPU")],
        );
    }
    let s = ing.stats();
    assert!(s.mapped_blocks <= 8 && s.map_evictions >= 12, "{s:?}");
    assert_eq!(
        local_blocks(&r, "a") as u64,
        s.mapped_blocks,
        "evicted entries left the index"
    );
}

#[test]
fn live_messages_lagging_behind_a_replay_are_stale_not_a_restart() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", true);
    let t = toks(0, 24);
    let block = |i: usize| stored_owned(i, &t);
    feed(&mut ing, &r, src, 0, &[block(0)]);
    assert_eq!(feed(&mut ing, &r, src, 2, &[block(2)]).replay_from, Some(1));
    // The replay already carries batches the SUB has not delivered yet.
    for seq in 1..=4u64 {
        let reply = vec![
            Vec::new(),
            Vec::new(),
            seq.to_be_bytes().to_vec(),
            payload(&[block(seq as usize)], 0),
        ];
        ing.on_replay_reply(&r, src, &reply).unwrap();
    }
    let end = vec![Vec::new(), Vec::new(), END_SEQ.to_be_bytes().to_vec(), Vec::new()];
    assert!(ing.on_replay_reply(&r, src, &end).unwrap().replay_done);
    feed(&mut ing, &r, src, 3, &[block(3)]);
    feed(&mut ing, &r, src, 4, &[block(4)]);
    feed(&mut ing, &r, src, 5, &[block(5)]);
    assert_eq!(hits(&r, "a", &t, None).0, 6);
    let s = ing.stats();
    assert_eq!((s.restarts, s.resets, s.stale_messages), (0, 0, 3));
}

/// Block `i` of `t` as a `BlockStored` continuing block `i - 1` (engine hash `i + 1`).
fn stored_owned(i: usize, t: &[u32]) -> Ev<'_> {
    const HASHES: [u64; 6] = [1, 2, 3, 4, 5, 6];
    let b = B as usize;
    stored(
        &HASHES[i..=i],
        (i > 0).then(|| HASHES[i - 1]),
        &t[i * b..(i + 1) * b],
        "GPU",
    )
}

/// A sink with only the required methods: it claims every instance exists (the default
/// `has_instance`), so a write to an unknown instance fails inside `apply` (as when the
/// instance leaves the router between the ingestor's check and its write).
struct Optimist<'a>(&'a Router);

impl IndexSink for Optimist<'_> {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }

    fn hash_seed(&self) -> u64 {
        self.0.config().hash_seed
    }

    fn apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Result<(), SinkError> {
        Ok(self.0.apply_blocks(Some(instance), ops, None)?)
    }
}

#[test]
fn a_write_refused_after_the_check_drops_what_the_source_held_there() {
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let ghost = ing.add_source("gone", false);
    let t = toks(0, 8);
    let sink = Optimist(&r);
    let events = [
        stored(&[1], None, &t[..4], "GPU"),
        stored(&[2], Some(1), &t[4..], "CPU"),
    ];
    ing.on_message(&sink, ghost, &msg(0, &events)).unwrap();
    let s = ing.stats();
    assert_eq!((s.unknown_instances, s.sink_errors), (1, 0));
    assert_eq!(
        ing.held_blocks(),
        (0, 1),
        "the local block is forgotten, the global one kept"
    );
    assert_eq!(r.stats().index.global_blocks, 1);
    // Later events about the forgotten block find nothing to remove.
    ing.on_message(&sink, ghost, &msg(1, &[Ev::Removed(&[1], "GPU")]))
        .unwrap();
    assert_eq!(ing.stats().unmapped_hashes, 1);
}

/// A sink that counts the `apply` calls reaching the router; with `busy`, `try_apply` finds
/// the index lock taken (as when a decision holds it) and applies nothing.
struct Counting<'a>(&'a Router, std::cell::Cell<usize>, bool);

impl IndexSink for Counting<'_> {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }

    fn hash_seed(&self) -> u64 {
        self.0.config().hash_seed
    }

    fn has_instance(&self, instance: &str) -> bool {
        IndexSink::has_instance(self.0, instance)
    }

    fn apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Result<(), SinkError> {
        self.1.set(self.1.get() + 1);
        IndexSink::apply(self.0, instance, ops)
    }

    fn try_apply(&self, instance: &str, ops: &[IndexOp<'_>]) -> Option<Result<(), SinkError>> {
        (!self.2).then(|| self.apply(instance, ops))
    }
}

#[test]
fn on_messages_is_on_message_for_each_with_one_write() {
    let t = toks(0, 24);
    let stream: Vec<Vec<Vec<u8>>> = vec![
        msg(0, &[stored_owned(0, &t), stored_owned(1, &t)]),
        msg(1, &[stored_owned(2, &t)]),
        msg(2, &[Ev::Removed(&[3], "GPU"), stored_owned(3, &t)]),
        msg(3, &[Ev::Removed(&[2], "GPU")]),
        msg(5, &[stored_owned(4, &t)]), // a gap: no replay, so the source resets
        msg(6, &[stored_owned(0, &t), stored_owned(1, &t)]),
    ];
    let (one, many) = (router(&["a"]), router(&["a"]));
    let (mut ing_one, mut ing_many) = (
        Ingestor::new(IngestConfig::default()),
        Ingestor::new(IngestConfig::default()),
    );
    let (src_one, src_many) = (ing_one.add_source("a", false), ing_many.add_source("a", false));
    let sink_one = Counting(&one, std::cell::Cell::new(0), false);
    // The index lock busy throughout: every write waits for the end of the call.
    let sink_many = Counting(&many, std::cell::Cell::new(0), true);
    let steps_one: Vec<Step> = stream
        .iter()
        .map(|m| ing_one.on_message(&sink_one, src_one, m).unwrap())
        .collect();
    let steps_many = ing_many.on_messages(&sink_many, src_many, &stream[..4]).unwrap();
    assert_eq!(sink_many.1.get(), 1, "four messages, the lock busy: one write");
    let rest = ing_many.on_messages(&sink_many, src_many, &stream[4..]).unwrap();
    assert_eq!(steps_one, [steps_many, rest].concat());
    assert!(sink_one.1.get() > 4);
    assert_eq!(ing_one.stats(), ing_many.stats());
    assert_eq!(ing_one.held_blocks(), ing_many.held_blocks());
    for n in 1..=t.len() as u32 / B {
        let prefix = &t[..(n * B) as usize];
        assert_eq!(hits(&one, "a", prefix, None), hits(&many, "a", prefix, None));
    }
    assert_eq!(local_blocks(&one, "a"), local_blocks(&many, "a"));
    assert!(ing_many.on_messages(&sink_many, SourceId(9), &stream[..1]).is_err());
}

#[test]
fn on_messages_writes_each_message_when_the_lock_is_free() {
    let t = toks(0, 24);
    let stream: Vec<Vec<Vec<u8>>> = (0..4).map(|i| msg(i as u64, &[stored_owned(i, &t)])).collect();
    let r = router(&["a"]);
    let mut ing = Ingestor::new(IngestConfig::default());
    let src = ing.add_source("a", false);
    let sink = Counting(&r, std::cell::Cell::new(0), false);
    ing.on_messages(&sink, src, &stream).unwrap();
    assert_eq!(
        sink.1.get(),
        4,
        "each message's writes go out as soon as the lock is free"
    );
    assert_eq!(hits(&r, "a", &t[..16], None), (4, 0));
    // Past DEFERRED_WRITES_MAX_BLOCKS queued blocks, the ingestor waits for the lock.
    let long = toks(1_000, (crate::ingest::DEFERRED_WRITES_MAX_BLOCKS as u32 + 8) * B);
    let hashes: Vec<u64> = (100..100 + long.len() as u64 / u64::from(B)).collect();
    let busy = Counting(&r, std::cell::Cell::new(0), true);
    let big = [
        msg(4, &[stored(&hashes, None, &long, "GPU")]),
        msg(5, &[stored_owned(4, &t)]),
    ];
    ing.on_messages(&busy, src, &big).unwrap();
    assert_eq!(
        busy.1.get(),
        2,
        "the big batch forces its write; the last is flushed at the end"
    );
}

//! Host tiers through the router (docs §2.8): a prefix offloaded to an instance's own host
//! memory is credited to that instance alone; a shared pool credits its members; the shared
//! store credits everyone (the negative control of each test).

use std::sync::Arc;

use super::*;
use crate::error::SmetricError;
use crate::ids::BlockHash;
use crate::index::HostPool;
use crate::router::request::{IndexOp, Prompt, RouteRequest, Tier};
use crate::turn::TurnHint;

const B: u32 = 4;

fn router(n: usize, config: RouterConfig) -> Router {
    let names: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
    Router::new(&names, PolicyKind::Smetric, B, 0, config).unwrap()
}

/// The default configuration with host tiers on.
fn hosts() -> RouterConfig {
    RouterConfig {
        host_capacity_blocks: 1024,
        ..RouterConfig::default()
    }
}

fn chain(len: u64) -> Vec<BlockHash> {
    (0..len).map(|k| BlockHash(1000 + k)).collect()
}

/// `(local, host)` hits per instance and the global hit of a 10-block prompt (`n = 41`).
fn hits(r: &Router, c: &[BlockHash]) -> (Vec<u64>, Vec<u64>, u64) {
    let h = r
        .query(
            Prompt::Hashes {
                hashes: c,
                num_tokens: Some(u64::from(B) * c.len() as u64 + 1),
            },
            None,
            Some(0.0),
        )
        .unwrap();
    (
        h.local.iter().map(|(_, t)| *t).collect(),
        h.host.iter().map(|(_, t)| *t).collect(),
        h.global_hit_tokens,
    )
}

#[test]
fn a_host_local_copy_credits_only_its_instance() {
    let c = chain(10);
    let r = router(3, hosts());
    r.store_blocks(Some("i1"), Tier::Host, &c, None, Some(0.0)).unwrap();
    assert_eq!(hits(&r, &c), (vec![0, 0, 0], vec![0, 40, 0], 0));
    // Negative control: the same blocks reported as the shared store's credit everyone.
    let shared = router(3, hosts());
    shared.store_blocks(None, Tier::Global, &c, None, Some(0.0)).unwrap();
    assert_eq!(hits(&shared, &c), (vec![0, 0, 0], vec![0, 0, 0], 40));
    // Removal and clear address the same pool.
    r.remove_blocks(Some("i1"), Tier::Host, &c[5..]).unwrap();
    assert_eq!(hits(&r, &c).1, vec![0, 20, 0]);
    r.clear(Some("i1"), Tier::Host).unwrap();
    assert_eq!(hits(&r, &c).1, vec![0, 0, 0]);
    // A host write names its instance.
    assert!(matches!(
        r.store_blocks(None, Tier::Host, &c, None, None),
        Err(SmetricError::InvalidArgument {
            argument: "instance",
            ..
        })
    ));
    assert!(matches!(
        r.store_blocks(Some("nope"), Tier::Host, &c, None, None),
        Err(SmetricError::UnknownInstance { .. })
    ));
}

#[test]
fn a_shared_pool_credits_its_members_only() {
    let c = chain(10);
    let r = router(4, hosts());
    let node: Arc<str> = Arc::from("node-a");
    for name in ["i0", "i2"] {
        r.set_host_pool(name, &HostPool::Shared(node.clone())).unwrap();
    }
    assert_eq!(r.host_pool("i0").unwrap(), Some(HostPool::Shared(node.clone())));
    assert_eq!(r.host_pool("i1").unwrap(), Some(HostPool::Own));
    r.store_blocks(Some("i2"), Tier::Host, &c[..6], None, Some(0.0))
        .unwrap();
    assert_eq!(hits(&r, &c).1, vec![24, 0, 24, 0]);
    // i0 leaves the pool for its own host memory: the pool's blocks stay with the pool.
    r.set_host_pool("i0", &HostPool::Own).unwrap();
    assert_eq!(hits(&r, &c).1, vec![0, 0, 24, 0]);
    // The last member leaving drops the pool and its blocks; a new member of the same name
    // starts empty.
    r.remove_instance("i2").unwrap();
    r.set_host_pool("i3", &HostPool::Shared(node)).unwrap();
    assert_eq!(hits(&r, &c).1, vec![0, 0, 0]);
}

#[test]
fn batched_ops_reach_the_host_pool() {
    let c = chain(4);
    let r = router(2, hosts());
    let ops = [
        IndexOp::Store {
            tier: Tier::Local,
            hashes: &c[..2],
            parent: None,
        },
        IndexOp::Store {
            tier: Tier::Host,
            hashes: &c,
            parent: None,
        },
    ];
    r.apply_blocks(Some("i1"), &ops, Some(0.0)).unwrap();
    assert_eq!(hits(&r, &c), (vec![0, 8], vec![0, 16], 0));
    assert!(matches!(
        r.apply_blocks(None, &ops, Some(0.0)),
        Err(SmetricError::InvalidArgument { .. })
    ));
}

#[test]
fn host_tiers_off_ignore_host_writes() {
    let c = chain(4);
    let r = router(
        2,
        RouterConfig {
            host_capacity_blocks: 0,
            ..RouterConfig::default()
        },
    );
    r.store_blocks(Some("i0"), Tier::Host, &c, None, Some(0.0)).unwrap();
    assert_eq!(hits(&r, &c).1, vec![0, 0]);
    assert_eq!(r.host_pool("i0").unwrap(), None);
}

#[test]
fn a_host_pool_holds_at_most_its_capacity() {
    let r = router(
        1,
        RouterConfig {
            host_capacity_blocks: 8,
            ..RouterConfig::default()
        },
    );
    let old = chain(6);
    let new: Vec<BlockHash> = (0..6).map(|k| BlockHash(5000 + k)).collect();
    r.store_blocks(Some("i0"), Tier::Host, &old, None, Some(0.0)).unwrap();
    r.store_blocks(Some("i0"), Tier::Host, &new, None, Some(1.0)).unwrap();
    let stats = r.stats();
    assert_eq!(stats.host_blocks, vec![8]);
    // The older chain lost its tail first (vLLM frees tails first): its head still matches.
    assert_eq!(hits(&r, &old).1, vec![8]);
    assert_eq!(hits(&r, &new).1, vec![24]);
}

/// Source pricing: a follow-up whose home's GPU lost the session but whose own host memory
/// kept it stays home (a host load), where without the host tier it is re-placed as evicted.
#[test]
fn a_follow_up_resumes_where_its_host_copy_is() {
    let turn: Vec<u32> = (0..41).collect();
    let c_home = |r: &Router| {
        let chain = r.hash_tokens(&turn, None);
        r.store_blocks(Some("i2"), Tier::Host, &chain, None, Some(0.0)).unwrap();
        r.route(&RouteRequest {
            now: Some(0.0),
            turn: TurnHint::Turn(2),
            ..RouteRequest::new(Prompt::Tokens(&turn))
        })
        .unwrap()
    };
    let cfg = RouterConfig {
        global_capacity_blocks: 0,
        ..hosts()
    };
    for rule in [crate::config::SmetricRule::V1, crate::config::SmetricRule::V2] {
        let r = router(
            4,
            RouterConfig {
                smetric_rule: rule,
                ..cfg.clone()
            },
        );
        let d = c_home(&r);
        assert_eq!(&*d.instance_name, "i2", "{rule:?}");
        assert_eq!((d.local_hit_tokens, d.host_hit_tokens, d.prefill_tokens), (0, 40, 1));
        assert_eq!(d.reason, crate::policy::Reason::Sticky, "{rule:?}");
        // Negative control: the same copy credited nowhere (host tiers off) is an eviction.
        let off = router(
            4,
            RouterConfig {
                smetric_rule: rule,
                host_capacity_blocks: 0,
                ..cfg.clone()
            },
        );
        let d = c_home(&off);
        assert_eq!(d.reason, crate::policy::Reason::MigrateEvicted, "{rule:?}");
        assert_eq!(d.prefill_tokens, 41);
    }
}

/// A prefix only a host pool holds still makes the request a follow-up (turn inference sees
/// the deepest match of every holder).
#[test]
fn a_host_copy_counts_for_turn_inference() {
    let r = router(2, hosts());
    let turn: Vec<u32> = (0..41).collect();
    let chain = r.hash_tokens(&turn, None);
    r.store_blocks(Some("i1"), Tier::Host, &chain, None, Some(0.0)).unwrap();
    let mut longer = turn.clone();
    longer.extend(100..120);
    let d = r
        .route(&RouteRequest {
            now: Some(0.0),
            ..RouteRequest::new(Prompt::Tokens(&longer))
        })
        .unwrap();
    assert!(!d.first_turn);
    assert_eq!(&*d.instance_name, "i1");
}

/// A naive model of the pools (no capacity reached): each pool a set of blocks, each instance
/// in one pool; an instance's host hit is the longest prefix its pool's set holds.
#[derive(Default)]
struct Pools {
    pool_of: std::collections::HashMap<usize, String>,
    blocks: std::collections::HashMap<String, std::collections::HashSet<u64>>,
    next_own: usize,
}

impl Pools {
    fn own(&mut self, i: usize) {
        self.next_own += 1;
        self.join(i, format!("own-{}", self.next_own));
    }
    fn join(&mut self, i: usize, pool: String) {
        if self.pool_of.get(&i) == Some(&pool) {
            return;
        }
        if let Some(old) = self.pool_of.remove(&i)
            && !self.pool_of.values().any(|p| *p == old)
        {
            self.blocks.remove(&old);
        }
        self.pool_of.insert(i, pool);
    }
    fn hit(&self, i: usize, chain: &[u64]) -> u64 {
        let set = self.blocks.get(&self.pool_of[&i]);
        chain.iter().take_while(|h| set.is_some_and(|s| s.contains(h))).count() as u64
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Host stores, removals, pool moves and instances leaving and rejoining, against the
    /// naive model: every instance's host hit agrees after every op.
    #[test]
    fn pools_match_a_naive_model(ops in proptest::collection::vec((0u8..6, 0usize..4, 0u64..6, 1u64..6), 1..120)) {
        let r = router(4, hosts());
        let mut model = Pools::default();
        for i in 0..4 {
            model.own(i);
        }
        let probe: Vec<u64> = (0..8).collect();
        let probe_chain: Vec<BlockHash> = probe.iter().map(|&h| BlockHash(h)).collect();
        for (kind, who, start, len) in ops {
            let name = format!("i{who}");
            let run: Vec<u64> = (start..start + len).collect();
            let chain: Vec<BlockHash> = run.iter().map(|&h| BlockHash(h)).collect();
            match kind {
                0 | 1 => {
                    r.store_blocks(Some(&name), Tier::Host, &chain, None, Some(0.0)).unwrap();
                    let pool = model.pool_of[&who].clone();
                    model.blocks.entry(pool).or_default().extend(run.iter().copied());
                }
                2 => {
                    r.remove_blocks(Some(&name), Tier::Host, &chain).unwrap();
                    if let Some(set) = model.blocks.get_mut(&model.pool_of[&who]) {
                        for h in &run {
                            set.remove(h);
                        }
                    }
                }
                3 => {
                    let pool = format!("node-{}", start % 2);
                    r.set_host_pool(&name, &HostPool::Shared(Arc::from(pool.as_str()))).unwrap();
                    model.join(who, pool);
                }
                4 => {
                    r.set_host_pool(&name, &HostPool::Own).unwrap();
                    model.own(who);
                }
                _ => {
                    r.remove_instance(&name).unwrap();
                    r.add_instance(&name).unwrap();
                    let old = model.pool_of.remove(&who).unwrap();
                    if !model.pool_of.values().any(|p| *p == old) {
                        model.blocks.remove(&old);
                    }
                    model.own(who);
                }
            }
            let h = r
                .query(Prompt::Hashes { hashes: &probe_chain, num_tokens: Some(u64::from(B) * 8 + 1) }, None, Some(0.0))
                .unwrap();
            for (name, tokens) in &h.host {
                let i: usize = name[1..].parse().unwrap();
                proptest::prop_assert_eq!(*tokens, model.hit(i, &probe) * u64::from(B), "instance {}", name);
            }
        }
    }
}

/// Approximate mode with host tiers: a route records the prompt in the chosen instance's host
/// pool too, and only there; without host tiers nothing is recorded in any host pool.
#[test]
fn an_approximate_route_records_the_prompt_in_its_host_pool() {
    let turn: Vec<u32> = (0..41).collect();
    let on = router(3, hosts());
    let d = on
        .route(&RouteRequest {
            now: Some(0.0),
            ..RouteRequest::new(Prompt::Tokens(&turn))
        })
        .unwrap();
    let chain = on.hash_tokens(&turn, None);
    let slot = d.instance.0 as usize;
    let host = hits(&on, &chain).1;
    for (i, t) in host.iter().enumerate() {
        assert_eq!(*t, if i == slot { 40 } else { 0 }, "instance {i}");
    }
    let off = router(3, RouterConfig::default());
    off.route(&RouteRequest {
        now: Some(0.0),
        ..RouteRequest::new(Prompt::Tokens(&turn))
    })
    .unwrap();
    assert_eq!(hits(&off, &chain).1, vec![0, 0, 0]);
}

/// The same prompt routed again to the same instance touches its GPU, global and host-pool
/// holders in place (no exclusive lock), even after another prompt was stored after it (it then
/// re-fronts it: nobody's blocks change); the first route, which adds the blocks, cannot.
#[test]
fn a_repeated_route_renews_the_host_pool_in_place() {
    let r = router(1, hosts());
    let turn: Vec<u32> = (0..41).collect();
    let route = || {
        r.route(&RouteRequest {
            now: Some(0.0),
            turn: TurnHint::Turn(2),
            ..RouteRequest::new(Prompt::Tokens(&turn))
        })
        .unwrap()
    };
    route();
    route();
    let order = r.write_order.lock().clone();
    assert_eq!(
        order.iter().map(|(_, in_place)| *in_place).collect::<Vec<_>>(),
        [false, true]
    );
    let chain = r.hash_tokens(&turn, None);
    assert_eq!(hits(&r, &chain).1, vec![40], "the pool still holds the prompt");
    // Another prompt stored after it: the chain is no longer the pool's newest, but the pool
    // still holds all of it, so the repeat re-fronts it in place.
    let other: Vec<BlockHash> = (0..4).map(|k| BlockHash(9000 + k)).collect();
    r.store_blocks(Some("i0"), Tier::Host, &other, None, Some(0.0)).unwrap();
    route();
    assert_eq!(r.write_order.lock().last().map(|(_, in_place)| *in_place), Some(true));
    // Negative control: the pool lost a block of the chain (its connector evicted it), so the
    // repeat must write it back under the exclusive lock.
    r.remove_blocks(Some("i0"), Tier::Host, &chain[5..6]).unwrap();
    route();
    assert_eq!(r.write_order.lock().last().map(|(_, in_place)| *in_place), Some(false));
    assert_eq!(hits(&r, &chain).1, vec![40], "the pool holds the prompt again");
}

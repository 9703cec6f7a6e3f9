//! The turn a request carries: derived from the trace's sessions, handed to the router by
//! default (`TurnFeed::Request`), withheld with `TurnFeed::Index`, absent for sessionless traces.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use smetric_sim::{
    BailianOptions, PolicyKind, SimConfig, SimReport, SyntheticSessions, TurnFeed, WekaOptions, Workload, load_bailian,
    load_mooncake, load_weka, run, synthetic_sessions,
};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn weka_excerpt() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/smetric/data/weka_excerpt.jsonl.gz")
}

fn turns(w: &Workload) -> Vec<Option<u32>> {
    (0..w.len()).map(|i| w.turn(i)).collect()
}

#[test]
fn session_traces_carry_the_turns_they_record() {
    // Bailian: the `turn` field of bailian_small.jsonl is 1, 1, 2, 3, 2.
    let w = load_bailian(data("bailian_small.jsonl"), &BailianOptions::default()).unwrap();
    assert_eq!(turns(&w), [Some(1), Some(1), Some(2), Some(3), Some(2)]);
    // Weka: every request's derived turn is the `turn` the trace recorded for it.
    let path = weka_excerpt();
    let w = load_weka(&[&path], &WekaOptions::default()).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let recorded: Vec<u32> = BufReader::new(flate2::read::GzDecoder::new(file))
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            u32::try_from(row["turn"].as_u64().unwrap()).unwrap()
        })
        .collect();
    assert_eq!(recorded.len(), w.len());
    assert!(recorded.iter().any(|&t| t > 10), "the excerpt has long sessions");
    let derived: Vec<u32> = turns(&w).into_iter().map(Option::unwrap).collect();
    assert_eq!(derived, recorded);
}

#[test]
fn sessionless_traces_carry_none_and_route_alike_either_way() {
    let w = load_mooncake(data("mooncake_small.jsonl.gz")).unwrap();
    assert!(turns(&w).iter().all(Option::is_none));
    let run_with = |turns| {
        let config = SimConfig {
            turns,
            ..SimConfig::default()
        };
        run(&config, &w, PolicyKind::Smetric).unwrap()
    };
    let (request, index) = (run_with(TurnFeed::Request), run_with(TurnFeed::Index));
    assert_eq!((request.turns.as_str(), index.turns.as_str()), ("request", "index"));
    assert_eq!(
        SimReport {
            turns: String::new(),
            ..request
        },
        SimReport {
            turns: String::new(),
            ..index
        }
    );
}

#[test]
fn the_router_hears_the_turn_unless_told_to_infer_it() {
    let shape = SyntheticSessions {
        sessions: 12,
        turns: 6,
        shared_tokens: 1024,
        turn_tokens: 512,
        output_tokens: 20,
        think_s: 0.5,
    };
    let w = synthetic_sessions(16, shape).unwrap();
    let config = |turns| SimConfig {
        instances: 4,
        session_rate_per_s: 2.0,
        turns,
        ..SimConfig::default()
    };
    let request = run(&config(TurnFeed::Request), &w, PolicyKind::Smetric).unwrap();
    assert_eq!(SimConfig::default().turns, TurnFeed::Request);
    assert_eq!(request.turn_inference_accuracy, Some(1.0), "the hint is the truth");
    assert_eq!(request.turn_inference_samples, w.len() as u64);
    let firsts = |r: &SimReport| -> u64 {
        r.reasons
            .iter()
            .filter(|(reason, _)| reason.starts_with("first-turn"))
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(firsts(&request), u64::from(shape.sessions));
    // Index-only inference is the router's own guess (here it also sees the shared prompt's
    // branches); the run is scored against the same truth.
    let index = run(&config(TurnFeed::Index), &w, PolicyKind::Smetric).unwrap();
    assert_eq!(index.turns, "index");
    assert_eq!(index.turn_inference_samples, w.len() as u64);
}

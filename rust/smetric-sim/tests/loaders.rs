//! Trace loaders on small committed files (`tests/data/`) and on broken inputs written to a
//! temporary directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use smetric_sim::workload::weka::shared_prefix_id;
use smetric_sim::{
    ArrivalKind, BailianOptions, SimConfig, SimError, WekaOptions, load_azure, load_bailian, load_mooncake, load_weka,
    run,
};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn scratch_file(name: &str, content: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smetric-sim-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(content.as_bytes())
        .unwrap();
    path
}

#[test]
fn bailian_sessions_full_blocks_and_ground_truth() {
    let w = load_bailian(data("bailian_small.jsonl"), &BailianOptions::default()).unwrap();
    assert_eq!(w.len(), 5);
    assert_eq!(w.block_tokens(), 16);
    assert_eq!(w.arrival(), ArrivalKind::OpenLoop);
    // 40 tokens: two full blocks, the partial third id is dropped.
    assert_eq!(w.chain(0), &[1, 2]);
    assert_eq!(w.chain(3), &[1, 2, 4, 5, 9]);
    let r = w.requests();
    assert_eq!(r[2].prev, Some(0));
    assert_eq!(r[3].prev, Some(2));
    assert_eq!(r[4].prev, Some(1));
    assert_eq!((r[0].session, r[2].session, r[3].session), (0, 0, 0));
    assert_eq!((r[1].session, r[4].session), (1, 1));
    assert_eq!(r[0].first_turn, Some(true));
    assert_eq!(r[3].first_turn, Some(false));
    assert_eq!(r[3].output_tokens, 1, "a zero output length becomes one token");
    assert_eq!(w.sessions(), 2);
    let gated = load_bailian(data("bailian_small.jsonl"), &BailianOptions { gate_on_parent: true }).unwrap();
    assert_eq!(gated.arrival(), ArrivalKind::GatedOpenLoop);
    let report = run(&SimConfig::default(), &gated, smetric_sim::PolicyKind::Lmetric).unwrap();
    assert_eq!(report.completed, 5);
}

#[test]
fn mooncake_gzip_milliseconds_and_512_token_blocks() {
    let w = load_mooncake(data("mooncake_small.jsonl.gz")).unwrap();
    assert_eq!(w.len(), 3);
    assert_eq!(w.block_tokens(), 512);
    assert_eq!(w.chain(0), &[0, 1]);
    assert_eq!(w.chain(1), &[0, 1]);
    assert_eq!(w.chain(2), &[0]);
    assert!((w.requests()[1].time_s - 0.25).abs() < 1e-12);
    assert!(w.requests().iter().all(|r| r.first_turn.is_none()));
}

#[test]
fn azure_has_no_chains() {
    let w = load_azure(data("azure_small.jsonl")).unwrap();
    assert_eq!(w.len(), 3);
    assert_eq!(w.total_hash_ids(), 0);
    assert_eq!(w.requests()[2].output_tokens, 1);
    let report = run(&SimConfig::default(), &w, smetric_sim::PolicyKind::LeastLoad).unwrap();
    assert_eq!(report.completed, 3);
    assert!(report.local_hit_ratio.abs() < 1e-12);
}

#[test]
fn weka_closed_loop_subagents_coarsening_and_shared_prefix() {
    let plain = WekaOptions {
        coarsen: 1,
        shared_prefix: false,
    };
    let w = load_weka(&[data("weka_small.jsonl")], &plain).unwrap();
    assert_eq!(w.len(), 7);
    assert_eq!(w.block_tokens(), 64);
    assert_eq!(w.arrival(), ArrivalKind::ClosedLoop);
    assert_eq!(w.chain(0).len(), 31);
    assert_eq!(w.root_sessions(), 2);
    assert_eq!(w.sessions(), 3);
    let r = w.requests();
    // Turn 2 follows turn 1 after its recorded think time.
    assert_eq!(r[1].prev, Some(0));
    assert!((r[1].think_s - 8.0).abs() < 1e-12);
    // The subagent's first request keeps its recorded offset: 30 − 10 − 1.5.
    assert_eq!(r[2].prev, Some(1));
    assert!((r[2].think_s - 18.5).abs() < 1e-12);
    assert_eq!(r[2].first_turn, Some(true));
    assert_ne!(r[2].session, r[1].session);
    assert_eq!(r[2].root_session, r[1].root_session);
    // A missing think time falls back to the recorded gap: 40 − 10 − 1.5.
    assert!((r[4].think_s - 28.5).abs() < 1e-12);

    let coarse = load_weka(
        &[data("weka_small.jsonl")],
        &WekaOptions {
            coarsen: 4,
            shared_prefix: false,
        },
    )
    .unwrap();
    assert_eq!(coarse.block_tokens(), 256);
    // 31 ids → 7 coarse blocks, each named by the last id of its group of four.
    assert_eq!(coarse.chain(0), &[103, 107, 111, 115, 119, 123, 127]);

    let shared = load_weka(&[data("weka_small.jsonl")], &WekaOptions::default()).unwrap();
    // (1000 + 300) / 256 = 5 shared blocks for both root sessions, 3 for the subagent.
    assert_eq!(shared.chain(0)[..5], shared.chain(5)[..5]);
    assert_eq!(shared.chain(0)[4], shared_prefix_id(1000, 300, 4));
    assert_eq!(shared.chain(0)[5], 123);
    assert_eq!(shared.chain(2)[2], shared_prefix_id(800, 200, 2));
    assert_ne!(shared.chain(2)[3], shared.chain(0)[3]);

    let report = run(
        &SimConfig {
            instances: 2,
            ..SimConfig::default()
        },
        &shared,
        smetric_sim::PolicyKind::Smetric,
    )
    .unwrap();
    assert_eq!(report.completed, 7);
    assert_eq!(report.turn_inference_samples, 7);
}

#[test]
fn bad_records_report_file_and_line() {
    let bad_json = scratch_file(
        "bad.jsonl",
        "{\"timestamp\":0,\"input_length\":5,\"output_length\":1}\n{oops\n",
    );
    match load_azure(&bad_json) {
        Err(SimError::Parse { line, path, .. }) => {
            assert_eq!(line, 2);
            assert_eq!(path, bad_json);
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    let zero = scratch_file(
        "zero.jsonl",
        "\n{\"timestamp\":0,\"input_length\":0,\"output_length\":1}\n",
    );
    assert!(matches!(load_mooncake(&zero), Err(SimError::Parse { line: 2, .. })));
    let negative = scratch_file(
        "neg.jsonl",
        "{\"timestamp\":-3,\"input_length\":5,\"output_length\":1}\n",
    );
    assert!(matches!(load_azure(&negative), Err(SimError::Parse { line: 1, .. })));
    let missing = scratch_file("missing.jsonl", "{\"timestamp\":1,\"output_length\":1}\n");
    assert!(matches!(load_azure(&missing), Err(SimError::Parse { line: 1, .. })));
    let dup = scratch_file(
        "dup.jsonl",
        "{\"chat_id\":1,\"parent_chat_id\":-1,\"timestamp\":0,\"input_length\":5,\"output_length\":1}\n\
         {\"chat_id\":1,\"parent_chat_id\":-1,\"timestamp\":1,\"input_length\":5,\"output_length\":1}\n",
    );
    assert!(matches!(
        load_bailian(&dup, &BailianOptions::default()),
        Err(SimError::Parse { line: 2, .. })
    ));
    let empty = scratch_file("empty.jsonl", "\n\n");
    assert!(matches!(load_azure(&empty), Err(SimError::EmptyWorkload)));
    assert!(matches!(
        load_azure(Path::new("/nonexistent/trace.jsonl")),
        Err(SimError::Io { .. })
    ));
    let not_utf8 = std::env::temp_dir().join(format!("smetric-sim-bin-{}.jsonl", std::process::id()));
    std::fs::write(&not_utf8, [0xff, 0xfe, b'\n']).unwrap();
    assert!(matches!(load_azure(&not_utf8), Err(SimError::Parse { line: 1, .. })));
}

/// Full-scale check on the staged traces (needs `/work/shared`; run with `--ignored`).
#[test]
#[ignore = "needs the full Weka traces under /work/shared/traces"]
fn full_weka_set_runs_within_budget() {
    let dir = Path::new("/work/shared/traces");
    let files: Vec<PathBuf> = ["0001-0175", "0176-0400", "0401-0475", "0476-0549"]
        .iter()
        .map(|r| dir.join(format!("weka_cc_sessions_{r}.jsonl.gz")))
        .collect();
    let start = std::time::Instant::now();
    let w = load_weka(&files, &WekaOptions::default()).unwrap();
    assert_eq!(w.len(), 32_697);
    let report = run(&SimConfig::default(), &w, smetric_sim::PolicyKind::Smetric).unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    assert_eq!(report.completed + report.rejected, 32_697);
    assert!(elapsed < 60.0, "took {elapsed:.1} s");
}

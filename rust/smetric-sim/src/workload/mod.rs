//! Workloads: traces loaded into a compact, immutable in-memory form.
//!
//! A [`Workload`] is a list of [`RequestSpec`]s plus one flat `Vec<u64>` holding every
//! request's block-hash chain back to back (`offsets[i]..offsets[i+1]`). No per-request
//! vector, no Python object: the full Weka set (32,697 requests, 70.5M 64-token ids) takes
//! 17.6M ids ≈ 141 MB once coarsened to 256-token blocks (see [`weka`]).
//!
//! Chains hold only *full* blocks, because vLLM caches only full blocks: a trace id that
//! covers a partial tail (Bailian, Mooncake) is dropped at load time.
//!
//! **Turns.** A real follow-up re-sends its session's history, so the router sees its turn;
//! [`Workload::turn`] is that number for every request of a trace with sessions (Weka, Bailian):
//! its position in the chain of earlier requests of its (sub)session. Sessionless open-loop
//! traces (Mooncake, Azure) record no session, so their requests carry no turn (`None`).
//!
//! Loaders stream the file line by line (gzip detected by its magic bytes) and report a bad
//! record as [`SimError::Parse`] with its 1-based line number; they never panic.

pub mod azure;
pub mod bailian;
pub mod codex;
pub mod mooncake;
pub mod synthetic;
pub mod weka;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

pub(crate) use smetric_core::rng::mix64;

use crate::error::{Result, SimError};

/// How request arrival times are produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalKind {
    /// Replay trace timestamps: arrival = `time_s / time_scale`.
    OpenLoop,
    /// Open loop, but a request with a parent also waits for the parent to finish:
    /// arrival = `max(time_s / time_scale, finish(prev) + think_s)`.
    GatedOpenLoop,
    /// Sessions: a root request arrives at its root session's (Poisson) start + `time_s`;
    /// every other request leaves `think_s` after its `prev` finishes.
    ClosedLoop,
}

/// One request of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    /// The id the trace gave the request (`request_id`, `chat_id`, or the line index).
    pub trace_id: i64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Tokens to generate (at least 1: vLLM always samples one).
    pub output_tokens: u32,
    /// Open loop: trace arrival time in seconds (unscaled). Closed loop: offset of a root
    /// request from its root session's start.
    pub time_s: f64,
    /// Closed loop: delay between `prev` finishing and this request leaving, seconds.
    pub think_s: f64,
    /// The request this one follows (previous turn, or the parent of a subagent).
    pub prev: Option<u32>,
    /// Index of the (sub)session; turn metrics use it.
    pub session: u32,
    /// Index of the root session; closed-loop session starts are drawn per root session.
    pub root_session: u32,
    /// Ground truth "first request of its session", when the trace says.
    pub first_turn: Option<bool>,
}

impl RequestSpec {
    /// An open-loop request with no session structure (Mooncake, Azure): the `index`-th request
    /// of the trace is its own session, arriving at `time_s`.
    pub fn standalone(index: u32, input_tokens: u32, output_tokens: u32, time_s: f64) -> Self {
        Self {
            trace_id: i64::from(index),
            input_tokens,
            output_tokens,
            time_s,
            think_s: 0.0,
            prev: None,
            session: index,
            root_session: index,
            first_turn: None,
        }
    }
}

/// A loaded trace.
#[derive(Clone, Debug)]
pub struct Workload {
    name: String,
    block_tokens: u32,
    arrival: ArrivalKind,
    requests: Vec<RequestSpec>,
    offsets: Vec<u64>,
    hashes: Vec<u64>,
    sessions: u32,
    root_sessions: u32,
    /// Per request: its turn, 0 when unknown (see [`Workload::turn`]).
    turns: Vec<u32>,
}

impl Workload {
    /// Short description, e.g. `"weka(4 files)"`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tokens per block of the chains (after any coarsening).
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// How arrivals are produced.
    pub fn arrival(&self) -> ArrivalKind {
        self.arrival
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// True when there is no request.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// All requests, in trace order.
    pub fn requests(&self) -> &[RequestSpec] {
        &self.requests
    }

    /// Full-block hash chain of request `i`.
    pub fn chain(&self, i: usize) -> &[u64] {
        &self.hashes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Total block ids stored.
    pub fn total_hash_ids(&self) -> usize {
        self.hashes.len()
    }

    /// The turn request `i` carries, as a real request shows it by re-sending its history: 1
    /// for the first request of its (sub)session, else one more than its `prev` when that is in
    /// the same session. `None` when the trace does not say whether it starts a session
    /// (`first_turn` unknown: the sessionless Mooncake and Azure traces). A follow-up whose
    /// earlier turns are not in the workload (a parent outside the loaded files) gets 2: it is
    /// not a first turn, which is all a router reads from the number.
    pub fn turn(&self, i: usize) -> Option<u32> {
        self.turns.get(i).copied().filter(|&t| t > 0)
    }

    /// Number of (sub)sessions.
    pub fn sessions(&self) -> u32 {
        self.sessions
    }

    /// Number of root sessions.
    pub fn root_sessions(&self) -> u32 {
        self.root_sessions
    }
}

/// Tag bit of block ids that are shared across sessions by construction (the Weka loader's
/// synthetic system-prompt blocks); [`Workload::replicate`] keeps them shared.
pub const SHARED_ID_TAG: u64 = 1 << 63;

impl Workload {
    /// `copies` copies of a closed-loop (session) workload, its root sessions in a seeded
    /// random order: the load knob of session traces beyond their own number of sessions.
    ///
    /// Closed-loop load is the root-session arrival rate, and a trace only holds so many
    /// sessions (20 in the embedded excerpt, 62–214 per Weka window), so a sweep that must
    /// saturate a cluster over a fixed window needs more. Copy 0 keeps the trace's block ids;
    /// in copy `k ≥ 1` every id gets a private image (`mix64(id ^ mix64(k))` without the tag
    /// bit), so copies never share KV — except ids tagged [`SHARED_ID_TAG`], which model a
    /// prompt shared across sessions and stay shared. Requests, sessions and root sessions are
    /// renumbered copy by copy; the root sessions are then shuffled (Fisher–Yates on a
    /// SplitMix64 stream of `seed`), because the simulator starts them in index order and
    /// copies should interleave rather than follow one another. `copies = 1` only shuffles.
    ///
    /// Complexity: O(copies · (requests + ids)) time and memory.
    pub fn replicate(&self, copies: u32, seed: u64) -> Result<Workload> {
        if self.arrival != ArrivalKind::ClosedLoop {
            return Err(SimError::InvalidConfig {
                field: "copies",
                reason: "only closed-loop (session) workloads are replicated; speed up an open-loop trace \
                         with time_scale instead"
                    .into(),
            });
        }
        if copies == 0 {
            return Err(SimError::InvalidConfig {
                field: "copies",
                reason: "must be >= 1".into(),
            });
        }
        let roots = u64::from(self.root_sessions) * u64::from(copies);
        let requests = self.requests.len() as u64 * u64::from(copies);
        if roots > u64::from(u32::MAX) || requests > u64::from(u32::MAX) {
            return Err(SimError::InvalidConfig {
                field: "copies",
                reason: format!("{copies} copies exceed 2^32 requests or sessions"),
            });
        }
        // order[j] = new index of root session j (over all copies).
        let mut order: Vec<u32> = (0..roots as u32).collect();
        for i in (1..order.len()).rev() {
            let draw = mix64(seed ^ mix64(i as u64 ^ 0xA076_1D64_78BD_642F));
            order.swap(i, (draw % (i as u64 + 1)) as usize);
        }
        let name = if copies == 1 {
            self.name.clone()
        } else {
            format!("{} x{copies}", self.name)
        };
        let mut builder = WorkloadBuilder::new(name, self.block_tokens, self.arrival);
        let n = self.requests.len() as u32;
        for k in 0..copies {
            let salt = mix64(u64::from(k));
            for (i, spec) in self.requests.iter().enumerate() {
                let root = k * self.root_sessions + spec.root_session;
                let copy = RequestSpec {
                    prev: spec.prev.map(|p| k * n + p),
                    session: k * self.sessions + spec.session,
                    root_session: order[root as usize],
                    ..spec.clone()
                };
                let chain = self.chain(i).iter().map(|&id| {
                    if k == 0 || id & SHARED_ID_TAG != 0 {
                        id
                    } else {
                        mix64(id ^ salt) & !SHARED_ID_TAG
                    }
                });
                builder.push(copy, chain);
            }
        }
        builder.build()
    }
}

/// Builds a [`Workload`] request by request; loaders and tests use it.
#[derive(Clone, Debug)]
pub struct WorkloadBuilder {
    inner: Workload,
}

impl WorkloadBuilder {
    /// An empty workload with chains of `block_tokens`-token blocks.
    pub fn new(name: impl Into<String>, block_tokens: u32, arrival: ArrivalKind) -> Self {
        Self {
            inner: Workload {
                name: name.into(),
                block_tokens,
                arrival,
                requests: Vec::new(),
                offsets: vec![0],
                hashes: Vec::new(),
                sessions: 0,
                root_sessions: 0,
                turns: Vec::new(),
            },
        }
    }

    /// Appends a request with its full-block chain; returns its index.
    pub fn push(&mut self, spec: RequestSpec, chain: impl IntoIterator<Item = u64>) -> u32 {
        let w = &mut self.inner;
        w.sessions = w.sessions.max(spec.session + 1);
        w.root_sessions = w.root_sessions.max(spec.root_session + 1);
        w.requests.push(spec);
        w.hashes.extend(chain);
        w.offsets.push(w.hashes.len() as u64);
        (w.requests.len() - 1) as u32
    }

    /// Mutable access to a pushed request (loaders resolve `prev` after the fact).
    pub fn request_mut(&mut self, i: u32) -> Option<&mut RequestSpec> {
        self.inner.requests.get_mut(i as usize)
    }

    /// Requests pushed so far.
    pub fn len(&self) -> usize {
        self.inner.requests.len()
    }

    /// True when nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.inner.requests.is_empty()
    }

    /// Checks the workload and returns it.
    pub fn build(mut self) -> Result<Workload> {
        let w = &mut self.inner;
        if w.block_tokens == 0 {
            return Err(SimError::InvalidConfig {
                field: "block_tokens",
                reason: "must be >= 1".into(),
            });
        }
        if w.requests.is_empty() {
            return Err(SimError::EmptyWorkload);
        }
        let n = w.requests.len() as u32;
        for (i, r) in w.requests.iter().enumerate() {
            if r.prev.is_some_and(|p| p >= n || p as usize == i) {
                return Err(SimError::InvalidConfig {
                    field: "prev",
                    reason: format!("request {i} has an invalid prev {:?}", r.prev),
                });
            }
            if r.input_tokens == 0 || r.output_tokens == 0 {
                return Err(SimError::InvalidConfig {
                    field: "input_tokens",
                    reason: format!("request {i} needs at least one input and one output token"),
                });
            }
            if !(r.time_s.is_finite() && r.think_s.is_finite() && r.think_s >= 0.0) {
                return Err(SimError::InvalidConfig {
                    field: "time_s",
                    reason: format!("request {i} has a non-finite time or a negative think time"),
                });
            }
        }
        w.hashes.shrink_to_fit();
        w.turns = turns(&w.requests);
        Ok(self.inner)
    }
}

/// [`Workload::turn`] of every request (0: unknown). A request's turn follows from its `prev`
/// chain, which may point forward in trace order, so each chain is walked once and memoised;
/// a cycle (the builder rejects only self-references) stops the walk. O(requests).
fn turns(requests: &[RequestSpec]) -> Vec<u32> {
    const PENDING: u32 = u32::MAX;
    let mut turns = vec![0_u32; requests.len()];
    let mut path = Vec::new();
    for start in 0..requests.len() {
        let mut i = start;
        // Walk up to the first request whose turn is known or follows on its own.
        let base = loop {
            if turns[i] == PENDING {
                break 1; // a cycle: restart its count
            }
            if turns[i] != 0 {
                break turns[i];
            }
            let r = &requests[i];
            let prev = r.prev.filter(|&p| requests[p as usize].session == r.session);
            match (r.first_turn, prev) {
                (None, _) => break 0,
                (Some(true), _) => {
                    turns[i] = 1;
                    break 1;
                }
                (Some(false), None) => {
                    turns[i] = 2;
                    break 2;
                }
                (Some(false), Some(p)) => {
                    turns[i] = PENDING;
                    path.push(i);
                    i = p as usize;
                }
            }
        };
        let mut t = base;
        while let Some(j) = path.pop() {
            t = if t == 0 {
                0
            } else {
                t.saturating_add(1).min(PENDING - 1)
            };
            turns[j] = t;
        }
    }
    turns
}

/// Opens `path`, transparently gunzipping it when it starts with the gzip magic bytes.
pub(crate) fn open_trace(path: &Path) -> Result<Box<dyn BufRead>> {
    let io_err = |source| SimError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = BufReader::with_capacity(1 << 20, File::open(path).map_err(io_err)?);
    let magic = file.fill_buf().map_err(io_err)?;
    if magic.starts_with(&[0x1f, 0x8b]) {
        let gz = flate2::bufread::MultiGzDecoder::new(file);
        Ok(Box::new(BufReader::with_capacity(1 << 20, gz)))
    } else {
        Ok(Box::new(file))
    }
}

/// Calls `f(line_number, line)` for every non-blank line of a (gzipped) JSON Lines file.
pub(crate) fn for_each_line(path: &Path, mut f: impl FnMut(u64, &str) -> Result<()>) -> Result<()> {
    let mut reader = open_trace(path)?;
    let mut buf = Vec::with_capacity(1 << 16);
    let mut line_no = 0_u64;
    loop {
        buf.clear();
        let read = reader.read_until(b'\n', &mut buf).map_err(|source| SimError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if read == 0 {
            return Ok(());
        }
        line_no += 1;
        let line = std::str::from_utf8(&buf).map_err(|e| SimError::Parse {
            path: path.to_path_buf(),
            line: line_no,
            reason: format!("not UTF-8: {e}"),
        })?;
        let line = line.trim();
        if !line.is_empty() {
            f(line_no, line)?;
        }
    }
}

/// A parse error at `path:line`.
pub(crate) fn parse_error(path: &Path, line: u64, reason: impl Into<String>) -> SimError {
    SimError::Parse {
        path: path.to_path_buf(),
        line,
        reason: reason.into(),
    }
}

/// Converts a token count from a trace to `u32`, rejecting zero-length prompts and
/// counts beyond `u32`.
pub(crate) fn prompt_tokens(path: &Path, line: u64, value: u64) -> Result<u32> {
    match u32::try_from(value) {
        Ok(0) => Err(parse_error(path, line, "input_length must be >= 1")),
        Ok(v) => Ok(v),
        Err(_) => Err(parse_error(path, line, format!("input_length {value} is too large"))),
    }
}

/// Output length: at least one token (vLLM always samples one), clamped to `u32`.
pub(crate) fn output_tokens(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX).max(1)
}

/// A finite, non-negative time, or a parse error naming `field`.
pub(crate) fn time_field(path: &Path, line: u64, field: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(parse_error(
            path,
            line,
            format!("{field} must be a finite number >= 0, got {value}"),
        ))
    }
}

/// The shape of [`synthetic_sessions`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticSessions {
    /// Sessions (each its own root session).
    pub sessions: u32,
    /// Turns per session.
    pub turns: u32,
    /// Prompt tokens every session shares (a system prompt), a multiple of the block size.
    pub shared_tokens: u32,
    /// Prompt tokens each turn adds to the previous one.
    pub turn_tokens: u32,
    /// Output tokens of every request.
    pub output_tokens: u32,
    /// Think time before each follow-up, seconds.
    pub think_s: f64,
}

/// Closed-loop agent sessions for tests and examples: turn `t` of a session has
/// `shared_tokens + (t + 1) · turn_tokens` prompt tokens and extends turn `t − 1`; the shared
/// blocks have ids `0, 1, …`, the others are private to the session (`10^6 · (s + 1) + k` for
/// block `k` of session `s`).
///
/// # Errors
/// [`SimError::InvalidWorkload`] for a zero block size (from [`WorkloadBuilder::build`]).
pub fn synthetic_sessions(block_tokens: u32, shape: SyntheticSessions) -> Result<Workload> {
    let mut b = WorkloadBuilder::new("synthetic-sessions", block_tokens, ArrivalKind::ClosedLoop);
    let block = u64::from(block_tokens.max(1));
    let shared = u64::from(shape.shared_tokens) / block;
    for s in 0..shape.sessions {
        let mut prev = None;
        for t in 0..shape.turns {
            let input = shape.shared_tokens + shape.turn_tokens * (t + 1);
            let ids = (0..shared).chain((shared..u64::from(input) / block).map(|k| 1_000_000 * u64::from(s + 1) + k));
            let spec = RequestSpec {
                trace_id: 0,
                input_tokens: input,
                output_tokens: shape.output_tokens,
                time_s: 0.0,
                think_s: shape.think_s,
                prev,
                session: s,
                root_session: s,
                first_turn: Some(t == 0),
            };
            prev = Some(b.push(spec, ids));
        }
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(prev: Option<u32>) -> RequestSpec {
        RequestSpec {
            trace_id: 0,
            input_tokens: 10,
            output_tokens: 1,
            time_s: 0.0,
            think_s: 0.0,
            prev,
            session: 0,
            root_session: 0,
            first_turn: None,
        }
    }

    #[test]
    fn chains_are_stored_back_to_back() {
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop);
        b.push(spec(None), [1, 2, 3]);
        b.push(spec(Some(0)), []);
        b.push(spec(Some(1)), [4]);
        let w = b.build().unwrap();
        assert_eq!(w.chain(0), &[1, 2, 3]);
        assert!(w.chain(1).is_empty());
        assert_eq!(w.chain(2), &[4]);
        assert_eq!(w.total_hash_ids(), 4);
    }

    #[test]
    fn replicas_get_private_ids_but_keep_shared_ones() {
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::ClosedLoop);
        b.push(spec(None), [SHARED_ID_TAG | 7, 1, 2]);
        b.push(spec(Some(0)), [SHARED_ID_TAG | 7, 1, 2, 3]);
        let w = b.build().unwrap();
        let r = w.replicate(3, 42).unwrap();
        assert_eq!((r.len(), r.sessions(), r.root_sessions()), (6, 3, 3));
        assert_eq!(r.chain(0), w.chain(0), "copy 0 keeps the trace's ids");
        assert_eq!(r.chain(2)[0], SHARED_ID_TAG | 7, "shared ids stay shared");
        assert_ne!(r.chain(2)[1], 1);
        assert_ne!(r.chain(2)[1], r.chain(4)[1], "each copy has its own private ids");
        assert_eq!(&r.chain(3)[..3], r.chain(2), "a copy keeps its own prefix chain");
        assert_eq!(r.requests()[3].prev, Some(2));
        let mut roots: Vec<u32> = r.requests().iter().step_by(2).map(|s| s.root_session).collect();
        roots.sort_unstable();
        assert_eq!(roots, [0, 1, 2], "root sessions are a permutation");
        assert_eq!(w.replicate(3, 42).unwrap().requests(), r.requests(), "seeded");
        assert!(w.replicate(0, 0).is_err());
        let mut open = WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop);
        open.push(spec(None), []);
        assert!(open.build().unwrap().replicate(2, 0).is_err());
    }

    #[test]
    fn turns_follow_the_session_chain() {
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::ClosedLoop);
        let first = |first_turn, prev, session| RequestSpec {
            session,
            first_turn,
            ..spec(prev)
        };
        b.push(first(Some(false), Some(2), 0), []); // 0: turn 3, its prev comes later
        b.push(first(Some(true), None, 0), []); // 1: turn 1
        b.push(first(Some(false), Some(1), 0), []); // 2: turn 2
        b.push(first(Some(true), Some(0), 1), []); // 3: a subagent's first request
        b.push(first(Some(false), Some(3), 1), []); // 4: its turn 2
        b.push(first(Some(false), None, 2), []); // 5: a follow-up whose history is not loaded
        b.push(first(None, None, 3), []); // 6: sessionless
        let w = b.build().unwrap();
        let turns: Vec<Option<u32>> = (0..w.len()).map(|i| w.turn(i)).collect();
        assert_eq!(turns, [Some(3), Some(1), Some(2), Some(1), Some(2), Some(2), None]);
        assert_eq!(
            w.replicate(2, 7).unwrap().turn(w.len()),
            Some(3),
            "copies keep their turns"
        );
        let mut open = WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop);
        open.push(RequestSpec::standalone(0, 10, 1, 0.0), []);
        assert_eq!(open.build().unwrap().turn(0), None);
    }

    #[test]
    fn bad_workloads_are_rejected() {
        assert!(matches!(
            WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop).build(),
            Err(SimError::EmptyWorkload)
        ));
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop);
        b.push(spec(Some(0)), []);
        assert!(b.build().is_err(), "self-referencing prev");
        let mut b = WorkloadBuilder::new("t", 0, ArrivalKind::OpenLoop);
        b.push(spec(None), []);
        assert!(b.build().is_err(), "zero block size");
        let mut b = WorkloadBuilder::new("t", 16, ArrivalKind::OpenLoop);
        b.push(
            RequestSpec {
                output_tokens: 0,
                ..spec(None)
            },
            [],
        );
        assert!(b.build().is_err(), "zero output tokens");
    }
}

//! Stateless turn inference: is this request the first of its session?
//!
//! Sources, in order (docs §4): an explicit hint; the chat history (any assistant or tool
//! message before the last message ⇒ follow-up); the index — a match that ends where
//! earlier requests already branched off (a shared system prompt) or no match at all ⇒
//! first turn, a match that ends at a block nobody extended yet (the previous turn's
//! prompt) ⇒ follow-up.
//!
//! Complexity: O(messages) for the history rule, O(1) for the index rule (the query
//! already found the deepest match and its branch count).

/// What the caller told the router about the request's turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TurnHint {
    /// Nothing: infer it from the index.
    #[default]
    Unknown,
    /// The caller's turn number (1 = first turn).
    Turn(u32),
    /// The verdict of [`first_turn_from_roles`] on the request's chat messages.
    Messages { first_turn: bool },
}

/// How `Decision::first_turn` was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnSource {
    /// From the caller's `turn`.
    Hint,
    /// From the chat messages.
    Messages,
    /// From the index's match and branch count.
    Index,
}

impl TurnSource {
    /// The name used in Python.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hint => "hint",
            Self::Messages => "messages",
            Self::Index => "index",
        }
    }
}

/// Roles that only appear once the model has answered at least once.
const MODEL_TURN_ROLES: [&str; 4] = ["assistant", "tool", "function", "ipython"];

/// First turn iff no message before the last one comes from the model or a tool.
pub fn first_turn_from_roles<'a>(roles: impl ExactSizeIterator<Item = &'a str>) -> bool {
    let n = roles.len();
    !roles.take(n.saturating_sub(1)).any(|r| MODEL_TURN_ROLES.contains(&r))
}

/// Resolves the hint, falling back to the index rule.
pub fn infer(hint: TurnHint, deepest_blocks: u32, branches: u32, min_branches: u32) -> (bool, TurnSource) {
    match hint {
        TurnHint::Turn(t) => (t == 1, TurnSource::Hint),
        TurnHint::Messages { first_turn } => (first_turn, TurnSource::Messages),
        TurnHint::Unknown => (deepest_blocks == 0 || branches >= min_branches, TurnSource::Index),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        assert!(first_turn_from_roles(["system", "user"].into_iter()));
        assert!(first_turn_from_roles(["user"].into_iter()));
        assert!(first_turn_from_roles(std::iter::empty()));
        assert!(!first_turn_from_roles(
            ["system", "user", "assistant", "tool"].into_iter()
        ));
        assert!(!first_turn_from_roles(["user", "assistant", "user"].into_iter()));
        assert!(
            first_turn_from_roles(["system", "user", "assistant"].into_iter()),
            "only messages before the last count"
        );
    }

    #[test]
    fn index_rule() {
        assert_eq!(infer(TurnHint::Unknown, 0, 0, 1), (true, TurnSource::Index));
        assert_eq!(infer(TurnHint::Unknown, 10, 3, 1), (true, TurnSource::Index));
        assert_eq!(infer(TurnHint::Unknown, 10, 0, 1), (false, TurnSource::Index));
        assert_eq!(infer(TurnHint::Turn(2), 0, 0, 1), (false, TurnSource::Hint));
    }
}

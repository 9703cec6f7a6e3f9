//! Whether a JSON text escapes a lone UTF-16 surrogate (`"\ud800"`): valid JSON, but no Unicode
//! text. An engine decodes such a body and fails on it later (a 500), so the proxy refuses it up
//! front, for every API, before forwarding a byte.
//!
//! # Algorithm
//! One `memmem` search (SIMD) for the two bytes `\u` over the whole text; only its hits are
//! looked at. A hit is an escape when the run of backslashes that ends at it is odd (`\\u` is an
//! escaped backslash and then text). Escapes are then paired left to right: a high half
//! (`\uD800`–`\uDBFF`) must be followed at once by a low half (`\uDC00`–`\uDFFF`), and a low half
//! must follow a high one. Backslashes exist only inside strings in valid JSON (the caller has
//! parsed the text), so no string boundary needs tracking: a high half that ends its string is
//! followed by a quote, which fails the "at once" test.
//!
//! # Complexity
//! O(length) at `memmem` speed: a body without a `\u` escape (token ids, ASCII text) is one
//! vectorized pass. Each hit costs O(1) plus its backslash run, and the runs of different hits
//! are disjoint, so the walk back is O(length) in all. It replaced a Python scan (two substring
//! searches of `\ud` and `\uD`, then a regex over the escapes) that took ≈ 258 µs on a
//! 32K-token-id body (220 KB) and ≈ 225 µs on a 100 KB chat body (BENCHMARKS.md).

use memchr::memmem;

/// Whether the JSON text `raw` escapes half of a UTF-16 surrogate pair alone (see the module
/// docs). An escaped pair (`\ud83d\ude00`) is text; so is `\\ud800` (an escaped backslash, then
/// the letters `ud800`).
pub fn escapes_lone_surrogate(raw: &[u8]) -> bool {
    let mut high_end: Option<usize> = None;
    for at in memmem::find_iter(raw, b"\\u") {
        let run = raw[..at].iter().rev().take_while(|&&b| b == b'\\').count();
        if run % 2 == 1 {
            continue; // the backslash at `at` is escaped itself: text, not an escape
        }
        let code = raw.get(at + 2..at + 6).and_then(hex4);
        let is_low = matches!(code, Some(0xDC00..=0xDFFF));
        if let Some(end) = high_end.take() {
            if at != end || !is_low {
                return true; // the high half was not followed by its low half
            }
            continue;
        }
        match code {
            Some(0xD800..=0xDBFF) => high_end = Some(at + 6),
            Some(0xDC00..=0xDFFF) => return true,
            _ => {}
        }
    }
    high_end.is_some()
}

/// The value of four hexadecimal digits, or `None` when they are not.
fn hex4(digits: &[u8]) -> Option<u32> {
    digits
        .iter()
        .try_fold(0u32, |value, &b| Some(value * 16 + char::from(b).to_digit(16)?))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::escapes_lone_surrogate;

    fn lone(text: &str) -> bool {
        escapes_lone_surrogate(text.as_bytes())
    }

    #[test]
    fn lone_halves_are_found_and_pairs_are_text() {
        assert!(lone(r#"{"a":"\ud800"}"#), "a high half alone");
        assert!(lone(r#"{"a":"\udc00"}"#), "a low half alone");
        assert!(lone(r#"{"a":"\uD800\n"}"#), "a high half followed by another escape");
        assert!(lone(r#"{"a":"\ud800x\udc00"}"#), "a high half followed by text");
        assert!(lone(r#"{"a":"\ud800","b":"\udc00"}"#), "halves in two strings");
        assert!(lone(r#"{"a":"\ud83d\ud83d"}"#), "two high halves");
        assert!(lone(r#"{"a":"\ud83d\ude00\udc00"}"#), "a pair, then a low half");
        assert!(!lone(r#"{"a":"\ud83d\ude00"}"#), "an emoji as its pair");
        assert!(
            !lone(r#"{"a":"\uD83D\uDE00 \u00e9 \n"}"#),
            "upper-case pair and other escapes"
        );
        assert!(!lone(r#"{"a":"\\ud800"}"#), "an escaped backslash, then text");
        assert!(lone(r#"{"a":"\\\ud800"}"#), "an escaped backslash, then a lone half");
        assert!(!lone(r#"{"a":[1,2,3]}"#));
        assert!(!lone(""));
        assert!(lone(r#""\ud800"#), "a high half at the very end");
        assert!(
            !lone(r#""\u12"#),
            "a cut escape is not a surrogate (the parser refuses it)"
        );
    }

    /// The plain reference: every escape in order, as the Python scan it replaced.
    fn reference(raw: &[u8]) -> bool {
        let mut high_end: Option<usize> = None;
        let mut i = 0;
        while i < raw.len() {
            if raw[i] != b'\\' {
                i += 1;
                continue;
            }
            let code = if raw.get(i + 1) == Some(&b'u') {
                raw.get(i + 2..i + 6).and_then(super::hex4)
            } else {
                None
            };
            let end = if code.is_some() { i + 6 } else { i + 2 };
            if let Some(expected) = high_end.take() {
                if i != expected || !matches!(code, Some(0xDC00..=0xDFFF)) {
                    return true;
                }
            } else if matches!(code, Some(0xD800..=0xDBFF)) {
                high_end = Some(end);
            } else if matches!(code, Some(0xDC00..=0xDFFF)) {
                return true;
            }
            i = end;
        }
        high_end.is_some()
    }

    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "a",
            "u",
            "d800",
            " ",
            "\\\\",
            "\\n",
            "\\\"",
            "\\u0041",
            "\\ud800",
            "\\uDBFF",
            "\\udc00",
            "\\uDFFF",
            "\\ud83d\\ude00",
            "\\u00e9",
        ])
    }

    proptest! {
        #[test]
        fn agrees_with_the_plain_scan(pieces in prop::collection::vec(piece(), 0..24)) {
            let text = format!("\"{}\"", pieces.concat());
            prop_assert_eq!(escapes_lone_surrogate(text.as_bytes()), reference(text.as_bytes()), "{}", text);
        }
    }
}

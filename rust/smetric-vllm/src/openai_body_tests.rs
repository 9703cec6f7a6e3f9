//! Tests of [`super::parse_openai_body`]: every field's type check, the prompt variants, and
//! that no input panics.

use proptest::prelude::*;

use std::marker::PhantomData;

use super::{BodyError, Endpoint, MAX_NESTING, OpenAiBody, Prompt, flat_ids, parse_chat_body_with, parse_openai_body};

fn chat(body: &str) -> Result<OpenAiBody<'_>, BodyError> {
    parse_openai_body(body.as_bytes(), Endpoint::Chat)
}

fn completions(body: &str) -> Result<OpenAiBody<'_>, BodyError> {
    parse_openai_body(body.as_bytes(), Endpoint::Completions)
}

fn error_param(result: Result<OpenAiBody<'_>, BodyError>) -> Option<&'static str> {
    result.expect_err("the body should be rejected").param
}

#[test]
fn chat_fields_are_read_and_messages_kept_as_text() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi \u00e9"}],"stream":true,
        "max_tokens":7,"max_completion_tokens":9,"user":"u","prompt_cache_key":"k","cache_salt":"s",
        "tools":[{"type":"function"}],"chat_template_kwargs":{"enable_thinking":false},
        "add_generation_prompt":false,"continue_final_message":true,"temperature":0.5,"prompt":[1]}"#;
    let parsed = chat(body).unwrap();
    assert_eq!(parsed.model.as_deref(), Some("m"));
    assert!(parsed.stream);
    assert_eq!(parsed.max_tokens, Some(9), "chat prefers max_completion_tokens");
    assert_eq!(parsed.user.as_deref(), Some("u"));
    assert_eq!(parsed.prompt_cache_key.as_deref(), Some("k"));
    assert_eq!(parsed.cache_salt.as_deref(), Some("s"));
    assert_eq!(parsed.messages, Some(r#"[{"role":"user","content":"hi \u00e9"}]"#));
    assert_eq!(parsed.tools, Some(r#"[{"type":"function"}]"#));
    assert_eq!(parsed.chat_template_kwargs, Some(r#"{"enable_thinking":false}"#));
    assert!(!parsed.add_generation_prompt);
    assert!(parsed.continue_final_message);
    assert!(!parsed.add_special_tokens, "chat's default");
    assert_eq!(parsed.prompt, None, "chat ignores prompt");
}

#[test]
fn defaults_and_nulls() {
    let parsed = chat(r#"{"messages":[],"model":null,"stream":null,"max_tokens":null,"tools":null}"#).unwrap();
    assert_eq!(parsed.model, None);
    assert!(!parsed.stream);
    assert_eq!(parsed.max_tokens, None);
    assert_eq!(parsed.tools, None);
    assert!(parsed.add_generation_prompt);
    assert!(!parsed.continue_final_message);
}

#[test]
fn the_fields_the_proxy_rewrites_are_found_only_at_the_top_level() {
    let parsed = completions(
        r#"{"prompt":[1],"stream_options":{"include_usage":false},"kv_transfer_params":{"do_remote_prefill":true}}"#,
    )
    .unwrap();
    assert_eq!(parsed.stream_options, Some(r#"{"include_usage":false}"#));
    assert!(parsed.kv_transfer_params);
    let null = completions(r#"{"prompt":[1],"stream_options":null,"kv_transfer_params":null}"#).unwrap();
    assert_eq!(null.stream_options, Some("null"), "null is kept: the field is there");
    assert!(null.kv_transfer_params);
    let nested = chat(
        r#"{"messages":[{"role":"user","content":"\"stream_options\" \"kv_transfer_params\""}],
        "tools":[{"kv_transfer_params":1,"stream_options":2}]}"#,
    )
    .unwrap();
    assert_eq!(
        nested.stream_options, None,
        "a name inside a string or a nested object is not the field"
    );
    assert!(!nested.kv_transfer_params);
}

#[test]
fn last_duplicate_key_wins_like_python_json() {
    let parsed = chat(r#"{"model":"a","messages":[],"model":"b"}"#).unwrap();
    assert_eq!(parsed.model.as_deref(), Some("b"));
}

/// The seeded parse reads `messages` with the caller's seed (the last one given), every other
/// field as the plain parse does, and gives nothing where the plain parse errs or lacks them.
#[test]
fn a_seed_reads_messages_in_the_bodys_pass() {
    fn seeded(body: &str) -> Option<(OpenAiBody<'_>, Vec<u8>)> {
        parse_chat_body_with(body.as_bytes(), PhantomData::<Vec<u8>>)
    }
    let (body, messages) = seeded(r#"{"messages":[1],"model":"m","messages":[2,3],"max_tokens":4}"#).unwrap();
    assert_eq!(messages, vec![2, 3], "the last `messages` is the one read");
    assert_eq!(
        (body.model.as_deref(), body.max_tokens, body.messages),
        (Some("m"), Some(4), None)
    );
    for refused in [
        r#"{"messages":[1],"max_tokens":0}"#,
        r#"{"messages":null}"#,
        r#"{"model":"m"}"#,
        r#"{"messages":["not a byte"]}"#,
        r#"{"messages":[1]"#,
        "[]",
    ] {
        assert!(seeded(refused).is_none(), "{refused}");
    }
}

#[test]
fn escaped_keys_are_recognised() {
    let parsed = chat(r#"{"mod\u0065l":"a","messages":[]}"#).unwrap();
    assert_eq!(parsed.model.as_deref(), Some("a"));
}

#[test]
fn completions_prompt_variants() {
    let ids = completions(r#"{"prompt":[0, 1, 4294967295]}"#).unwrap();
    assert_eq!(ids.prompt, Some(Prompt::Ids(vec![0, 1, u32::MAX])));
    let text = completions(r#"{"prompt":"hello"}"#).unwrap();
    assert_eq!(text.prompt, Some(Prompt::Text("hello".to_owned())));
    let batch_text = completions(r#"{"prompt":["hello"]}"#).unwrap();
    assert_eq!(batch_text.prompt, Some(Prompt::Text("hello".to_owned())));
    let batch_ids = completions(r#"{"prompt":[[5,6]]}"#).unwrap();
    assert_eq!(batch_ids.prompt, Some(Prompt::Ids(vec![5, 6])));
    let empty_text = completions(r#"{"prompt":""}"#).unwrap();
    assert_eq!(empty_text.prompt, Some(Prompt::Text(String::new())));
    assert_eq!(
        completions(r#"{"prompt":[1],"max_tokens":3,"max_completion_tokens":9}"#)
            .unwrap()
            .max_tokens,
        Some(3)
    );
}

#[test]
fn bad_ids_name_their_position() {
    for (body, needle) in [
        (r#"{"prompt":[1,-1]}"#, "prompt[1] is -1"),
        (r#"{"prompt":[4294967296]}"#, "prompt[0] is 4294967296"),
        (r#"{"prompt":[1,2.5]}"#, "prompt[1] is 2.5"),
        (r#"{"prompt":[1,"a"]}"#, "prompt[1] is a string"),
        (r#"{"prompt":[[1,2,null]]}"#, "prompt[0][2] is null"),
        (r#"{"prompt":[-3]}"#, "prompt[0] is -3"),
    ] {
        let err = completions(body).unwrap_err();
        assert_eq!(err.param, Some("prompt"), "{body}");
        assert!(err.message.contains(needle), "{body}: {}", err.message);
    }
}

#[test]
fn prompt_shapes_rejected() {
    for (body, needle) in [
        (r"{}", "prompt is required"),
        (r#"{"prompt":null}"#, "prompt is required"),
        (r#"{"prompt":[]}"#, "must not be empty"),
        (r#"{"prompt":[[]]}"#, "must not be empty"),
        (r#"{"prompt":["a","b"]}"#, "batch of 2"),
        (r#"{"prompt":[[1],[2],[3]]}"#, "batch of 3"),
        (r#"{"prompt":5}"#, "got a number"),
        (r#"{"prompt":{"a":1}}"#, "got an object"),
        (r#"{"prompt":[{"a":1}]}"#, "holding an object"),
        (r#"{"prompt":[true]}"#, "holding a boolean"),
    ] {
        let err = completions(body).unwrap_err();
        assert_eq!(err.param, Some("prompt"), "{body}");
        assert!(err.message.contains(needle), "{body}: {}", err.message);
    }
}

#[test]
fn field_types_are_checked() {
    for (body, param) in [
        (r#"{"messages":[],"model":3}"#, "model"),
        (r#"{"messages":[],"stream":"yes"}"#, "stream"),
        (r#"{"messages":[],"max_tokens":1.5}"#, "max_tokens"),
        (r#"{"messages":[],"max_tokens":0}"#, "max_tokens"),
        (r#"{"messages":[],"max_completion_tokens":-2}"#, "max_completion_tokens"),
        (r#"{"messages":[],"user":[]}"#, "user"),
        (r#"{"messages":[],"prompt_cache_key":1}"#, "prompt_cache_key"),
        (r#"{"messages":[],"cache_salt":""}"#, "cache_salt"),
        (r#"{"messages":[],"cache_salt":7}"#, "cache_salt"),
        (r#"{"messages":[],"tools":{}}"#, "tools"),
        (r#"{"messages":[],"chat_template_kwargs":[]}"#, "chat_template_kwargs"),
        (r#"{"messages":[],"add_generation_prompt":1}"#, "add_generation_prompt"),
        (r#"{"messages":[],"add_special_tokens":"no"}"#, "add_special_tokens"),
        (r#"{"messages":"hi"}"#, "messages"),
        (r#"{"messages":null}"#, "messages"),
        (r#"{"model":"m"}"#, "messages"),
    ] {
        assert_eq!(error_param(chat(body)), Some(param), "{body}");
    }
}

#[test]
fn malformed_and_non_object_bodies() {
    for body in [
        "",
        "{",
        "[1,2]",
        "\"text\"",
        "3",
        "null",
        "true",
        r#"{"a":1} x"#,
        r#"{"a":1,}"#,
    ] {
        let err = chat(body).unwrap_err();
        assert_eq!(err.param, None, "{body}");
    }
    assert!(chat("[1]").unwrap_err().message.contains("must be a JSON object"));
    assert!(chat("{").unwrap_err().message.contains("malformed JSON"));
    let invalid_utf8 = parse_openai_body(b"{\"model\":\"\xff\",\"messages\":[]}", Endpoint::Chat);
    assert!(invalid_utf8.unwrap_err().message.contains("malformed JSON"));
}

#[test]
fn the_byte_loop_takes_flat_lists_and_leaves_the_rest_to_serde() {
    assert_eq!(flat_ids(b"[1,2,3]"), Some(vec![1, 2, 3]));
    assert_eq!(flat_ids(b"[ 0 ,\n\t4294967295\r]"), Some(vec![0, u32::MAX]));
    for other in [
        &b"[]"[..],
        b"[ ]",
        b"[-1]",
        b"[4294967296]",
        b"[12345678901]",
        b"[1.5]",
        b"[1e3]",
        b"[1,]",
        b"[[1]]",
        b"[\"a\"]",
        b"[1] ",
        b"\"1\"",
    ] {
        assert_eq!(flat_ids(other), None, "{}", String::from_utf8_lossy(other));
    }
    // And serde words the errors of what the loop leaves.
    let eleven = completions(r#"{"prompt":[1, 12345678901]}"#).unwrap_err();
    assert!(
        eleven.message.contains("prompt[1] is 12345678901"),
        "{}",
        eleven.message
    );
    let float = completions(r#"{"prompt":[1e3]}"#).unwrap_err();
    assert!(float.message.contains("prompt[0] is 1000"), "{}", float.message);
}

proptest! {
    #[test]
    fn never_panics(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_openai_body(&raw, Endpoint::Chat);
        let _ = parse_openai_body(&raw, Endpoint::Completions);
    }

    #[test]
    fn ids_round_trip(ids in proptest::collection::vec(any::<u32>(), 1..300), spaced in any::<bool>()) {
        let list = if spaced {
            format!("{ids:?}").replace(", ", " ,\n ")
        } else {
            format!("{ids:?}").replace(", ", ",")
        };
        let body = format!("{{\"prompt\": {list} }}");
        let parsed = parse_openai_body(body.as_bytes(), Endpoint::Completions).unwrap();
        prop_assert_eq!(parsed.prompt, Some(Prompt::Ids(ids)));
    }
}

#[test]
fn a_body_nested_deeper_than_engines_parse_is_rejected_wherever_the_nesting_is() {
    let deep = |depth: usize| "[".repeat(depth) + &"]".repeat(depth);
    for field in ["unknown", "messages", "tools"] {
        let body = format!(r#"{{"prompt": "x", "{field}": {}}}"#, deep(MAX_NESTING + 1));
        let err = parse_openai_body(body.as_bytes(), Endpoint::Completions).unwrap_err();
        assert_eq!(err.param, None);
        assert!(err.message.contains("deeper than 256"), "{}", err.message);
    }
    // At the limit (the top-level object is one level), and brackets inside strings, pass.
    let ok = format!(r#"{{"prompt": "x", "unknown": {}}}"#, deep(MAX_NESTING - 1));
    assert!(parse_openai_body(ok.as_bytes(), Endpoint::Completions).is_ok());
    let quoted = format!(r#"{{"prompt": "{}", "n\"[": 1}}"#, "[{".repeat(2000));
    assert!(parse_openai_body(quoted.as_bytes(), Endpoint::Completions).is_ok());
    // Many brackets side by side are not depth.
    let wide = format!(r#"{{"prompt": "x", "unknown": [{}]}}"#, vec!["[]"; 5000].join(","));
    assert!(parse_openai_body(wide.as_bytes(), Endpoint::Completions).is_ok());
}

#[test]
fn the_nesting_check_reads_escapes_and_survives_truncation() {
    use super::nests_deeper_than;
    let brackets = "[".repeat(10);
    // An escaped quote does not end the string; an escaped backslash does not escape the quote.
    assert!(!nests_deeper_than(format!(r#"{{"a": "\"{brackets}"}}"#).as_bytes(), 5));
    assert!(nests_deeper_than(
        format!(r#"{{"a": "\\", "b": {brackets}}}"#).as_bytes(),
        5
    ));
    for cut in [r#"{"a": "\"#, r#"{"a": "x"#, r#"[[[[[[[["\"#, "\"", "\\"] {
        let text = format!("{brackets}{cut}");
        let _ = nests_deeper_than(text.as_bytes(), 5); // no panic, whatever the answer
    }
}

#[test]
fn a_prompt_escaping_a_lone_surrogate_says_so() {
    for prompt in [r#""\ud800""#, r#"["\udc00"]"#, r#""a\ud83d\ud83d""#] {
        let body = format!(r#"{{"prompt": {prompt}}}"#);
        let err = parse_openai_body(body.as_bytes(), Endpoint::Completions).unwrap_err();
        assert_eq!(err.param, Some("prompt"));
        assert!(err.message.contains("lone surrogate"), "{}", err.message);
    }
    let pair = r#"{"prompt": "\ud83d\ude00"}"#;
    assert!(parse_openai_body(pair.as_bytes(), Endpoint::Completions).is_ok());
}

#[test]
fn a_body_both_decoders_reject_has_the_parsers_words() {
    use super::json_syntax_error;
    let error = |raw: &[u8]| json_syntax_error(raw);
    assert_eq!(
        error(b"{").as_deref(),
        Some("malformed JSON body: EOF while parsing an object at line 1 column 1")
    );
    assert_eq!(
        error(br#"{"a": 1,}"#).as_deref(),
        Some("malformed JSON body: key must be a string at line 1 column 9")
    );
    assert_eq!(
        error(b"[1[1[1").as_deref(),
        Some("malformed JSON body: expected `,` or `]` at line 1 column 3")
    );
    assert!(error(b"\xff").is_some(), "not UTF-8: CPython refuses it too");
    assert_eq!(error(br#"{"a": [1, {"b": null}]}"#), None, "JSON");
    assert_eq!(error(b"[1, 2]"), None, "JSON, if not an object");
    // What CPython might read though serde does not: not its to word.
    assert_eq!(error(br#"{"a": NaN}"#), None);
    assert_eq!(error(br#"{"a": -Infinity}"#), None);
    assert_eq!(error(b"\xef\xbb\xbf{}"), None, "a UTF-8 byte-order mark");
    assert_eq!(error(b"{\x00\"\x00"), None, "UTF-16");
    let deep = format!("{}{}", "[".repeat(MAX_NESTING + 1), "]".repeat(MAX_NESTING));
    assert_eq!(error(deep.as_bytes()), None, "the nesting refusal comes first");
    let fine_deep = format!("{}{}", "[".repeat(MAX_NESTING - 1), "]".repeat(MAX_NESTING - 1));
    assert_eq!(
        error(fine_deep.as_bytes()),
        None,
        "no recursion limit below the nesting one"
    );
}

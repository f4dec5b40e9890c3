//! Hostile `serve` request bodies read by the completions parser, without a server: random
//! bytes, a valid body cut at every length, every field set to values of every JSON kind and
//! size, prompts of every shape. Each must end in a request the scorer can run (non-empty
//! prompts of known token ids within the context, top lists within the bound) or a 400 naming
//! the field, never a panic.

use crate::common;

use std::path::Path;

use quantppl::data::TextTokenizer;
use quantppl::rng::Rng;
use quantppl::serve::api::{Bounds, MAX_LOGPROBS, parse_completion};
use serde_json::json;

const VOCAB: usize = 512;
const CONTEXT: usize = 64;

#[test]
fn hostile_completion_requests_end_in_a_job_or_a_400() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/stories260K-w4a16-channel");
    let tokenizer = TextTokenizer::from_model_dir(&dir).unwrap();
    let mut tried = 0;
    let mut refused = 0;
    let mut check = |body: &[u8], what: &str| {
        tried += 1;
        let result = std::panic::catch_unwind(|| {
            parse_completion(body, &tokenizer, &Bounds::model(VOCAB, CONTEXT))
        })
        .unwrap_or_else(|_| panic!("{what}: panicked"));
        match result {
            Err(e) => {
                assert_eq!(e.status, 400, "{what}");
                assert!(e.param.is_some(), "{what}: no field named");
                assert!(!e.message.is_empty() && !e.message.contains('\n'), "{what}");
                refused += 1;
            }
            Ok(c) => {
                assert!(c.logprobs.unwrap_or(0) <= MAX_LOGPROBS, "{what}");
                assert!(c.max_tokens <= 1, "{what}");
                for p in &c.prompts {
                    assert!(!p.is_empty() && p.len() <= CONTEXT, "{what}");
                    assert!(p.iter().all(|&id| (id as usize) < VOCAB), "{what}");
                }
            }
        }
    };

    let valid = json!({
        "prompt": [[1, 2, 3], [4, 5]], "echo": true, "logprobs": 3, "max_tokens": 1,
        "temperature": 0, "n": 1, "stream": false, "model": "m"
    });
    let text = serde_json::to_vec(&valid).unwrap();
    check(&text, "the valid body");
    for n in 0..text.len() {
        check(&text[..n], &format!("cut at {n}"));
    }
    let hostile = [
        json!(-1),
        json!(0),
        json!(1),
        json!(2),
        json!(21),
        json!(1u64 << 62),
        json!(u64::MAX),
        json!(2.5),
        json!(-0.0),
        json!(1e308),
        json!("x"),
        json!("\u{0}\u{fffd}é"),
        json!("a ".repeat(50_000)),
        json!(null),
        json!(true),
        json!([]),
        json!([[]]),
        json!([1, "x"]),
        json!([[1], 2]),
        json!([-1]),
        json!([VOCAB]),
        json!([0.5]),
        json!(vec![1; CONTEXT + 1]),
        json!(vec![vec![3; CONTEXT]; 40]),
        json!(["", "a"]),
        json!({}),
        json!({"prompt": "x"}),
    ];
    for key in valid.as_object().unwrap().keys() {
        for bad in &hostile {
            let mut body = valid.clone();
            body[key] = bad.clone();
            check(
                &serde_json::to_vec(&body).unwrap(),
                &format!("{key} = {bad:.40}"),
            );
            body.as_object_mut().unwrap().remove(key);
            check(&serde_json::to_vec(&body).unwrap(), &format!("no {key}"));
        }
    }
    for body in [
        json!(null),
        json!([valid.clone()]),
        json!("prompt"),
        json!(7),
    ] {
        check(
            &serde_json::to_vec(&body).unwrap(),
            &format!("body {body:.40}"),
        );
    }
    // Nesting far past serde_json's recursion limit.
    let deep = format!(
        "{{\"prompt\": {}1{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    check(deep.as_bytes(), "prompt nested 10,000 deep");
    let mut rng = Rng::new(23);
    for i in 0..2000 {
        let n = rng.below(200) as usize;
        let mut bytes = rng.bytes(n);
        if i % 2 == 0 && !bytes.is_empty() {
            // Mostly printable JSON punctuation, to get past the first byte.
            let alphabet = b"{}[]\":,0123456789-.eE truefalsnpromptechologprobs";
            for b in &mut bytes {
                *b = alphabet[*b as usize % alphabet.len()];
            }
        }
        check(&bytes, &format!("random body {i}"));
    }
    let mut body = text.clone();
    for i in 0..2000 {
        body.clone_from(&text);
        let at = rng.below(body.len() as u64) as usize;
        body[at] = rng.next_u64() as u8;
        check(&body, &format!("valid body with byte {at} changed ({i})"));
    }
    common::tally!("{tried} hostile request bodies: {refused} answered 400 naming the field");
    assert!(tried > 4000);
}

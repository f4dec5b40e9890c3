//! `quantppl serve` through HTTP on the bundled model (CPU backend): its logprobs are the
//! eval's, its top-N lists a full-vocabulary log-softmax, concurrent clients get exactly the
//! answers lone requests get, and bad requests, a full queue and SIGTERM are handled; its
//! resident memory stays flat over thousands of requests.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Command, Stdio};

use quantppl::backend::SeqLayout;
use quantppl::backend::cpu::CpuBackend;
use quantppl::model::Model;
use serde_json::{Value, json};

struct Server {
    child: Child,
    port: u16,
    /// What it prints after its first line (read at `stop`).
    stderr: BufReader<ChildStderr>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args(["serve", "--backend", "cpu", "--port", "0"])
            .args(extra)
            // One glibc arena: per-thread arenas (connections' and the CPU backend's threads)
            // fragment under the prefix cache's turnover and grow resident memory by megabytes
            // before levelling off; with one, `resident_bytes` measures what the server holds.
            .env("MALLOC_ARENA_MAX", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        stderr.read_line(&mut line).unwrap();
        let port = line
            .split("http://127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no address in: {line}"));
        Server {
            child,
            port,
            stderr,
        }
    }

    /// Stops it with SIGTERM; what it printed since its first line.
    fn stop(mut self) -> String {
        // SAFETY: a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}");
        let mut rest = String::new();
        self.stderr.read_to_string(&mut rest).unwrap();
        rest
    }

    /// (status, headers, JSON body) of one request.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: &str,
        auth: Option<&str>,
    ) -> (u16, String, Value) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (
            status,
            head.to_string(),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }

    fn complete(&self, body: &Value) -> Value {
        let (status, _, v) = self.request("POST", "/v1/completions", &body.to_string(), None);
        assert_eq!(status, 200, "{v}");
        v
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn logprobs_are_the_evals_and_top_lists_a_full_log_softmax() {
    logprobs_of(None);
}

/// Activations quantized per token (FP8 dynamic): two prompts scored in one batch get the
/// numbers eval gives each window, as if each had run alone.
#[test]
fn quantized_activations_are_per_prompt_as_in_eval() {
    logprobs_of(Some(&common::fixture("stories260K-fp8-dynamic")));
}

/// GLM-5.3-Flash through `serve`: KDA layers, sparse attention over pools of tokens (windows
/// of 128 keep 16 keys of each query's up to 127) and hyper-connections give eval's numbers.
#[test]
fn glm5_next_serves_evals_numbers() {
    logprobs_of(Some(&common::fixture("synth-glm5-next-mini")));
}

/// Serves `model` (the bundled one where `None`) and holds its echo logprobs of two windows
/// sent in one request to eval's NLL of the same windows, and its top lists to a full
/// log-softmax of the CPU backend's logits.
fn logprobs_of(model: Option<&std::path::Path>) {
    // Two windows of 128 tokens, scored by eval on every position after the first.
    let tag = model.map_or("bundled".into(), |m| {
        m.file_name().unwrap().to_string_lossy()
    });
    let dir = std::env::temp_dir().join(format!("quantppl-serve-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("nll.jsonl");
    let model_args: Vec<&str> = match model {
        Some(m) => vec!["--model", m.to_str().unwrap()],
        None => vec![],
    };
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args([
            "eval",
            "--backend",
            "cpu",
            "-q",
            "--method",
            "gptq",
            "--ctx",
            "128",
        ])
        .args(["--rows", "2", "--dump-nll", dump.to_str().unwrap()])
        .args(&model_args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let windows: Vec<Value> = std::fs::read_to_string(&dump)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<Vec<u32>> = windows
        .iter()
        .map(|w| serde_json::from_value(w["ids"].clone()).unwrap())
        .collect();

    let server = Server::start(&model_args);
    let top = 5;
    let v = server.complete(&json!({
        "prompt": ids, "echo": true, "logprobs": top, "max_tokens": 1, "temperature": 0
    }));
    // The full-vocabulary distributions, computed here on the CPU backend.
    let opened =
        quantppl::run::open_model(model, None, quantppl::run::Activations::Declared).unwrap();
    let b = CpuBackend::new();
    let model = Model::load(&b, &opened.ckpt, 512, &|_, _| {}).unwrap();
    for (w, window) in windows.iter().enumerate() {
        let choice = &v["choices"][w];
        assert_eq!(choice["index"], w);
        let lp = &choice["logprobs"];
        let tokens = &lp["token_logprobs"];
        assert!(tokens[0].is_null());
        // Prompt tokens 1..128, then the greedy next token.
        assert_eq!(tokens.as_array().unwrap().len(), 129);
        let nll = floats(&window["nll"]);
        let served = floats(&Value::Array(tokens.as_array().unwrap()[1..128].to_vec()));
        for (p, (s, n)) in served.iter().zip(&nll).enumerate() {
            assert!(
                (s + n).abs() <= 1e-6 * n.abs().max(1e-3),
                "window {w} position {p}: {s} vs -{n}"
            );
        }
        let hidden = model
            .hidden(&b, &ids[w], &SeqLayout::from_lengths([ids[w].len()]))
            .unwrap();
        let rows: Vec<u32> = (0..ids[w].len() as u32).collect();
        let logits = model
            .head_reduce(&b, &hidden, &rows, |row, _| row.to_vec())
            .unwrap();
        let vocab = logits[0].len();
        for (p, row) in logits.iter().enumerate() {
            let max = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &c| row[c].partial_cmp(&row[a]).unwrap().then(a.cmp(&c)));
            let want: Vec<f64> = order[..top].iter().map(|&t| row[t] as f64 - lse).collect();
            let got: Vec<f64> = {
                let mut g: Vec<f64> = lp["top_logprobs"][p + 1]
                    .as_object()
                    .unwrap()
                    .values()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                g.sort_by(|a, c| c.partial_cmp(a).unwrap());
                g
            };
            // Distinct tokens may decode to the same text and share a key.
            assert!(got.len() <= top && !got.is_empty());
            for g in &got {
                assert!(
                    want.iter().any(|x| (x - g).abs() < 1e-9),
                    "window {w} row {p}: {g} not in {want:?}"
                );
            }
            assert!((got[0] - want[0]).abs() < 1e-9);
            // lm-eval's is_greedy compares a token's logprob with its list's best value.
            if p + 1 < ids[w].len() && order[0] == ids[w][p + 1] as usize {
                assert_eq!(tokens[p + 1].as_f64().unwrap(), got[0]);
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Twelve prompts of different lengths and the answer each gets when sent alone.
struct Load {
    prompts: Vec<String>,
    lone: Vec<Value>,
}

impl Load {
    fn new(server: &Server) -> Load {
        let prompts: Vec<String> = (0..12)
            .map(|i| {
                format!(
                    "Once upon a time there were {i} little cats who{}",
                    " ran".repeat(i)
                )
            })
            .collect();
        let mut load = Load {
            prompts,
            lone: Vec::new(),
        };
        load.lone = (0..load.prompts.len())
            .map(|i| server.complete(&load.body(i))["choices"].clone())
            .collect();
        load
    }

    fn body(&self, i: usize) -> Value {
        json!({"prompt": self.prompts[i], "echo": true, "logprobs": 3, "max_tokens": 1})
    }

    /// `clients` concurrent clients of `rounds` rounds each, with malformed bodies and clients
    /// that hang up mid-request mixed in; every well-formed answer must be the lone one.
    /// Returns the number of requests sent.
    fn run(&self, server: &Server, clients: usize, rounds: usize) -> usize {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|client| s.spawn(move || self.client(server, client, rounds)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        })
    }

    fn client(&self, server: &Server, client: usize, rounds: usize) -> usize {
        let mut sent = 0;
        for round in 0..rounds {
            let i = (client * 5 + round) % self.lone.len();
            if (client + round) % 4 == 1 {
                // A client that goes away mid-request: its prompts are dropped.
                let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
                let body =
                    json!({"prompt": vec![self.prompts[i].clone(); 6], "echo": true}).to_string();
                write!(
                    s,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
                drop(s);
                sent += 1;
            }
            if (client + round).is_multiple_of(3) {
                let (status, _, v) =
                    server.request("POST", "/v1/completions", "{\"prompt\": [1, ", None);
                assert_eq!(status, 400, "{v}");
                sent += 1;
            }
            assert_eq!(
                server.complete(&self.body(i))["choices"],
                self.lone[i],
                "client {client} prompt {i}"
            );
            sent += 1;
        }
        sent
    }
}

#[test]
fn concurrent_clients_get_the_answers_of_lone_requests() {
    // At once, and gathering prompts for 20 ms before each batch.
    for gather in ["0", "20"] {
        let server = Server::start(&["--max-batch-tokens", "256", "--gather-ms", gather]);
        let load = Load::new(&server);
        load.run(&server, 8, 6);
    }
}

/// The server's resident memory, from /proc.
#[cfg(target_os = "linux")]
fn resident_bytes(server: &Server) -> u64 {
    memory_bytes(server, "VmRSS:")
}

/// A `/proc/PID/status` memory line of the server, in bytes (`VmRSS:` now, `VmHWM:` the peak).
#[cfg(target_os = "linux")]
fn memory_bytes(server: &Server, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[cfg(target_os = "linux")]
#[test]
fn memory_stays_flat_over_a_long_run() {
    // The prefix cache within 1 MB, full after the warm-up.
    let server = Server::start(&["--max-batch-tokens", "256", "--prefix-cache-mb", "1"]);
    let load = Load::new(&server);
    // Warm up: allocator arenas, per-thread buffers and the batcher reach their working size.
    let mut sent = load.run(&server, 8, 40);
    let warm = resident_bytes(&server);
    let mut samples = Vec::new();
    for _ in 0..5 {
        sent += load.run(&server, 8, 80);
        samples.push(resident_bytes(&server));
    }
    let last = *samples.last().unwrap();
    common::tally!(
        "serve: {sent} requests; resident {:.1} MiB after warm-up, then {:?} MiB",
        warm as f64 / 1048576.0,
        samples
            .iter()
            .map(|&b| (b as f64 / 104857.6).round() / 10.0)
            .collect::<Vec<_>>()
    );
    // A leak of even one small buffer per request (a few KiB x thousands) would show here.
    assert!(
        last < warm + 4 * 1024 * 1024,
        "resident memory grew from {warm} to {last} bytes over {sent} requests"
    );
}

#[test]
fn bad_requests_full_queues_keys_and_sigterm() {
    let server = Server::start(&["--queue", "2", "--api-key", "k3y"]);
    let post = |body: &str| server.request("POST", "/v1/completions", body, Some("Bearer k3y"));
    for (body, needle) in [
        ("{\"prompt\": ", "not JSON"),
        ("[1, 2]", "not an object"),
        ("{\"prompt\": 7}", "`prompt` is a number"),
        ("{\"prompt\": [1, 99999]}", "99999"),
        ("{\"prompt\": \"a\", \"max_tokens\": 16}", "max_tokens 16"),
        (
            "{\"prompt\": \"a\", \"echo\": \"yes\"}",
            "`echo` is a string",
        ),
        (
            "{\"prompt\": \"a\", \"max_tokens\": 1, \"temperature\": 0.7}",
            "temperature",
        ),
    ] {
        let (status, _, v) = post(body);
        assert_eq!(status, 400, "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    let long: Vec<u32> = vec![1; 600];
    let (status, _, v) = post(&json!({"prompt": long}).to_string());
    assert_eq!(status, 400);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("600 tokens") && message.contains("context of 512"),
        "{message}"
    );
    // No key, a wrong key, a key of another length, the key with the scheme in any case;
    // `/health` is open (probes carry no key).
    let models = |auth| server.request("GET", "/v1/models", "", auth).0;
    assert_eq!(models(None), 401);
    assert_eq!(models(Some("Bearer nope")), 401);
    assert_eq!(models(Some("Bearer k3")), 401);
    assert_eq!(models(Some("Basic k3y")), 401);
    assert_eq!(models(Some("Bearer k3y")), 200);
    assert_eq!(models(Some("bearer k3y")), 200);
    assert_eq!(models(Some("BEARER  k3y")), 200);
    assert_eq!(server.request("GET", "/health", "", None).0, 200);
    // More prompts in one request than the queue of 2 holds: 413 naming --queue.
    let many: Vec<Vec<u32>> = (0..64).map(|i| vec![100 + i; 200]).collect();
    let (status, _, v) = post(&json!({"prompt": many, "echo": true, "logprobs": 1}).to_string());
    assert_eq!(status, 413, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--queue"),
        "{v}"
    );
    // Clients filling the queue of 2 from eight threads: some answered 503 with Retry-After.
    let two: Vec<Vec<u32>> = (0..2).map(|i| vec![100 + i; 400]).collect();
    let body = json!({"prompt": two, "echo": true, "logprobs": 5}).to_string();
    let busy = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..25).find_map(|_| {
                        let (status, head, _) = post(&body);
                        (status == 503).then_some(head)
                    })
                })
            })
            .collect();
        clients.into_iter().find_map(|c| c.join().unwrap())
    });
    let head = busy.expect("no 503 from a queue of 2 under eight clients");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    // The tokenizer endpoints.
    let (_, _, t) = server.request(
        "POST",
        "/tokenize",
        "{\"prompt\": \"a cat\"}",
        Some("Bearer k3y"),
    );
    let (_, _, d) = server.request(
        "POST",
        "/detokenize",
        &json!({"tokens": t["tokens"]}).to_string(),
        Some("Bearer k3y"),
    );
    assert!(d["prompt"].as_str().unwrap().ends_with("a cat"), "{d}");
    let (_, _, info) = server.request("GET", "/tokenizer_info", "", Some("Bearer k3y"));
    assert_eq!(info["bos_token"], "<s>");
    let (_, _, models) = server.request("GET", "/v1/models", "", Some("Bearer k3y"));
    assert_eq!(models["data"][0]["max_model_len"], 512);
    // SIGTERM: a clean exit.
    let mut server = server;
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// What lm-eval's `local-completions` and other OpenAI clients rely on beyond the numbers:
/// text prompts counted as lm-eval counts them (no BOS unless asked), token strings with their
/// spaces and offsets into `text`, the served name, and the endpoints that are not served.
#[test]
fn the_openai_contract_as_lm_eval_reads_it() {
    let server = Server::start(&["--served-model-name", "tiny-int4"]);
    let text = "Once upon a time there was a little cat";
    let post = |path: &str, body: &Value| {
        let (status, _, v) = server.request("POST", path, &body.to_string(), None);
        (status, v)
    };
    // Tokens as lm-eval's remote tokenizer asks for them (no special tokens), then the
    // prompt's answer: the same tokens, no BOS; with add_special_tokens, BOS first.
    let (_, plain) = post(
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    );
    let (_, with_bos) = post("/tokenize", &json!({"prompt": text}));
    let plain = plain["tokens"].as_array().unwrap().clone();
    assert_eq!(with_bos["tokens"].as_array().unwrap()[1..], plain[..]);
    // A literal `<s>` is the BOS token.
    let (_, literal) = post(
        "/tokenize",
        &json!({"prompt": format!("<s>{text}"), "add_special_tokens": false}),
    );
    assert_eq!(literal["tokens"], with_bos["tokens"]);
    let body = json!({"prompt": text, "echo": true, "logprobs": 3, "max_tokens": 0});
    let v = server.complete(&body);
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), plain.len(), "{lp}");
    assert_eq!(v["usage"]["prompt_tokens"], plain.len());
    let mut asked = body.clone();
    asked["add_special_tokens"] = json!(true);
    let v_bos = server.complete(&asked);
    assert_eq!(v_bos["usage"]["prompt_tokens"], plain.len() + 1);
    // Token strings keep their spaces: end to end they are the text, and each offset is
    // where its string starts in it.
    assert_eq!(tokens.concat(), text);
    assert_eq!(v["choices"][0]["text"], text);
    assert!(
        tokens.iter().filter(|t| t.starts_with(' ')).count() >= 7,
        "{tokens:?}"
    );
    let offsets = lp["text_offset"].as_array().unwrap();
    for (i, t) in tokens.iter().enumerate() {
        let at = offsets[i].as_u64().unwrap() as usize;
        assert!(text[at..].starts_with(t), "token {i} {t:?} at {at}");
    }
    // Top lists read as the position's own token reads: the scored token is among its keys
    // where it is among the top 3 (with its own logprob).
    let (tops, logprobs) = (
        lp["top_logprobs"].as_array().unwrap(),
        lp["token_logprobs"].as_array().unwrap(),
    );
    let mut listed = 0;
    for p in 1..tokens.len() {
        let top = tops[p].as_object().unwrap();
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let own = logprobs[p].as_f64().unwrap();
        if own >= best - 1e-12 {
            assert_eq!(top.get(tokens[p]).and_then(Value::as_f64), Some(own), "{p}");
            listed += 1;
        }
    }
    assert!(listed > 0, "no prompt token was the greedy one: {lp}");
    // The served name: in /v1/models and answers; another name is 404 naming the served one.
    let (_, _, models) = server.request("GET", "/v1/models", "", None);
    assert_eq!(models["data"][0]["id"], "tiny-int4");
    assert_eq!(v["model"], "tiny-int4");
    let mut named = body.clone();
    named["model"] = json!("tiny-int4");
    server.complete(&named);
    named["model"] = json!("gpt-4");
    let (status, v) = post("/v1/completions", &named);
    assert_eq!(status, 404, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("gpt-4") && message.contains("tiny-int4"),
        "{message}"
    );
    // Endpoints that are not served say so.
    let (status, v) = post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 404);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/completions"),
        "{v}"
    );
    let (status, _, v) = server.request("GET", "/v2/anything", "", None);
    assert_eq!(status, 404);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v2/anything"),
        "{v}"
    );
}

/// Listening beyond the loopback without a key is warned about, with a key it is not.
#[test]
fn an_open_address_without_a_key_is_warned_about() {
    for (key, warned) in [(None, true), (Some("k3y"), false)] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args([
                "serve",
                "--backend",
                "cpu",
                "--port",
                "0",
                "--host",
                "0.0.0.0",
            ])
            .args(key.map_or(vec![], |k| vec!["--api-key", k]))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        assert!(first.contains("listening on http://0.0.0.0:"), "{first}");
        // The warning follows at once where it is due; a key gives no second line (the
        // server is stopped to end its stderr).
        let next = if warned {
            lines.next().unwrap().unwrap()
        } else {
            // SAFETY: a signal to our own child process.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            lines.map(Result::unwrap).collect::<Vec<_>>().join("\n")
        };
        assert_eq!(next.contains("without --api-key"), warned, "{next}");
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A connected socket that has sent `sent`, and the seconds until the server closed it (or
/// answered, then closed), with what it answered.
fn held_open(port: u16, sent: &[u8]) -> (f64, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(sent).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let start = std::time::Instant::now();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    (
        start.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&got).into_owned(),
    )
}

/// Slow and oversized clients (issue 56, F3-F7): an idle connection and half-sent headers are
/// closed after --client-timeout, a body that stalls is answered 408; a body past
/// --max-body-mb, an answer past --max-response-mb are 413 and a text too long to fit the
/// context 400, each before any tokenizing or scoring; SIGTERM with a half-sent request still
/// exits within the timeout.
#[test]
fn slow_and_oversized_clients_are_bounded() {
    let mut server = Server::start(&[
        "--client-timeout",
        "2",
        "--max-body-mb",
        "1",
        "--max-response-mb",
        "1",
    ]);
    let port = server.port;
    for (sent, what) in [
        (&b""[..], "an idle connection"),
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
            "half-sent headers",
        ),
    ] {
        let (seconds, got) = held_open(port, sent);
        assert!(got.is_empty(), "{what}: {got}");
        assert!(
            (1.5..10.0).contains(&seconds),
            "{what}: closed after {seconds} s"
        );
    }
    let stalled = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{";
    let (seconds, got) = held_open(port, stalled);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("did not arrive within 2 s"), "{got}");
    assert!((1.5..10.0).contains(&seconds), "answered after {seconds} s");
    let post = |body: &Value| server.request("POST", "/v1/completions", &body.to_string(), None);
    // A body declared past --max-body-mb is answered 413 before any of it is parsed; what the
    // client still writes is read and dropped for a moment, so that it reads the answer.
    let (status, _, v) = post(&json!({"prompt": "a".repeat(2 << 20)}));
    assert_eq!(status, 413, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-body-mb"),
        "{v}"
    );
    let long: Vec<Vec<u32>> = vec![vec![100; 500]; 4];
    let (status, _, v) = post(&json!({"prompt": long, "echo": true, "logprobs": 20}));
    assert_eq!(status, 413, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-response-mb"),
        "{v}"
    );
    let (status, _, v) = post(&json!({"prompt": "a b ".repeat(100_000)}));
    assert_eq!(status, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("400000 bytes") && message.contains("context of 512"),
        "{message}"
    );
    // Still serving, then SIGTERM while a client holds a half-sent request.
    assert_eq!(server.request("GET", "/health", "", None).0, 200);
    let mut holder = TcpStream::connect(("127.0.0.1", port)).unwrap();
    holder.write_all(stalled).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let start = std::time::Instant::now();
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let seconds = start.elapsed().as_secs_f64();
    assert!(seconds < 10.0, "exited {seconds} s after SIGTERM");
}

/// --max-connections (F4): with one connection allowed and an idle client holding it, a
/// `/health` probe waits until the client timeout frees the slot, then is answered.
#[test]
fn a_full_connection_table_frees_itself() {
    let server = Server::start(&["--max-connections", "1", "--client-timeout", "2"]);
    let idle = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let start = std::time::Instant::now();
    assert_eq!(server.request("GET", "/health", "", None).0, 200);
    let waited = start.elapsed().as_secs_f64();
    assert!((1.0..10.0).contains(&waited), "answered after {waited} s");
    drop(idle);
}

/// 30 MB of one-token prompts (7.8 million, F6): refused as too many for the queue while they
/// are read, the server's peak memory far below what a JSON tree of them took (4.5 GB for
/// 60 MB).
#[cfg(target_os = "linux")]
#[test]
fn millions_of_prompts_are_refused_as_they_are_read() {
    let server = Server::start(&[]);
    let body = format!("{{\"prompt\": [{}]}}", vec!["[1]"; 7_800_000].join(","));
    let (status, _, v) = server.request("POST", "/v1/completions", &body, None);
    assert_eq!(status, 413, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--queue"),
        "{v}"
    );
    let peak = memory_bytes(&server, "VmHWM:");
    assert!(peak < 150 << 20, "peak {} MiB", peak >> 20);
}

#[test]
fn several_devices_answer_as_one() {
    // `--devices 0,1` on the CPU backend makes two CPU workers (the multi-device stand-in).
    let body = json!({
        "prompt": ["Once upon a time", "The little dog ran to the park and", "Tom and Sue"],
        "echo": true, "logprobs": 4, "max_tokens": 1
    });
    let one = Server::start(&[]).complete(&body)["choices"].clone();
    for parallel in ["data", "layers"] {
        let server = Server::start(&["--devices", "0,1", "--parallel", parallel]);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| assert_eq!(server.complete(&body)["choices"], one, "{parallel}"));
            }
        });
    }
}

/// A config claiming a billion positions (issue 56, F2): the server sizes its tables for
/// `--context` (default at most 32,768) instead of allocating for the claim, serves prompts
/// as before and refuses a longer one by that bound; `--context` beyond the model's claim is
/// refused at start.
#[test]
fn a_huge_max_position_embeddings_is_not_allocated() {
    let dir = common::writable_copy(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/stories260K-w4a16-channel"),
        "serve-huge-context",
    );
    let config = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = json!(1_000_000_000u64);
    std::fs::write(&config, c.to_string()).unwrap();
    let model = dir.to_str().unwrap();
    let server = Server::start(&["--model", model, "--context", "600"]);
    let (status, _, info) = server.request("GET", "/v1/models", "", None);
    assert_eq!(status, 200);
    assert_eq!(info["data"][0]["max_model_len"], 600, "{info}");
    let short = json!({"prompt": vec![5u32; 500], "max_tokens": 1, "echo": true, "logprobs": 1});
    let (status, _, v) = server.request("POST", "/v1/completions", &short.to_string(), None);
    assert_eq!(status, 200, "{v}");
    let long = json!({"prompt": vec![5u32; 700], "max_tokens": 1});
    let (status, _, v) = server.request("POST", "/v1/completions", &long.to_string(), None);
    assert_eq!(status, 400, "{v}");
    drop(server);
    // The default: started at all (it used to abort allocating 16 GB of tables).
    let server = Server::start(&["--model", model]);
    assert_eq!(server.request("GET", "/health", "", None).0, 200);
    drop(server);
    common::fails_with(
        &[
            "serve",
            "--backend",
            "cpu",
            "--model",
            "assets/stories260K-w4a16-channel",
            "--context",
            "100000",
        ],
        &["--context 100000", "max_position_embeddings = 512"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Prompts of one request that start alike (a multiple-choice context sent once per choice)
/// share their common start in the batch; each answer is the one the prompt gets alone, on
/// the device-reduced path (logprobs 1) and the host's (logprobs 5).
#[test]
fn prompts_that_start_alike_answer_as_alone() {
    let context: Vec<u32> = (0..40).map(|i| 20 + (i * 37) % 400).collect();
    let with = |tail: &[u32]| -> Vec<u32> { context.iter().chain(tail).copied().collect() };
    let prompts = vec![
        with(&[300, 301, 302]),
        with(&[77]),
        context[..5].iter().chain(&[9, 9, 9]).copied().collect(),
        with(&[300, 301, 302]),
        (100..130).collect::<Vec<u32>>(),
        with(&[5, 6, 7, 8, 9, 10, 11]),
    ];
    // Without the prefix cache, so that "alone" is computed whole.
    let server = Server::start(&["--prefix-cache-mb", "0"]);
    for logprobs in [1, 5] {
        let ask = |p: &Value| {
            server.complete(&json!({
                "prompt": p, "echo": true, "logprobs": logprobs, "max_tokens": 1, "temperature": 0
            }))
        };
        let together = ask(&json!(prompts));
        for (i, p) in prompts.iter().enumerate() {
            let alone = ask(&json!([p]));
            let (a, t) = (
                &alone["choices"][0]["logprobs"],
                &together["choices"][i]["logprobs"],
            );
            let (a_lp, t_lp) = (
                a["token_logprobs"].as_array().unwrap(),
                t["token_logprobs"].as_array().unwrap(),
            );
            assert_eq!(a_lp.len(), t_lp.len(), "prompt {i}");
            for (x, y) in a_lp.iter().zip(t_lp).skip(1) {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                    "prompt {i} logprobs {logprobs}: {x} vs {y}"
                );
            }
            assert_eq!(a["tokens"], t["tokens"], "prompt {i}");
            for (x, y) in a["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .zip(t["top_logprobs"].as_array().unwrap())
                .skip(1)
            {
                let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
                assert_eq!(
                    x.keys().collect::<Vec<_>>(),
                    y.keys().collect::<Vec<_>>(),
                    "prompt {i}"
                );
                for (u, v) in x.values().zip(y.values()) {
                    let (u, v) = (u.as_f64().unwrap(), v.as_f64().unwrap());
                    assert!(
                        (u - v).abs() <= 1e-5 * u.abs().max(1.0),
                        "prompt {i}: {u} vs {v}"
                    );
                }
            }
        }
    }
}

/// A prompt starting like one an earlier batch scored (lm-eval's choices of one context, in
/// requests of their own) continues the rows the prefix cache kept: every answer is the one a
/// server without the cache gives, to the last digit on the CPU (a longer top list than the
/// kept one's, a repeat, a context's own start among them); the cache did give rows; and over
/// hundreds of distinct contexts within a 1 MB budget the server's memory stays flat.
#[test]
fn prompts_continue_the_rows_earlier_batches_kept() {
    let plain = Server::start(&["--prefix-cache-mb", "0"]);
    let cached = Server::start(&["--prefix-cache-mb", "1"]);
    let context = |c: u32| -> Vec<u32> { (0..40).map(|i| 20 + (i * 37 + c * 11) % 400).collect() };
    let body = |ids: Vec<u32>, logprobs: u32| json!({"prompt": [ids], "echo": true, "logprobs": logprobs, "max_tokens": 1});
    let tails: [(&[u32], u32); 6] = [
        (&[300, 301, 302], 1),
        (&[77], 5),
        (&[300, 301, 302], 1),
        (&[5, 6, 7, 8, 9, 10, 11], 1),
        (&[], 1),
        (&[300, 301], 5),
    ];
    let rounds = |contexts: std::ops::Range<u32>| {
        for c in contexts {
            for &(tail, logprobs) in &tails {
                let ids: Vec<u32> = context(c).iter().chain(tail).copied().collect();
                let b = body(ids, logprobs);
                assert_eq!(
                    cached.complete(&b)["choices"],
                    plain.complete(&b)["choices"],
                    "context {c} tail {tail:?} logprobs {logprobs}"
                );
            }
            // A context's first half, then a prompt that leaves it after 20 tokens.
            let half: Vec<u32> = context(c)[..20].to_vec();
            let off: Vec<u32> = half.iter().chain(&[1, 2, 3]).copied().collect();
            for ids in [half, off] {
                let b = body(ids, 1);
                assert_eq!(
                    cached.complete(&b)["choices"],
                    plain.complete(&b)["choices"]
                );
            }
        }
    };
    rounds(0..60);
    #[cfg(target_os = "linux")]
    {
        let warm = resident_bytes(&cached);
        rounds(60..300);
        let last = resident_bytes(&cached);
        common::tally!(
            "serve prefix cache: resident {:.1} MiB after 60 contexts, {:.1} MiB after 300",
            warm as f64 / 1048576.0,
            last as f64 / 1048576.0
        );
        assert!(
            last < warm + 4 * 1024 * 1024,
            "resident memory grew from {warm} to {last} bytes over 240 new contexts"
        );
    }
    let printed = cached.stop();
    let gave: u64 = printed
        .split("the prefix cache gave ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prefix cache line in: {printed}"));
    assert!(gave > 60 * 5 * 38, "the cache gave {gave} rows");
}

//! Plans against the fixtures' reference.json: the scored-token counts and the exl3 row ids
//! must equal what the Python reference scored. Expected values are read from the fixtures.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use quantppl::data::{TextTokenizer, TextView, load_text};
use quantppl::plan;

fn usize_of(v: &serde_json::Value) -> usize {
    usize::try_from(v.as_u64().unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

#[test]
fn plans_match_every_reference() {
    let text = load_text(&common::wiki_test_raw(), TextView::Raw).unwrap();
    // Tokenize once per distinct tokenizer.json (the stories260K variants share one).
    let mut streams: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
    // The fixtures whose reference records all three plans (the others record exl3 and
    // nonoverlap only, and fixtures_ppl.rs checks those).
    let dirs: Vec<PathBuf> = common::reference_dirs()
        .into_iter()
        .filter(|d| common::reference(d)["llamacpp"].is_object())
        .collect();
    assert!(dirs.len() >= 2, "no fixtures with a full reference.json");
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let key = std::fs::read(dir.join("tokenizer.json")).unwrap();
        let t = streams.entry(key).or_insert_with(|| {
            let tok = TextTokenizer::from_model_dir(&dir).unwrap();
            tok.encode(&text, true).unwrap()
        });
        assert_eq!(
            t.len(),
            usize_of(&r["tokenizer_check"]["n_tokens"]),
            "{name}"
        );

        let e = &r["exl3"];
        let (l, s) = (usize_of(&e["L"]), usize_of(&e["S"]));
        let p = plan::exl3(t, l, s, Some(usize_of(&e["max_rows"]))).unwrap();
        assert_eq!(p.scored(), usize_of(&e["scored"]), "{name} exl3");
        let starts: Vec<usize> = e["row_starts"]
            .as_array()
            .unwrap()
            .iter()
            .map(usize_of)
            .collect();
        assert_eq!(p.windows.len(), starts.len(), "{name} exl3 rows");
        for (w, &a) in p.windows.iter().zip(&starts) {
            assert_eq!(w.ids, t[a..a + l], "{name} exl3 row at {a}");
        }
        for (i, row) in [&e["row0"], &e["row1"]].into_iter().enumerate() {
            assert_eq!(
                p.windows[i].ids,
                ids(&row["token_ids"]),
                "{name} exl3 row{i}"
            );
            assert_eq!(p.windows[i].scored(), row["nll"].as_array().unwrap().len());
        }

        let c = &r["llamacpp"];
        let bos = c["bos_replaced"]
            .as_bool()
            .unwrap()
            .then(|| u32::try_from(c["bos_id"].as_u64().unwrap()).unwrap());
        let n_chunks = usize_of(&c["n_chunks"]);
        let p = plan::llamacpp(t, usize_of(&c["n_ctx"]), bos, Some(n_chunks)).unwrap();
        assert_eq!(p.windows.len(), n_chunks, "{name} llamacpp chunks");
        assert_eq!(p.scored(), usize_of(&c["scored"]), "{name} llamacpp");
        let scored: Vec<usize> = (0..p.windows[0].targets.len())
            .filter(|&j| p.windows[0].targets[j] >= 0)
            .collect();
        assert_eq!(scored.first(), Some(&usize_of(&c["first_scored_logit"])));
        assert_eq!(scored.last(), Some(&usize_of(&c["last_scored_logit"])));

        let g = &r["nonoverlap"];
        let rows = usize_of(&g["rows"]);
        let p = plan::gptq(t, usize_of(&g["L"]), Some(rows)).unwrap();
        assert_eq!(p.windows.len(), rows, "{name} nonoverlap rows");
        assert_eq!(p.scored(), usize_of(&g["scored"]), "{name} nonoverlap");
    }
}

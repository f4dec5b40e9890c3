# Sourced by run.sh and gpu_vs_hf.sh: lm-eval task definitions over local files.

# wikitext_task DIR PAGES_JSONL: lm-eval's wikitext task (lm_eval/tasks/wikitext/wikitext.yaml)
# as `wikitext_local`, its pages read from PAGES_JSONL (wikitext_pages.py's output).
wikitext_task() {
    cat > "$1/wikitext_local.yaml" <<YAML
task: wikitext_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: $2
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: !function wikitext_fns.wikitext_detokenizer
process_results: !function wikitext_fns.process_results
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
YAML
    echo "from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer, process_results" \
        > "$1/wikitext_fns.py"
}

# choice_task DIR NAME JSONL: a multiple-choice task NAME over JSONL's
# `{"context", "choices", "label"}` lines, scored by acc and acc_norm.
choice_task() {
    cat > "$1/$2.yaml" <<YAML
task: $2
dataset_path: json
dataset_kwargs:
  data_files:
    test: $3
output_type: multiple_choice
test_split: test
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
  - metric: acc_norm
YAML
}

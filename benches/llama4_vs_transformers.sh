#!/usr/bin/env bash
# docs/performance.md "Llama 4 against transformers": a `--layers` slice of the Llama-4-Scout
# shape in W4A16 (each layer 16 experts with the top-1 sigmoid on its input and a shared expert;
# the experts per expert as llm-compressor writes them, which transformers 5.23 +
# compressed-tensors 0.20 load) through quantppl and through transformers on the same exl3
# windows (benches/slice_vs_transformers.sh).
# Usage: [RUNS=3 ROWS=60 LAYERS=4 WHEELS=.whl] benches/llama4_vs_transformers.sh \
#   QUANTPPL_BINARY TOKENIZER_JSON TEXT_FILE OUT_DIR
SHAPE=llama4-scout exec "$(dirname "$0")/slice_vs_transformers.sh" "$@"

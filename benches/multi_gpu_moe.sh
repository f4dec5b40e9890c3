#!/usr/bin/env bash
# Mixtures of experts on several GPUs (docs/performance.md "Several GPUs").
# Usage: benches/multi_gpu_moe.sh QUANTPPL TOKENIZER TEXT OUT STEP...
#   scaling       Qwen3-30B-A3B W4A16: exl3 ctx 2048 stride 512, ROWS (200; `all`: every window
#                 of the text) windows on 1 GPU, on every power-of-two GPU count of the host
#                 with --parallel data, and split by layers over 2; REPEAT (3) runs of each.
#   split         Qwen3-235B-A22B (SCHEME, default w4a16-g128): SPLIT_ROWS (200) windows with
#                 its layers split over 2 GPUs (and 4 where the host has them), and on 1 GPU
#                 where the checkpoint fits one; batches of 4 windows, then the default batch.
#   transformers  the first SLICE (20; `all`: the whole model) layers of Qwen3-235B-A22B over
#                 every GPU of the host: quantppl's layer split against transformers +
#                 compressed-tensors with device_map="auto" (bf16 after decompression: the
#                 whole model needs ~470 GB), SPLIT_ROWS windows, 4 a forward on both sides;
#                 quantppl also at its default batch.
#   deepseek      the first DS_LAYERS (8) layers of DeepSeek-V3 (3 dense, then MoE with 256
#                 experts) on 1 GPU and split over 2.
#   deepseek-v3.2 the first DS_LAYERS (8) layers of DeepSeek-V3.2 (sparse attention keeping
#                 2048 keys) on 1 GPU where they fit and split over 2 (and 4 where the host
#                 has them), at ctx 2048 (DS_ROWS windows) and 8192 (a quarter as many), the
#                 second four times the indexer's top-k.
#   minimax-slice the first MM_LAYERS (20) layers of MiniMax-M2 (SCHEME) on 1 GPU and split over
#                 2 (the same digits), and through transformers + compressed-tensors with
#                 device_map="auto" over every GPU of the host (bf16 after decompression); the
#                 slice is removed after, so that the whole checkpoint has the disk.
#   minimax       the whole of MiniMax-M2 (SCHEME; ~115 GB in W4A16, 62 layers) split by layers
#                 over 2 GPUs, REPEAT runs at 8,192-token batches and one at the default batch
#                 (transformers needs ~460 GB for it decompressed: it runs the slice above).
#                 Issue 51's two-GPU run: minimax-slice and minimax, one device call each on
#                 an nvidia-h200-x2 (a 128 GiB disk holds one of the two checkpoints at a time).
# Every eval writes OUT/NAME.RUN.json; the table printed last (a median over the runs of a
# name) says whether the PPL digits agree across device counts, and gives each device's busy
# seconds in a name's first run. Synthetic checkpoints go to
# WORK (/tmp/quantppl-bench).
set -euo pipefail
Q=$1; TOK=$2; TEXT=$3; OUT=$4; shift 4
WORK=${WORK:-/tmp/quantppl-bench}
SCHEME=${SCHEME:-w4a16-g128}
REPEAT=${REPEAT:-3}
mkdir -p "$WORK" "$OUT"
gpus=$(nvidia-smi -L | wc -l)
gpu_bytes=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0) << 20))
common="--tokenizer $TOK --data $TEXT --method exl3 --backend cuda -q"
window="--ctx 2048 --stride 512"

synth() { # DIR SHAPE [LAYERS]: written beside DIR, renamed when complete
    [ -d "$1" ] && return
    rm -rf "$1.partial"
    "$Q" synth --shape "$2" --scheme "$SCHEME" ${3:+--layers "$3"} --out "$1.partial" -q
    mv "$1.partial" "$1"
}
eval_runs() { # NAME RUNS MODEL ARGS...
    local name=$1 runs=$2 model=$3; shift 3
    for i in $(seq "$runs"); do
        "$Q" eval --model "$model" $common $window "$@" --json "$OUT/$name.$i.json" \
            || echo "$name: quantppl failed (exit $?)"
    done
}
transformers_run() { # NAME MODEL ARGS...: transformers + compressed-tensors over every GPU
    local name=$1 model=$2; shift 2
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 \
        "$(dirname "$0")/transformers_compare.py" "$model" "$TOK" "$TEXT" --ctx 2048 \
        --stride 512 "$@" --batch 4 --device-map auto --dequantize \
        > "$OUT/$name.1.json" || echo "$name: transformers failed (exit $?)"
}
fits_one_gpu() { # MODEL: the checkpoint takes at most 85 % of one GPU
    [ $(du -sb "$1" | cut -f1) -lt $((gpu_bytes / 100 * 85)) ]
}

for step in "$@"; do
    case $step in
    scaling)
        m="$WORK/qwen3-30b-a3b-$SCHEME"; synth "$m" qwen3-30b-a3b
        r=${ROWS:-200}; tag="30b-${r}rows"
        [ "$r" != all ] || r=1000000000
        rows="--rows $r --batch-tokens 8192"
        eval_runs "${tag}_1" "$REPEAT" "$m" $rows --devices 0
        for n in 2 4 8; do
            [ "$n" -le "$gpus" ] || break
            eval_runs "${tag}_${n}_data" "$REPEAT" "$m" $rows \
                --devices "$(seq -s, 0 $((n - 1)))" --parallel data
        done
        eval_runs "${tag}_2_layers" "$REPEAT" "$m" $rows --devices 0,1 --parallel layers
        ;;
    split)
        m="$WORK/qwen3-235b-a22b-$SCHEME"; synth "$m" qwen3-235b-a22b
        rows="--rows ${SPLIT_ROWS:-200}"
        ! fits_one_gpu "$m" || eval_runs "235b_1" 1 "$m" $rows --batch-tokens 8192 --devices 0
        eval_runs "235b_2_layers" "$REPEAT" "$m" $rows --batch-tokens 8192 --devices 0,1 \
            --parallel layers
        eval_runs "235b_2_layers_default_batch" 1 "$m" $rows --devices 0,1 --parallel layers
        [ "$gpus" -lt 4 ] || eval_runs "235b_4_layers" 1 "$m" $rows --batch-tokens 8192 \
            --devices 0,1,2,3 --parallel layers
        ;;
    transformers)
        slice=${SLICE:-20}
        if [ "$slice" = all ]; then
            m="$WORK/qwen3-235b-a22b-$SCHEME"; synth "$m" qwen3-235b-a22b; tag="235b"
        else
            m="$WORK/qwen3-235b-a22b-$SCHEME-$slice-layers"
            synth "$m" qwen3-235b-a22b "$slice"; tag="slice"
        fi
        rows="--rows ${SPLIT_ROWS:-200}"
        devices=$(seq -s, 0 $((gpus - 1)))
        eval_runs "${tag}_${gpus}_layers" "$REPEAT" "$m" $rows --batch-tokens 8192 \
            --devices "$devices" --parallel layers
        eval_runs "${tag}_${gpus}_layers_default_batch" "$REPEAT" "$m" $rows \
            --devices "$devices" --parallel layers
        transformers_run "${tag}_transformers" "$m" $rows
        ;;
    deepseek)
        m="$WORK/deepseek-v3-$SCHEME-${DS_LAYERS:-8}-layers"
        synth "$m" deepseek-v3 "${DS_LAYERS:-8}"
        rows="--rows ${DS_ROWS:-32} --batch-tokens 8192"
        ! fits_one_gpu "$m" || eval_runs "deepseek_1" 1 "$m" $rows --devices 0
        eval_runs "deepseek_2_layers" 1 "$m" $rows --devices 0,1 --parallel layers
        ;;
    deepseek-v3.2)
        m="$WORK/deepseek-v3.2-$SCHEME-${DS_LAYERS:-8}-layers"
        synth "$m" deepseek-v3.2 "${DS_LAYERS:-8}"
        for w in "2048 512 ${DS_ROWS:-32}" "8192 2048 $((${DS_ROWS:-32} / 4))"; do
            set -- $w
            window="--ctx $1 --stride $2"
            rows="--rows $3 --batch-tokens 8192"
            ! fits_one_gpu "$m" || eval_runs "ds32-$1_1" 1 "$m" $rows --devices 0
            eval_runs "ds32-$1_2_layers" 1 "$m" $rows --devices 0,1 --parallel layers
            [ "$gpus" -lt 4 ] || eval_runs "ds32-$1_4_layers" 1 "$m" $rows \
                --devices 0,1,2,3 --parallel layers
        done
        window="--ctx 2048 --stride 512"
        ;;
    minimax-slice)
        m="$WORK/minimax-m2-$SCHEME-${MM_LAYERS:-20}-layers"
        synth "$m" minimax-m2 "${MM_LAYERS:-20}"
        rows="--rows ${SPLIT_ROWS:-200}"
        eval_runs "mmslice_1" 1 "$m" $rows --batch-tokens 8192 --devices 0
        eval_runs "mmslice_2_layers" 1 "$m" $rows --batch-tokens 8192 --devices 0,1 \
            --parallel layers
        transformers_run mmslice_transformers "$m" $rows
        rm -rf "$m"
        ;;
    minimax)
        rm -rf "$WORK/minimax-m2-$SCHEME-${MM_LAYERS:-20}-layers"
        m="$WORK/minimax-m2-$SCHEME"; synth "$m" minimax-m2
        rows="--rows ${SPLIT_ROWS:-200}"
        eval_runs "minimax_2_layers" "$REPEAT" "$m" $rows --batch-tokens 8192 --devices 0,1 \
            --parallel layers
        eval_runs "minimax_2_layers_default_batch" 1 "$m" $rows --devices 0,1 --parallel layers
        ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done

python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
runs = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    try:
        runs.setdefault(os.path.basename(f).rsplit(".", 2)[0], []).append(json.load(open(f)))
    except ValueError:
        print(f"{f}: not JSON")
gib = 2**30
print(f"{'run':<28} {'GPUs':>4} {'parallel':<22} {'batch':>6} {'PPL':>18} {'tokens/s':>8} "
      f"{'load s':>6} {'peak GiB/GPU':>12}  runs' tokens/s")
first = {}  # the first PPL of each model at each batch size: the others must match it
for name, rs in runs.items():
    r = rs[0]
    if "tool" in r:  # transformers_compare.py
        print(f"{name:<28} {r['devices']:>4} {'device_map=auto':<22} {r['batch'] * 2048:>6} "
              f"{r['ppl']:>18.8f} {r['tokens_per_second']:>8.0f} "
              f"{r['load_and_decompress_seconds']:>6.1f} {r['peak_gpu_memory_bytes'] / gib:>12.2f}")
        continue
    tps = [x["tokens_per_second"] for x in rs]
    key = (name.split("_")[0], r["batch_tokens"])
    same = all(x["ppl"] == first.setdefault(key, r["ppl"]) for x in rs)
    print(f"{name:<28} {r['devices']:>4} {r['parallel']:<22} {r['batch_tokens']:>6} "
          f"{r['ppl']:>18.8f} {statistics.median(tps):>8.0f} "
          f"{statistics.median(x['load_seconds'] for x in rs):>6.1f} "
          f"{max(x['peak_device_memory_bytes'] for x in rs) / gib:>12.2f}  "
          + ", ".join(f"{t:.0f}" for t in tps) + ("" if same else "  PPL DIGITS DIFFER"))
    times = r.get("device_times", [])
    if len(times) > 1:  # the first run's busy seconds per device, first batches apart
        print(f"{'':<28} busy s per device: " + " ".join(f"{t['seconds']:.2f}" for t in times)
              + " (first batches " + " ".join(f"{t['first_batch_seconds']:.2f}" for t in times)
              + "; batches " + " ".join(str(t["batches"]) for t in times) + ")")
PY

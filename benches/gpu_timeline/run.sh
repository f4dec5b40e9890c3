#!/usr/bin/env bash
# Builds cupti_trace.c against the CUDA toolkit's CUPTI and traces one command, then prints
# gaps.py's report. Usage: [SEG=7 MARK=copy1_819200] benches/gpu_timeline/run.sh OUT.tsv COMMAND...
#   e.g. benches/gpu_timeline/run.sh /tmp/t.tsv quantppl bench --model M --backend cuda --ctx 2048 --batch 100 --iters 2
set -euo pipefail
HERE=$(dirname "$0"); OUT=$1; shift
CUPTI=${CUPTI:-$(dirname "$(dirname "$(find /usr/local/cuda*/ -name cupti_activity.h 2>/dev/null | head -1)")")}
H=$CUPTI/include/cupti_activity.h
latest() { grep -o "$1[0-9]*\b" "$H" | sort -V | tail -1; }
LIB=$(dirname "$(find "$CUPTI" -name 'libcupti.so*' | head -1)")
gcc -O2 -shared -fPIC -I"$CUPTI/include" -I/usr/local/cuda/include \
    -DKERNEL_T="$(latest CUpti_ActivityKernel)" -DMEMCPY_T="$(latest CUpti_ActivityMemcpy)" \
    -DMEMSET_T="$(latest CUpti_ActivityMemset)" -o /tmp/libcupti_trace.so "$HERE/cupti_trace.c" \
    -L"$LIB" -lcupti
LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-} CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so \
    TRACE_API=1 TRACE_OUT="$OUT" "$@"
python3 "$HERE/gaps.py" "$OUT"

// Where the GPU waits: a CUPTI activity tracer loaded into any CUDA program through
// CUDA_INJECTION64_PATH (no change to the program, no Nsight Systems needed). It writes one
// line per kernel (K), copy (C) and memset (S) with start and end in ns, and with TRACE_API=1
// per driver call (D), to $TRACE_OUT; `gaps.py` reads it. Build and use: see run.sh.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;
#define BUFFER_BYTES (32u << 20)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = BUFFER_BYTES;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            KERNEL_T *k = (KERNEL_T *)r;
            fprintf(out, "K\t%llu\t%llu\t%u\t%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, k->name);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            MEMCPY_T *c = (MEMCPY_T *)r;
            fprintf(out, "C\t%llu\t%llu\t%u\tcopy%d_%llu\n", (unsigned long long)c->start,
                    (unsigned long long)c->end, c->streamId, (int)c->copyKind,
                    (unsigned long long)c->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            MEMSET_T *m = (MEMSET_T *)r;
            fprintf(out, "S\t%llu\t%llu\t%u\tmemset_%llu\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)r;
            const char *name = "?";
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
            fprintf(out, "D\t%llu\t%llu\t%u\t%s\n", (unsigned long long)a->start,
                    (unsigned long long)a->end, a->threadId, name);
            break;
        }
        default:
            break;
        }
    }
    free(buffer);
}

static void flush(void) {
    cuptiActivityFlushAll(1);
    fflush(out);
}

int InitializeInjection(void) {
    const char *path = getenv("TRACE_OUT");
    out = fopen(path ? path : "trace.tsv", "w");
    if (!out) return 0;
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    if (getenv("TRACE_API")) cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
    atexit(flush);
    return 1;
}

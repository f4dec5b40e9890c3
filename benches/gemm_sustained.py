# bf16 GEMM throughput of 8192^3 products on GPU 0 (torch): a burst of 10 (a rate measured
# before the clocks settle) and 1 s and 3 s of them, with the SM clock and power nvidia-smi
# reports after each: how far a power-capped GPU falls below its burst rate (docs/decisions.md:
# Sustained, not burst, GEMM peak). Usage: python3 benches/gemm_sustained.py
import subprocess, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
def clock():
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
def run(reps):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): a @ b
    torch.cuda.synchronize(); dt = time.perf_counter() - t
    return 2 * n**3 * reps / dt / 1e12
run(3); time.sleep(2)
print(f"burst of 10: {run(10):.0f} TFLOP/s ({clock()})")
for secs in (1, 3):
    reps = int(secs * 560)
    print(f"sustained {secs} s ({reps} products): {run(reps):.0f} TFLOP/s (clock after: {clock()})")
time.sleep(3)
print(f"burst of 10 after 3 s idle: {run(10):.0f} TFLOP/s")

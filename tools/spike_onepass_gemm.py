"""Spike: does a one-pass small-M GEMM kernel beat ONNX Runtime's MLAS at verify row counts?

    python tools/spike_onepass_gemm.py [--threads 2]      (needs g++ with -mavx2 -mfma and OpenMP)

bench_gemm_rows.py's roofline leaves depth 8 (M = 9 rows) no slower than depth 1 on this
CPU, while MLAS takes a second row block from M = 7. The obvious remedy is a kernel that
multiplies all M rows of a verify in ONE pass over the weights: weights prepacked as 8-column
strips [N/8][K][8], an M x (S x 8) tile of AVX2 accumulators per strip group (M x S <= 12 of
the 16 ymm registers), one weight load shared by the M broadcast rows. This writes that
kernel (explicit registers, no arrays, so that GCC keeps the accumulators in registers),
compiles it with OpenMP over the strips, checks it against a float64 product and prints
the median time per M relative to M = 1, for SmolLM2-135M's weight shapes. Not part of
specrt: a measurement that decides whether a custom ONNX Runtime operator is worth writing.

Measured here 2026-11-30 (AMD EPYC Zen 3, AVX2, 2 threads, training paused; two runs):
at M = 9 the one-pass kernel takes about what MLAS takes (bench_gemm_rows.py, same hour):
lm_head [576 x 49152] 5.6-6.0 ms (MLAS 5.4-6.0 ms), gate/up [576 x 3072] 0.27-0.29 ms (MLAS
0.28-0.35 ms); and its M = 9 costs 1.45-2x its own M = 6. With 16 ymm registers nine rows
leave room for one weight vector per step, so each weight load feeds nine FMAs against ten
loads (the broadcasts): load-bound, no better than MLAS's two passes of a 6 x 16 tile over
weights that stay in cache. The roofline room at depth 8 is real but not reachable this way
on AVX2; AVX-512 (32 registers and embedded broadcasts, where the same engines measured
depth 8 at 1.25x) is where it lies. No custom operator was written.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = [(1, 4), (2, 4), (3, 3), (4, 2), (5, 2), (6, 2), (7, 1), (9, 1), (12, 1)]  # (rows M, strips S)
SHAPES = [(576, 49152), (576, 3072), (1536, 576), (576, 960)]  # lm_head, gate_up, down, qkv [K x N]


def tile_source(r: int, s: int) -> str:
    """One M = r by (s x 8) tile function with every accumulator a named register variable."""
    acc = [[f"a{i}_{j}" for j in range(s)] for i in range(r)]
    lines = [f"static void tile_{r}_{s}(const float* __restrict X, int K, const float* __restrict Wp, int j0, "
             "float* __restrict Y, int N) {",
             *(f"  __m256 {a} = _mm256_setzero_ps();" for row in acc for a in row),
             "  const float* wb = Wp + (size_t)j0 * K * 8;",
             "  for (int k = 0; k < K; k++) {",
             *(f"    __m256 w{j} = _mm256_load_ps(wb + ((size_t){j} * K + k) * 8);" for j in range(s))]
    for i in range(r):
        lines.append(f"    {{ __m256 x = _mm256_broadcast_ss(X + (size_t){i} * K + k);")
        lines += [f"      {acc[i][j]} = _mm256_fmadd_ps(x, w{j}, {acc[i][j]});" for j in range(s)]
        lines.append("    }")
    lines.append("  }")
    lines += [f"  _mm256_storeu_ps(Y + (size_t){i} * N + (j0 + {j}) * 8, {acc[i][j]});" for i in range(r) for j in range(s)]
    lines.append("}")
    return "\n".join(lines)


def gemm_source(r: int, s: int) -> str:
    """Groups of s strips in parallel, then the strips left over one at a time (tile_r_1)."""
    return "\n".join([
        f"static void gemm_{r}_{s}(const float* X, int K, const float* Wp, float* Y, int N) {{",
        f"  const int strips = N / 8, full = strips / {s} * {s};",
        "#pragma omp parallel for schedule(static)",
        f"  for (int j = 0; j < full; j += {s}) tile_{r}_{s}(X, K, Wp, j, Y, N);",
        f"  for (int j = full; j < strips; j++) tile_{r}_1(X, K, Wp, j, Y, N);",
        "}"])


MAIN = r"""
typedef void (*fn)(const float*, int, const float*, float*, int);
int main(int argc, char** argv) {
  const int K = atoi(argv[1]), N = atoi(argv[2]);
  float* W = (float*)aligned_alloc(64, (size_t)K * N * 4);
  float* Wp = (float*)aligned_alloc(64, (size_t)K * N * 4);
  srand(0);
  for (size_t i = 0; i < (size_t)K * N; i++) W[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.04f;
  if (N % 8) { fprintf(stderr, "N = %d: expected a multiple of 8\n", N); return 3; }
  for (int j = 0; j < N / 8; j++)
    for (int k = 0; k < K; k++)
      for (int c = 0; c < 8; c++) Wp[((size_t)j * K + k) * 8 + c] = W[(size_t)k * N + j * 8 + c];
  std::vector<float> X(12 * K), Y(12 * N);
  for (auto& v : X) v = rand() / (float)RAND_MAX - 0.5f;
  struct { int m; fn f; } cases[] = {CASES};
  double base = 0;
  for (auto& c : cases) {
    c.f(X.data(), K, Wp, Y.data(), N);
    std::vector<double> ts;
    for (int it = 0; it < 40; it++) {
      auto t0 = std::chrono::steady_clock::now();
      c.f(X.data(), K, Wp, Y.data(), N);
      ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    const double med = ts[ts.size() / 2];
    if (c.m == 1) base = med;
    double err = 0;
    for (int r = 0; r < c.m; r++)
      for (int n = 0; n < N; n += 97) {
        double s = 0;
        for (int k = 0; k < K; k++) s += (double)X[r * K + k] * W[(size_t)k * N + n];
        err = std::max(err, std::abs(s - Y[r * N + n]));
      }
    printf("[%d x %d] M=%2d %.3f ms (%.2fx M=1), max |error| vs float64 %.1e\n", K, N, c.m, med, med / base, err);
    if (err > 1e-4) return 2;
  }
  return 0;
}
"""


def source() -> str:
    head = "\n".join(f"#include <{h}>" for h in ("immintrin.h", "omp.h", "algorithm", "chrono", "cmath", "cstdio",
                                                 "cstdlib", "vector"))
    cases = ", ".join(f"{{{r}, gemm_{r}_{s}}}" for r, s in CASES)
    tiles = sorted({*CASES, *((r, 1) for r, _ in CASES)})
    return (head + "\n" + "\n".join(tile_source(r, s) for r, s in tiles) + "\n"
            + "\n".join(gemm_source(r, s) for r, s in CASES) + MAIN).replace("{CASES}", "{" + cases + "}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "onepass.cpp", Path(d) / "onepass"
        src.write_text(source())
        try:
            subprocess.run(["g++", "-O3", "-mavx2", "-mfma", "-fopenmp", str(src), "-o", str(exe)], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"error: cannot compile the kernel with g++ -mavx2 -mfma -fopenmp ({e})", file=sys.stderr)
            return 1
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
        for k, n in SHAPES:
            r = subprocess.run([str(exe), str(k), str(n)], env=env)
            if r.returncode:
                print(f"error: the kernel's result is wrong or it crashed on [{k} x {n}] (exit {r.returncode})",
                      file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

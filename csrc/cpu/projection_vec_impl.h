// Vectorised CPU kernels of the projection (see projection_vec.h). Included once by each
// projection_vec_<capability>.cpp after every generic header, once it has defined
// ENTANGLE_PROJ_NS, ENTANGLE_PROJ_NAME and, for the wide variants, ENTANGLE_PROJ_AVX2 /
// ENTANGLE_PROJ_AVX512 and ENTANGLE_PROJ_TARGET (the instruction sets, e.g. "avx2,fma"): then
// everything below is compiled under a target pragma for that instruction set, popped at the end.
// Everything here has internal linkage or lives in a capability-specific namespace, so no inline
// function compiled for a wide instruction set can replace a baseline one at link time.
//
// Pass 1 streams each chunk once in blocks of kBlock elements: the Gram of the k + 1 rows
// [v_0..v_{k-1}, g] is formed by register tiles (groups of up to kGroup rows, each row loaded once
// per tile and converted to float64 in registers), accumulated in float64 vectors across the chunk
// and reduced across lanes in a fixed order at its end. Pass 2 streams g and the basis once more.

#if defined(ENTANGLE_PROJ_TARGET)
#define ENTANGLE_PROJ_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define ENTANGLE_PROJ_TARGET_PUSH(t) \
  ENTANGLE_PROJ_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#else
#pragma GCC push_options
// GCC 12 reports its own AVX-512 conversion intrinsics as "maybe uninitialized" (false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ENTANGLE_PROJ_TARGET_PUSH(t) ENTANGLE_PROJ_PRAGMA(GCC target(t))
#endif
ENTANGLE_PROJ_TARGET_PUSH(ENTANGLE_PROJ_TARGET)
#endif

namespace entangle_ext {
namespace ENTANGLE_PROJ_NS {
namespace {

// ---- a float64 vector of W lanes: intrinsics for AVX-512 / AVX2, plain arrays otherwise ----------
#if defined(ENTANGLE_PROJ_AVX512)
constexpr int W = 8;
constexpr int kGroup = 5;  // 32 vector registers: a 4 x 5 tile (20 accumulators + 9 rows)
struct Vd { __m512d x; };
inline Vd vset(double a) { return {_mm512_set1_pd(a)}; }
inline Vd vload(const double* p) { return {_mm512_loadu_pd(p)}; }
inline Vd vload(const float* p) { return {_mm512_cvtps_pd(_mm256_loadu_ps(p))}; }
inline void vstore(double* p, Vd a) { _mm512_storeu_pd(p, a.x); }
inline void vstore(float* p, Vd a) { _mm256_storeu_ps(p, _mm512_cvtpd_ps(a.x)); }
inline Vd vfma(Vd a, Vd b, Vd c) { return {_mm512_fmadd_pd(a.x, b.x, c.x)}; }
inline Vd vmul(Vd a, Vd b) { return {_mm512_mul_pd(a.x, b.x)}; }
inline Vd vabsmax(Vd m, Vd a) { return {_mm512_max_pd(m.x, _mm512_abs_pd(a.x))}; }
#elif defined(ENTANGLE_PROJ_AVX2)
constexpr int W = 4;
constexpr int kGroup = 3;  // 16 vector registers: a 3 x 3 tile (9 accumulators + 6 rows)
struct Vd { __m256d x; };
inline Vd vset(double a) { return {_mm256_set1_pd(a)}; }
inline Vd vload(const double* p) { return {_mm256_loadu_pd(p)}; }
inline Vd vload(const float* p) { return {_mm256_cvtps_pd(_mm_loadu_ps(p))}; }
inline void vstore(double* p, Vd a) { _mm256_storeu_pd(p, a.x); }
inline void vstore(float* p, Vd a) { _mm_storeu_ps(p, _mm256_cvtpd_ps(a.x)); }
inline Vd vfma(Vd a, Vd b, Vd c) { return {_mm256_fmadd_pd(a.x, b.x, c.x)}; }
inline Vd vmul(Vd a, Vd b) { return {_mm256_mul_pd(a.x, b.x)}; }
inline Vd vabsmax(Vd m, Vd a) {
  return {_mm256_max_pd(m.x, _mm256_andnot_pd(_mm256_set1_pd(-0.0), a.x))};
}
#else
constexpr int W = 4;
constexpr int kGroup = 2;
struct Vd { double x[W]; };
inline Vd vset(double a) { return {{a, a, a, a}}; }
template <typename T>
inline Vd vload(const T* p) {
  Vd r;
  for (int l = 0; l < W; ++l) r.x[l] = static_cast<double>(p[l]);
  return r;
}
template <typename T>
inline void vstore(T* p, Vd a) {
  for (int l = 0; l < W; ++l) p[l] = static_cast<T>(a.x[l]);
}
inline Vd vfma(Vd a, Vd b, Vd c) {
  for (int l = 0; l < W; ++l) c.x[l] = std::fma(a.x[l], b.x[l], c.x[l]);
  return c;
}
inline Vd vmul(Vd a, Vd b) {
  for (int l = 0; l < W; ++l) a.x[l] *= b.x[l];
  return a;
}
inline Vd vabsmax(Vd m, Vd a) {
  for (int l = 0; l < W; ++l) m.x[l] = std::max(m.x[l], std::fabs(a.x[l]));
  return m;
}
#endif

constexpr int64_t kBlock = 512;  // elements per block: k + 1 rows stay in L1 across the tiles
constexpr int kMaxRows = kProjMaxK + 1;
static_assert(kBlock % W == 0, "kBlock must be a multiple of the vector width");

// float16 / bfloat16 through float32, one lane at a time (these dtypes are not a speed target).
template <typename T>
inline Vd load_d(const T* p) {
  float t[W];
  for (int l = 0; l < W; ++l) t[l] = static_cast<float>(p[l]);
  return vload(static_cast<const float*>(t));
}
template <>
inline Vd load_d<double>(const double* p) {
  return vload(p);
}
template <>
inline Vd load_d<float>(const float* p) {
  return vload(p);
}

template <typename T>
inline void store_d(T* p, const Vd& x) {
  double t[W];
  vstore(t, x);
  for (int l = 0; l < W; ++l) p[l] = static_cast<T>(t[l]);
}
template <>
inline void store_d<double>(double* p, const Vd& x) {
  vstore(p, x);
}
template <>
inline void store_d<float>(float* p, const Vd& x) {
  vstore(p, x);
}

template <typename T>
inline double to_d(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
inline double to_d<double>(double x) {
  return x;
}

// Sum of the lanes in a fixed (pairwise) order.
inline double hsum(const Vd& x) {
  double t[W];
  vstore(t, x);
  for (int w = W / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) t[l] += t[l + w];
  return t[0];
}

// ---- pass 1: register tiles of the Gram -----------------------------------------------------------
// acc[i * R + j] += sum_e x_i[e] x_j[e] for rows i in [i0, i0 + NI) and j in [j0, j0 + NJ) (only
// j <= i on a diagonal tile), over n elements (a multiple of W).
template <typename T, bool SC, int NI, int NJ, bool DIAG>
void gram_tile(const T* const* rows, int i0, int j0, int64_t n, const Vd* sc, Vd* acc, int R) {
  Vd a[NI][NJ];
  const T* pi[NI];
  const T* pj[NJ];
  for (int i = 0; i < NI; ++i) pi[i] = rows[i0 + i];
  for (int j = 0; j < NJ; ++j) pj[j] = rows[j0 + j];
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j)
      if (!DIAG || j <= i) a[i][j] = acc[(i0 + i) * R + j0 + j];
  for (int64_t e = 0; e < n; e += W) {
    Vd xi[NI];
    for (int i = 0; i < NI; ++i) {
      xi[i] = load_d(pi[i] + e);
      if constexpr (SC) xi[i] = vmul(xi[i], sc[i0 + i]);
    }
    if constexpr (DIAG) {
      for (int i = 0; i < NI; ++i)
        for (int j = 0; j <= i; ++j) a[i][j] = vfma(xi[i], xi[j], a[i][j]);
    } else {
      Vd xj[NJ];
      for (int j = 0; j < NJ; ++j) {
        xj[j] = load_d(pj[j] + e);
        if constexpr (SC) xj[j] = vmul(xj[j], sc[j0 + j]);
      }
      for (int i = 0; i < NI; ++i)
        for (int j = 0; j < NJ; ++j) a[i][j] = vfma(xi[i], xj[j], a[i][j]);
    }
  }
  for (int i = 0; i < NI; ++i)
    for (int j = 0; j < NJ; ++j)
      if (!DIAG || j <= i) acc[(i0 + i) * R + j0 + j] = a[i][j];
}

// Row groups have balanced sizes with the larger ones first, so an off-diagonal tile (later group
// i, earlier group j) has NJ in {NI, NI + 1}: only those shapes are instantiated.
template <typename T, bool SC, int NI>
void run_tile(int ni, int nj, const T* const* rows, int i0, int j0, int64_t n, const Vd* sc,
              Vd* acc, int R) {
  if constexpr (NI <= kGroup) {
    if (ni != NI) return run_tile<T, SC, NI + 1>(ni, nj, rows, i0, j0, n, sc, acc, R);
    if (i0 == j0) return gram_tile<T, SC, NI, NI, true>(rows, i0, j0, n, sc, acc, R);
    if (nj == NI) return gram_tile<T, SC, NI, NI, false>(rows, i0, j0, n, sc, acc, R);
    if constexpr (NI + 1 <= kGroup) {
      if (nj == NI + 1) return gram_tile<T, SC, NI, NI + 1, false>(rows, i0, j0, n, sc, acc, R);
    }
  }
}

template <typename T, bool SC>
void gram_rows(const T* const* rows, int R, int64_t n, const Vd* sc, Vd* acc) {
  const int ng = (R + kGroup - 1) / kGroup;
  int gstart[kMaxRows + 1], gsize[kMaxRows];
  for (int q = 0, s = 0; q < ng; ++q) {
    gsize[q] = R / ng + (q < R % ng ? 1 : 0);
    gstart[q] = s;
    s += gsize[q];
  }
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, n - b0);
    const T* blk[kMaxRows];
    for (int r = 0; r < R; ++r) blk[r] = rows[r] + b0;
    for (int qi = 0; qi < ng; ++qi)
      for (int qj = 0; qj <= qi; ++qj)
        run_tile<T, SC, 1>(gsize[qi], gsize[qj], blk, gstart[qi], gstart[qj], nb, sc, acc, R);
  }
}

// Gram of the rows over n elements of any length: the whole vectors in place, the last n % W
// elements through a zero-padded copy (zeros add nothing).
template <typename T, bool SC>
void gram_any(const T* const* rows, int R, int64_t n, const Vd* sc, Vd* acc) {
  const int64_t n_main = n - n % W;
  if (n_main > 0) gram_rows<T, SC>(rows, R, n_main, sc, acc);
  if (n_main == n) return;
  T tail[kMaxRows][W];
  const T* trows[kMaxRows] = {};
  for (int r = 0; r < R; ++r) {
    for (int l = 0; l < W; ++l) tail[r][l] = n_main + l < n ? rows[r][n_main + l] : T(0);
    trows[r] = tail[r];
  }
  gram_rows<T, SC>(trows, R, W, sc, acc);
}

template <typename T, bool SC>
void pass1_typed(const ProjChunk& ch, const double* scale, double* out) {
  const int R = ch.k + 1;
  const T* rows[kMaxRows];
  for (int i = 0; i < ch.k; ++i) rows[i] = static_cast<const T*>(ch.v[i]);
  rows[ch.k] = static_cast<const T*>(ch.g);
  Vd acc[kMaxRows * kMaxRows];
  Vd sc[kMaxRows];
  for (int r = 0; r < kMaxRows * kMaxRows; ++r) acc[r] = vset(0.0);
  for (int r = 0; r < kMaxRows; ++r) sc[r] = vset(SC && r < R ? scale[r] : 1.0);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    gram_any<T, SC>(rows, R, ch.n, sc, acc);
  } else {  // float16 / bfloat16: convert each block to float32 first
    float buf[kMaxRows][kBlock];
    const float* frows[kMaxRows];
    for (int64_t b0 = 0; b0 < ch.n; b0 += kBlock) {
      const int64_t nb = std::min(kBlock, ch.n - b0);
      for (int r = 0; r < R; ++r) {
        for (int64_t e = 0; e < nb; ++e) buf[r][e] = static_cast<float>(rows[r][b0 + e]);
        frows[r] = buf[r];
      }
      gram_any<float, SC>(frows, R, nb, sc, acc);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j <= i; ++j) out[tri_index(i, j)] = hsum(acc[i * R + j]);
}

// ---- pass 2: out = g - sum_i c_i (s_i v_i) -------------------------------------------------------
template <typename T, bool SC>
void pass2_typed(const ProjChunk& ch, const double* c, const double* scale) {
  constexpr int U = 4;
  const int k = ch.k;
  const T* g = static_cast<const T*>(ch.g);
  T* out = static_cast<T*>(ch.out);
  const T* v[kProjMaxK];
  Vd nc[kProjMaxK], sc[kProjMaxK];
  for (int i = 0; i < k; ++i) {
    v[i] = static_cast<const T*>(ch.v[i]);
    nc[i] = vset(-c[i]);
    sc[i] = vset(SC ? scale[i] : 1.0);
  }
  int64_t e = 0;
  for (; e + U * W <= ch.n; e += U * W) {
    Vd r[U];
    for (int u = 0; u < U; ++u) r[u] = load_d(g + e + u * W);
    for (int i = 0; i < k; ++i)
      for (int u = 0; u < U; ++u) {
        Vd x = load_d(v[i] + e + u * W);
        if constexpr (SC) x = vmul(x, sc[i]);
        r[u] = vfma(x, nc[i], r[u]);
      }
    for (int u = 0; u < U; ++u) store_d(out + e + u * W, r[u]);
  }
  for (; e < ch.n; ++e) {
    double r = to_d(g[e]);
    for (int i = 0; i < k; ++i) r = std::fma(SC ? to_d(v[i][e]) * scale[i] : to_d(v[i][e]), -c[i], r);
    out[e] = static_cast<T>(r);
  }
}

// ---- rescue pass: max |row| (non-finite data gives a non-finite result whatever the scale) ------
template <typename T>
void absmax_typed(const ProjChunk& ch, double* amax) {
  for (int r = 0; r <= ch.k; ++r) {
    const T* p = static_cast<const T*>(r < ch.k ? ch.v[r] : ch.g);
    Vd m = vset(0.0);
    int64_t e = 0;
    for (; e + W <= ch.n; e += W) m = vabsmax(m, load_d(p + e));
    double t[W];
    vstore(t, m);
    double s = 0.0;
    for (int l = 0; l < W; ++l) s = std::max(s, t[l]);
    for (; e < ch.n; ++e) s = std::max(s, std::fabs(to_d(p[e])));
    amax[r] = s;
  }
}

// ---- dtype dispatch ------------------------------------------------------------------------------
template <template <typename, bool> class Fn, typename... Args>
void dispatch_scaled(at::ScalarType dt, bool scaled, Args... args) {
  switch (dt) {
    case at::kDouble: return scaled ? Fn<double, true>::run(args...) : Fn<double, false>::run(args...);
    case at::kFloat: return scaled ? Fn<float, true>::run(args...) : Fn<float, false>::run(args...);
    case at::kHalf: return scaled ? Fn<c10::Half, true>::run(args...) : Fn<c10::Half, false>::run(args...);
    case at::kBFloat16:
      return scaled ? Fn<c10::BFloat16, true>::run(args...) : Fn<c10::BFloat16, false>::run(args...);
    default: return;  // unreachable: dtypes are checked before
  }
}
template <typename T, bool SC>
struct Pass1Fn {
  static void run(const ProjChunk* ch, const double* s, double* acc) { pass1_typed<T, SC>(*ch, s, acc); }
};
template <typename T, bool SC>
struct Pass2Fn {
  static void run(const ProjChunk* ch, const double* c, const double* s) { pass2_typed<T, SC>(*ch, c, s); }
};
template <typename T, bool SC>
struct AbsMaxFn {
  static void run(const ProjChunk* ch, double* amax) { absmax_typed<T>(*ch, amax); }
};

void pass1(at::ScalarType dt, const ProjChunk& ch, const double* scale, double* acc) {
  dispatch_scaled<Pass1Fn>(dt, scale != nullptr, &ch, scale, acc);
}
void pass2(at::ScalarType dt, const ProjChunk& ch, const double* c, const double* scale) {
  dispatch_scaled<Pass2Fn>(dt, scale != nullptr, &ch, c, scale);
}
void absmax(at::ScalarType dt, const ProjChunk& ch, double* amax) {
  dispatch_scaled<AbsMaxFn>(dt, false, &ch, amax);
}

}  // namespace

const ProjCpuKernels kKernels = {ENTANGLE_PROJ_NAME, &pass1, &pass2, &absmax};

}  // namespace ENTANGLE_PROJ_NS
}  // namespace entangle_ext

#if defined(ENTANGLE_PROJ_TARGET)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
#endif

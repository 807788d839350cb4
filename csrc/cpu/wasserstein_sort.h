// Stable CPU sorts of W2 segments on the order-preserving integer keys of csrc/wasserstein.h.
//
// Items hold the key (and, when the caller needs the sort permutation, the 32-bit local index
// below it), so equal keys keep their input order and sorted values are decoded from the keys
// (no gather). Three shapes of work:
//  * one segment (sort_segment): insertion sort up to kInsertionMax values, else an LSD radix sort
//    (11-bit digits between kRadix8Max and kRadix11Max values, where the fewer passes pay for the
//    2048-bucket histograms and the buffers stay in cache; 8-bit digits otherwise), skipping
//    passes whose digit is the same for every item;
//  * a batch of short float32 segments (sort_batch): one LSD radix sort of (segment, key,
//    position) words, so the histogram cost is paid once per batch instead of once per segment;
//  * one long segment over every thread (sort_long): one stable MSD pass, then whole buckets per
//    thread (see below).
// A stable order is unique, so every path gives the same result whatever the thread count.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "../wasserstein.h"

namespace entangle_ext {
namespace w2 {
namespace cpu {

// Item layouts: float32 with index = key << 32 | index (one 64-bit word); key only otherwise.
template <typename T, bool kIndex>
struct Item;
template <>
struct Item<float, true> {
  using type = uint64_t;
  static constexpr int kKeyBits = 32;
  static type make(uint32_t k, uint32_t i) { return (static_cast<uint64_t>(k) << 32) | i; }
  static uint32_t key(type it) { return static_cast<uint32_t>(it >> 32); }
  static uint32_t index(type it) { return static_cast<uint32_t>(it); }
  static bool less(type a, type b) { return a < b; }
};
template <>
struct Item<float, false> {
  using type = uint32_t;
  static constexpr int kKeyBits = 32;
  static type make(uint32_t k, uint32_t) { return k; }
  static uint32_t key(type it) { return it; }
  static uint32_t index(type) { return 0; }
  static bool less(type a, type b) { return a < b; }
};
struct KeyIndex64 {
  uint64_t key;
  uint32_t index;
};
template <>
struct Item<double, true> {
  using type = KeyIndex64;
  static constexpr int kKeyBits = 64;
  static type make(uint64_t k, uint32_t i) { return {k, i}; }
  static uint64_t key(const type& it) { return it.key; }
  static uint32_t index(const type& it) { return it.index; }
  static bool less(const type& a, const type& b) {
    return a.key < b.key || (a.key == b.key && a.index < b.index);
  }
};
template <>
struct Item<double, false> {
  using type = uint64_t;
  static constexpr int kKeyBits = 64;
  static type make(uint64_t k, uint32_t) { return k; }
  static uint64_t key(type it) { return it; }
  static uint32_t index(type) { return 0; }
  static bool less(type a, type b) { return a < b; }
};

constexpr int64_t kInsertionMax = 32;
constexpr int64_t kRadix8Max = 2048;
constexpr int64_t kRadix11Max = int64_t(1) << 18;  // above: 8-bit digits (2048 write streams miss the caches)

// Reusable buffers of one thread (grown to the longest segment it sorts). Kept across calls
// (thread_scratch): fresh multi-megabyte buffers cost a page fault per 4 KiB on every call.
struct Scratch {
  std::vector<uint64_t> a, b;  // item buffers (uint64_t words: aligned for every item type)
  std::vector<uint32_t> hist;
  template <typename I>
  I* items(std::vector<uint64_t>& buf, int64_t n) {
    const size_t words = (static_cast<size_t>(n) * sizeof(I) + 7) / 8;
    if (buf.size() < words) buf.resize(words);
    return reinterpret_cast<I*>(buf.data());
  }
  // Releases buffers above `keep_bytes` each (called when a call is done).
  void trim(size_t keep_bytes) {
    for (auto* v : {&a, &b})
      if (v->capacity() * 8 > keep_bytes) std::vector<uint64_t>().swap(*v);
  }
};

constexpr size_t kKeepScratchBytes = size_t(16) << 20;  // per buffer and thread, across calls

inline Scratch& thread_scratch() {
  thread_local Scratch sc;
  return sc;
}

template <typename Tr>
void insertion_sort(typename Tr::type* a, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    const auto x = a[i];
    int64_t j = i - 1;
    while (j >= 0 && Tr::less(x, a[j])) {
      a[j + 1] = a[j];
      --j;
    }
    a[j + 1] = x;
  }
}

// Exclusive prefix sums of one digit histogram; false when one bucket holds every item (skip).
inline bool digit_offsets(uint32_t* h, int radix, int64_t n) {
  uint32_t sum = 0;
  for (int r = 0; r < radix; ++r) {
    const uint32_t c = h[r];
    if (static_cast<int64_t>(c) == n) return false;
    h[r] = sum;
    sum += c;
  }
  return true;
}

// Single-thread LSD radix sort of a[0:n) (tmp: n more items). Returns the buffer holding the result.
template <int kBits, typename Tr>
typename Tr::type* radix_sort(typename Tr::type* a, typename Tr::type* tmp, int64_t n,
                              std::vector<uint32_t>& hist_buf) {
  constexpr int kRadix = 1 << kBits;
  constexpr int kPasses = (Tr::kKeyBits + kBits - 1) / kBits;
  if (hist_buf.size() < static_cast<size_t>(kPasses * kRadix)) hist_buf.resize(kPasses * kRadix);
  uint32_t* hist = hist_buf.data();
  std::fill(hist, hist + kPasses * kRadix, 0u);
  for (int64_t i = 0; i < n; ++i) {
    const auto k = Tr::key(a[i]);
    for (int p = 0; p < kPasses; ++p) ++hist[p * kRadix + ((k >> (p * kBits)) & (kRadix - 1))];
  }
  for (int p = 0; p < kPasses; ++p) {
    uint32_t* h = hist + p * kRadix;
    if (!digit_offsets(h, kRadix, n)) continue;
    for (int64_t i = 0; i < n; ++i) {
      const auto it = a[i];
      tmp[h[(Tr::key(it) >> (p * kBits)) & (kRadix - 1)]++] = it;
    }
    std::swap(a, tmp);
  }
  return a;
}

// Writes sorted[0:n) (values decoded from the keys) and, if perm, the local source indices.
// Returns whether every value is finite (the extreme keys are).
template <typename T, typename Tr>
bool decode_sorted(const typename Tr::type* a, int64_t begin, int64_t end, int64_t n, T* sorted,
                   uint32_t* perm) {
  for (int64_t i = begin; i < end; ++i) sorted[i] = key_value<T>(Tr::key(a[i]));
  if (perm)
    for (int64_t i = begin; i < end; ++i) perm[i] = Tr::index(a[i]);
  return n == 0 || (key_is_finite<T>(Tr::key(a[0])) && key_is_finite<T>(Tr::key(a[n - 1])));
}

template <typename T, bool kIndex>
bool sort_segment_impl(const T* x, int64_t n, T* sorted, uint32_t* perm, Scratch& sc) {
  using Tr = Item<T, kIndex>;
  using I = typename Tr::type;
  I* a = sc.items<I>(sc.a, n);
  for (int64_t i = 0; i < n; ++i) a[i] = Tr::make(sort_key(x[i]), static_cast<uint32_t>(i));
  if (n <= kInsertionMax) {
    insertion_sort<Tr>(a, n);
  } else {
    I* tmp = sc.items<I>(sc.b, n);
    a = (n <= kRadix8Max || n > kRadix11Max) ? radix_sort<8, Tr>(a, tmp, n, sc.hist)
                                             : radix_sort<11, Tr>(a, tmp, n, sc.hist);
  }
  return decode_sorted<T, Tr>(a, 0, n, n, sorted, perm);
}

// Stable sort of x[0:n) by one thread; perm may be null (values only). Returns "all finite".
template <typename T>
bool sort_segment(const T* x, int64_t n, T* sorted, uint32_t* perm, Scratch& sc) {
  TORCH_CHECK_VALUE(n < (int64_t(1) << 32), "wasserstein2_1d: segments hold at most 2^32-1 values");
  return perm ? sort_segment_impl<T, true>(x, n, sorted, perm, sc)
              : sort_segment_impl<T, false>(x, n, sorted, perm, sc);
}

// ---------------------------------------------------------------------------------------------
// Several short segments at once: one radix sort of 64-bit words (segment << 46 | key << 14 |
// position) over the segment and key bits, so the histogram cost is paid once per batch.
// ---------------------------------------------------------------------------------------------
constexpr int kPosBits = 14;
constexpr int64_t kBatchMax = int64_t(1) << kPosBits;  // values per side in one batch

// LSD radix sort of a[0:n) on bits [shift, shift + bits) (zero above), kPasses digits of at most
// 11 bits each.
template <int kPasses>
uint64_t* radix_sort_bits(uint64_t* a, uint64_t* tmp, int64_t n, int shift, int bits,
                          std::vector<uint32_t>& hist_buf) {
  const int d = (bits + kPasses - 1) / kPasses, radix = 1 << d;
  const uint64_t mask = static_cast<uint64_t>(radix - 1);
  if (hist_buf.size() < static_cast<size_t>(kPasses * radix)) hist_buf.resize(kPasses * radix);
  uint32_t* hist = hist_buf.data();
  std::fill(hist, hist + kPasses * radix, 0u);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t k = a[i] >> shift;
#pragma GCC unroll 8
    for (int p = 0; p < kPasses; ++p) ++hist[p * radix + ((k >> (p * d)) & mask)];
  }
  for (int p = 0; p < kPasses; ++p) {
    uint32_t* h = hist + p * radix;
    if (!digit_offsets(h, radix, n)) continue;
    const int sh = shift + p * d;
    for (int64_t i = 0; i < n; ++i) tmp[h[(a[i] >> sh) & mask]++] = a[i];
    std::swap(a, tmp);
  }
  return a;
}

inline uint64_t* radix_sort_bits(uint64_t* a, uint64_t* tmp, int64_t n, int shift, int bits,
                                 std::vector<uint32_t>& hist) {
  if (bits <= 33) return radix_sort_bits<3>(a, tmp, n, shift, bits, hist);
  if (bits <= 44) return radix_sort_bits<4>(a, tmp, n, shift, bits, hist);
  return radix_sort_bits<5>(a, tmp, n, shift, bits, hist);
}

// Stable sort of K consecutive segments x[lo[k] : lo[k] + n[k]) (sum of n[k] <= kBatchMax unless
// K == 1). vals/perm receive the segments one after another (perm: index within the segment).
// Returns whether every value is finite.
inline bool sort_batch(const float* x, const int64_t* lo, const int64_t* n, int64_t K, float* vals,
                       uint32_t* perm, Scratch& sc) {
  int64_t total = 0;
  for (int64_t k = 0; k < K; ++k) total += n[k];
  if (K == 1 || total > kBatchMax) {  // one segment (any length): its own sort
    TORCH_CHECK(K == 1, "wasserstein2_1d: internal error, batch too large");
    return sort_segment(x + lo[0], n[0], vals, perm, sc);
  }
  uint64_t* a = sc.items<uint64_t>(sc.a, total);
  int64_t pos = 0;
  for (int64_t k = 0; k < K; ++k) {
    const uint64_t seg = static_cast<uint64_t>(k) << (32 + kPosBits);
    for (int64_t i = 0; i < n[k]; ++i, ++pos)
      a[pos] = seg | (static_cast<uint64_t>(sort_key(x[lo[k] + i])) << kPosBits) | static_cast<uint64_t>(pos);
  }
  const int seg_bits = K > 1 ? 64 - __builtin_clzll(static_cast<unsigned long long>(K - 1)) : 0;
  if (total <= kInsertionMax) insertion_sort<Item<double, false>>(a, total);  // plain uint64 order
  else a = radix_sort_bits(a, sc.items<uint64_t>(sc.b, total), total, kPosBits, 32 + seg_bits, sc.hist);
  bool finite = true;
  int64_t k = 0, base = 0;
  for (int64_t r = 0; r < total; ++r) {
    while (r >= base + n[k]) base += n[k++];
    const uint32_t key = static_cast<uint32_t>(a[r] >> kPosBits);
    vals[r] = key_value<float>(key);
    finite &= key_is_finite<float>(key);
    if (perm) perm[r] = static_cast<uint32_t>((a[r] & (kBatchMax - 1)) - base);
  }
  return finite;
}

// float64 keys do not fit a 64-bit word with a segment and a position: one sort per segment.
inline bool sort_batch(const double* x, const int64_t* lo, const int64_t* n, int64_t K, double* vals,
                       uint32_t* perm, Scratch& sc) {
  bool finite = true;
  for (int64_t k = 0, base = 0; k < K; base += n[k++])
    finite &= sort_segment(x + lo[k], n[k], vals + base, perm ? perm + base : nullptr, sc);
  return finite;
}

// ---------------------------------------------------------------------------------------------
// One long segment, every thread: one stable MSD pass on the 11 key bits below the highest bit
// where the smallest and largest keys differ (so the 2048 buckets split the actual key range),
// then each thread sorts whole buckets (cache-sized on average) by LSD on the bits below. Four
// parallel regions in all, so few synchronisation points.
// ---------------------------------------------------------------------------------------------
// LSD radix sort of a[0:n) on the key bits [0, bits) (the bits above are equal).
template <typename Tr>
typename Tr::type* radix_sort_low(typename Tr::type* a, typename Tr::type* tmp, int64_t n, int bits,
                                  std::vector<uint32_t>& hist_buf) {
  if (bits == 0) return a;  // equal keys: the stable order is the input order
  if (n <= kInsertionMax) {
    insertion_sort<Tr>(a, n);
    return a;
  }
  int dmax = 4;  // digits of about log2(n) - 1 bits (at most 11): histograms no larger than the data
  while (dmax < 11 && (int64_t(4) << dmax) <= n) ++dmax;
  const int passes = (bits + dmax - 1) / dmax, d = (bits + passes - 1) / passes, radix = 1 << d;
  if (hist_buf.size() < static_cast<size_t>(radix)) hist_buf.resize(radix);
  for (int p = 0; p < passes; ++p) {
    uint32_t* h = hist_buf.data();
    std::fill(h, h + radix, 0u);
    const int sh = p * d;
    for (int64_t i = 0; i < n; ++i) ++h[(Tr::key(a[i]) >> sh) & (radix - 1)];
    if (!digit_offsets(h, radix, n)) continue;
    for (int64_t i = 0; i < n; ++i) tmp[h[(Tr::key(a[i]) >> sh) & (radix - 1)]++] = a[i];
    std::swap(a, tmp);
  }
  return a;
}

template <typename T, bool kIndex>
bool sort_long_impl(const T* x, int64_t n, T* sorted, uint32_t* perm) {
  using Tr = Item<T, kIndex>;
  using I = typename Tr::type;
  using K = decltype(Tr::key(std::declval<I>()));
  if (n == 0) return true;
  const int64_t C = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / 4096));
  Scratch& own = thread_scratch();  // the calling thread's buffers (kept across calls)
  I* a = own.items<I>(own.a, n);
  I* b = own.items<I>(own.b, n);
  auto chunk = [&](int64_t c, int64_t* lo, int64_t* hi) { *lo = n * c / C; *hi = n * (c + 1) / C; };
  std::vector<K> kmin(C, ~K(0)), kmax(C, K(0));
  at::parallel_for(0, C, 1, [&](int64_t cb, int64_t ce) {  // 1: items, key range per chunk
    for (int64_t c = cb, lo, hi; c < ce; ++c) {
      chunk(c, &lo, &hi);
      K mn = ~K(0), mx = K(0);  // in registers: kmin/kmax of neighbouring chunks share a cache line
      for (int64_t i = lo; i < hi; ++i) {
        const auto k = sort_key(x[i]);
        a[i] = Tr::make(k, static_cast<uint32_t>(i));
        mn = std::min<K>(mn, k);
        mx = std::max<K>(mx, k);
      }
      kmin[c] = mn;
      kmax[c] = mx;
    }
  });
  const K lo_key = *std::min_element(kmin.begin(), kmin.end());
  const K hi_key = *std::max_element(kmax.begin(), kmax.end());
  int top = 0;  // bits below (and including) the highest differing bit
  for (K diff = lo_key ^ hi_key; diff; diff >>= 1) ++top;
  const int shift = std::max(0, top - 11);
  const int64_t R = int64_t(1) << (top - shift);
  auto digit = [&](const I& it) { return static_cast<int64_t>((Tr::key(it) >> shift) & static_cast<K>(R - 1)); };
  std::vector<int64_t> offs(C * R, 0);  // offs[c * R + r]
  at::parallel_for(0, C, 1, [&](int64_t cb, int64_t ce) {  // 2: digit histogram per chunk
    for (int64_t c = cb, lo, hi; c < ce; ++c) {
      chunk(c, &lo, &hi);
      for (int64_t i = lo; i < hi; ++i) ++offs[c * R + digit(a[i])];
    }
  });
  std::vector<int64_t> bucket(R + 1, 0);  // bucket r = [bucket[r], bucket[r+1]) after the scatter
  for (int64_t r = 0, run = 0; r < R; ++r) {  // bucket-major, chunk-minor: a stable scatter
    bucket[r] = run;
    for (int64_t c = 0; c < C; ++c) {
      const int64_t cnt = offs[c * R + r];
      offs[c * R + r] = run;
      run += cnt;
    }
  }
  bucket[R] = n;
  at::parallel_for(0, C, 1, [&](int64_t cb, int64_t ce) {  // 3: scatter
    for (int64_t c = cb, lo, hi; c < ce; ++c) {
      chunk(c, &lo, &hi);
      int64_t* o = offs.data() + c * R;
      for (int64_t i = lo; i < hi; ++i) b[o[digit(a[i])]++] = a[i];
    }
  });
  // 4: each thread sorts the buckets that start in its chunks (LSD below the MSD digit), decodes.
  at::parallel_for(0, C, 1, [&](int64_t cb, int64_t ce) {
    std::vector<uint32_t> hist;
    const int64_t r0 = std::lower_bound(bucket.begin(), bucket.end() - 1, n * cb / C) - bucket.begin();
    const int64_t r1 = std::lower_bound(bucket.begin(), bucket.end() - 1, n * ce / C) - bucket.begin();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t lo = bucket[r], len = bucket[r + 1] - bucket[r];
      if (len == 0) continue;
      const I* res = radix_sort_low<Tr>(b + lo, a + lo, len, shift, hist);
      decode_sorted<T, Tr>(res - lo, lo, lo + len, 0, sorted, perm);
    }
  });
  return key_is_finite<T>(lo_key) && key_is_finite<T>(hi_key);
}

template <typename T>
bool sort_long(const T* x, int64_t n, T* sorted, uint32_t* perm) {
  TORCH_CHECK_VALUE(n < (int64_t(1) << 32), "wasserstein2_1d: segments hold at most 2^32-1 values");
  return perm ? sort_long_impl<T, true>(x, n, sorted, perm) : sort_long_impl<T, false>(x, n, sorted, perm);
}

}  // namespace cpu
}  // namespace w2
}  // namespace entangle_ext

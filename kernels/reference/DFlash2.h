//===- DFlash2.h - CPU reference of the DFlash2 drafter's ops ---*- C++ -*-===//
//
// The two additions of a DFlash2 drafter (docs/semantics.md section 13): the
// block-local grouped dynamic convolution around each sublayer and the
// low-rank selector that re-ranks the top-K of the unary logits (their
// transform is Reference.h's, with the cross-entropy that takes it too),
// each with its gradient. Conventions as Reference.h's:
// row-major arrays, `T` float or double, sums in double, gradients overwrite
// their outputs, letters of docs/semantics.md (B rows, N blocks, bs block
// size, Q = N*bs, H hidden, V vocabulary, kc taps, gs channels per group,
// G = H / gs, r rank, K top candidates).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_REFERENCE_DFLASH2_H
#define DFLASH_KERNELS_REFERENCE_DFLASH2_H

#include "kernels/reference/Reference.h"

#include <cstdint>
#include <vector>

namespace dflash::ref {

//===----------------------------------------------------------------------===//
// Grouped dynamic convolution (docs/semantics.md section 13, "Convolution")
//===----------------------------------------------------------------------===//

/// A convolution's shape. A layer's projection D = h @ Wc^T is [B, Q,
/// 2*kc*G]: per slot, [2, kc, G] row-major, so D[b, q, (i*kc + o)*G + g] is
/// half i (0 before the sublayer, 1 after it), tap o, group g. One
/// convolution reads one half: `delta` = D + i*kc*G with deltaStride =
/// 2*kc*G. A compact [B, Q, kc*G] delta has deltaStride = kc*G (0 means
/// that).
struct GroupedConvShape {
  int64_t B, N, bs, H, kc, gs;
  int64_t deltaStride = 0; ///< elements from one slot's delta to the next
  int64_t G() const { return H / gs; }
  int64_t Q() const { return N * bs; }
  int64_t stride() const { return deltaStride ? deltaStride : kc * G(); }
};

/// out[b, q, c] = sum over o in [0, kc) with k - o >= 0 of
/// (base[o, c] + delta[b, q, o, c / gs]) * in[b, q - o, c], with q = n*bs + k:
/// causal inside each block of bs slots and never reaching the previous
/// block (slot 0 sees only itself). in, out [B, Q, H]; delta [B, Q, kc, G]
/// at the shape's slot stride, taken at the output slot; base [kc, H].
/// H must be a multiple of gs (a caller error otherwise).
template <typename T>
void groupedConv(const T *in, const T *delta, const T *base, T *out,
                 const GroupedConvShape &shape);

/// Gradients of groupedConv given dOut [B, Q, H]:
/// dIn[b, q', c] = sum over o with k' + o < bs of
///   (base[o, c] + delta[b, q' + o, o, c / gs]) * dOut[b, q' + o, c];
/// dDelta[b, q, o, g] = sum over c in group g of dOut[b, q, c] *
///   in[b, q - o, c] (0 where k < o), written at the shape's slot stride
///   (only this half's entries of a [2, kc, G] layout are touched);
/// dBase[o, c] = sum over b, q with k >= o of dOut[b, q, c] * in[b, q - o, c].
template <typename T>
void groupedConvGrad(const T *dOut, const T *in, const T *delta, const T *base,
                     T *dIn, T *dDelta, T *dBase,
                     const GroupedConvShape &shape);

//===----------------------------------------------------------------------===//
// The selector (docs/semantics.md section 13, "Selector" and "Loss")
//===----------------------------------------------------------------------===//

/// The K largest of u [V] by descending value, ties to the lower index
/// first: indices [K]. 1 <= K <= V (a caller error otherwise).
template <typename T>
void topK(const T *u, int64_t V, int64_t K, int32_t *indices);

/// What happens to a label outside the top-K (`selector_gold`).
enum class SelectorGold {
  /// SpecForge (the default): the slot has no selector term (cov = 0).
  Skip,
  /// "inject" (speculators, ModelOpt): the label replaces candidate K,
  /// scored with its own unary logit u[label]; cov = 1.
  Inject,
};

/// The selector's inputs over `rows` slots (one row per slot (b, q)).
template <typename T> struct SelectorInputs {
  const T *u = nullptr;                  ///< [rows, V] transformed unary logits
  const T *t = nullptr;                  ///< [rows, r] y @ Wh^T
  const int32_t *predecessors = nullptr; ///< [rows] p, in [0, V)
  const int32_t *labels = nullptr;       ///< [rows] in [0, V)
  /// [rows] section 4's w(n, k). A row whose weight is 0 (every k = 0 slot
  /// among them) is skipped: nothing of it is read. nullptr: every row
  /// weighs 1.
  const T *weights = nullptr;
  const T *P = nullptr; ///< [V, r] predecessor codebook
  const T *S = nullptr; ///< [V, r] successor codebook
  int64_t rows = 0, V = 0, r = 0, K = 0;
  SelectorGold gold = SelectorGold::Skip;
};

/// The selector's forward, per row with a nonzero weight (a skipped row
/// has candidates and choice -1, gold -1, everything else 0):
/// - candidates c_j = topK(u) and values v_j = u[c_j] ([rows, K]); with
///   Inject and the label outside the top-K, c_K = label, v_K = u[label];
/// - scores s_j = v_j + z . S[c_j] with z = P[p] * t elementwise ([rows, K]);
/// - cov = [label among the candidates] (after injection), gold = j* (the
///   label's index among them, -1 without cov), ce = CE_s =
///   -log softmax(s)[j*] over the K candidates (0 without cov);
/// - choice = the token greedy serving picks: c_j of argmax_j s_j (ties: the
///   lower j) over the true top-K, never an injected label; hit =
///   [choice == label] (what acceptance counts, docs/semantics.md section 13).
/// lossSum = sum(w * cov * ce) and coveredWeight = sum(w * cov) over the
/// rows (the selector term's numerator and the "covered" denominator).
template <typename T> struct SelectorForward {
  int64_t rows = 0, K = 0;
  std::vector<int32_t> candidates; ///< [rows, K]
  std::vector<T> values, scores;   ///< [rows, K]
  std::vector<uint8_t> cov;        ///< [rows]
  std::vector<int32_t> gold;       ///< [rows]
  std::vector<T> ce;               ///< [rows]
  std::vector<int32_t> choice;     ///< [rows]
  std::vector<uint8_t> hits;       ///< [rows]
  double lossSum = 0, coveredWeight = 0;
};

template <typename T>
SelectorForward<T> selectorForward(const SelectorInputs<T> &in);

/// Sparse gradient rows of a [numRows, width] table (a codebook): entry e
/// adds values[e*width, (e+1)*width) to row rows[e]. Rows repeat when
/// several entries reach the same row; nothing is summed before the
/// scatter.
template <typename T> struct RowGradients {
  int64_t width = 0;
  std::vector<int32_t> rows;
  std::vector<T> values; ///< [rows.size(), width]
};

/// dense[rows[e], :] += values[e, :] for every entry, in order; dense
/// [numRows, width]. False (and that entry left out) for an entry outside
/// [0, numRows).
template <typename T>
bool scatterAddRows(const RowGradients<T> &gradients, T *dense,
                    int64_t numRows);

/// Gradients of scale * lossSum = scale * sum(w * cov * CE_s) (scale holds
/// alpha_t and the denominator). With e_j = scale * w * (softmax(s)_j -
/// [j == j*]) at a covered row, z = P[p] * t and dz = sum_j e_j S[c_j]:
/// - du [rows, V]: e_j at u[c_j] (an injected label's own logit included),
///   0 elsewhere; all 0 with stopGradient;
/// - dt [rows, r] = dz * P[p]. It is given with stopGradient too, as Wh
///   still learns from it (dWh = dt^T y): under stopGradient the caller
///   leaves out dt's path into y;
/// - dP: one entry per covered row, row p, dz * t;
/// - dS: K entries per covered row, row c_j, e_j z, in the order of j.
/// Rows without cov (or skipped) contribute nothing. dP and dS are
/// overwritten (their width set to r).
template <typename T>
void selectorBackward(const SelectorInputs<T> &in,
                      const SelectorForward<T> &forward, double scale,
                      bool stopGradient, T *du, T *dt, RowGradients<T> &dP,
                      RowGradients<T> &dS);

//===----------------------------------------------------------------------===//
// The step around the selector (docs/semantics.md section 13, "Selector" and
// "Loss")
//===----------------------------------------------------------------------===//

/// Teacher forcing: out[b, n*bs + k] = inputIds[b, anchors[b, n] + k - 1]
/// for k >= 1 of a kept block whose position lies in the row, else 0.
/// inputIds [B, S], anchors and keep [B, N], out [B, N*bs].
void draftPredecessors(const int32_t *inputIds, const int32_t *anchors,
                       const uint8_t *keep, int32_t *out, int64_t B, int64_t S,
                       int64_t N, int64_t bs);

/// alpha_t at 0-based optimizer step `step` of `total`: 0 for the first
/// int(warmupRatio * total) steps, then linear up to `alpha` over the next
/// int(rampRatio * total) (at once when that is 0), then `alpha`. The
/// formula is kernels/Selector.h's, which the device calls too.
double selectorAlphaAt(int64_t step, int64_t total, double alpha,
                       double warmupRatio, double rampRatio);

/// d(loss numerator)/d(selector_sum): alpha, times weightSum / coveredWeight
/// (0 when that is 0) for selector_denominator = "covered"
/// (kernels/Selector.h's, as the device's).
double selectorTermScale(double alpha, double weightSum, double coveredWeight,
                         bool covered);

} // namespace dflash::ref

#endif // DFLASH_KERNELS_REFERENCE_DFLASH2_H

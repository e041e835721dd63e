//===- Reference.h - CPU reference of every op of the step ------*- C++ -*-===//
//
// Plain C++ implementations of every dflash op and its gradient, one function
// per op, in the exact semantics of docs/semantics.md. They are the oracle
// of the GPU kernel tests and the bodies of the reference executor. No MLIR,
// no CUDA.
//
// Conventions:
// - Tensors are row-major arrays; shapes are given in each comment with the
//   letters of docs/semantics.md (B rows, S context, N anchors, bs block size,
//   Q = N*bs, nh/nkv/d heads, V vocabulary).
// - Floating tensors are `T` (float or double); sums over long axes accumulate
//   in double. Nothing here rounds to bf16: callers that emulate bf16 storage
//   round what they store.
// - Flags (`keep`, `loss_mask`) are uint8_t, indices int32_t.
// - Gradient functions overwrite their outputs (they do not accumulate).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_REFERENCE_REFERENCE_H
#define DFLASH_KERNELS_REFERENCE_REFERENCE_H

#include <cstdint>

namespace dflash::ref {

//===----------------------------------------------------------------------===//
// Draft-block bookkeeping (docs/semantics.md sections 3 and 4)
//===----------------------------------------------------------------------===//

/// out[b, n*bs + k] = positionIds[b, anchors[b, n]] + k; anchors [B, N],
/// positionIds [B, S] (arange(S) in an unpacked row), out [B, N*bs].
void draftPositions(const int32_t *anchors, const int32_t *positionIds,
                    int32_t *out, int64_t B, int64_t S, int64_t N, int64_t bs);

/// out[b, n*bs] = keep[b,n] ? inputIds[b, anchors[b,n]] : maskTokenId and
/// out[b, n*bs + k] = maskTokenId for k > 0. inputIds [B, S].
void draftTokens(const int32_t *inputIds, const int32_t *anchors,
                 const uint8_t *keep, int32_t *out, int64_t B, int64_t S,
                 int64_t N, int64_t bs, int64_t maskTokenId);

/// labels[b, n*bs+k] = inputIds[b, a+k] (0 when a+k >= S), with a the anchor;
/// weights[b, n*bs+k] = keep * [a+k < S] * [k > 0] * lossMask[b, a+k] *
/// [positionIds[b, a+k] == positionIds[b, a] + k] * decay(k), decay(k) =
/// exp(-(k-1)/gamma) if gamma > 0 else 1.
template <typename T>
void draftTargets(const int32_t *inputIds, const uint8_t *lossMask,
                  const int32_t *anchors, const uint8_t *keep,
                  const int32_t *positionIds, int32_t *labels, T *weights,
                  int64_t B, int64_t S, int64_t N, int64_t bs, double gamma);

//===----------------------------------------------------------------------===//
// Dense layers
//===----------------------------------------------------------------------===//

/// out[r, :] = table[ids[r], :]; table [V, H], ids [rows], out [rows, H].
template <typename T>
void embed(const T *table, const int32_t *ids, T *out, int64_t rows, int64_t H);

/// y[M, N] = x[M, K] * w[N, K]^T.
template <typename T>
void linear(const T *x, const T *w, T *y, int64_t M, int64_t N, int64_t K);
/// dx[M, K] = dy[M, N] * w[N, K].
template <typename T>
void linearGradInput(const T *dy, const T *w, T *dx, int64_t M, int64_t N,
                     int64_t K);
/// dw[N, K] = dy[M, N]^T * x[M, K].
template <typename T>
void linearGradWeight(const T *dy, const T *x, T *dw, int64_t M, int64_t N,
                      int64_t K);

/// y = x * rsqrt(mean(x^2) + eps) * w over the last dimension D; x, y
/// [rows, D], w [D].
template <typename T>
void rmsNorm(const T *x, const T *w, T *y, int64_t rows, int64_t D, double eps);
/// dx [rows, D] and dw [D] (summed over rows) of rmsNorm.
template <typename T>
void rmsNormGrad(const T *dy, const T *x, const T *w, T *dx, T *dw,
                 int64_t rows, int64_t D, double eps);

/// Rotate-half RoPE of x [rows, heads, d] at positions pos [rows]: with
/// inv_i = 1 / theta^(2i/d) and angle = pos * inv_i both computed in fp32
/// (as the Hugging Face Qwen3 code does), for i < d/2:
/// y[i] = x[i] cos - x[i+d/2] sin, y[i+d/2] = x[i+d/2] cos + x[i] sin.
template <typename T>
void rope(const T *x, const int32_t *pos, T *y, int64_t rows, int64_t heads,
          int64_t d, double theta);
/// rope with Llama-3's frequency scaling (a target decoder's): inv_i with a
/// wavelength 2 pi / inv_i above original / lowFreqFactor divided by
/// factor, below original / highFreqFactor kept, and between them
/// (1 - s) inv_i / factor + s inv_i, s = (original / wavelength -
/// lowFreqFactor) / (highFreqFactor - lowFreqFactor).
template <typename T>
void scaledRope(const T *x, const int32_t *pos, T *y, int64_t rows,
                int64_t heads, int64_t d, double theta, double factor,
                double lowFreqFactor, double highFreqFactor,
                int64_t originalMaxPositions);
/// YaRN's rope scaling (a gpt-oss or Qwen3 target's, or the drafter's
/// [drafter.rope_scaling]), as transformers computes it:
/// with pos_i = theta^(2i/d) in fp32, inv_i blends 1 / pos_i
/// (extrapolation) and 1 / (factor pos_i) (interpolation) by a linear ramp
/// over i between the correction dimensions of betaFast and betaSlow
/// rotations at originalMaxPositions (floored/ceiled when `truncate`);
/// cos and sin are multiplied by attentionFactor.
struct YarnScaling {
  double theta, factor, betaFast, betaSlow;
  int64_t originalMaxPositions;
  bool truncate;
  double attentionFactor;
};
/// YaRN's d/2 inverse frequencies, in fp32 as transformers keeps them.
void yarnInverseFrequencies(int64_t d, const YarnScaling &yarn, float *inv);
/// rope with YaRN's frequencies and attention factor.
template <typename T>
void yarnRope(const T *x, const int32_t *pos, T *y, int64_t rows, int64_t heads,
              int64_t d, const YarnScaling &yarn);
/// dx of rope (the rotation by the opposite angle).
template <typename T>
void ropeGrad(const T *dy, const int32_t *pos, T *dx, int64_t rows,
              int64_t heads, int64_t d, double theta);
/// dx of yarnRope: the opposite rotation, times the attention factor.
template <typename T>
void yarnRopeGrad(const T *dy, const int32_t *pos, T *dx, int64_t rows,
                  int64_t heads, int64_t d, const YarnScaling &yarn);

/// y = silu(g) * u elementwise, n elements.
template <typename T> void swiglu(const T *g, const T *u, T *y, int64_t n);
/// gpt-oss's clamped gated activation: with g' = min(g, limit) and u' =
/// clamp(u, -limit, limit), y = (u' + 1) * g' * sigmoid(alpha g').
template <typename T>
void clampedSwiglu(const T *g, const T *u, T *y, int64_t n, double alpha,
                   double limit);
/// y[M, N] = x[M, K] * w[N, K]^T + b[N].
template <typename T>
void biasedLinear(const T *x, const T *w, const T *b, T *y, int64_t M,
                  int64_t N, int64_t K);
template <typename T>
void swigluGrad(const T *dy, const T *g, const T *u, T *dg, T *du, int64_t n);

//===----------------------------------------------------------------------===//
// Block-prefix attention (docs/semantics.md section 3, item 4)
//===----------------------------------------------------------------------===//

struct AttentionShape {
  int64_t B, S, N, bs, nh, nkv, d;
  int64_t window = 0;  ///< 0: no window (full layer)
  bool causal = false; ///< in-block causality (sliding layers)
  int64_t Q() const { return N * bs; }
};

/// q [B, Q, nh, d]; contextKeys/contextValues [B, S, nkv, d]; draftKeys/
/// draftValues [B, Q, nkv, d]; anchors/keep [B, N]; positionIds [B, S].
/// Query (n, k) of row b, head h reads kv head h / (nh/nkv) and sees context
/// key j iff keep and a - positionIds[b, a] <= j < a (the anchor's
/// conversation) and (no window or j >= a + k - (window - 1)), and draft key
/// (n, k') iff keep and (not causal or k' <= k). Scale d^-0.5. out [B, Q, nh,
/// d] is 0 for a query that sees nothing; lse [B, Q, nh] is the natural-log
/// log-sum-exp of the scaled scores, -infinity for such a query.
template <typename T>
void blockAttention(const T *q, const T *contextKeys, const T *contextValues,
                    const T *draftKeys, const T *draftValues,
                    const int32_t *anchors, const uint8_t *keep,
                    const int32_t *positionIds, T *out, T *lse,
                    const AttentionShape &shape);

/// A target decoder's attention (inference only): q [B, S, nh, d] and k, v
/// [B, S, nkv, d]; query i of row b, head h reads kv head h / (nh/nkv) and
/// sees key j iff j <= i and pos[b, i] - pos[b, j] == i - j (earlier tokens
/// of its own conversation in a packed row) and, with window > 0, i - j <
/// window (a sliding layer). Scale d^-0.5, keys summed in ascending order,
/// so a conversation's outputs do not depend on what else its row holds.
/// With `sinks` [nh] (gpt-oss), head h's softmax denominator also holds
/// exp(sinks[h]), a logit no value goes with. out [B, S, nh, d].
template <typename T>
void causalAttention(const T *q, const T *k, const T *v, const int32_t *pos,
                     T *out, int64_t B, int64_t S, int64_t nh, int64_t nkv,
                     int64_t d, const T *sinks = nullptr, int64_t window = 0);

/// Gradients of blockAttention given dOut and the forward's out and lse.
/// dContextKeys/Values sum the contributions of every block that sees them.
template <typename T>
void blockAttentionGrad(const T *dOut, const T *q, const T *contextKeys,
                        const T *contextValues, const T *draftKeys,
                        const T *draftValues, const int32_t *anchors,
                        const uint8_t *keep, const int32_t *positionIds,
                        const T *out, const T *lse, T *dq, T *dContextKeys,
                        T *dContextValues, T *dDraftKeys, T *dDraftValues,
                        const AttentionShape &shape);

//===----------------------------------------------------------------------===//
// lm_head + weighted cross-entropy (docs/semantics.md section 4)
//===----------------------------------------------------------------------===//

/// The unary transform of a DFlash2 drafter's logits (docs/semantics.md
/// section 13, "Unary logits"): T(z) = c tanh(m z / c), m =
/// output_multiplier, c = final_logit_softcapping; without a cap (softcap
/// 0) T(z) = m z. The default is the identity (every other drafter's).
struct UnaryTransform {
  double multiplier = 1.0;
  double softcap = 0.0; ///< 0: none
  bool identity() const { return multiplier == 1.0 && softcap == 0.0; }
};

/// u = T(z) elementwise over n values (u may be z).
template <typename T>
void unaryTransform(const T *z, T *u, int64_t n, const UnaryTransform &t);
/// dz = du * T'(z), T'(z) = m (1 - tanh^2(m z / c)) (m without a cap); dz
/// may be du.
template <typename T>
void unaryTransformGrad(const T *du, const T *z, T *dz, int64_t n,
                        const UnaryTransform &t);

struct CrossEntropySums {
  double lossSum = 0;   ///< sum(w * CE)
  double weightSum = 0; ///< sum(w)
  double correct = 0;   ///< sum([argmax == label] * [w > 0])
  double count = 0;     ///< sum([w > 0])
};

/// logits = transform(y [rows, H] * w [V, H]^T); CE from logits in the
/// working precision. argmax takes the first maximum (the transform is
/// monotonic, so it is z's). hits [rows], when given, gets [argmax == label]
/// * [w > 0] per row (what acceptance counts).
template <typename T>
CrossEntropySums lmHeadCrossEntropy(const T *y, const T *w,
                                    const int32_t *labels, const T *weights,
                                    int64_t rows, int64_t V, int64_t H,
                                    uint8_t *hits = nullptr,
                                    const UnaryTransform &transform = {});

/// dy [rows, H] of dLossSum * sum(w * CE) with respect to y: dz = T'(z) *
/// w * dLossSum * (softmax(T(z)) - onehot), dy = dz w.
template <typename T>
void lmHeadCrossEntropyGrad(const T *y, const T *w, const int32_t *labels,
                            const T *weights, double dLossSum, T *dy,
                            int64_t rows, int64_t V, int64_t H,
                            const UnaryTransform &transform = {});

//===----------------------------------------------------------------------===//
// Acceptance length (docs/semantics.md section 10)
//===----------------------------------------------------------------------===//

/// What greedy verification would accept of the drafted blocks, summed (so
/// that sums of several GPUs add up): tau = runSum / keptBlocks.
struct AcceptanceSums {
  double runSum = 0;     ///< sum over kept blocks of 1 + run_n
  double keptBlocks = 0; ///< kept blocks
  /// Per block position k in [0, bs): kept blocks with w(n, k) > 0, and
  /// those of them predicted right (the accuracy at k is their ratio; k = 0
  /// never counts).
  double positionCounts[64] = {}, positionHits[64] = {};
  /// Per bucket j of anchor position (docs/semantics.md section 14): runSum,
  /// keptBlocks and the position sums over every k, of the kept blocks in
  /// bucket j. Each adds up over the buckets to its total.
  double bucketRuns[8] = {}, bucketBlocks[8] = {}, bucketHits[8] = {},
         bucketCounts[8] = {};
};

/// Where the blocks' anchors are, for the per-bucket sums: an anchor at
/// position p = positionIds[b, anchors[b, n]] of its conversation is in
/// bucket "number of edges <= p". numEdges <= 7; without anchors every
/// block is in bucket 0.
struct AnchorPositions {
  const int32_t *anchors = nullptr;     ///< [B, N]
  const int32_t *positionIds = nullptr; ///< [B, S]
  int64_t S = 0;
  const int64_t *edges = nullptr; ///< ascending
  int64_t numEdges = 0;
};

/// hits [B, N*bs] ([argmax == label] * [w > 0], lmHeadCrossEntropy's),
/// weights [B, N*bs], keep [B, N]. run_n is the largest r such that every
/// 1 <= k <= r has w(n, k) > 0 and a hit (0 <= run_n <= bs - 1). bs <= 64.
template <typename T>
AcceptanceSums draftAcceptance(const uint8_t *hits, const T *weights,
                               const uint8_t *keep, int64_t B, int64_t N,
                               int64_t bs, const AnchorPositions &where = {});

//===----------------------------------------------------------------------===//
// Optimizer (docs/semantics.md section 5)
//===----------------------------------------------------------------------===//

/// The sum of squares of n values (the global norm is the square root of
/// the sum over every gradient).
template <typename T> double sumOfSquares(const T *x, int64_t n);

/// min(1, maxNorm / (norm + 1e-6)).
double clipCoefficient(double norm, double maxNorm);

/// The learning rate at 0-based optimizer step `step` of `total`: with
/// warm = int(warmupRatio * total), lr * (step+1) / warm while step < warm,
/// then lr * 0.5 * (1 + cos(pi * (step - warm) / (total - warm))).
double learningRate(int64_t step, int64_t total, double lr, double warmupRatio);

struct AdamWConfig {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
};

/// One torch.optim.AdamW step on n fp32 masters with gradient grad * scale
/// (scale is the clip coefficient), at 1-based step t for bias correction:
/// p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
template <typename T>
void adamw(T *master, const T *grad, T *m, T *v, int64_t n, int64_t t,
           double scale, const AdamWConfig &config);

//===----------------------------------------------------------------------===//
// Mixture of experts (a Qwen3-MoE or gpt-oss target's sparse MLP)
//===----------------------------------------------------------------------===//

/// How a router's logits become the k experts' weights.
enum class MoeScoring {
  /// Qwen3-MoE: softmax over the E experts, then the k largest.
  SoftmaxTopK,
  /// gpt-oss: the k largest logits, then softmax over those k.
  TopKSoftmax,
};

/// The k experts of each of T tokens and their weights (double): with
/// SoftmaxTopK, softmax over the E logits, then the k largest
/// probabilities (ties: the lower expert first), divided by their sum when
/// `normalize`; with TopKSoftmax, the k largest logits (same ties), then
/// softmax over them. weights [T, k] and experts [T, k], by descending
/// weight.
void moeRoute(const double *logits, double *weights, int32_t *experts,
              int64_t T, int64_t E, int64_t k, bool normalize,
              MoeScoring scoring = MoeScoring::SoftmaxTopK);

/// Groups the T*k routed rows by expert (ascending, then by t*k + j):
/// permuted [T*k, H] = x[t] for slot t*k + j, offsets [E + 1], source
/// [T*k] = the slot of each permuted row. Experts outside [0, E) are a
/// caller error (moeRoute makes none).
void moePermute(const double *x, const int32_t *experts, double *permuted,
                int32_t *offsets, int32_t *source, int64_t T, int64_t H,
                int64_t k, int64_t E);

/// y[r] = x[r] @ w[e]^T (+ bias[e] when given) for r in [offsets[e],
/// offsets[e + 1]); w [E, N, K], bias [E, N].
void groupedLinear(const double *x, const double *w, const int32_t *offsets,
                   double *y, int64_t E, int64_t N, int64_t K,
                   const double *bias = nullptr);

/// y[t] = sum_j weights[t, j] * permuted[p], source[p] = t*k + j.
void moeUnpermute(const double *permuted, const int32_t *source,
                  const double *weights, double *y, int64_t T, int64_t H,
                  int64_t k);

//===----------------------------------------------------------------------===//
// The Qwen3.5 / Qwen3-Next hybrid target (DeltaNet.cpp), double only. Packed
// rows restart at each conversation: token j is in token i's iff
// pos[i] - pos[j] == i - j.
//===----------------------------------------------------------------------===//

/// y [B, S, C] = silu(sum_j w[c, j] x[b, t - (K - 1) + j, c]) over the taps
/// in token t's conversation; w [C, K], pos [B, S].
void causalConv(const double *x, const double *w, const int32_t *pos, double *y,
                int64_t B, int64_t S, int64_t C, int64_t K);

/// The gated delta rule, token by token: q, k [B, S, Hk, dk] L2-normalised
/// (eps 1e-6 inside the root), v [B, S, Hv, dv], a and beta's logits
/// [B, S, Hv], aLog and dtBias [Hv]; per row and value head h (key head
/// h / (Hv / Hk)) the state M [dk, dv] starts at zero with each
/// conversation and, at each token, M = exp(g) M with g = -exp(aLog[h])
/// softplus(a + dtBias[h]), M += k (sigmoid(beta) (v - M^T k))^T, and
/// out [B, S, Hv, dv] = dk^-0.5 M^T q.
void gatedDeltaRule(const double *q, const double *k, const double *v,
                    const double *a, const double *beta, const double *aLog,
                    const double *dtBias, const int32_t *pos, double *out,
                    int64_t B, int64_t S, int64_t Hk, int64_t Hv, int64_t dk,
                    int64_t dv);

/// y = x rsqrt(mean(x^2) + eps) w silu(z), rows of D.
void gatedRmsNorm(const double *x, const double *z, const double *w, double *y,
                  int64_t rows, int64_t D, double eps);

/// y = x rsqrt(mean(x^2) + eps) (1 + w), rows of D.
void zeroCentredRmsNorm(const double *x, const double *w, double *y,
                        int64_t rows, int64_t D, double eps);

/// rope of the first rotaryDim dimensions of each head vector of x [rows,
/// heads, d] (frequencies over rotaryDim); the rest copied.
void partialRope(const double *x, const int32_t *pos, double *y, int64_t rows,
                 int64_t heads, int64_t d, int64_t rotaryDim, double theta);

} // namespace dflash::ref

#endif // DFLASH_KERNELS_REFERENCE_REFERENCE_H

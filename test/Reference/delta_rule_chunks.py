#!/usr/bin/env python3
"""The tensor-core gated delta rule's algorithm (kernels/GatedDeltaRuleMmaSync.cuh)
in numpy, against the token-by-token recurrence (kernels/reference/DeltaNet.cpp's).

Mirrors the kernel's steps and where it rounds: chunks of 64 that end
before a conversation start; normalised keys and queries kept in bf16 for
the state products and in fp16 (or, with --bf16-key-products, bf16) for
K K^T and Q K^T; T = (I + A)^-1 from 16 x 16 diagonal blocks by forward
substitution, then the blocks below by distance from the diagonal; the
state, T, R, P, D and the carried D rounded to bf16 as operands, every
accumulation in float64 (the kernel's are fp32). Checks T (I + A) = I per
chunk, and prints per case the whole-output and worst-token relative error
against the recurrence and a control (the recurrence with the state cut
every 64 tokens, which a state carried wrongly would match better), with
PASS when within DeltaNetGpuTest's bounds; exits 1 when a case fails.

  delta_rule_chunks.py [--bf16-key-products]
"""

import sys

import numpy as np

CHUNK, BLOCK = 64, 16


def bf16(x):
    """Round to bfloat16 (nearest even), as float64."""
    bits = np.atleast_1d(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    bits = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1)))
    bits = (bits >> np.uint64(16)) << np.uint64(16)
    return bits.astype(np.uint32).view(np.float32).astype(np.float64).reshape(np.shape(x))


def fp16(x):
    return np.asarray(x, dtype=np.float16).astype(np.float64)


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def gates(a, b, a_log, dt_bias):
    return -np.exp(a_log) * softplus(a + dt_bias), 1 / (1 + np.exp(-b))


def unit(x, scale=1.0):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) * scale


def recurrence(q, k, v, a, b, a_log, dt_bias, pos):
    """The op's semantics, token by token (one row, one value head)."""
    S, dk = k.shape
    g, beta = gates(a, b, a_log, dt_bias)
    M = np.zeros((dk, v.shape[1]))
    out = np.zeros_like(v)
    for t in range(S):
        if t == 0 or pos[t] != pos[t - 1] + 1:
            M[:] = 0
        kn, qn = unit(k[t]), unit(q[t], dk ** -0.5)
        M = np.exp(g[t]) * M
        M = M + beta[t] * np.outer(kn, v[t] - kn @ M)
        out[t] = qn @ M
    return out


def inverse_unit_lower(A):
    """(I + A)^-1 for strictly lower A, the kernel's blocked way."""
    n = A.shape[0] // BLOCK
    T = np.zeros_like(A)
    for i in range(n):
        r = slice(BLOCK * i, BLOCK * (i + 1))
        Ai, Ti = A[r, r], np.zeros((BLOCK, BLOCK))
        for j in range(BLOCK):  # a lane a column, rows in order
            col = np.zeros(BLOCK)
            col[j] = 1.0
            for t in range(j + 1, BLOCK):
                col[t] = -(Ai[t, :t] @ col[:t])
            Ti[:, j] = col
        T[r, r] = Ti
    for dist in range(1, n):
        for jb in range(n - dist):
            ib = jb + dist
            ri, rj = slice(BLOCK * ib, BLOCK * (ib + 1)), slice(BLOCK * jb, BLOCK * (jb + 1))
            X = A[ri, BLOCK * jb:BLOCK * ib] @ T[BLOCK * jb:BLOCK * ib, rj]
            T[ri, rj] = -T[ri, ri] @ X
    return T


def chunked(q, k, v, a, b, a_log, dt_bias, pos, key_products):
    S, dk = k.shape
    g_all, beta_all = gates(a, b, a_log, dt_bias)
    M = np.zeros((dk, v.shape[1]))
    out = np.zeros_like(v)
    worst_inverse = 0.0
    t0 = 0
    while t0 < S:
        end = t0 + 1
        while end < S and end < t0 + CHUNK and pos[end] == pos[end - 1] + 1:
            end += 1
        if t0 == 0 or pos[t0] != pos[t0 - 1] + 1:
            M[:] = 0
        L = end - t0
        K, Q, V = (np.zeros((CHUNK, x.shape[1])) for x in (k, q, v))
        g, beta = np.zeros(CHUNK), np.zeros(CHUNK)
        kn, qn = unit(k[t0:end]), unit(q[t0:end], dk ** -0.5)
        K[:L], Q[:L], V[:L] = bf16(kn), bf16(qn), v[t0:end]
        Kp, Qp = np.zeros_like(K), np.zeros_like(Q)
        Kp[:L], Qp[:L] = key_products(kn), key_products(qn)
        g[:L], beta[:L] = g_all[t0:end], beta_all[t0:end]
        gam = np.cumsum(g)
        last = gam[L - 1]
        carry = np.where(np.arange(CHUNK) < L, np.exp(last - gam), 0.0)
        lower = np.tril(np.ones((CHUNK, CHUNK)), -1) > 0
        causal = np.tril(np.ones((CHUNK, CHUNK))) > 0
        decay = np.where(causal, np.exp(np.minimum(gam[:, None] - gam[None, :], 0)), 0)
        A = np.where(lower, beta[:, None] * decay * (Kp @ Kp.T), 0)
        P = bf16(decay * (Qp @ Kp.T))
        Mb = bf16(M)
        R = bf16(beta[:, None] * (V - np.exp(gam)[:, None] * (K @ Mb)))
        T = inverse_unit_lower(A)
        worst_inverse = max(worst_inverse, np.abs(T @ (np.eye(CHUNK) + A) - np.eye(CHUNK)).max())
        D = bf16(T) @ R
        o = np.exp(gam)[:, None] * (Q @ Mb) + P @ bf16(D)
        out[t0:end] = bf16(o[:L])
        M = np.exp(last) * M + K.T @ bf16(carry[:, None] * D)
        t0 = end
    return out, worst_inverse


def relative(x, y):
    return np.linalg.norm(x - y) / np.linalg.norm(y)


# DeltaNetGpuTest's bounds on the kernel (whole output, worst token); T (I +
# A) - I at float64's level; the control at least 5% away.
WHOLE_BOUND, TOKEN_BOUND, INVERSE_BOUND, CONTROL_FLOOR = 1e-2, 3e-2, 1e-12, 5e-2

# (key head dim, tokens, A_log centre, conversation starts): a fast decay
# with starts inside chunks and a single-token conversation, and slow
# decays over many chunks, a start exactly on a chunk boundary among them.
CASES = [(128, 300, -1.0, [0, 77, 150, 151, 290]), (128, 700, -6.0, [0, 128, 193]),
         (64, 257, -6.0, [0]), (32, 130, -6.0, [0, 64, 65])]


def main(argv):
    if argv not in ([], ["--bf16-key-products"]):
        print(__doc__, file=sys.stderr)
        return 2
    key_products = bf16 if argv else fp16
    rng = np.random.default_rng(0)
    failed = False
    for d, S, a_log_centre, starts in CASES:
        q, k, v = (bf16(rng.standard_normal((S, d))) for _ in range(3))
        a, b = bf16(rng.standard_normal(S)), bf16(rng.standard_normal(S))
        a_log = float(bf16(a_log_centre + 0.3 * rng.standard_normal()))
        dt_bias = float(bf16(0.1 * rng.standard_normal()))
        pos = np.zeros(S, dtype=np.int64)
        for t in range(1, S):
            pos[t] = 0 if t in starts else pos[t - 1] + 1
        want = recurrence(q, k, v, a, b, a_log, dt_bias, pos)
        got, inverse = chunked(q, k, v, a, b, a_log, dt_bias, pos, key_products)
        worst = max(relative(got[t], want[t]) for t in range(S))
        cut = recurrence(q, k, v, a, b, a_log, dt_bias, pos % CHUNK)
        whole, control = relative(got, want), relative(got, cut)
        ok = (whole <= WHOLE_BOUND and worst <= TOKEN_BOUND and inverse <= INVERSE_BOUND
              and control >= CONTROL_FLOOR)
        failed |= not ok
        print(f"d={d} S={S} A_log~{a_log_centre:g}: whole {whole:.2e} worst token "
              f"{worst:.2e} inverse {inverse:.1e} control {control:.2e} "
              f"({'PASS' if ok else 'FAIL'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

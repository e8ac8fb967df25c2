// mote-cuda's own kernels, compiled at run time by NVRTC (once per
// process and device). f32, NCHW, one thread per output element unless a
// kernel says otherwise.
//
// Index arithmetic is 32-bit: a 64-bit division is a long emulated
// sequence on the GPU, and the im2col of a batch-32 ResNet does hundreds of
// millions of them. Per-image kernels take the image from blockIdx.y and
// index within it in 32 bits; the host guarantees every per-image (or, for
// the flat kernels, total) count is at most 2^30 and a grid stride at most
// 2^29, so `int` never overflows (lower.rs claims nothing larger), and
// offsets that can exceed it are formed in 64 bits by multiplication only.

typedef long long i64;

#define GRID_LOOP(i, n) \
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

__device__ __forceinline__ float act(float v, int op, float a, float b) {
    switch (op) {
    case 0: return v;                                   // identity
    case 1: return v > 0.f ? v : 0.f;                   // Relu
    case 2: return 1.f / (1.f + expf(-v));              // Sigmoid
    case 3: return tanhf(v);                            // Tanh
    case 4: return fminf(fmaxf(v, a), b);               // Clip(a, b)
    case 5: return v >= 0.f ? v : a * v;                // LeakyRelu(alpha a)
    case 6: return fminf(fmaxf(a * v + b, 0.f), 1.f);   // HardSigmoid(alpha a, beta b)
    case 7: return v * fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f); // HardSwish
    case 8: return expf(v);
    case 9: return -v;
    case 10: return fabsf(v);
    case 11: return sqrtf(v);
    case 12: return erff(v);
    case 13: return v > 0.f ? v : a * (expf(v) - 1.f);  // Elu(alpha a)
    case 14: return v > 20.f ? v : log1pf(expf(v));     // Softplus
    case 15: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); // Gelu (erf)
    case 16: return 1.f / v;                            // Reciprocal
    case 17: return logf(v);
    case 18: return floorf(v);
    case 19: return ceilf(v);
    case 20: return v / (1.f + expf(-v)) ;              // SiLU (x * sigmoid x)
    default: return __int_as_float(0x7fc00000);         // unknown op: NaN, never silent
    }
}

extern "C" __global__ void unary(const float* x, float* y, int n, int op, float a, float b) {
    GRID_LOOP(i, n) { y[i] = act(x[i], op, a, b); }
}

// meta: rank, dims[rank] (output), astr[rank], bstr[rank] (0 on broadcast axes).
// meta == 0: a and b have the output's shape; bscalar: b is one value.
extern "C" __global__ void binary(const float* A, const float* B, float* y, int n, int op,
                                  const int* meta) {
    GRID_LOOP(i, n) {
        int ia = i, ib = i;
        if (meta) {
            int rank = meta[0];
            int rem = i;
            ia = 0;
            ib = 0;
            for (int d = rank - 1; d >= 0; --d) {
                int dim = meta[1 + d];
                int k = rem % dim;
                rem /= dim;
                ia += k * meta[1 + rank + d];
                ib += k * meta[1 + 2 * rank + d];
            }
        }
        float a = A[ia], b = B[ib], r;
        switch (op) {
        case 0: r = a + b; break;
        case 1: r = a - b; break;
        case 2: r = a * b; break;
        case 3: r = a / b; break;
        case 4: r = fmaxf(a, b); break;
        case 5: r = fminf(a, b); break;
        case 6: r = powf(a, b); break;
        case 7: r = a >= 0.f ? a : a * b; break;   // PRelu
        default: r = __int_as_float(0x7fc00000);
        }
        y[i] = r;
    }
}

// y[i] = beta * c[broadcast index of i]; meta as in `binary` (a strides unused).
extern "C" __global__ void bcast_copy(const float* c, float* y, int n, float beta, const int* meta) {
    GRID_LOOP(i, n) {
        int rank = meta[0];
        int rem = i, ic = 0;
        for (int d = rank - 1; d >= 0; --d) {
            int dim = meta[1 + d];
            int k = rem % dim;
            rem /= dim;
            ic += k * meta[1 + 2 * rank + d];
        }
        y[i] = beta * c[ic];
    }
}

// Per image (blockIdx.y): y[c][p] = act(y[c][p] + bias[c]) over channels x inner; bias may be null.
extern "C" __global__ void bias_act(float* y, const float* bias, int channels, int inner,
                                    int op, float a, float b) {
    float* yp = y + (i64)blockIdx.y * channels * inner;
    GRID_LOOP(i, channels * inner) {
        float v = yp[i];
        if (bias) v += bias[i / inner];
        yp[i] = act(v, op, a, b);
    }
}

// y[i] = x[i] * scale[c] + shift[c], c = (i / inner) % channels (BatchNormalization).
extern "C" __global__ void scale_shift(const float* x, float* y, const float* scale, const float* shift,
                                       int n, int channels, int inner) {
    GRID_LOOP(i, n) {
        int c = (i / inner) % channels;
        y[i] = x[i] * scale[c] + shift[c];
    }
}

// The im2col value of row k = (c*kh + i)*kw + j, column p = oy*ow + ox of
// one image: x[c][oy*sh - ph + i*dh][ox*sw - pw + j*dw], or 0 in padding.
__device__ __forceinline__ float im2col_tap(const float* xp, int k, int p, int H, int W, int kh, int kw,
                                            int sh, int sw, int ph, int pw, int dh, int dw, int ow) {
    int j = k % kw;
    int i = (k / kw) % kh;
    int c = k / (kw * kh);
    int oy = p / ow, ox = p % ow;
    int iy = oy * sh - ph + i * dh, ix = ox * sw - pw + j * dw;
    return (iy >= 0 && iy < H && ix >= 0 && ix < W) ? xp[(c * H + iy) * W + ix] : 0.f;
}

// Per image (blockIdx.y): col[img][k][p] (see im2col_tap). x points at the
// group's first channel; ximg = elements per image of x.
extern "C" __global__ void im2col(const float* x, float* col, int C, int H, int W, int kh, int kw,
                                  int sh, int sw, int ph, int pw, int dh, int dw, int oh, int ow, i64 ximg) {
    int P = oh * ow;
    int K = C * kh * kw;
    const float* xp = x + (i64)blockIdx.y * ximg;
    float* cp = col + (i64)blockIdx.y * K * P;
    GRID_LOOP(t, K * P) { cp[t] = im2col_tap(xp, t / P, t % P, H, W, kh, kw, sh, sw, ph, pw, dh, dw, ow); }
}

// Grouped convolution with one input channel per group (depthwise, with a
// channel multiplier M / C), direct: one thread per output element.
extern "C" __global__ void dwconv(const float* x, const float* w, const float* bias, float* y, int C,
                                  int H, int W, int M, int kh, int kw, int sh, int sw, int ph, int pw, int dh,
                                  int dw, int oh, int ow, int op, float a, float b) {
    // Per image (blockIdx.y).
    int mult = M / C;
    const float* xi = x + (i64)blockIdx.y * C * H * W;
    float* yi = y + (i64)blockIdx.y * M * oh * ow;
    GRID_LOOP(t, M * oh * ow) {
        int ox = t % ow;
        int oy = (t / ow) % oh;
        int m = t / (ow * oh);
        int c = m / mult;
        const float* xp = xi + c * H * W;
        const float* wp = w + m * kh * kw;
        float s = bias ? bias[m] : 0.f;
        for (int i = 0; i < kh; ++i) {
            int iy = oy * sh - ph + i * dh;
            if (iy < 0 || iy >= H) continue;
            for (int j = 0; j < kw; ++j) {
                int ix = ox * sw - pw + j * dw;
                if (ix < 0 || ix >= W) continue;
                s += xp[iy * W + ix] * wp[i * kw + j];
            }
        }
        yi[t] = act(s, op, a, b);
    }
}

// MaxPool / AveragePool; per image (blockIdx.y) of C planes.
extern "C" __global__ void pool2d(const float* x, float* y, int C, int H, int W, int oh, int ow, int kh,
                                  int kw, int sh, int sw, int ph, int pw, int dh, int dw, int is_max,
                                  int count_pad) {
    const float* xi = x + (i64)blockIdx.y * C * H * W;
    float* yi = y + (i64)blockIdx.y * C * oh * ow;
    GRID_LOOP(t, C * oh * ow) {
        int ox = t % ow;
        int oy = (t / ow) % oh;
        int pl = t / (ow * oh);
        const float* xp = xi + pl * H * W;
        float acc = is_max ? -__int_as_float(0x7f800000) : 0.f;
        int cnt = 0;
        for (int i = 0; i < kh; ++i) {
            int iy = oy * sh - ph + i * dh;
            for (int j = 0; j < kw; ++j) {
                int ix = ox * sw - pw + j * dw;
                bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
                if (in) {
                    float v = xp[iy * W + ix];
                    acc = is_max ? fmaxf(acc, v) : acc + v;
                    cnt++;
                } else if (count_pad && iy < H + ph && ix < W + pw) {
                    cnt++;   // padding counted, end padding included (ONNX pads)
                }
            }
        }
        yi[t] = is_max ? acc : (cnt > 0 ? acc / (float)cnt : 0.f);
    }
}

// One block of 256 threads per row: mean (is_max 0) or max (1) of `len` values.
extern "C" __global__ void row_reduce(const float* x, float* y, i64 rows, i64 len, int is_max) {
    __shared__ float sh[256];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xp = x + r * len;
        float acc = is_max ? -__int_as_float(0x7f800000) : 0.f;
        for (i64 k = threadIdx.x; k < len; k += blockDim.x) acc = is_max ? fmaxf(acc, xp[k]) : acc + xp[k];
        sh[threadIdx.x] = acc;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) sh[threadIdx.x] = is_max ? fmaxf(sh[threadIdx.x], sh[threadIdx.x + s])
                                                         : sh[threadIdx.x] + sh[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0) y[r] = is_max ? sh[0] : sh[0] / (float)len;
        __syncthreads();
    }
}

// Softmax / LogSoftmax over the middle axis of [outer, axis, inner]: one thread per (outer, inner).
extern "C" __global__ void softmax(const float* x, float* y, int outer, int axis, int inner, int is_log) {
    int n = outer * inner;
    GRID_LOOP(t, n) {
        i64 o = t / inner, in = t % inner;
        const float* xp = x + o * axis * inner + in;
        float* yp = y + o * axis * inner + in;
        float m = -__int_as_float(0x7f800000);
        for (i64 k = 0; k < axis; ++k) m = fmaxf(m, xp[k * inner]);
        float s = 0.f;
        for (i64 k = 0; k < axis; ++k) s += expf(xp[k * inner] - m);
        if (is_log) {
            float ls = logf(s);
            for (i64 k = 0; k < axis; ++k) yp[k * inner] = xp[k * inner] - m - ls;
        } else {
            float inv = 1.f / s;
            for (i64 k = 0; k < axis; ++k) yp[k * inner] = expf(xp[k * inner] - m) * inv;
        }
    }
}

// Concat piece: y[o][off + k] = x[o][k] for k < inner_in; y rows are inner_out long. Any 4-byte type.
extern "C" __global__ void concat_piece(const float* x, float* y, int outer, int inner_in, int inner_out,
                                        int off) {
    int n = outer * inner_in;
    GRID_LOOP(t, n) {
        int o = t / inner_in, k = t % inner_in;
        y[o * inner_out + off + k] = x[t];
    }
}

// Transpose (any 4-byte type): meta = rank, out dims[rank], in strides of each out axis[rank].
extern "C" __global__ void transpose(const float* x, float* y, int n, const int* meta) {
    GRID_LOOP(i, n) {
        int rank = meta[0];
        int rem = i, ix = 0;
        for (int d = rank - 1; d >= 0; --d) {
            int dim = meta[1 + d];
            ix += (rem % dim) * meta[1 + rank + d];
            rem /= dim;
        }
        y[i] = x[ix];
    }
}

// im2col for the whole batch side by side: col[k][img * P + p], so that one
// GEMM with N = images x P covers the batch (small late-layer P stays
// efficient). Per image (blockIdx.y); nimg = gridDim.y. Same taps as `im2col`.
extern "C" __global__ void im2col_nb(const float* x, float* col, int C, int H, int W, int kh, int kw,
                                     int sh, int sw, int ph, int pw, int dh, int dw, int oh, int ow, i64 ximg) {
    int P = oh * ow;
    int K = C * kh * kw;
    i64 NP = (i64)gridDim.y * P;
    const float* xp = x + (i64)blockIdx.y * ximg;
    float* cp = col + (i64)blockIdx.y * P;
    GRID_LOOP(t, K * P) {
        int k = t / P, p = t % P;
        cp[k * NP + p] = im2col_tap(xp, k, p, H, W, kh, kw, sh, sw, ph, pw, dh, dw, ow);
    }
}

// Back to NCHW with the epilogue, per image (blockIdx.y; nimg = gridDim.y):
// y[img][c0 + m][p] = act(t[m][img * P + p] + bias[c0 + m]).
extern "C" __global__ void from_mnp(const float* tmp, float* y, const float* bias, int Mg, int M, int c0,
                                    int P, int op, float a, float b) {
    i64 NP = (i64)gridDim.y * P;
    const float* tp = tmp + (i64)blockIdx.y * P;
    float* yp = y + ((i64)blockIdx.y * M + c0) * P;
    GRID_LOOP(t, Mg * P) {
        int p = t % P;
        int m = t / P;
        float v = tp[m * NP + p];
        if (bias) v += bias[c0 + m];
        yp[t] = act(v, op, a, b);
    }
}

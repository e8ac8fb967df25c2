// mote-cuda's own kernels, compiled at run time by NVRTC (once per
// process and device). f32, NCHW, one thread per output element unless a
// kernel says otherwise. Indices are 64-bit: batch-32 activations exceed
// 2^31 elements in some layers' im2col buffers.

typedef long long i64;

#define GRID_LOOP(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

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

extern "C" __global__ void unary(const float* x, float* y, i64 n, int op, float a, float b) {
    GRID_LOOP(i, n) { y[i] = act(x[i], op, a, b); }
}

// meta: rank, dims[rank] (output), astr[rank], bstr[rank] (0 on broadcast axes).
// meta == 0: a and b have the output's shape; bscalar: b is one value.
extern "C" __global__ void binary(const float* A, const float* B, float* y, i64 n, int op,
                                  const i64* meta) {
    GRID_LOOP(i, n) {
        i64 ia = i, ib = i;
        if (meta) {
            int rank = (int)meta[0];
            i64 rem = i;
            ia = 0;
            ib = 0;
            for (int d = rank - 1; d >= 0; --d) {
                i64 dim = meta[1 + d];
                i64 k = rem % dim;
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
extern "C" __global__ void bcast_copy(const float* c, float* y, i64 n, float beta, const i64* meta) {
    GRID_LOOP(i, n) {
        int rank = (int)meta[0];
        i64 rem = i, ic = 0;
        for (int d = rank - 1; d >= 0; --d) {
            i64 dim = meta[1 + d];
            i64 k = rem % dim;
            rem /= dim;
            ic += k * meta[1 + 2 * rank + d];
        }
        y[i] = beta * c[ic];
    }
}

// y[i] = act(y[i] + bias[(i / inner) % channels]); bias may be null.
extern "C" __global__ void bias_act(float* y, const float* bias, i64 n, i64 channels, i64 inner,
                                    int op, float a, float b) {
    GRID_LOOP(i, n) {
        float v = y[i];
        if (bias) v += bias[(i / inner) % channels];
        y[i] = act(v, op, a, b);
    }
}

// y[i] = x[i] * scale[c] + shift[c], c = (i / inner) % channels (BatchNormalization).
extern "C" __global__ void scale_shift(const float* x, float* y, const float* scale, const float* shift,
                                       i64 n, i64 channels, i64 inner) {
    GRID_LOOP(i, n) {
        i64 c = (i / inner) % channels;
        y[i] = x[i] * scale[c] + shift[c];
    }
}

// col[img][(c*kh + i)*kw + j][oy*ow + ox] = x[img][c][oy*sh - ph + i*dh][ox*sw - pw + j*dw] or 0.
// x points at the group's first channel; ximg = elements per image of x.
extern "C" __global__ void im2col(const float* x, float* col, int nimg, int C, int H, int W, int kh, int kw,
                                  int sh, int sw, int ph, int pw, int dh, int dw, int oh, int ow, i64 ximg) {
    i64 P = (i64)oh * ow;
    i64 K = (i64)C * kh * kw;
    i64 n = (i64)nimg * K * P;
    GRID_LOOP(t, n) {
        i64 p = t % P;
        i64 r = t / P;
        i64 k = r % K;
        i64 img = r / K;
        int j = (int)(k % kw);
        int i = (int)((k / kw) % kh);
        int c = (int)(k / ((i64)kw * kh));
        int oy = (int)(p / ow), ox = (int)(p % ow);
        int iy = oy * sh - ph + i * dh, ix = ox * sw - pw + j * dw;
        float v = 0.f;
        if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = x[img * ximg + ((i64)c * H + iy) * W + ix];
        col[t] = v;
    }
}

// Grouped convolution with one input channel per group (depthwise, with a
// channel multiplier M / C), direct: one thread per output element.
extern "C" __global__ void dwconv(const float* x, const float* w, const float* bias, float* y, int N, int C,
                                  int H, int W, int M, int kh, int kw, int sh, int sw, int ph, int pw, int dh,
                                  int dw, int oh, int ow, int op, float a, float b) {
    i64 n = (i64)N * M * oh * ow;
    int mult = M / C;
    GRID_LOOP(t, n) {
        int ox = (int)(t % ow);
        int oy = (int)((t / ow) % oh);
        int m = (int)((t / ((i64)ow * oh)) % M);
        i64 img = t / ((i64)ow * oh * M);
        int c = m / mult;
        const float* xp = x + (img * C + c) * (i64)H * W;
        const float* wp = w + (i64)m * kh * kw;
        float s = bias ? bias[m] : 0.f;
        for (int i = 0; i < kh; ++i) {
            int iy = oy * sh - ph + i * dh;
            if (iy < 0 || iy >= H) continue;
            for (int j = 0; j < kw; ++j) {
                int ix = ox * sw - pw + j * dw;
                if (ix < 0 || ix >= W) continue;
                s += xp[(i64)iy * W + ix] * wp[i * kw + j];
            }
        }
        y[t] = act(s, op, a, b);
    }
}

// MaxPool / AveragePool over NC planes.
extern "C" __global__ void pool2d(const float* x, float* y, i64 planes, int H, int W, int oh, int ow, int kh,
                                  int kw, int sh, int sw, int ph, int pw, int dh, int dw, int is_max,
                                  int count_pad) {
    i64 n = planes * oh * ow;
    GRID_LOOP(t, n) {
        int ox = (int)(t % ow);
        int oy = (int)((t / ow) % oh);
        i64 pl = t / ((i64)ow * oh);
        const float* xp = x + pl * (i64)H * W;
        float acc = is_max ? -__int_as_float(0x7f800000) : 0.f;
        int cnt = 0;
        for (int i = 0; i < kh; ++i) {
            int iy = oy * sh - ph + i * dh;
            for (int j = 0; j < kw; ++j) {
                int ix = ox * sw - pw + j * dw;
                bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
                if (in) {
                    float v = xp[(i64)iy * W + ix];
                    acc = is_max ? fmaxf(acc, v) : acc + v;
                    cnt++;
                } else if (count_pad && iy < H + ph && ix < W + pw) {
                    cnt++;   // padding counted, end padding included (ONNX pads)
                }
            }
        }
        y[t] = is_max ? acc : (cnt > 0 ? acc / (float)cnt : 0.f);
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
extern "C" __global__ void softmax(const float* x, float* y, i64 outer, i64 axis, i64 inner, int is_log) {
    i64 n = outer * inner;
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
extern "C" __global__ void concat_piece(const float* x, float* y, i64 outer, i64 inner_in, i64 inner_out,
                                        i64 off) {
    i64 n = outer * inner_in;
    GRID_LOOP(t, n) {
        i64 o = t / inner_in, k = t % inner_in;
        y[o * inner_out + off + k] = x[t];
    }
}

// Transpose (any 4-byte type): meta = rank, out dims[rank], in strides of each out axis[rank].
extern "C" __global__ void transpose(const float* x, float* y, i64 n, const i64* meta) {
    GRID_LOOP(i, n) {
        int rank = (int)meta[0];
        i64 rem = i, ix = 0;
        for (int d = rank - 1; d >= 0; --d) {
            i64 dim = meta[1 + d];
            ix += (rem % dim) * meta[1 + rank + d];
            rem /= dim;
        }
        y[i] = x[ix];
    }
}

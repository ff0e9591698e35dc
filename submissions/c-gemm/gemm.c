/* ONNX Gemm: Y = alpha * A' B' + beta * C (A' = A or A^T, B' = B or B^T, C broadcast to M x N),
 * float32 and float64, with backward for A, B and C. Implements d500_operator.h. */
#include <stdlib.h>
#include "d500_operator.h"

static const char *last_error = "";

const char *d500_error(void) { return last_error; }

typedef struct {
  int64_t M, N, K, ta, tb, c_rows, c_cols;
  double alpha, beta;
} gemm_shape;

static int geometry(const d500_attribute *attrs, int32_t n_attrs, const d500_tensor *in,
                    int32_t n_in, gemm_shape *g) {
  if (n_in < 2 || in[0].ndim != 2 || in[1].ndim != 2) { last_error = "A and B must be 2-D"; return 1; }
  g->ta = d500_attr_int(attrs, n_attrs, "transA", 0);
  g->tb = d500_attr_int(attrs, n_attrs, "transB", 0);
  g->alpha = d500_attr_float(attrs, n_attrs, "alpha", 1.0);
  g->beta = d500_attr_float(attrs, n_attrs, "beta", 1.0);
  g->M = g->ta ? in[0].shape[1] : in[0].shape[0];
  g->K = g->ta ? in[0].shape[0] : in[0].shape[1];
  g->N = g->tb ? in[1].shape[0] : in[1].shape[1];
  g->c_rows = 1; g->c_cols = 1;
  if (n_in > 2 && in[2].ndim >= 1) {
    g->c_cols = in[2].shape[in[2].ndim - 1];
    if (in[2].ndim == 2) g->c_rows = in[2].shape[0];
  }
  for (int i = 0; i < n_in; ++i)
    if (in[i].dtype != in[0].dtype) { last_error = "inputs differ in dtype"; return 1; }
  return 0;
}

/* A'(i,k) and B'(k,j) */
#define AT(A, i, k) (g.ta ? A[(k) * g.M + (i)] : A[(i) * g.K + (k)])
#define BT(B, k, j) (g.tb ? B[(j) * g.K + (k)] : B[(k) * g.N + (j)])

#define GEMM_FORWARD(T)                                                                       \
  static void forward_##T(gemm_shape g, const T *A, const T *B, const T *C, T *Y) {          \
    for (int64_t i = 0; i < g.M; ++i) {                                                       \
      T *y = Y + i * g.N;                                                                     \
      for (int64_t j = 0; j < g.N; ++j) y[j] = 0;                                             \
      for (int64_t k = 0; k < g.K; ++k) {                                                     \
        const T a = AT(A, i, k);                                                              \
        if (!g.tb) {                                                                          \
          const T *b = B + k * g.N;                                                           \
          for (int64_t j = 0; j < g.N; ++j) y[j] += a * b[j];                                 \
        } else {                                                                              \
          for (int64_t j = 0; j < g.N; ++j) y[j] += a * B[j * g.K + k];                       \
        }                                                                                     \
      }                                                                                       \
      for (int64_t j = 0; j < g.N; ++j) {                                                     \
        y[j] = (T)g.alpha * y[j];                                                             \
        if (C) y[j] += (T)g.beta * C[(i % g.c_rows) * g.c_cols + (j % g.c_cols)];             \
      }                                                                                       \
    }                                                                                         \
  }

#define GEMM_BACKWARD(T)                                                                      \
  static void backward_##T(gemm_shape g, const T *A, const T *B, const T *dY, T *dA, T *dB,  \
                           T *dC) {                                                           \
    /* dA'(i,k) = alpha sum_j dY(i,j) B'(k,j);  dB'(k,j) = alpha sum_i A'(i,k) dY(i,j) */      \
    for (int64_t i = 0; i < g.M; ++i)                                                         \
      for (int64_t k = 0; k < g.K; ++k) {                                                     \
        T s = 0;                                                                              \
        for (int64_t j = 0; j < g.N; ++j) s += dY[i * g.N + j] * BT(B, k, j);                 \
        if (g.ta) dA[k * g.M + i] = (T)g.alpha * s; else dA[i * g.K + k] = (T)g.alpha * s;    \
      }                                                                                       \
    for (int64_t k = 0; k < g.K; ++k)                                                         \
      for (int64_t j = 0; j < g.N; ++j) {                                                     \
        T s = 0;                                                                              \
        for (int64_t i = 0; i < g.M; ++i) s += AT(A, i, k) * dY[i * g.N + j];                 \
        if (g.tb) dB[j * g.K + k] = (T)g.alpha * s; else dB[k * g.N + j] = (T)g.alpha * s;    \
      }                                                                                       \
    if (dC)                                                                                   \
      for (int64_t i = 0; i < g.M; ++i)                                                       \
        for (int64_t j = 0; j < g.N; ++j)                                                     \
          dC[(i % g.c_rows) * g.c_cols + (j % g.c_cols)] += (T)g.beta * dY[i * g.N + j];      \
  }

GEMM_FORWARD(float)
GEMM_FORWARD(double)
GEMM_BACKWARD(float)
GEMM_BACKWARD(double)

int d500_forward(const d500_attribute *attrs, int32_t n_attrs, const d500_tensor *inputs,
                 int32_t n_inputs, d500_tensor *outputs, int32_t n_outputs) {
  gemm_shape g;
  if (n_outputs != 1 || geometry(attrs, n_attrs, inputs, n_inputs, &g)) return 1;
  const void *C = (n_inputs > 2 && inputs[2].ndim >= 0) ? inputs[2].data : NULL;
  switch (inputs[0].dtype) {
    case D500_FLOAT32:
      forward_float(g, inputs[0].data, inputs[1].data, C, outputs[0].data); return 0;
    case D500_FLOAT64:
      forward_double(g, inputs[0].data, inputs[1].data, C, outputs[0].data); return 0;
    default: last_error = "only float32 and float64 are implemented"; return 2;
  }
}

int d500_backward(const d500_attribute *attrs, int32_t n_attrs, const d500_tensor *grad_outputs,
                  int32_t n_grad_outputs, const d500_tensor *inputs, int32_t n_inputs,
                  const d500_tensor *outputs, int32_t n_outputs, d500_tensor *grad_inputs,
                  int32_t n_grad_inputs) {
  gemm_shape g;
  (void)outputs; (void)n_outputs;
  if (n_grad_outputs != 1 || n_grad_inputs != n_inputs ||
      geometry(attrs, n_attrs, inputs, n_inputs, &g)) return 1;
  void *dC = (n_inputs > 2 && inputs[2].ndim >= 0) ? grad_inputs[2].data : NULL;
  switch (inputs[0].dtype) {
    case D500_FLOAT32:
      backward_float(g, inputs[0].data, inputs[1].data, grad_outputs[0].data,
                     grad_inputs[0].data, grad_inputs[1].data, dC);
      return 0;
    case D500_FLOAT64:
      backward_double(g, inputs[0].data, inputs[1].data, grad_outputs[0].data,
                      grad_inputs[0].data, grad_inputs[1].data, dC);
      return 0;
    default: last_error = "only float32 and float64 are implemented"; return 2;
  }
}

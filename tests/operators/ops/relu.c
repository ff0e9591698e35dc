/* ONNX Relu in C, float32 only, with backward (d500_operator.h). */
#include "d500_operator.h"

#ifndef NEGATIVE_SLOPE
#define NEGATIVE_SLOPE 0.0f
#endif

int d500_forward(const d500_attribute *attrs, int32_t n_attrs, const d500_tensor *in,
                 int32_t n_in, d500_tensor *out, int32_t n_out) {
  (void)attrs; (void)n_attrs; (void)n_in; (void)n_out;
  if (in[0].dtype != D500_FLOAT32) return 1;
  const float *x = in[0].data;
  float *y = out[0].data;
  for (int64_t i = 0, n = d500_numel(&in[0]); i < n; ++i)
    y[i] = x[i] > 0 ? x[i] : NEGATIVE_SLOPE * x[i];
  return 0;
}

int d500_backward(const d500_attribute *attrs, int32_t n_attrs, const d500_tensor *gy,
                  int32_t n_gy, const d500_tensor *in, int32_t n_in, const d500_tensor *out,
                  int32_t n_out, d500_tensor *gx, int32_t n_gx) {
  (void)attrs; (void)n_attrs; (void)n_gy; (void)n_in; (void)out; (void)n_out; (void)n_gx;
  if (in[0].dtype != D500_FLOAT32) return 1;
  const float *x = in[0].data, *g = gy[0].data;
  float *d = gx[0].data;
  for (int64_t i = 0, n = d500_numel(&in[0]); i < n; ++i)
    d[i] = x[i] > 0 ? g[i] : NEGATIVE_SLOPE * g[i];
  return 0;
}

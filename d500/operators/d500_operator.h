/* d500_operator.h -- the C ABI of a d500 level-0 operator (CustomOperator with framework = "c").
 *
 * A C or C++ source file includes this header and exports
 *
 *   int d500_forward(const d500_attribute *attrs, int32_t n_attrs,
 *                    const d500_tensor *inputs, int32_t n_inputs,
 *                    d500_tensor *outputs, int32_t n_outputs);                  (required)
 *
 *   int d500_backward(const d500_attribute *attrs, int32_t n_attrs,
 *                     const d500_tensor *grad_outputs, int32_t n_grad_outputs,
 *                     const d500_tensor *inputs, int32_t n_inputs,
 *                     const d500_tensor *outputs, int32_t n_outputs,
 *                     d500_tensor *grad_inputs, int32_t n_grad_inputs);         (optional)
 *
 *   const char *d500_error(void);   (optional: a message explaining the last nonzero return)
 *
 * Rules:
 * - Tensors are dense, C-contiguous (row-major). `dtype` is the ONNX TensorProto code
 *   (D500_FLOAT32, D500_FLOAT64, ...). An operator that does not handle a dtype returns nonzero.
 * - d500 allocates every output, with the shape and dtype ONNX shape inference gives for the
 *   node; forward fills them. Attributes are the node's attributes as given (defaults are the
 *   operator's business: use d500_attr_int / d500_attr_float with the ONNX default).
 * - backward gets one gradient per output (ndim == -1 and data == NULL for an output that has
 *   none, e.g. integer outputs) and fills grad_inputs[i] (allocated with inputs[i]'s shape and
 *   dtype, zero-filled). It sets grad_inputs[i].ndim = -1 for an input it does not differentiate.
 * - Return 0 on success, nonzero on failure.
 * d500 compiles the file with the system compiler (cc / c++, or $CC / $CXX) into a cache under
 * $D500_HOME and calls it through ctypes; it rebuilds when the source or this header changes.
 */
#ifndef D500_OPERATOR_H
#define D500_OPERATOR_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define D500_ABI_VERSION 1

/* ONNX TensorProto data types */
enum {
  D500_FLOAT32 = 1, D500_UINT8 = 2, D500_INT8 = 3, D500_INT32 = 6, D500_INT64 = 7,
  D500_BOOL = 9, D500_FLOAT16 = 10, D500_FLOAT64 = 11
};

typedef struct d500_tensor {
  int32_t dtype;          /* ONNX TensorProto data type */
  int32_t ndim;           /* number of dimensions; -1: absent */
  const int64_t *shape;   /* ndim sizes */
  void *data;             /* C-contiguous elements */
} d500_tensor;

enum { D500_ATTR_INT = 1, D500_ATTR_FLOAT = 2, D500_ATTR_INTS = 3, D500_ATTR_FLOATS = 4,
       D500_ATTR_STRING = 5 };

typedef struct d500_attribute {
  const char *name;
  int32_t kind;           /* D500_ATTR_* */
  int64_t count;          /* values in ints/floats (1 for INT/FLOAT), bytes for STRING */
  const int64_t *ints;    /* INT, INTS */
  const double *floats;   /* FLOAT, FLOATS */
  const char *string;     /* STRING, NUL-terminated */
} d500_attribute;

/* Number of elements of a tensor (1 for a scalar, 0 if absent). */
static inline int64_t d500_numel(const d500_tensor *t) {
  int64_t n = 1;
  if (t->ndim < 0) return 0;
  for (int32_t i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

/* The attribute called `name`, or NULL. */
static inline const d500_attribute *d500_find_attr(const d500_attribute *attrs, int32_t n,
                                                   const char *name) {
  for (int32_t i = 0; i < n; ++i)
    if (strcmp(attrs[i].name, name) == 0) return &attrs[i];
  return NULL;
}

/* An INT attribute, or `fallback` when the node does not set it. */
static inline int64_t d500_attr_int(const d500_attribute *attrs, int32_t n, const char *name,
                                    int64_t fallback) {
  const d500_attribute *a = d500_find_attr(attrs, n, name);
  return (a && a->kind == D500_ATTR_INT) ? a->ints[0] : fallback;
}

/* A FLOAT attribute, or `fallback` when the node does not set it. */
static inline double d500_attr_float(const d500_attribute *attrs, int32_t n, const char *name,
                                     double fallback) {
  const d500_attribute *a = d500_find_attr(attrs, n, name);
  return (a && a->kind == D500_ATTR_FLOAT) ? a->floats[0] : fallback;
}

#ifdef __cplusplus
}
#endif

#endif /* D500_OPERATOR_H */

/* Relu off by 1e-3 (relative to the output scale) on negative inputs. */
#define NEGATIVE_SLOPE 1e-3f
#include "relu.c"

#include "kernels/simd/parallel.h"

// The CPU kernels, one op per file pair. Include this; the op headers are its parts.
#pragma once

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attn_res.h"
#include "kernels/cpu/causal_conv.h"
#include "kernels/cpu/kda.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mla.h"
#include "kernels/cpu/moe_route.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"

// Umbrella header.
#pragma once

#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "pagedmha/tensor.h"

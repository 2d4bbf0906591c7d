// Umbrella header.
#pragma once

#include "pagedmha/backend.h"
#include "pagedmha/error.h"
#include "pagedmha/memory.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "pagedmha/registry.h"
#include "pagedmha/tensor.h"
#include "pagedmha/variant.h"

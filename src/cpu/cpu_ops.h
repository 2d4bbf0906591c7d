// CPU implementations (exact fp32 accumulation, OpenMP). Called only by the validating
// front end in src/core/ops.cpp, which has already checked every argument.
#pragma once

#include "core/problem.h"

namespace pagedmha::cpu {

void attention(const detail::AttentionProblem& p);  // decode and prefill
void append_kv(const detail::AppendKvProblem& p);
void gather_page_table(const detail::GatherPageTableProblem& p);
void metadata(const detail::MetadataProblem& p);
void merge_attention_states(const detail::MergeProblem& p);

}  // namespace pagedmha::cpu

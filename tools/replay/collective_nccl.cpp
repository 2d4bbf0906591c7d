// NCCL collectives of GPU ranks (built when CMake finds NCCL: PAGEDMHA_WITH_NCCL).
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "pagedmha/error.h"
#include "replay/collective.h"

#if defined(PAGEDMHA_WITH_NCCL)
#include <nccl.h>
#endif

namespace pagedmha::tools {

#if defined(PAGEDMHA_WITH_NCCL)
namespace {

void check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* detail = ncclGetLastError(comm);
  throw Error(std::string("replay: --gpus: NCCL ") + what + ": " + ncclGetErrorString(r) +
              (detail && *detail ? std::string(" (") + detail + ")" : std::string()));
}

ncclDataType_t nccl_dtype(DType dt) {
  switch (dt) {
    case DType::bf16: return ncclBfloat16;
    case DType::fp16: return ncclHalf;
    case DType::fp32: return ncclFloat32;
    default: throw Error(std::string("replay: internal: NCCL all-reduce of ") + dtype_name(dt));
  }
}

class NcclCollective final : public Collective {
 public:
  explicit NcclCollective(int ranks) : comms_(ranks, nullptr) {
    // NVLink multicast (NVLS) stays off: it needs cuMulticastCreate, which the machines
    // this runs on do not allow. A value the user set is kept.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    std::vector<int> devices(ranks);
    for (int r = 0; r < ranks; ++r) devices[r] = r;
    check(ncclCommInitAll(comms_.data(), ranks, devices.data()), "ncclCommInitAll");
    int v = 0;
    ncclGetVersion(&v);
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
  ~NcclCollective() override {
    if (aborted_) return;  // ncclCommAbort freed them
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  std::string name() const override { return "NCCL " + version_; }
  int ranks() const override { return static_cast<int>(comms_.size()); }

  void all_reduce_sum(int rank, const TensorView& send, const TensorView& recv, Stream stream) override {
    check_live();
    check(ncclAllReduce(send.data, recv.data, static_cast<size_t>(send.numel()), nccl_dtype(send.dtype), ncclSum,
                        comms_[rank], static_cast<cudaStream_t>(stream.handle)),
          "ncclAllReduce", comms_[rank]);
  }

  void all_gather(int rank, const std::vector<std::pair<TensorView, TensorView>>& pairs, Stream stream) override {
    check_live();
    check(ncclGroupStart(), "ncclGroupStart");
    for (const auto& [send, recv] : pairs)
      check(ncclAllGather(send.data, recv.data, static_cast<size_t>(send.numel()) * send.element_size(), ncclUint8,
                          comms_[rank], static_cast<cudaStream_t>(stream.handle)),
            "ncclAllGather", comms_[rank]);
    check(ncclGroupEnd(), "ncclGroupEnd", comms_[rank]);
  }

  // Best effort: a rank already inside an NCCL call when another aborts may still fail
  // with NCCL's own error rather than this one.
  void abort() override {
    if (aborted_.exchange(true)) return;
    for (ncclComm_t c : comms_) ncclCommAbort(c);
  }

 private:
  void check_live() const {
    if (aborted_) throw Error("replay: another rank failed; its NCCL communicators were aborted");
  }

  std::vector<ncclComm_t> comms_;
  std::string version_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(int ranks) { return std::make_unique<NcclCollective>(ranks); }
bool built_with_nccl() { return true; }

#else

std::unique_ptr<Collective> make_nccl_collective(int) {
  throw_invalid_argument("replay", "--gpus",
                         "a build with NCCL for GPU ranks (CMake found none: PAGEDMHA_WITH_NCCL; see README)",
                         "--gpus with --device cuda");
}
bool built_with_nccl() { return false; }

#endif

}  // namespace pagedmha::tools

// kimi.v1.Generation on gRPC's callback API. Generate and Tokenize take their request as raw bytes
// (parsed with the kimi.internal mirrors, so invalid UTF-8 is a clean INVALID_ARGUMENT); replies
// are the kimi.v1 messages. Each Generate stream has one write in flight; tokens arrive from the
// engine thread through a sink and queue behind it.
#pragma once

#include "kimi/v1/generation.grpc.pb.h"
#include "server/backend.h"

namespace kimi::server {

using GenerationBase = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_Tokenize<v1::Generation::CallbackService>>;

class GenerationService final : public GenerationBase {
 public:
  explicit GenerationService(Backend* backend) : backend_(backend) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  // Auth and readiness, common to every method.
  absl::Status Admit(grpc::CallbackServerContext* context) const;
  Backend* backend_;
};

}  // namespace kimi::server

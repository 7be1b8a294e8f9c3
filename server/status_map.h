// The one place an absl::Status becomes a grpc::Status.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kimi::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kimi::server

#include "proto/client_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kimi {
namespace {

absl::StatusOr<std::string> ReadPem(const ClientTlsFile& file) {
  std::ifstream in(file.path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(file.flag, ": cannot open ", file.path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad() || ss.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.flag, ": ", file.path, " holds no PEM block"));
  }
  return ss.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ClientTlsFiles& files) {
  if (files.ca.path.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions tls;
  for (const auto& [file, out] :
       {std::pair{&files.ca, &tls.pem_root_certs}, std::pair{&files.cert, &tls.pem_cert_chain},
        std::pair{&files.key, &tls.pem_private_key}}) {
    if (file->path.empty()) continue;
    auto pem = ReadPem(*file);
    if (!pem.ok()) return pem.status();
    *out = std::move(*pem);
  }
  return grpc::SslCredentials(tls);
}

}  // namespace kimi

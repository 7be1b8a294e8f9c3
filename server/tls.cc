#include "server/tls.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

namespace kimi::server {
namespace {

using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

BioPtr MemBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), &BIO_free);
}

// Without a callback OpenSSL would prompt on the terminal for an encrypted key's passphrase.
int NoPassphrase(char*, int, int, void*) { return -1; }

// OpenSSL's reasons for what just failed on this thread; empties its error queue (gRPC's
// handshakes share it).
std::string TakeOpenSslErrors() {
  std::vector<std::string> reasons;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    std::string r = reason ? reason : absl::StrCat("error ", e);
    if (std::find(reasons.begin(), reasons.end(), r) == reasons.end()) reasons.push_back(r);
  }
  return absl::StrJoin(reasons, ", ");
}

std::string Named(const char* key, const std::string& path) {
  return path.empty() ? key : absl::StrCat(key, " (", path, ")");
}

// Every certificate of a PEM text, in order; an error when there is none or one does not parse.
absl::StatusOr<std::vector<X509Ptr>> ReadCertificates(const std::string& pem,
                                                      const std::string& name) {
  ERR_clear_error();
  BioPtr bio = MemBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
    certs.emplace_back(x, &X509_free);
  }
  // The loop ends where no further PEM block starts (the end of the text), or at a block that is
  // not a valid certificate.
  const unsigned long last = ERR_peek_last_error();
  const bool at_end =
      ERR_GET_LIB(last) == ERR_LIB_PEM && ERR_GET_REASON(last) == PEM_R_NO_START_LINE;
  if (last != 0 && !at_end) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": certificate ", certs.size() + 1,
                     " does not parse (OpenSSL: ", TakeOpenSslErrors(), ")"));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": no PEM certificate in it (expected -----BEGIN CERTIFICATE-----",
                     pem.empty() ? "; the file is empty)" : ")"));
  }
  return certs;
}

std::string TimeText(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (!bio || ASN1_TIME_print(bio.get(), t) != 1) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> ReadPem(const char* key, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(key, ": cannot read ", path));
  return ss.str();
}

}  // namespace

absl::StatusOr<TlsMaterial> ReadTlsFiles(const ServerConfig& c) {
  TlsMaterial tls;
  if (c.tls_cert_file.empty()) return tls;
  tls.cert_file = c.tls_cert_file;
  tls.key_file = c.tls_key_file;
  tls.client_ca_file = c.tls_client_ca_file;
  auto cert = ReadPem("tls.cert_file", c.tls_cert_file);
  if (!cert.ok()) return cert.status();
  tls.cert_chain = std::move(*cert);
  auto key = ReadPem("tls.key_file", c.tls_key_file);
  if (!key.ok()) return key.status();
  tls.private_key = std::move(*key);
  if (!c.tls_client_ca_file.empty()) {
    auto ca = ReadPem("tls.client_ca_file", c.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    tls.client_ca = std::move(*ca);
  }
  return tls;
}

absl::Status CheckTlsMaterial(const TlsMaterial& tls, std::vector<std::string>* warnings) {
  const std::string cert_name = Named("tls.cert_file", tls.cert_file);
  const std::string key_name = Named("tls.key_file", tls.key_file);
  auto chain = ReadCertificates(tls.cert_chain, cert_name);
  if (!chain.ok()) return chain.status();

  ERR_clear_error();
  BioPtr bio = MemBio(tls.private_key);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr), &EVP_PKEY_free);
  if (!key) {
    const std::string why = TakeOpenSslErrors();
    if (absl::StrContains(tls.private_key, "ENCRYPTED")) {
      return absl::InvalidArgumentError(
          absl::StrCat(key_name,
                       ": the key is encrypted; gRPC needs it unencrypted (openssl pkey -in KEY "
                       "-out PLAIN)"));
    }
    // A key block that does not parse says why; text with no key block in it needs no reason
    // (OpenSSL's, "unsupported", would only confuse).
    if (absl::StrContains(tls.private_key, "PRIVATE KEY-----")) {
      return absl::InvalidArgumentError(
          absl::StrCat(key_name, ": the private key does not parse (OpenSSL: ", why, ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(key_name, ": no PEM private key in it (expected -----BEGIN PRIVATE KEY-----",
                     tls.private_key.empty() ? "; the file is empty)" : ")"));
  }
  // The first certificate is the server's; its public key must be this key's.
  X509* leaf = chain->front().get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    const std::string why = TakeOpenSslErrors();
    return absl::InvalidArgumentError(
        absl::StrCat(key_name, ": does not belong to the certificate in ", cert_name,
                     " (the first certificate there must be the server's): ", why));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
    warnings->push_back(absl::StrCat(cert_name, ": the server certificate expired on ",
                                     TimeText(X509_get0_notAfter(leaf)),
                                     "; clients that check it will refuse the connection"));
  } else if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    warnings->push_back(absl::StrCat(cert_name, ": the server certificate is not valid before ",
                                     TimeText(X509_get0_notBefore(leaf)),
                                     "; clients that check it will refuse the connection"));
  }
  if (!tls.client_ca_file.empty() || !tls.client_ca.empty()) {
    auto ca = ReadCertificates(tls.client_ca, Named("tls.client_ca_file", tls.client_ca_file));
    if (!ca.ok()) return ca.status();
  }
  ERR_clear_error();
  return absl::OkStatus();
}

}  // namespace kimi::server
